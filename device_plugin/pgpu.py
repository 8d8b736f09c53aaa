"""pgpu mode: ``nvidia.com/gpu``, whole GPUs or MIG devices, hard isolation by the GPU itself.

Device IDs are the GPU UUIDs, with the NUMA node in TopologyInfo. For several
GPUs, GetPreferredAllocation picks the set with the most NVLink-connected
pairs, then the most GPUs on one NUMA node (topology from NVML; the choice
itself is device_plugin.inventory.best_set, shared with vgpu whole cards).

MIG (``--mig-strategy``, as NVIDIA's k8s-device-plugin defines it; a GPU in
MIG mode is never offered whole):

- ``none``: whole GPUs without MIG mode only;
- ``single``: every MIG device as ``nvidia.com/gpu``; the node's MIG GPUs must all
  be in MIG mode, each with instances, all of one profile, else the agent refuses
  to start (no MIG GPU in MIG mode: whole GPUs, as ``none``);
- ``mixed``: one resource per profile, ``nvidia.com/mig-<profile>``, beside
  ``nvidia.com/gpu`` for the GPUs without MIG mode.

A MIG device's ID is its ``MIG-<uuid>``; Allocate names it the way the NVIDIA
container runtime takes it (``NVIDIA_VISIBLE_DEVICES=MIG-<uuid>``). Its health
is its parent GPU's: an XID on the parent marks every instance on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import grpc

from device_plugin import device_list
from device_plugin.inventory import NodeResource, best_set, health_state, topology
from device_plugin.kubelet import AllocationError, answer
from kube_contract.api import deviceplugin_v1beta1_pb2 as pb
from node_state import tenancy
from node_state.containers import ContainerStore, new_key
from node_state.daemon import StartError
from node_state.gpu_driver import NO_DRIVER
from node_state.gpus import Health, Inventory
from node_state.layout import ContainerRecord
from node_state.mig import MigDevice, Outcome, outcome
from node_state.tenancy import Injection
from py_vcuda.nvml import GPUInfo

RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

log = logging.getLogger(__name__)


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
        return _allocate(self, RESOURCE, device_ids, tuple(g.uuid for g in gpus))


def _allocate(plugin: NodeResource, resource: str, device_ids: Sequence[str], uuids: tuple[str, ...]
              ) -> pb.ContainerAllocateResponse:
    """The container sees these GPUs or MIG devices (NVIDIA_VISIBLE_DEVICES, for the NVIDIA runtime).

    Under the store's lock, which a MIG layout holds from its idle check to retiring the resources it
    replaces: a container is either recorded before (and the layout waits for it) or refused after."""
    with plugin.store.lock:
        if plugin.retired:
            raise AllocationError("the node's MIG layout changed these devices; kubelet gets the new list",
                                  grpc.StatusCode.UNAVAILABLE)
        # Recorded so the exporter can label the GPUs with their pod (via pod-resources), and so a MIG
        # layout knows the GPU is in use.
        plugin.store.layout.write_record(ContainerRecord(
            key=new_key(), mode="pgpu", resource=resource, device_ids=tuple(device_ids), gpus=uuids,
            core_request=100 * len(uuids), core_limit=100 * len(uuids), memory_limit=None,
            created=time.time()))
        return device_list.apply(answer(tenancy.gpu_container(uuids, plugin.gpu_driver)), uuids, plugin.device_list)


def mig_name(profile: str) -> str:
    """A profile as resource and label names may spell it: ``1g.10gb+me`` -> ``1g.10gb.me``."""
    return profile.replace("+", ".")


def mig_resource(profile: str) -> str:
    """The mixed strategy's resource of a profile: ``1g.10gb`` -> ``nvidia.com/mig-1g.10gb``."""
    return MIG_RESOURCE_PREFIX + mig_name(profile)


class MigPlugin(NodeResource):
    """MIG devices as one resource: those of one profile (mixed), or all of them as nvidia.com/gpu (single)."""

    def __init__(self, resource: str, socket_name: str, devices: Sequence[MigDevice], inventory: Inventory,
                 health: Health, store: ContainerStore, *, device_list: Sequence[str] = (device_list.ENVVAR,),
                 gpu_driver: Injection = NO_DRIVER) -> None:
        super().__init__(inventory, health, store, device_list=device_list, gpu_driver=gpu_driver)
        self.resource = resource
        self.socket_name = socket_name
        self.migs = {d.uuid: d for d in devices}

    def devices(self) -> list[pb.Device]:
        out = []
        for d in self.migs.values():
            parent = self.inventory.by_uuid(d.parent_uuid)
            out.append(pb.Device(ID=d.uuid, health=health_state(self.health, d.parent_uuid),
                                 topology=topology(parent) if parent else None))
        return out

    def _devices(self, ids: Sequence[str]) -> list[MigDevice]:
        if len(set(ids)) != len(ids):
            raise AllocationError(f"device IDs {sorted({d for d in ids if ids.count(d) > 1})} appear more than "
                                  "once in one request")
        unknown = [d for d in ids if d not in self.migs]
        if unknown:
            raise AllocationError(f"unknown device ID(s) {unknown}: not MIG devices of {self.resource} on this node "
                                  "(the MIG layout changed? kubelet gets the new list)")
        return [self.migs[d] for d in ids]

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """The required devices, then those on the GPUs already used, then the GPUs with the most free."""
        forced = self._devices(must_include)
        free = [d for d in self._devices(available) if d not in forced]
        if size > len(forced) + len(free):
            raise AllocationError(f"cannot choose {size} MIG devices from {len(forced) + len(free)}")
        per_parent: dict[str, int] = {}
        for d in free:
            per_parent[d.parent_uuid] = per_parent.get(d.parent_uuid, 0) + 1
        used = {d.parent_uuid for d in forced}
        free.sort(key=lambda d: (d.parent_uuid not in used, -per_parent[d.parent_uuid], d.parent_index,
                                 d.placement.start))
        return [d.uuid for d in [*forced, *free][:size]]

    def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        devs = self._devices(device_ids)
        if not devs:
            raise AllocationError("no device IDs in the request")
        return _allocate(self, self.resource, device_ids, tuple(d.uuid for d in devs))


def check_single(after: Outcome) -> str | None:
    """Why the single strategy cannot serve a node whose GPUs are (or will be) so (NVIDIA's rules), or None."""
    enabled = {i: c for i, c in after.items() if c is not None}
    if not enabled:
        return None   # no GPU in MIG mode: whole GPUs, as none
    disabled = [i for i, c in after.items() if c is None]
    if disabled:
        return ("mig-strategy single needs every GPU in MIG mode, but GPU(s) "
                f"{', '.join(map(str, disabled))} are not; use --mig-strategy mixed")
    empty = [i for i, c in enabled.items() if not c]
    if empty:
        return f"mig-strategy single: GPU(s) {', '.join(map(str, empty))} are in MIG mode with no MIG devices"
    profiles = sorted({p for c in enabled.values() for p in c})
    if len(profiles) > 1:
        return (f"mig-strategy single needs one MIG profile on the whole node, found {', '.join(profiles)}; "
                "use --mig-strategy mixed or a uniform layout")
    return None


def plugins(strategy: str, inventory: Inventory, health: Health, store: ContainerStore, *,
            device_list: Sequence[str] = (device_list.ENVVAR,), gpu_driver: Injection = NO_DRIVER
            ) -> list[NodeResource]:
    """The pgpu resources of this node under a MIG strategy (see the module docstring)."""
    whole = inventory.whole()
    mig = inventory.mig
    if mig.enabled and strategy == "none":
        log.warning("GPU(s) %s are in MIG mode: not offered (--mig-strategy none offers whole GPUs only)",
                    ", ".join(sorted(mig.enabled)))
    if strategy == "single" and mig.enabled:
        why = check_single(outcome(mig, inventory.gpus))
        if why:
            raise StartError(why)
        return [MigPlugin(RESOURCE, GPUPlugin.socket_name, mig.devices(), inventory, health, store,
                          device_list=device_list, gpu_driver=gpu_driver)]
    if strategy == "single":
        log.info("no GPU in MIG mode: mig-strategy single falls back to whole GPUs (as none)")
    out: list[NodeResource] = []
    if whole.gpus or strategy != "mixed" or not mig.enabled:
        out.append(GPUPlugin(whole, health, store, device_list=device_list, gpu_driver=gpu_driver))
    if strategy == "mixed":
        for g in mig.gpus.values():
            if g.enabled and not g.devices:
                log.warning("GPU %d (%s) is in MIG mode with no MIG devices: nothing to offer on it", g.index, g.uuid)
        by_profile: dict[str, list[MigDevice]] = {}
        for d in mig.devices():
            by_profile.setdefault(d.profile, []).append(d)
        for profile, devs in sorted(by_profile.items()):
            out.append(MigPlugin(mig_resource(profile), f"nvidia-mig-{mig_name(profile)}.sock", devs,
                                 inventory, health, store, device_list=device_list, gpu_driver=gpu_driver))
    return out
