"""vgpu mode: ``tencent.com/vcuda-core`` (100 per GPU) and ``tencent.com/vcuda-memory``
(256 MiB units), GPU-Manager's names, enforced by libvcuda and the token schedulers.

Core requests: below 100 cores is a share of one GPU (a tenant of its token
scheduler); a multiple of 100 is that many whole cards, unthrottled; anything
else is refused. See device_plugin.quota for how memory limits are found.

GetPreferredAllocation follows the extender: the GPUs it assigned to the
oldest container waiting for this many cores (kubelet does not say which
container it asks for). Without an assignment, a share goes to the fullest GPU
that holds it (best fit) and whole cards to the NVLink / NUMA-closest set
(inventory.best_set, as in pgpu mode).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from device_plugin import device_list
from device_plugin import pods as podlib
from device_plugin.inventory import best_set, logical_devices, parse_ids
from device_plugin.kubelet import AllocationError, answer
from device_plugin.quota import QuotaError, quota
from kube_contract.api import deviceplugin_v1beta1_pb2 as pb
from kube_contract.names import CORES_PER_GPU, MEMORY_UNIT_BYTES, Names
from node_state import tenancy
from node_state.containers import ContainerStore, new_key
from node_state.gpu_driver import NO_DRIVER
from node_state.gpus import Health, Inventory
from node_state.layout import ContainerRecord
from node_state.schedulers import SchedulerError, TokenScheduler, remove_tenant
from node_state.tenancy import Injection
from py_vcuda.nvml import GPUInfo

log = logging.getLogger(__name__)


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
    device_list: Sequence[str] = (device_list.ENVVAR,)          # how answers name the GPUs (device_list)
    opt_out_namespaces: Collection[str] = frozenset()           # whose shares may skip the preload
    gpu_driver: Injection = NO_DRIVER                           # the driver's part (node_state.gpu_driver)


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
        return self._whole(free, forced, size)

    def _fractional(self, free: dict[str, list[int]], forced: dict[str, list[int]], size: int) -> list[str]:
        if len(forced) > 1:
            raise AllocationError("must-include devices span several GPUs; a share must stay on one GPU")
        fits = {u: ids for u, ids in free.items() if len(ids) >= size}
        if forced:
            fits = {u: ids for u, ids in fits.items() if u in forced}
        if not fits:
            raise AllocationError(f"no single GPU has {size} free cores; the request cannot be split")
        hinted = next((u for gpus, _ in self._assigned(size) for u in gpus if u in fits), None)
        # Best fit: the fullest GPU that still holds the request keeps whole GPUs free.
        uuid = hinted or min(fits, key=lambda u: (len(fits[u]), u))
        ids = sorted(forced.get(uuid, [])) + sorted(i for i in fits[uuid] if i not in forced.get(uuid, []))
        return [f"{uuid}::{i}" for i in ids[:size]]

    def _whole(self, free: dict[str, list[int]], forced: dict[str, list[int]], size: int) -> list[str]:
        cards = size // CORES_PER_GPU
        whole = [u for u, ids in free.items() if len(ids) == CORES_PER_GPU]
        partial = [u for u in forced if u not in whole]
        if partial:
            raise AllocationError(f"must-include devices are on GPU(s) {', '.join(partial)}, which are not "
                                  f"wholly free; {size} cores need whole GPUs")
        if len(whole) < cards:
            raise AllocationError(f"{size} cores need {cards} whole free GPUs; only {len(whole)} are free")
        chosen = self._whole_hint(whole, list(forced), cards)
        if chosen is None:   # no extender decision to follow: the NVLink / NUMA-closest set, as pgpu picks
            inv = self.ctx.inventory
            by_uuid = [inv.by_uuid(u) for u in whole]
            picked = best_set([g for g in by_uuid if g is not None],
                              [g for g in by_uuid if g is not None and g.uuid in forced], cards, inv)
            chosen = [g.uuid for g in picked]
        return [f"{u}::{i}" for u in chosen for i in sorted(free[u])]

    def _whole_hint(self, whole: list[str], forced: list[str], cards: int) -> list[str] | None:
        """The extender's GPUs for the oldest waiting container of this size that can have them now."""
        inv = self.ctx.inventory
        for gpus, exact in self._assigned(cards * CORES_PER_GPU):
            usable = [u for u in gpus if u in whole]
            if exact:
                if len(gpus) == cards and len(usable) == cards and set(forced) <= set(gpus):
                    return list(gpus)
                continue
            if len(usable) >= cards and set(forced) <= set(usable):   # an init container: any of its pod's GPUs
                found = [g for g in (inv.by_uuid(u) for u in usable) if g is not None]
                picked = best_set(found, [g for g in found if g.uuid in forced], cards, inv)
                return [g.uuid for g in picked]
        return None

    def _assigned(self, size: int) -> list[tuple[tuple[str, ...], bool]]:
        """The extender's GPUs for each container waiting for `size` cores, oldest pod first.

        Following the oldest keeps GetPreferredAllocation and Allocate in step: kubelet admits pods
        one at a time, and Allocate knows the container by the GPUs it gets (pods.identify).
        """
        try:
            pods = self.ctx.pods.list_pods(self.ctx.node)
        except Exception as exc:  # a hint only: never fail the allocation over it
            log.debug("no pod list for the preferred allocation: %s", exc)
            return []
        return podlib.assigned_gpus(pods, names=self.ctx.names, resource=self.resource, count=size,
                                    allocated=self.ctx.store.allocated())

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
            existing = list(ctx.store.records())   # read once: who is served, provisional, init tenants
            match, pods = self._identify(cores, len(device_ids), single, existing)
            existing = self._release_finished(pods, existing)
            annotations = match.annotations if match else {}
            share_memory = next((s.memory for s in match.shares), None) if match and match.shares else None
            units = podlib.requested(match.spec, ctx.names.memory_resource) if match else 0
            try:
                q = quota(ctx.names, annotations, cores=len(device_ids) if fractional else CORES_PER_GPU,
                          share_memory=share_memory, memory_units=units, gpus=len(groups))
            except QuotaError as exc:
                raise AllocationError(f"pod {match.namespace}/{match.pod}: {exc}" if match else str(exc)) from None
            disabled = self._opted_out(match, fractional)
            key = new_key()
            handed = self._init_tenant(match, next(iter(groups)), existing) if fractional else None
            extra = {"preload": "0" if disabled else "1"}
            if self._provisional(match, existing):
                extra["identity"] = "provisional"
            if match and match.init and not match.sidecar:
                extra["init"] = "1"   # runs to completion before the next container starts
            record = ContainerRecord(
                key=key, mode="vgpu", resource=self.resource, device_ids=tuple(device_ids),
                gpus=tuple(groups), core_request=q.core_request, core_limit=q.core_limit,
                memory_limit=q.memory_limit, tenant=(handed.tenant if handed else key) if fractional else None,
                priority=q.priority,
                namespace=match.namespace if match else "", pod=match.pod if match else "",
                pod_uid=match.uid if match else "", container=match.container if match else "",
                created=time.time(), extra=extra)
            try:
                tenant_dir = tenancy.set_up(ctx.store, ctx.schedulers, record, preload=not disabled)
            except SchedulerError as exc:
                raise AllocationError(f"the container's token-scheduler tenant could not be set up: {exc}",
                                      grpc.StatusCode.UNAVAILABLE) from None
            if handed is not None:
                # The app container now owns the tenant (and its quota); the init container, which
                # runs before it, keeps using the same socket. Only one record may re-register it.
                ctx.store.layout.write_record(dataclasses.replace(
                    handed, tenant=None, extra={**handed.extra, "tenant_to": key}))
        log.info("allocated %s to %s/%s:%s (%s, cores %d/%d %s, memory %s)", key, record.namespace,
                 record.pod, record.container, ",".join(record.gpus), q.core_request, q.core_limit,
                 q.priority, q.memory_limit)
        return self._response(record, tenant_dir, disabled)

    def _opted_out(self, match: podlib.PodMatch | None, fractional: bool) -> bool:
        """Whether the container goes without /etc/ld.so.preload: it sets VCUDA_DISABLE=1 and it either has
        whole GPUs or runs in a namespace the operator lists (--allow-opt-out-namespaces). A share of a GPU
        elsewhere is held to its quota whatever its spec says: the quota protects the GPU's other tenants."""
        if match is None or match.env.get("VCUDA_DISABLE") != "1":
            return False
        if not fractional or match.namespace in self.ctx.opt_out_namespaces:
            return True
        log.warning("pod %s/%s container %s sets VCUDA_DISABLE=1 on a share of a GPU: ignored, it is held to its "
                    "quota (only namespaces listed in --allow-opt-out-namespaces may opt out)", match.namespace,
                    match.pod, match.container)
        return False

    def _init_tenant(self, match: podlib.PodMatch | None, uuid: str,
                     existing: list[ContainerRecord]) -> ContainerRecord | None:
        """The tenant of a finished init container of the same pod on this GPU, for the next container
        there to take over.

        kubelet hands a regular init container's devices on to the containers after it (it runs to
        completion first, never beside them), and the extender counts them once: a second tenant on
        the same cores could push the GPU's guaranteed requests past 100 % and be refused. A sidecar
        keeps running, so its tenant is never handed on (its record has no "init").
        """
        if match is None or not match.uid:
            return None
        return next((r for r in existing
                     if r.pod_uid == match.uid and r.extra.get("init") == "1" and r.tenant
                     and r.gpus == (uuid,)), None)

    def release(self, device_ids: Sequence[str]) -> None:
        ctx = self.ctx
        with ctx.store.lock:
            record = ctx.store.newest(device_ids)
            if record is None:
                return
            # A tenant taken over from an init container stays with the record that still has it.
            if not any(r.tenant == record.tenant and r.key != record.key for r in ctx.store.records()):
                remove_tenant(ctx.schedulers, record)
            ctx.store.remove(record.key)

    def _identify(self, cores: dict[str, int], count: int, single: bool,
                  existing: list[ContainerRecord]) -> tuple[podlib.PodMatch | None, list[podlib.Pod] | None]:
        """The container this Allocate is for, and the node's pods it was found among (None: no list)."""
        ctx = self.ctx
        try:
            pods = ctx.pods.list_pods(ctx.node)
        except Exception as exc:
            if single:
                log.warning("no pod list (%s): serving anonymously on this single-GPU node", exc)
                return None, None
            raise AllocationError(f"cannot list the pods of node {ctx.node!r} ({exc}); the plugin needs "
                                  "the API server to tell containers apart on a node with several GPUs",
                                  grpc.StatusCode.UNAVAILABLE) from None
        return podlib.identify(pods, node=ctx.node, names=ctx.names, resource=self.resource, cores=cores,
                               count=count, allocated=ctx.store.allocated(existing), single_gpu=single,
                               opt_out_namespaces=ctx.opt_out_namespaces), pods

    def _release_finished(self, pods: list[podlib.Pod] | None,
                          existing: list[ContainerRecord]) -> list[ContainerRecord]:
        """Release the containers of pods that have finished (Succeeded, Failed), before a new tenant comes.

        A finished pod's GPU share is free for kube-scheduler and the extender at once, and kubelet hands
        its devices on; its tenant must not stay in the token scheduler until the pod object is deleted,
        or the next pod the extender places there is refused (its guarantee would push the sum past
        100 %). The reconciler does the same on the pod's update; this closes the race with it.
        Returns the records left."""
        if not pods:
            return existing
        finished = {podlib.meta(p).get("uid", "") for p in pods if podlib.finished(p)} - {""}
        gone = [r for r in existing if r.resource == self.resource and r.pod_uid in finished]
        for record in gone:
            log.info("releasing %s (%s/%s:%s): its pod has finished", record.key, record.namespace, record.pod,
                     record.container)
            if not any(r.tenant == record.tenant and r.key != record.key for r in self.ctx.store.records()):
                remove_tenant(self.ctx.schedulers, record)
            self.ctx.store.remove(record.key)
        return [r for r in existing if r not in gone]

    def _provisional(self, match: podlib.PodMatch | None, existing: list[ContainerRecord]) -> bool:
        """Provisional, or chosen by elimination next to a provisional one (which may be wrong).

        Never an init container: pod-resources, which confirms identities, does not list them.
        """
        if match is None or match.init:
            return False
        return match.provisional or any(r.extra.get("identity") == "provisional" for r in existing)

    def _response(self, record: ContainerRecord, tenant_dir: Path | None,
                  disabled: bool) -> pb.ContainerAllocateResponse:
        inj = tenancy.injection(self.ctx.store.layout, record, tenant_dir, self.ctx.host_lib, preload=not disabled,
                                driver=self.ctx.gpu_driver)
        return device_list.apply(answer(inj), record.gpus, self.ctx.device_list)


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
        if device_ids and isinstance(self.ctx.pods, podlib.NoPods):  # only with --without-api-server
            log.warning("%d %s units (%d MiB) allocated but NOT enforced: no API server to tell which "
                        "container they are for (--without-api-server)", len(device_ids), self.resource,
                        len(device_ids) * MEMORY_UNIT_BYTES >> 20)
        return pb.ContainerAllocateResponse()

    def release(self, device_ids: Sequence[str]) -> None:
        pass   # allocate kept nothing
