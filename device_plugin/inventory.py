"""The GPUs this agent serves, their topology and health, and the device IDs built on them.

Every mode names its logical devices ``<uuid>::<i>``, so the GPU of any device
ID is the text before ``::`` (pgpu uses the bare UUID). Health is per GPU: a
failed GPU makes every logical device on it unhealthy at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from device_plugin.api import deviceplugin_v1beta1_pb2 as pb
from device_plugin.containers import ContainerStore
from device_plugin.kubelet import HEALTHY, UNHEALTHY, AllocationError
from py_vcuda.nvml import NVML, GPUInfo

SEPARATOR = "::"


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[GPUInfo, ...]
    nvlink: dict[int, frozenset[int]] = field(default_factory=dict)   # index -> NVLink peers

    @classmethod
    def from_nvml(cls, nvml: NVML) -> Inventory:
        gpus = tuple(nvml.gpus())
        nvlink = {g.index: frozenset(nvml.nvlink_peers(g.index)) for g in gpus}
        return cls(gpus, nvlink)

    def by_uuid(self, uuid: str) -> GPUInfo | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def topology(self, gpu: GPUInfo) -> pb.TopologyInfo | None:
        return None if gpu.numa_node is None else pb.TopologyInfo(nodes=[pb.NUMANode(ID=gpu.numa_node)])


def device_id(uuid: str, i: int) -> str:
    return f"{uuid}{SEPARATOR}{i}"


def parse_ids(ids: Sequence[str], inventory: Inventory, units_per_gpu: Callable[[GPUInfo], int]
              ) -> dict[str, list[int]]:
    """Device IDs grouped by GPU UUID (in first-seen order); unknown IDs raise AllocationError."""
    groups: dict[str, list[int]] = {}
    for did in ids:
        uuid, sep, index = did.rpartition(SEPARATOR)
        gpu = inventory.by_uuid(uuid) if sep else None
        if gpu is None or not index.isdigit() or int(index) >= units_per_gpu(gpu):
            raise AllocationError(f"unknown device ID {did!r}: not a device of this node "
                                  "(kubelet and plugin disagree; restart the plugin pod if GPUs changed)")
        groups.setdefault(uuid, []).append(int(index))
    return groups


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
