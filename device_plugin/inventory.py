"""The device plugin's view of the node's GPUs (node_state.gpus): the device IDs built on them,
their kubelet health and topology, and the choice of GPU sets.

Every mode names its logical devices ``<uuid>::<i>``, so the GPU of any device
ID is the text before ``::`` (pgpu uses the bare UUID). Health is per GPU: a
failed GPU makes every logical device on it unhealthy at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from device_plugin import device_list
from device_plugin.kubelet import HEALTHY, UNHEALTHY, AllocationError
from kube_contract.api import deviceplugin_v1beta1_pb2 as pb
from node_state.containers import ContainerStore
from node_state.gpu_driver import NO_DRIVER
from node_state.gpus import Health, Inventory
from node_state.tenancy import Injection
from py_vcuda.nvml import GPUInfo

SEPARATOR = "::"
MAX_EXHAUSTIVE = 5000   # candidate GPU sets scored exactly; beyond, grow greedily


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


def topology(gpu: GPUInfo) -> pb.TopologyInfo | None:
    """The GPU's NUMA node, as kubelet's topology manager reads it."""
    return None if gpu.numa_node is None else pb.TopologyInfo(nodes=[pb.NUMANode(ID=gpu.numa_node)])


def health_state(health: Health, uuid: str) -> str:
    return HEALTHY if health.healthy(uuid) else UNHEALTHY


def logical_devices(inventory: Inventory, health: Health, units: Callable[[GPUInfo], int]) -> list[pb.Device]:
    """``units(gpu)`` devices per GPU, each with its GPU's health and NUMA node."""
    return [pb.Device(ID=device_id(g.uuid, i), health=health_state(health, g.uuid), topology=topology(g))
            for g in inventory.gpus for i in range(units(g))]


class NodeResource:
    """Base of the pgpu and mps resources: the node's GPUs, their health, the container records."""

    def __init__(self, inventory: Inventory, health: Health, store: ContainerStore, *,
                 device_list: Sequence[str] = (device_list.ENVVAR,), gpu_driver: Injection = NO_DRIVER) -> None:
        self.inventory = inventory
        self.gpu_driver = gpu_driver   # the driver's part of each container (node_state.gpu_driver)
        self.health = health
        self.store = store
        self.device_list = tuple(device_list)   # device_list strategies of its Allocate answers
        self.retired = False   # replaced after a MIG layout: its devices may be gone

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def release(self, device_ids: Sequence[str]) -> None:
        with self.store.lock:
            record = self.store.newest(device_ids)
            if record is not None:
                self.store.remove(record.key)
