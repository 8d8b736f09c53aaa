"""pgpu mode: ``nvidia.com/gpu``, whole GPUs, hard isolation by the GPU itself.

Device IDs are the GPU UUIDs, with the NUMA node in TopologyInfo. For several
GPUs, GetPreferredAllocation picks the set with the most NVLink-connected
pairs, then the most GPUs on one NUMA node (topology from NVML; the choice
itself is device_plugin.inventory.best_set, shared with vgpu whole cards).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from device_plugin import device_list
from device_plugin.inventory import NodeResource, best_set, health_state, topology
from device_plugin.kubelet import AllocationError
from kube_contract.api import deviceplugin_v1beta1_pb2 as pb
from node_state.containers import new_key
from node_state.layout import ContainerRecord
from py_vcuda.nvml import GPUInfo

RESOURCE = "nvidia.com/gpu"


class GPUPlugin(NodeResource):
    resource = RESOURCE
    socket_name = "nvidia-gpu.sock"

    def devices(self) -> list[pb.Device]:
        return [pb.Device(ID=g.uuid, health=health_state(self.health, g.uuid), topology=topology(g))
                for g in self.inventory.gpus]

    def _gpus(self, ids: Sequence[str]) -> list[GPUInfo]:
        if len(set(ids)) != len(ids):
            raise AllocationError(f"device IDs {sorted({d for d in ids if ids.count(d) > 1})} appear more than "
                                  "once in one request")
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
        return device_list.apply(pb.ContainerAllocateResponse(), uuids, self.device_list)
