"""The node's GPUs as the node daemons see them: the inventory (identities, NVLink,
MIG: node_state.mig) and their health, which the XID monitor (node_state.health) keeps and the device
plugin and the DRA driver publish, each in its own API (ListAndWatch, ResourceSlices).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from node_state.mig import MigDevice, MigView
from py_vcuda.nvml import NVML, GPUInfo


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[GPUInfo, ...]
    nvlink: dict[int, frozenset[int]] = field(default_factory=dict)   # index -> NVLink peers
    # (a, b) with a < b -> number of NVLink links; pairs in `nvlink` missing here count one link
    links: dict[tuple[int, int], int] = field(default_factory=dict)
    mig: MigView = field(default_factory=MigView)   # MIG-capable GPUs, their mode and instances

    @classmethod
    def from_nvml(cls, nvml: NVML) -> Inventory:
        gpus = tuple(nvml.gpus())
        mig = MigView.read(nvml, [g.index for g in gpus])
        links: dict[tuple[int, int], int] = {}
        for g in gpus:
            for peer, n in nvml.nvlink_links(g.index).items():
                links[(min(g.index, peer), max(g.index, peer))] = n
        nvlink = {g.index: frozenset(b if a == g.index else a for a, b in links if g.index in (a, b)) for g in gpus}
        return cls(gpus, nvlink, links, mig)

    def whole(self) -> Inventory:
        """The GPUs that may be offered whole: those not in MIG mode (a GPU in MIG mode runs
        work only on its instances)."""
        if not self.mig.enabled:
            return self
        keep = tuple(g for g in self.gpus if g.uuid not in self.mig.enabled)
        indexes = {g.index for g in keep}
        return Inventory(keep, {i: p & indexes for i, p in self.nvlink.items() if i in indexes},
                         {k: n for k, n in self.links.items() if set(k) <= indexes}, self.mig)

    def mig_devices(self) -> list[MigDevice]:
        return self.mig.devices()

    def shareable(self) -> Inventory:
        """The GPUs to share in vgpu mode: those without MIG mode, then every MIG instance as a GPU of
        its own (its MIG-<uuid>, its memory, the parent's NUMA node; index: past the physical GPUs,
        in the order NVML lists the instances). Instances have no NVLink."""
        whole = self.whole()
        parents = {g.uuid: g for g in self.gpus}
        instances = []
        for k, d in enumerate(self.mig.devices()):
            parent = parents.get(d.parent_uuid)
            instances.append(GPUInfo(
                index=len(self.gpus) + k, uuid=d.uuid, name=f"{parent.name if parent else 'GPU'} MIG {d.profile}",
                memory_total=d.memory_total, minor=parent.minor if parent else 0,
                numa_node=parent.numa_node if parent else None))
        return Inventory(whole.gpus + tuple(instances), whole.nvlink, whole.links, self.mig)

    def link_count(self, a: int, b: int) -> int:
        """NVLink links between two GPUs (0: not connected)."""
        if b not in self.nvlink.get(a, ()):
            return 0
        return self.links.get((min(a, b), max(a, b)), 1)

    def by_uuid(self, uuid: str) -> GPUInfo | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


class Health:
    """Which GPUs are unhealthy, and who to tell when that changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unhealthy: dict[str, str] = {}
        self._listeners: list[Callable[[], None]] = []
        self._parent: dict[str, str] = {}   # MIG instance uuid -> its GPU's: an instance is as healthy as its GPU

    def follow(self, uuid: str, parent: str) -> None:
        """`uuid` (a MIG instance) is healthy exactly when `parent` (its GPU) is."""
        with self._lock:
            self._parent[uuid] = parent

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
            return self._parent.get(uuid, uuid) not in self._unhealthy
