"""The GPUs this agent serves, their topology and health, and the device IDs built on them.

Every mode names its logical devices ``<uuid>::<i>``, so the GPU of any device
ID is the text before ``::`` (pgpu uses the bare UUID). Health is per GPU: a
failed GPU makes every logical device on it unhealthy at once.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from device_plugin.kubelet import HEALTHY, UNHEALTHY, AllocationError
from kube_contract.api import deviceplugin_v1beta1_pb2 as pb
from node_state.containers import ContainerStore
from py_vcuda.nvml import NVML, GPUInfo

SEPARATOR = "::"
MAX_EXHAUSTIVE = 5000   # candidate GPU sets scored exactly; beyond, grow greedily


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[GPUInfo, ...]
    nvlink: dict[int, frozenset[int]] = field(default_factory=dict)   # index -> NVLink peers
    # (a, b) with a < b -> number of NVLink links; pairs in `nvlink` missing here count one link
    links: dict[tuple[int, int], int] = field(default_factory=dict)

    @classmethod
    def from_nvml(cls, nvml: NVML) -> Inventory:
        gpus = tuple(nvml.gpus())
        links: dict[tuple[int, int], int] = {}
        for g in gpus:
            for peer, n in nvml.nvlink_links(g.index).items():
                links[(min(g.index, peer), max(g.index, peer))] = n
        nvlink = {g.index: frozenset(b if a == g.index else a for a, b in links if g.index in (a, b)) for g in gpus}
        return cls(gpus, nvlink, links)

    def link_count(self, a: int, b: int) -> int:
        """NVLink links between two GPUs (0: not connected)."""
        if b not in self.nvlink.get(a, ()):
            return 0
        return self.links.get((min(a, b), max(a, b)), 1)

    def by_uuid(self, uuid: str) -> GPUInfo | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def topology(self, gpu: GPUInfo) -> pb.TopologyInfo | None:
        return None if gpu.numa_node is None else pb.TopologyInfo(nodes=[pb.NUMANode(ID=gpu.numa_node)])


def device_id(uuid: str, i: int) -> str:
    return f"{uuid}{SEPARATOR}{i}"


def parse_ids(ids: Sequence[str], inventory: Inventory, units_per_gpu: Callable[[GPUInfo], int]
              ) -> dict[str, list[int]]:
    """Device IDs grouped by GPU UUID (in first-seen order); unknown or repeated IDs raise AllocationError."""
    groups: dict[str, list[int]] = {}
    if len(set(ids)) != len(ids):
        raise AllocationError(f"device IDs {sorted({d for d in ids if ids.count(d) > 1})} appear more than once "
                              "in one request (kubelet never sends that; is something else calling the plugin?)")
    for did in ids:
        uuid, sep, index = did.rpartition(SEPARATOR)
        gpu = inventory.by_uuid(uuid) if sep else None
        if gpu is None or not index.isdigit() or int(index) >= units_per_gpu(gpu):
            raise AllocationError(f"unknown device ID {did!r}: not a device of this node "
                                  "(kubelet and plugin disagree; restart the plugin pod if GPUs changed)")
        groups.setdefault(uuid, []).append(int(index))
    return groups


def set_score(gpus: Sequence[GPUInfo], inventory: Inventory) -> tuple[int, int]:
    """(NVLink-connected pairs, GPUs sharing the most common NUMA node): higher is better."""
    links = sum(1 for a, b in itertools.combinations(gpus, 2) if b.index in inventory.nvlink.get(a.index, ()))
    numa = [g.numa_node for g in gpus if g.numa_node is not None]
    same = max((numa.count(n) for n in set(numa)), default=0)
    return links, same


def best_set(available: Sequence[GPUInfo], forced: Sequence[GPUInfo], size: int,
             inventory: Inventory) -> list[GPUInfo]:
    """`size` GPUs from `available`, `forced` among them, with the most NVLink pairs, then the most on one NUMA node.

    Used by every mode that hands out several whole GPUs (pgpu, vgpu whole cards), so they choose alike.
    """
    rest = [g for g in available if g not in forced]
    need = size - len(forced)
    if need < 0 or need > len(rest):
        raise AllocationError(f"cannot choose {size} GPUs from {len(available)} available "
                              f"with {len(forced)} required")
    combos = itertools.combinations(rest, need)
    if sum(1 for _ in itertools.islice(itertools.combinations(rest, need), MAX_EXHAUSTIVE + 1)) <= MAX_EXHAUSTIVE:
        # Ties go to the lowest indexes: a stable answer for the same input.
        best = max(combos, key=lambda c: (set_score([*forced, *c], inventory), [-g.index for g in c]))
        return [*forced, *best]
    chosen = list(forced)
    while len(chosen) < size:
        pick = max((g for g in rest if g not in chosen),
                   key=lambda g: (set_score([*chosen, g], inventory), -g.index))
        chosen.append(pick)
    return chosen


class Health:
    """Which GPUs are unhealthy, and who to tell when that changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unhealthy: dict[str, str] = {}
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def set(self, uuid: str, healthy: bool, reason: str = "") -> None:
        """HealthMonitor's on_change; called from its thread."""
        with self._lock:
            before = uuid not in self._unhealthy
            if healthy:
                self._unhealthy.pop(uuid, None)
            else:
                self._unhealthy[uuid] = reason
        if before != healthy:
            for listener in self._listeners:
                listener()

    def healthy(self, uuid: str) -> bool:
        with self._lock:
            return uuid not in self._unhealthy

    def state(self, uuid: str) -> str:
        return HEALTHY if self.healthy(uuid) else UNHEALTHY


def logical_devices(inventory: Inventory, health: Health, units: Callable[[GPUInfo], int]) -> list[pb.Device]:
    """``units(gpu)`` devices per GPU, each with its GPU's health and NUMA node."""
    return [pb.Device(ID=device_id(g.uuid, i), health=health.state(g.uuid), topology=inventory.topology(g))
            for g in inventory.gpus for i in range(units(g))]


class NodeResource:
    """Base of the pgpu and mps resources: the node's GPUs, their health, the container records."""

    def __init__(self, inventory: Inventory, health: Health, store: ContainerStore) -> None:
        self.inventory = inventory
        self.health = health
        self.store = store

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def release(self, device_ids: Sequence[str]) -> None:
        with self.store.lock:
            record = self.store.newest(device_ids)
            if record is not None:
                self.store.remove(record.key)
