"""pgpu mode: ``nvidia.com/gpu``, whole GPUs, hard isolation by the GPU itself.

Device IDs are the GPU UUIDs, with the NUMA node in TopologyInfo. For several
GPUs, GetPreferredAllocation picks the set with the most NVLink-connected
pairs, then the most GPUs on one NUMA node (topology from NVML).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from device_plugin.api import deviceplugin_v1beta1_pb2 as pb
from device_plugin.containers import new_key
from device_plugin.inventory import Inventory, NodeResource
from device_plugin.kubelet import AllocationError
from device_plugin.layout import ContainerRecord
from py_vcuda.nvml import GPUInfo

RESOURCE = "nvidia.com/gpu"
MAX_EXHAUSTIVE = 5000   # candidate sets scored exactly; beyond, grow greedily


def set_score(gpus: Sequence[GPUInfo], inventory: Inventory) -> tuple[int, int]:
    """(NVLink-connected pairs, GPUs sharing the most common NUMA node): higher is better."""
    links = sum(1 for a, b in itertools.combinations(gpus, 2) if b.index in inventory.nvlink.get(a.index, ()))
    numa = [g.numa_node for g in gpus if g.numa_node is not None]
    same = max((numa.count(n) for n in set(numa)), default=0)
    return links, same


def best_set(available: Sequence[GPUInfo], forced: Sequence[GPUInfo], size: int,
             inventory: Inventory) -> list[GPUInfo]:
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


class GPUPlugin(NodeResource):
    resource = RESOURCE
    socket_name = "nvidia-gpu.sock"

    def devices(self) -> list[pb.Device]:
        return [pb.Device(ID=g.uuid, health=self.health.state(g.uuid), topology=self.inventory.topology(g))
                for g in self.inventory.gpus]

    def _gpus(self, ids: Sequence[str]) -> list[GPUInfo]:
        out = []
        for did in ids:
            gpu = self.inventory.by_uuid(did)
            if gpu is None:
                raise AllocationError(f"unknown device ID {did!r}: not a GPU of this node")
            out.append(gpu)
        return out

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        chosen = best_set(self._gpus(available), self._gpus(must_include), size, self.inventory)
        return [g.uuid for g in chosen]

    def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        gpus = self._gpus(device_ids)
        if not gpus:
            raise AllocationError("no device IDs in the request")
        uuids = tuple(g.uuid for g in gpus)
        # Recorded so the exporter can label the GPUs with their pod (via pod-resources).
        self.store.layout.write_record(ContainerRecord(
            key=new_key(), mode="pgpu", resource=RESOURCE, device_ids=tuple(device_ids), gpus=uuids,
            core_request=100 * len(gpus), core_limit=100 * len(gpus), memory_limit=None,
            created=time.time()))
        return pb.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)})
