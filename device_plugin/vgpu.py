"""vgpu mode: ``tencent.com/vcuda-core`` (100 per GPU) and ``tencent.com/vcuda-memory``
(256 MiB units), GPU-Manager's names, enforced by libvcuda and the token schedulers.

Core requests: below 100 cores is a share of one GPU (a tenant of its token
scheduler); a multiple of 100 is that many whole cards, unthrottled; anything
else is refused. See device_plugin.quota for how memory limits are found.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from device_plugin import pods as podlib
from device_plugin.api import deviceplugin_v1beta1_pb2 as pb
from device_plugin.containers import (
    CONTAINER_DIR,
    CONTAINER_LEDGER,
    CONTAINER_LIB,
    CONTAINER_SCHED_DIR,
    CONTAINER_SCHEDULER,
    PRELOAD_FILE,
    ContainerStore,
    mount,
    new_key,
)
from device_plugin.inventory import Health, Inventory, logical_devices, parse_ids
from device_plugin.kubelet import AllocationError
from device_plugin.layout import ContainerRecord
from device_plugin.quota import QuotaError, quota
from device_plugin.schedulers import SchedulerError, TokenScheduler
from py_vcuda.nvml import GPUInfo
from scheduler_extender import assignment
from scheduler_extender.names import CORES_PER_GPU, MEMORY_UNIT_BYTES, Names

log = logging.getLogger(__name__)

PRELOAD_TARGET = Path("/etc/ld.so.preload")


@dataclass
class VGPUContext:
    """What both vgpu resources share."""

    inventory: Inventory
    health: Health
    names: Names
    node: str
    pods: podlib.PodSource
    store: ContainerStore
    schedulers: Mapping[str, TokenScheduler]
    host_lib: Path        # libvcuda.so on the host


def cores_of(_gpu: GPUInfo) -> int:
    return CORES_PER_GPU


def memory_units_of(gpu: GPUInfo) -> int:
    return gpu.memory_total // MEMORY_UNIT_BYTES


def shape(groups: Mapping[str, list[int]], count: int) -> dict[str, int]:
    """Cores per GPU for a valid request; AllocationError says what is wrong with an invalid one."""
    if count < CORES_PER_GPU:
        if len(groups) > 1:
            raise AllocationError(f"a request of {count} cores must stay on one GPU, got devices of "
                                  f"{len(groups)} GPUs; let kubelet use the plugin's preferred allocation")
        return {uuid: len(ids) for uuid, ids in groups.items()}
    if count % CORES_PER_GPU:
        raise AllocationError(f"{count} cores is more than one GPU but not a multiple of {CORES_PER_GPU}; "
                              f"ask for at most {CORES_PER_GPU} (a share of one GPU) or whole GPUs "
                              f"({CORES_PER_GPU}, {2 * CORES_PER_GPU}, ...)")
    partial = [uuid for uuid, ids in groups.items() if len(ids) != CORES_PER_GPU]
    if partial:
        raise AllocationError(f"{count} cores must be whole GPUs, but GPU(s) {', '.join(partial)} are only "
                              "partly included; let kubelet use the plugin's preferred allocation")
    return {uuid: CORES_PER_GPU for uuid in groups}


class CorePlugin:
    socket_name = "vcuda-core.sock"

    def __init__(self, ctx: VGPUContext) -> None:
        self.ctx = ctx
        self.resource = ctx.names.core_resource

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def devices(self) -> list[pb.Device]:
        return logical_devices(self.ctx.inventory, self.ctx.health, cores_of)

    # --- GetPreferredAllocation -------------------------------------------------
    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        inv = self.ctx.inventory
        free = parse_ids(available, inv, cores_of)
        forced = parse_ids(must_include, inv, cores_of)
        if size < CORES_PER_GPU:
            return self._fractional(free, forced, size)
        if size % CORES_PER_GPU:
            shape({"": []}, size)   # raises with the message for this mistake
        whole = [u for u, ids in free.items() if len(ids) == CORES_PER_GPU]
        chosen = [u for u in forced if u in whole] + [u for u in whole if u not in forced]
        chosen = chosen[: size // CORES_PER_GPU]
        if len(chosen) < size // CORES_PER_GPU:
            raise AllocationError(f"{size} cores need {size // CORES_PER_GPU} whole free GPUs; "
                                  f"only {len(whole)} are free")
        return [f"{u}::{i}" for u in chosen for i in sorted(free[u])]

    def _fractional(self, free: dict[str, list[int]], forced: dict[str, list[int]], size: int) -> list[str]:
        if len(forced) > 1:
            raise AllocationError("must-include devices span several GPUs; a share must stay on one GPU")
        fits = {u: ids for u, ids in free.items() if len(ids) >= size}
        if forced:
            fits = {u: ids for u, ids in fits.items() if u in forced}
        if not fits:
            raise AllocationError(f"no single GPU has {size} free cores; the request cannot be split")
        hinted = self._assigned_gpu(size, set(fits))
        # Best fit: the fullest GPU that still holds the request keeps whole GPUs free.
        uuid = hinted or min(fits, key=lambda u: (len(fits[u]), u))
        ids = sorted(forced.get(uuid, [])) + sorted(i for i in fits[uuid] if i not in forced.get(uuid, []))
        return [f"{uuid}::{i}" for i in ids[:size]]

    def _assigned_gpu(self, size: int, candidates: set[str]) -> str | None:
        """The GPU the extender picked for a waiting container of this size, when only one fits."""
        try:
            pods = self.ctx.pods.list_pods(self.ctx.node)
        except Exception as exc:  # a hint only: never fail the allocation over it
            log.debug("no pod list for the preferred allocation: %s", exc)
            return None
        done = self.ctx.store.allocated()
        gpus: set[str] = set()
        for pod in pods:
            text = (podlib.meta(pod).get("annotations") or {}).get(self.ctx.names.assignment)
            uid = podlib.meta(pod).get("uid", "")
            if text is None:
                continue
            try:
                decided = assignment.decode(text)
            except assignment.AssignmentError:
                continue
            for c in pod.get("spec", {}).get("containers", []):
                entry = decided.container(c.get("name", ""))
                if (entry is None or (uid, c.get("name")) in done
                        or podlib.requested(c, self.resource) != size or len(entry.gpus) != 1):
                    continue
                if entry.gpus[0].uuid in candidates:
                    gpus.add(entry.gpus[0].uuid)
        return next(iter(gpus)) if len(gpus) == 1 else None

    # --- Allocate ---------------------------------------------------------------
    def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        ctx = self.ctx
        groups = parse_ids(device_ids, ctx.inventory, cores_of)
        if not groups:
            raise AllocationError("no device IDs in the request")
        cores = shape(groups, len(device_ids))
        fractional = len(device_ids) < CORES_PER_GPU
        single = len(ctx.inventory.gpus) == 1
        with ctx.store.lock:
            match = self._identify(cores, len(device_ids), single)
            annotations = match.annotations if match else {}
            share_memory = next((s.memory for s in match.shares), None) if match and match.shares else None
            units = podlib.requested(match.spec, ctx.names.memory_resource) if match else 0
            try:
                q = quota(ctx.names, annotations, cores=len(device_ids) if fractional else CORES_PER_GPU,
                          share_memory=share_memory, memory_units=units)
            except QuotaError as exc:
                raise AllocationError(f"pod {match.namespace}/{match.pod}: {exc}" if match else str(exc)) from None
            disabled = bool(match and match.env.get("VCUDA_DISABLE") == "1")
            key = new_key()
            record = ContainerRecord(
                key=key, mode="vgpu", resource=self.resource, device_ids=tuple(device_ids),
                gpus=tuple(groups), core_request=q.core_request, core_limit=q.core_limit,
                memory_limit=q.memory_limit, tenant=key if fractional else None,
                namespace=match.namespace if match else "", pod=match.pod if match else "",
                pod_uid=match.uid if match else "", container=match.container if match else "",
                created=time.time(), extra={"preload": "0" if disabled else "1",
                                            **({"identity": "provisional"} if self._provisional(match) else {})})
            directory = ctx.store.create(record, ledger=True, preload=not disabled)
            try:
                tenant_dir = self._register(record)
            except Exception:
                ctx.store.remove(key)
                raise
        log.info("allocated %s to %s/%s:%s (%s, cores %d/%d, memory %s)", key, record.namespace,
                 record.pod, record.container, ",".join(record.gpus), q.core_request, q.core_limit,
                 q.memory_limit)
        return self._response(record, directory, tenant_dir, disabled)

    def _identify(self, cores: dict[str, int], count: int, single: bool) -> podlib.PodMatch | None:
        ctx = self.ctx
        try:
            pods = ctx.pods.list_pods(ctx.node)
        except Exception as exc:
            if single:
                log.warning("no pod list (%s): serving anonymously on this single-GPU node", exc)
                return None
            raise AllocationError(f"cannot list the pods of node {ctx.node!r} ({exc}); the plugin needs "
                                  "the API server to tell containers apart on a node with several GPUs",
                                  grpc.StatusCode.UNAVAILABLE) from None
        return podlib.identify(pods, node=ctx.node, names=ctx.names, resource=self.resource, cores=cores,
                               count=count, allocated=ctx.store.allocated(), single_gpu=single)

    def _provisional(self, match: podlib.PodMatch | None) -> bool:
        """Provisional, or chosen by elimination next to a provisional one (which may be wrong)."""
        return bool(match) and (match.provisional or any(   # type: ignore[union-attr]
            r.extra.get("identity") == "provisional" for r in self.ctx.store.records()))

    def _register(self, record: ContainerRecord) -> Path | None:
        if record.tenant is None:
            return None
        scheduler = self.ctx.schedulers.get(record.gpus[0])
        if scheduler is None:
            raise AllocationError(f"no token scheduler for GPU {record.gpus[0]}", grpc.StatusCode.INTERNAL)
        try:
            return scheduler.add(record.tenant, record.core_request, record.core_limit)
        except SchedulerError as exc:
            raise AllocationError(f"the token scheduler refused the quota: {exc}",
                                  grpc.StatusCode.UNAVAILABLE) from None

    def _response(self, record: ContainerRecord, directory: Path, tenant_dir: Path | None,
                  disabled: bool) -> pb.ContainerAllocateResponse:
        envs = {
            "NVIDIA_VISIBLE_DEVICES": ",".join(record.gpus),
            "VCUDA_CORE_REQUEST": str(record.core_request),
            "VCUDA_CORE_LIMIT": str(record.core_limit),
            "VCUDA_LEDGER": str(CONTAINER_LEDGER),
        }
        if record.memory_limit is not None:
            envs["VCUDA_MEMORY_LIMIT"] = str(record.memory_limit)
        mounts = [mount(directory, CONTAINER_DIR, read_only=False),
                  mount(self.ctx.host_lib, CONTAINER_LIB, read_only=True)]
        if tenant_dir is not None:
            envs["VCUDA_SCHEDULER"] = CONTAINER_SCHEDULER
            mounts.append(mount(tenant_dir, CONTAINER_SCHED_DIR, read_only=False))
        if not disabled:
            mounts.append(mount(directory / PRELOAD_FILE, PRELOAD_TARGET, read_only=True))
        return pb.ContainerAllocateResponse(envs=envs, mounts=mounts)


class MemoryPlugin:
    """Accounting only: capacity in 256 MiB units; the limit is applied by CorePlugin (see quota)."""

    socket_name = "vcuda-memory.sock"

    def __init__(self, ctx: VGPUContext) -> None:
        self.ctx = ctx
        self.resource = ctx.names.memory_resource

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions()

    def devices(self) -> list[pb.Device]:
        return logical_devices(self.ctx.inventory, self.ctx.health, memory_units_of)

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        return (list(must_include) + [d for d in available if d not in must_include])[:size]

    def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        parse_ids(device_ids, self.ctx.inventory, memory_units_of)
        return pb.ContainerAllocateResponse()
