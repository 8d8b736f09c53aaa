"""Prepare and unprepare claims: the DRA driver's core, behind the kubelet's gRPC calls.

Prepare, for each claim the kubelet names:

1. already prepared (checkpoint): answer from the checkpoint, after making sure
   its container directories and CDI spec are there (the kubelet retries);
2. read the claim from the API server (and its pod, for container names);
   plan its shares (dra_driver.claims): a failure fails that claim only, with
   a message that says what to fix, and the kubelet retries it later;
3. for each share, set the container up exactly as vgpu Allocate does
   (node_state.tenancy: directory, ledger, token-scheduler tenant);
4. write the checkpoint, then the CDI spec; answer the devices with their CDI IDs.

Unprepare marks the checkpoint ``unpreparing``, removes the CDI spec, the
tenants and directories, then the checkpoint. Both are idempotent, and an
unknown claim unprepares successfully (it may have been cleaned up already).
`recover` runs at start and finishes or undoes whatever a crash left half done
(dra_driver.checkpoint lists the cases).

A DRA container's record (node_state.layout) has mode ``vgpu`` (that is the
enforcement it gets), resource ``gpu.vcuda.io``, the pod from the claim's
``reservedFor`` and the pod's containers that use the claim, and in ``extra``
the claim's UID, name and request: the exporter and `vcuda top` show it like a
vgpu container.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dra_driver import cdi
from dra_driver.checkpoint import (
    PREPARED,
    UNPREPARING,
    Checkpoint,
    PreparedClaim,
    PreparedDevice,
    PreparedShare,
)
from dra_driver.claims import Claim, ClaimError, Result, Share, parse_claim, plan
from dra_driver.names import CONFIG_KIND, DRIVER
from dra_driver.partitions import Partitioner
from dra_driver.slices import offers
from node_state import tenancy
from node_state.containers import ContainerStore, new_key
from node_state.gpu_driver import NO_DRIVER
from node_state.gpus import Health, Inventory
from node_state.layout import ContainerRecord
from node_state.schedulers import SchedulerError, TokenScheduler, remove_tenant
from node_state.tenancy import Injection
from py_vcuda.nvml import GPUInfo
from py_vcuda.quota_file import QUOTA_FILE

log = logging.getLogger(__name__)

MODE = "vgpu"   # the enforcement DRA shares get (the exporter's `mode` label)


class ClaimSource(Protocol):
    """The API server as prepare needs it (dra_driver.kube.KubeAPI); each call raises on failure."""

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]: ...
    def read_pod(self, namespace: str, name: str) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Prepared:
    """One claim's answer: its devices, or an error (then the devices are ignored)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class Driver:
    def __init__(self, *, node: str, inventory: Inventory, health: Health, store: ContainerStore,
                 schedulers: Mapping[str, TokenScheduler], host_lib: Path, specs: cdi.SpecDir,
                 checkpoint: Checkpoint, api: ClaimSource, opt_out_namespaces: Collection[str] = frozenset(),
                 partitioner: Partitioner | None = None, on_change: Callable[[], None] = lambda: None,
                 busy: Callable[[], AbstractContextManager[None]] = nullcontext,
                 gpu_driver: Injection = NO_DRIVER) -> None:
        self.node = node
        self.inventory = inventory
        self.health = health
        self.store = store
        self.schedulers = schedulers
        self.host_lib = host_lib
        self.gpu_driver = gpu_driver   # the driver's part of each container (node_state.gpu_driver)
        self.specs = specs
        self.checkpoint = checkpoint
        self.api = api
        self.opt_out_namespaces = opt_out_namespaces   # whose shares may go without /etc/ld.so.preload
        # Device name -> what a claim on it runs on (a MIG instance as a GPU of its own).
        self._by_device = {o.name: o.gpu for o in offers(inventory)}
        self._lock = threading.RLock()   # one claim at a time changes node state
        self.partitioner = partitioner   # --mig=dynamic: MIG partitions made at prepare
        self.on_change = on_change       # what is offered may have changed (dynamic MIG): republish
        self.busy = busy                 # around each kubelet call (the slice publisher holds back meanwhile)
        # Prepared claims' GPUs (claim UID -> its ref and GPU UUIDs), kept with the checkpoint: what
        # claims_on answers the slice publisher's thread without reading every checkpoint file.
        self._uses = {c.uid: _uses(c) for c in checkpoint.all()}

    # ---- the kubelet's calls ---------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Prepared]:
        out = {}
        with self.busy():
            for c in claims:
                try:
                    out[c.uid] = self.prepare_claim(c)
                except Exception as exc:
                    out[c.uid] = Prepared(error=_message("prepare", c, exc))
        if self.partitioner is not None:
            self.on_change()   # a GPU with work on it is not partitioned, one with partitions not offered whole
        return out

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Per claim UID, the error ("" when it went well)."""
        out = {}
        with self.busy():
            for c in claims:
                try:
                    self.unprepare_claim(c)
                    out[c.uid] = ""
                except Exception as exc:
                    out[c.uid] = _message("unprepare", c, exc)
        if self.partitioner is not None:
            self.on_change()
        return out

    # ---- prepare ---------------------------------------------------------------------------------

    def prepare_claim(self, ref: ClaimRef) -> Prepared:
        with self._lock:
            done = self.checkpoint.get(ref.uid)
            if done is not None and done.state == PREPARED:
                self._ensure(done)
                return Prepared(done.devices)
            if done is not None:
                self._take_down(done)   # an unprepare that did not finish: finish it, then start afresh
        claim = self._read(ref)
        made = self._make_partitions(claim)
        try:
            return self._prepare(claim, ref, made)
        except BaseException:
            if made and self.partitioner is not None:
                with self._lock:
                    done = self.checkpoint.get(ref.uid)
                    if done is None or done.state != PREPARED:
                        self.partitioner.release(claim.uid)
            raise

    def _make_partitions(self, claim: Claim) -> dict[str, GPUInfo]:
        """The claim's MIG partitions (--mig=dynamic), made now: device name -> the instance as a GPU."""
        if self.partitioner is None:
            return {}
        made = {}
        with self._lock:
            for r in claim.results:
                part = self.partitioner.partition(r.pool, r.device)
                if part is not None and r.device not in made:
                    made[r.device] = self.partitioner.make(claim.uid, r.device)
                    # The instance is as healthy as its GPU (XIDs are the GPU's).
                    self.health.follow(made[r.device].uuid, part.gpu.uuid)
        return made

    def _prepare(self, claim: Claim, ref: ClaimRef, made: Mapping[str, GPUInfo]) -> Prepared:
        shares = plan(claim, lambda r: made[r.device] if r.device in made and self.partitioner is not None
                      and self.partitioner.partition(r.pool, r.device) is not None else self._gpu_of(r))
        if not shares:
            return Prepared()   # nothing of ours in it (another driver's devices)
        if self.partitioner is not None:
            for share in shares:
                for uuid in share.gpus:
                    self.partitioner.check_whole(uuid)
        self._check_opt_out(claim, shares)
        for share in shares:
            for uuid in share.gpus:
                if not self.health.healthy(uuid):
                    raise ClaimError(f"ResourceClaim {claim.ref}: GPU {uuid} is unhealthy; it left this node's "
                                     "ResourceSlice, so the claim should be allocated elsewhere")
        pod, containers = self._consumers(claim)
        with self._lock:
            done = self.checkpoint.get(ref.uid)   # a concurrent call for the same claim may have won
            if done is not None and done.state == PREPARED:
                return Prepared(done.devices)
            return self._set_up(claim, shares, pod, containers)

    def _check_opt_out(self, claim: Claim, shares: list[Share]) -> None:
        """A share of a GPU is held to its quota: `preload: false` there is the operator's to allow (by
        namespace, --allow-opt-out-namespaces), not the claim's. Refused rather than ignored: the claim's
        author asked for something else, and the kubelet's event tells them why. Whole GPUs may opt out."""
        if claim.namespace in self.opt_out_namespaces:
            return
        for share in shares:
            if share.fractional and not share.preload:
                raise ClaimError(f"ResourceClaim {claim.ref}, request {share.request!r}: {CONFIG_KIND}.preload false "
                                 f"would run a share of GPU {share.gpus[0]} without its quota; namespace "
                                 f"{claim.namespace!r} is not one the driver's --allow-opt-out-namespaces lists. "
                                 "Remove `preload: false` (libvcuda is preloaded for you)")

    def _read(self, ref: ClaimRef) -> Claim:
        try:
            doc = self.api.read_claim(ref.namespace, ref.name)
        except Exception as exc:
            raise ApiUnavailable(f"{exc}; the kubelet retries the claim") from None
        claim = parse_claim(doc)
        if claim.uid != ref.uid:
            raise ClaimError(f"ResourceClaim {ref.ref} has UID {claim.uid}, not {ref.uid}: it was deleted and "
                             "created again; the kubelet's claim is gone")
        return claim

    def _gpu_of(self, result: Result) -> GPUInfo | None:
        if self.partitioner is not None and result.pool != self.node:   # a GPU's own pool: see check_whole
            return self.partitioner.whole_gpu(result.pool, result.device)
        return self._by_device.get(result.device) if result.pool == self.node else None

    def offers(self, device: str) -> bool:
        """Whether a device of the node's own pool is one this driver prepares claims on."""
        return device in self._by_device

    def claims_on(self, uuid: str) -> str | None:
        """Why GPU `uuid` runs whole-GPU or shared work: a prepared claim on it (None: none).

        Called from the slice publisher's thread too."""
        for ref, gpus in list(self._uses.values()):
            if uuid in gpus:
                return f"claim {ref} runs on it"
        return None

    def _consumers(self, claim: Claim) -> tuple[tuple[str, str], dict[str, list[str]]]:
        """(pod name, uid) the claim is reserved for, and per request the pod's containers that use it.

        For monitoring labels only: without them the claim still runs, so failures are logged, not raised.
        """
        if not claim.consumers:
            return ("", ""), {}
        first = claim.consumers[0]
        if len(claim.consumers) > 1:
            log.info("claim %s is shared by %d pods; its containers are labelled with pod %s", claim.ref,
                     len(claim.consumers), first.name)
        try:
            pod = self.api.read_pod(claim.namespace, first.name)
        except Exception as exc:
            log.warning("pod %s/%s of claim %s not read (%s); its containers go unnamed", claim.namespace,
                        first.name, claim.ref, exc)
            return (first.name, first.uid), {}
        requests = {r.request for r in claim.results}
        return (first.name, first.uid), {r: containers_using(pod, claim.name, r) for r in requests}

    def _set_up(self, claim: Claim, shares: list[Share], pod: tuple[str, str],
                containers: dict[str, list[str]]) -> Prepared:
        made: list[ContainerRecord] = []
        try:
            prepared_shares = []
            with self.store.lock:
                for share in shares:
                    record = self._record(claim, share, pod, containers.get(share.request, []))
                    tenancy.set_up(self.store, self.schedulers, record, preload=share.preload)
                    made.append(record)
                    prepared_shares.append(PreparedShare(share.request, record,
                                                         cdi.device_name(claim.uid, share.request)))
            done = PreparedClaim(uid=claim.uid, namespace=claim.namespace, name=claim.name, state=PREPARED,
                                 shares=tuple(prepared_shares), devices=_devices(shares, prepared_shares))
            self.checkpoint.put(done)          # before the CDI spec: see dra_driver.checkpoint
            self._uses[done.uid] = _uses(done)
            self._write_spec(done)
        except BaseException:
            self.specs.remove(claim.uid)
            self.checkpoint.remove(claim.uid)
            self._uses.pop(claim.uid, None)
            for record in reversed(made):
                self._remove_container(record)
            raise
        for s in done.shares:
            r = s.record
            log.info("prepared claim %s request %s: %s for %s/%s:%s (%s, cores %d/%d, memory %s)", claim.ref,
                     s.request, r.key, r.namespace, r.pod, r.container, ",".join(r.gpus), r.core_request,
                     r.core_limit, r.memory_limit)
        return Prepared(done.devices)

    def _record(self, claim: Claim, share: Share, pod: tuple[str, str], containers: list[str]) -> ContainerRecord:
        key = new_key()
        extra = {"driver": DRIVER, "claim_uid": claim.uid, "claim": claim.name, "request": share.request,
                 "preload": "1" if share.preload else "0"}
        share_ids = [r.share_id for r in share.results if r.share_id]
        if share_ids:
            extra["share_id"] = ",".join(share_ids)
        return ContainerRecord(
            key=key, mode=MODE, resource=DRIVER, device_ids=tuple(f"{r.pool}/{r.device}" for r in share.results),
            gpus=share.gpus, core_request=share.core_request, core_limit=share.core_limit,
            memory_limit=share.memory_limit, tenant=key if share.fractional else None, priority=share.priority,
            namespace=claim.namespace, pod=pod[0], pod_uid=pod[1], container=",".join(containers),
            created=time.time(), extra=extra)

    def _devices(self, done: PreparedClaim) -> list[cdi.Device]:
        devices = []
        for s in done.shares:
            edits = tenancy.injection(self.store.layout, s.record, tenancy.tenant_dir(self.schedulers, s.record),
                                      self.host_lib, preload=s.record.extra.get("preload") != "0",
                                      driver=self.gpu_driver)
            devices.append(cdi.Device(s.cdi_name, edits))
        return devices

    def _write_spec(self, done: PreparedClaim) -> None:
        self.specs.write(done.uid, self._devices(done))

    def _spec_current(self, done: PreparedClaim) -> bool:
        """Whether the claim's spec says what this driver would write (not one from an older driver, whose
        env carried VCUDA_* variables that libvcuda now ignores with a warning in every process)."""
        try:
            return self.specs.read(done.uid) == cdi.spec(self._devices(done))
        except (OSError, ValueError):
            return False

    def _ensure(self, done: PreparedClaim) -> None:
        """A prepared claim's directories, quota files and CDI spec exist and are current (made again when
        something removed them, or when an older driver prepared it: a driver from before quota files left
        no quota file and a spec without its mount, one from before this change a spec whose env had the
        VCUDA_* variables)."""
        respec = False
        for s in done.shares:
            if not self.store.layout.container_dir(s.record.key).is_dir():
                log.warning("claim %s: container directory %s was missing; making it again (empty ledger)",
                            done.ref, s.record.key)
                with self.store.lock:
                    tenancy.set_up(self.store, self.schedulers, s.record,
                                   preload=s.record.extra.get("preload") != "0")
            elif not (self.store.layout.quota_dir(s.record.key) / QUOTA_FILE).is_file():
                log.info("claim %s: writing the quota file of %s (and its CDI spec) again", done.ref, s.record.key)
                self.store.write_quota(s.record)
                respec = True
        if respec or not self._spec_current(done):
            log.info("claim %s: writing its CDI spec again", done.ref)
            self._write_spec(done)

    # ---- unprepare -------------------------------------------------------------------------------

    def unprepare_claim(self, ref: ClaimRef) -> None:
        with self._lock:
            done = self.checkpoint.get(ref.uid)
            if done is None:
                self._remove_orphans(ref.uid)   # a prepare that crashed before its checkpoint
                if self.partitioner is not None:
                    self.partitioner.release(ref.uid)
                return
            self._take_down(done)
            log.info("unprepared claim %s (%s)", done.ref, done.uid)

    def _take_down(self, done: PreparedClaim) -> None:
        if done.state != UNPREPARING:
            self.checkpoint.put(dataclasses.replace(done, state=UNPREPARING))
        self.specs.remove(done.uid)
        for s in done.shares:
            self._remove_container(s.record)
        self._remove_orphans(done.uid)
        if self.partitioner is not None:
            self.partitioner.release(done.uid)   # before the checkpoint goes: a crash here is finished at start
        self.checkpoint.remove(done.uid)
        self._uses.pop(done.uid, None)

    def _remove_container(self, record: ContainerRecord) -> None:
        with self.store.lock:
            remove_tenant(self.schedulers, record)
            self.store.remove(record.key)

    def _remove_orphans(self, uid: str) -> None:
        for record in list(self.store.records()):
            if record.extra.get("driver") == DRIVER and record.extra.get("claim_uid") == uid:
                log.info("removing container %s of claim %s, which has no checkpoint", record.key, uid)
                self._remove_container(record)
        self.specs.remove(uid)

    # ---- start -----------------------------------------------------------------------------------

    def recover(self) -> None:
        """Finish or undo what the last run left half done (dra_driver.checkpoint). Run before serving."""
        with self._lock:
            for done in self.checkpoint.all():
                try:
                    if done.state == UNPREPARING:
                        log.info("finishing the unprepare of claim %s", done.ref)
                        self._take_down(done)
                    else:
                        self._ensure(done)
                except Exception:   # one claim must not stop the others' recovery; its retry will tell
                    log.exception("recovering claim %s", done.ref)
            known = self.checkpoint.uids()
            for record in list(self.store.records()):
                uid = record.extra.get("claim_uid", "")
                if record.extra.get("driver") == DRIVER and uid not in known:
                    log.info("removing container %s of claim %s: its prepare did not finish", record.key, uid)
                    self._remove_container(record)
            for uid in self.specs.claims() - known:
                log.info("removing the CDI spec of claim %s, which is not prepared", uid)
                self.specs.remove(uid)
            prepared = self.checkpoint.all()
            self._uses = {c.uid: _uses(c) for c in prepared}
            if self.partitioner is not None:
                self.partitioner.recover({c.uid for c in prepared if c.state == PREPARED})

    def prepared(self) -> list[PreparedClaim]:
        return self.checkpoint.all()


class ApiUnavailable(RuntimeError):
    """The claim could not be read; the kubelet will ask again."""


def _uses(done: PreparedClaim) -> tuple[str, frozenset[str]]:
    return done.ref, frozenset(g for s in done.shares for g in s.record.gpus)


def _message(what: str, ref: ClaimRef, exc: Exception) -> str:
    """The kubelet's message for a claim that failed (it reaches the pod's events); the trace goes to our log."""
    if isinstance(exc, (ClaimError, ApiUnavailable, SchedulerError)):
        log.warning("%s of claim %s (%s): %s", what, ref.ref, ref.uid, exc)
        return str(exc)
    log.error("%s of claim %s (%s) failed", what, ref.ref, ref.uid, exc_info=exc)
    return f"internal error: {exc}"


def _devices(shares: list[Share], prepared: list[PreparedShare]) -> tuple[PreparedDevice, ...]:
    """Every allocated device of ours, the first of each share carrying its CDI device.

    Each share's CDI device holds the container's whole environment; a container using the request gets
    all of its devices, so one CDI ID per share injects it once.
    """
    out = []
    for share, p in zip(shares, prepared, strict=True):
        for i, r in enumerate(share.results):
            out.append(PreparedDevice(requests=(r.request,), pool=r.pool, device=r.device,
                                      cdi_ids=(cdi.qualified(p.cdi_name),) if i == 0 else ()))
    return tuple(out)


def containers_using(pod: Mapping[str, Any], claim_name: str, request: str) -> list[str]:
    """The pod's containers (init containers first) that use `request` of the claim named `claim_name`."""
    spec = pod.get("spec") or {}
    # The pod refers to the claim by its own name for it: set directly, or via a template (status says).
    names = {c.get("name") for c in spec.get("resourceClaims") or [] if c.get("resourceClaimName") == claim_name}
    names |= {s.get("name") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
              if s.get("resourceClaimName") == claim_name}
    out = []
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for use in (c.get("resources") or {}).get("claims") or []:
            wanted = use.get("request")
            if use.get("name") in names and (not wanted or request == wanted or request.startswith(f"{wanted}/")):
                out.append(str(c.get("name", "")))
                break
    return out
