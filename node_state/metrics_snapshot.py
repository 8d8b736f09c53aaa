"""One consistent reading of a node's GPUs and their tenants, for the exporter and `vcuda top`.

Sources (DESIGN.md, "Observability"): NVML for each GPU; the node state
directory (node_state.layout) for each container's record and ledger; each
GPU's token scheduler (admin `stats`) for shares, grants and token waits; the
kubelet pod-resources API for namespace/pod/container when a record lacks them.

Per-reading work is bounded: GPU identities are read once, records are
re-parsed only when their file changes, ledgers stay mapped, and scheduler
calls have a short timeout; a scheduler that missed one is left alone for
`scheduler_backoff_s`, so a hung scheduler costs one timeout, not one per scrape.
A scheduler's reply that is not a well-formed `stats` document is an error of
this reading (in `errors`), never an exception: one scheduler cannot fail a scrape.

GPU time (`ContainerGPU.gpu_time_s`, a counter): for a vGPU tenant the token
scheduler's own lifetime figure (`held_ms_total` in its `stats`); for a whole
card (pGPU, or a vGPU container of whole cards) NVML utilization integrated
across readings (trapezoids), starting at the first reading that sees it.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from kube_contract.podresources import PodResourcesClient
from node_state.layout import RECORD_FILE, SCHEDULER_DIR_KEY, ContainerRecord, LayoutError, NodeLayout, ledger_in
from py_vcuda.ledger import DeviceUsage, Ledger, LedgerError
from py_vcuda.nvml import NVML, GPUInfo, GPUUsage
from token_scheduler.admin_client import AdminClient

log = logging.getLogger("vcuda.metrics")


@dataclass(frozen=True)
class WaitHistogram:
    bounds_s: tuple[float, ...]
    cumulative: tuple[int, ...]   # one per bound, then the +Inf bucket (= count)
    sum_s: float

    @property
    def count(self) -> int:
        return self.cumulative[-1] if self.cumulative else 0

    @classmethod
    def from_stats(cls, doc: dict[str, object]) -> WaitHistogram:
        """From the scheduler's per-bucket counts (not cumulative, last slot +Inf)."""
        bounds = tuple(float(b) for b in doc["le_s"])  # type: ignore[union-attr]
        counts = [int(c) for c in doc["counts"]]  # type: ignore[union-attr]
        if len(counts) != len(bounds) + 1:
            raise ValueError(f"wait histogram: {len(counts)} counts for {len(bounds)} bounds")
        running, cumulative = 0, []
        for c in counts:
            running += c
            cumulative.append(running)
        return cls(bounds, tuple(cumulative), float(doc["sum_s"]))  # type: ignore[arg-type]


@dataclass(frozen=True)
class TenantStats:
    """One tenant in its GPU's token scheduler."""

    share: float          # of the scheduler window
    grants: int
    overruns: int
    waiting: int
    wait_p99_s: float
    wait: WaitHistogram
    priority: str = "normal"
    revocations: int = 0          # its leases revoked for a `high` tenant
    renewals: int = 0             # leases it kept at their quantum's end (RENEW)
    revoke_reclaims: int = 0      # ... not released in time, reclaimed
    budget_s: float | None = None  # its in-flight budget now; None: a scheduler without budgets
    budget_hits: int = 0          # launches that waited for room under the budget
    budget_wait_s: float = 0.0


@dataclass(frozen=True)
class GPUState:
    index: int
    uuid: str
    name: str
    usage: GPUUsage | None            # None: NVML did not answer
    scheduler_up: bool | None         # None: no scheduler for this GPU
    window_s: float | None


@dataclass(frozen=True)
class ContainerGPU:
    """One container on one GPU (a container with two GPUs is two of these)."""

    key: str
    mode: str
    gpu: int | None                   # the GPU's node index; None: unknown (no NVML)
    uuid: str
    namespace: str
    pod: str
    container: str
    tenant: str | None
    core_request: float               # ratio of one GPU
    core_limit: float
    memory_limit: int | None          # bytes; None: unlimited
    memory_used: int | None           # None: nothing measures it
    memory_peak: int | None
    oom_denials: int | None
    share: float | None               # measured share of GPU time; None: not measured
    tenant_stats: TenantStats | None  # None: no scheduler tenant
    gpu_time_s: float | None = None   # GPU time used (counter, module doc); None: not measured
    memory_unattributed: int | None = None  # part of memory_used the memory reconciler found; None: no ledger

    @property
    def display_name(self) -> str:
        if self.pod:
            return f"{self.namespace}/{self.pod}/{self.container}"
        return self.container or self.tenant or self.key


@dataclass(frozen=True)
class MigInstanceState:
    """One MIG instance (MIG device) of a GPU in MIG mode."""

    gpu: int                           # the parent GPU's node index
    parent_uuid: str
    uuid: str                          # MIG-<uuid>
    profile: str                       # "1g.10gb"
    memory_used: int | None            # bytes; None: NVML did not answer
    memory_total: int


@dataclass(frozen=True)
class NodeSnapshot:
    node: str
    mode: str                          # the node's sharing mode ("" unknown): for GPUs without containers
    gpus: tuple[GPUState, ...]
    containers: tuple[ContainerGPU, ...]
    errors: tuple[str, ...]            # unreadable records, dead schedulers: shown, never fatal
    mig: tuple[MigInstanceState, ...] = ()   # instances of the GPUs in MIG mode


class _Scheduler:
    """Admin client of one GPU's scheduler, with a back-off after a missed reply."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.client: AdminClient | None = None
        self.quiet_until = 0.0
        self.error = ""   # why the last stats() returned None ("" : no scheduler here)

    def stats(self, timeout_s: float, backoff_s: float) -> dict[str, object] | None:
        """The scheduler's `stats` reply, checked for the fields readers use; None with `error` set."""
        self.error = ""
        sock = self.directory / "admin.sock"
        now = time.monotonic()
        if not _is_socket(sock):
            return None
        if now < self.quiet_until:
            self.error = "did not answer (skipped until its back-off ends)"
            return None
        if self.client is None:
            self.client = AdminClient(sock)
        try:
            reply = self.client.call("stats", timeout_s=timeout_s)
        except TimeoutError:
            self.quiet_until = now + backoff_s
            self.error = "did not answer"
            return None
        except Exception as exc:  # a garbled reply or a broken socket: start over next time, never raise
            self.close()
            self.error = f"unreadable stats reply: {exc!r}"
            return None
        problem = _stats_problem(reply)
        if problem:
            self.error = problem
            return None
        return reply

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def _stats_problem(reply: object) -> str:
    """What is wrong with a `stats` reply ("" if nothing)."""
    if not isinstance(reply, dict):
        return f"stats reply is not an object: {type(reply).__name__}"
    if not reply.get("ok"):
        return f"stats refused: {reply.get('error', reply)!r}"[:200]
    if not isinstance(reply.get("tenants"), dict):
        return "stats reply without a tenants object"
    try:
        if float(reply["window_s"]) <= 0:
            return "stats reply with a window_s <= 0"
    except (KeyError, TypeError, ValueError):
        return "stats reply without a numeric window_s"
    return ""


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


@dataclass(frozen=True)
class _GPUTime:
    """The GPU-time counter of one container on one GPU, and what the next reading adds to."""

    at: float                  # clock of the reading
    total_s: float
    source: str                # "tenant" (token scheduler) or "card" (NVML utilization of a whole card)
    busy: float = 0.0          # card: its utilization ratio then


class NodeReader:
    """Reads NodeSnapshots of one node; not thread-safe (the exporter serialises scrapes).

    `mode` is the node agent's sharing mode; None (for `vcuda top`): the most common mode of
    the records, else "vgpu" when the node has token schedulers, else unknown ("").
    """

    def __init__(self, layout: NodeLayout, *, mode: str | None, node: str | None = None, nvml: NVML | None = None,
                 pod_resources: PodResourcesClient | None = None, admin_timeout_s: float = 0.2,
                 scheduler_backoff_s: float = 10.0, extra_layouts: tuple[NodeLayout, ...] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.layouts = (layout, *extra_layouts)
        self.layout = layout
        self.mode = mode
        self.node = node or socket.gethostname()
        self.nvml = nvml
        self.pod_resources = pod_resources
        self.admin_timeout_s = admin_timeout_s
        self.scheduler_backoff_s = scheduler_backoff_s
        self.clock = clock
        self._gpus: list[GPUInfo] | None = None
        self._records: dict[Path, tuple[tuple[int, int], ContainerRecord]] = {}
        self._ledgers: dict[Path, tuple[int, Ledger]] = {}
        self._schedulers: dict[Path, _Scheduler] = {}
        self._gpu_time: dict[tuple[str, str], _GPUTime] = {}

    def close(self) -> None:
        for _, ledger in self._ledgers.values():
            ledger.close()
        self._ledgers.clear()
        for scheduler in self._schedulers.values():
            scheduler.close()
        self._schedulers.clear()

    # -- sources ---------------------------------------------------------------

    def gpu_infos(self) -> list[GPUInfo]:
        if self._gpus is None:
            self._gpus = self.nvml.gpus() if self.nvml is not None else []
        return self._gpus

    def _usage(self, index: int) -> GPUUsage | None:
        if self.nvml is None:
            return None
        try:
            return self.nvml.usage(index)
        except Exception as exc:  # NVML errors are not one class across versions
            log.debug("NVML usage of GPU %d: %s", index, exc)
            return None

    def _mig(self, infos: list[GPUInfo]) -> list[MigInstanceState]:
        """The MIG instances of the GPUs in MIG mode (read every time: layouts change them)."""
        if self.nvml is None:
            return []
        out = []
        for g in infos:
            try:
                mode = self.nvml.mig_mode(g.index)
                devices = self.nvml.mig_devices(g.index) if mode is not None and mode[0] else []
            except Exception as exc:  # NVML errors are not one class across versions
                log.debug("NVML MIG devices of GPU %d: %s", g.index, exc)
                continue
            for d in devices:
                try:
                    used: int | None = self.nvml.mig_memory(d.uuid)[0]
                except Exception as exc:
                    log.debug("NVML memory of %s: %s", d.uuid, exc)
                    used = None
                out.append(MigInstanceState(g.index, g.uuid, d.uuid, d.profile, used, d.memory_total))
        return out

    def _record(self, directory: Path) -> ContainerRecord:
        path = directory / RECORD_FILE
        st = os.stat(path)
        stamp = (st.st_mtime_ns, st.st_ino)
        cached = self._records.get(directory)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        record = ContainerRecord.from_json(path.read_text(), str(path))
        self._records[directory] = (stamp, record)
        return record

    def _ledger_usage(self, directory: Path) -> dict[str, DeviceUsage] | None:
        path = ledger_in(directory)
        try:
            inode = os.stat(path).st_ino
        except OSError:
            return None
        cached = self._ledgers.get(directory)
        if cached is None or cached[0] != inode:
            if cached is not None:
                cached[1].close()
            try:
                cached = (inode, Ledger(path))
            except LedgerError as exc:
                log.debug("%s", exc)
                return None
            self._ledgers[directory] = cached
        return {d.uuid: d for d in cached[1].devices()}

    def _scheduler(self, directory: Path) -> _Scheduler:
        if directory not in self._schedulers:
            self._schedulers[directory] = _Scheduler(directory)
        return self._schedulers[directory]

    def _containers(self, errors: list[str]) -> list[tuple[ContainerRecord, Path]]:
        found: list[tuple[ContainerRecord, Path]] = []
        for layout in self.layouts:
            try:
                entries = sorted(p for p in layout.containers.iterdir() if p.is_dir())
            except FileNotFoundError:
                continue
            for directory in entries:
                try:
                    found.append((self._record(directory), directory))
                except FileNotFoundError:
                    continue  # being created or removed
                except (OSError, LayoutError) as exc:
                    errors.append(str(exc))
        live = {d for _, d in found}
        for gone in set(self._records) - live:
            del self._records[gone]
        for gone in set(self._ledgers) - live:
            self._ledgers.pop(gone)[1].close()
        return found

    def _node_mode(self, containers: list[tuple[ContainerRecord, Path]]) -> str:
        if self.mode is not None:
            return self.mode
        modes = Counter(record.mode for record, _ in containers)
        if modes:
            return sorted(modes.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
        try:
            has_schedulers = any(self.layout.schedulers.iterdir())
        except OSError:
            has_schedulers = False
        return "vgpu" if has_schedulers else ""

    # -- the reading -----------------------------------------------------------

    def snapshot(self) -> NodeSnapshot:
        errors: list[str] = []
        infos = self.gpu_infos()
        mig = self._mig(infos)
        index_of = {g.uuid: g.index for g in infos}
        containers = self._containers(errors)

        # Scheduler stats for every scheduler some GPU or container points at, once each.
        sched_dirs: dict[str, Path] = {g.uuid: self.layout.scheduler_dir(g.uuid) for g in infos}
        gpu_of_dir = {directory: index_of[uuid] for uuid, directory in sched_dirs.items()}
        wanted: dict[Path, dict[str, object] | None] = {}
        for g in infos:
            wanted[sched_dirs[g.uuid]] = None
        for m in mig:   # vgpu mode: a token scheduler per MIG instance, where it runs one
            directory = self.layout.scheduler_dir(m.uuid)
            sched_dirs[m.uuid] = directory
            if directory.exists():
                wanted[directory] = None
                gpu_of_dir[directory] = m.gpu
        for record, _ in containers:
            if SCHEDULER_DIR_KEY in record.extra:
                wanted[Path(record.extra[SCHEDULER_DIR_KEY])] = None
        for directory in wanted:
            scheduler = self._scheduler(directory)
            wanted[directory] = scheduler.stats(self.admin_timeout_s, self.scheduler_backoff_s)
            if scheduler.error:
                which = f"of GPU {gpu_of_dir[directory]} " if directory in gpu_of_dir else ""
                errors.append(f"token scheduler {which}({directory}) {scheduler.error}")

        gpus: list[GPUState] = []
        for g in infos:
            directory = sched_dirs[g.uuid]
            stats = wanted[directory]
            scheduler = self._schedulers[directory]
            has_scheduler = stats is not None or bool(scheduler.error)
            gpus.append(GPUState(
                index=g.index, uuid=g.uuid, name=g.name, usage=self._usage(g.index),
                scheduler_up=(stats is not None) if has_scheduler else None,
                window_s=float(stats["window_s"]) if stats else None,  # type: ignore[arg-type]
            ))
        usage_by_uuid = {g.uuid: g.usage for g in gpus}
        index_of.update({m.uuid: m.gpu for m in mig})   # a container on a MIG instance: its parent's index

        rows: list[ContainerGPU] = []
        now = self.clock()
        gpu_time: dict[tuple[str, str], _GPUTime] = {}
        looked_up = False
        for record, directory in containers:
            ledger = self._ledger_usage(directory)
            looked_up |= not record.pod and self.pod_resources is not None and bool(record.device_ids)
            ref = self._pod_ref(record)
            uuids = list(record.gpus) or sorted(ledger or {})
            for uuid in uuids:
                sched_dir = Path(record.extra[SCHEDULER_DIR_KEY]) if SCHEDULER_DIR_KEY in record.extra \
                    else sched_dirs.get(uuid)
                stats = wanted.get(sched_dir) if sched_dir is not None else None
                row = self._row(record, uuid, index_of.get(uuid), ref, ledger, stats,
                                usage_by_uuid.get(uuid), errors)
                rows.append(self._with_gpu_time(row, stats, _whole_cards(record), now, gpu_time))
        self._gpu_time = gpu_time  # containers gone are forgotten
        if looked_up and self.pod_resources is not None and self.pod_resources.last_error:
            errors.append(self.pod_resources.last_error)
        return NodeSnapshot(self.node, self._node_mode(containers), tuple(gpus), tuple(rows), tuple(errors),
                            tuple(mig))

    def _pod_ref(self, record: ContainerRecord) -> tuple[str, str, str]:
        if record.pod or self.pod_resources is None:
            return record.namespace, record.pod, record.container
        ref = self.pod_resources.lookup(record.resource, record.device_ids, since=record.created)
        if ref is None:
            return record.namespace, record.pod, record.container
        return ref.namespace, ref.pod, ref.container

    def _row(self, record: ContainerRecord, uuid: str, index: int | None, ref: tuple[str, str, str],
             ledger: dict[str, DeviceUsage] | None, stats: dict[str, object] | None,
             usage: GPUUsage | None, errors: list[str]) -> ContainerGPU:
        device = (ledger or {}).get(uuid)
        tenant_stats = None
        if record.tenant and stats is not None:
            doc = stats["tenants"].get(record.tenant)  # type: ignore[attr-defined]  (checked: a dict)
            if doc is not None:
                try:
                    tenant_stats = TenantStats(
                        share=float(doc["share"]), grants=int(doc["grants"]), overruns=int(doc["overruns"]),
                        waiting=int(doc.get("waiting", 0)),
                        wait_p99_s=float(doc.get("wait_us", {}).get("p99", 0.0)) / 1e6,
                        wait=WaitHistogram.from_stats(doc["wait_histogram"]),
                        priority=str(doc.get("priority", record.priority)),
                        revocations=int(doc.get("revocations", 0)),
                        renewals=int(doc.get("renewals", 0)),
                        revoke_reclaims=int(doc.get("revoke_reclaims", 0)),
                        budget_s=float(doc["budget_us"]) / 1e6 if "budget_us" in doc else None,
                        budget_hits=int(doc.get("budget_hits", 0)),
                        budget_wait_s=float(doc.get("budget_wait_ms", 0.0)) / 1e3,
                    )
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    errors.append(f"scheduler stats of tenant {record.tenant}: {exc!r}")
        exclusive = _whole_cards(record)
        memory_limit = record.memory_limit
        if device is not None and device.limit is not None:
            memory_limit = device.limit  # the ledger holds the live limit (it can change)
        if memory_limit is None and exclusive and usage is not None:
            memory_limit = usage.memory_total
        memory_used: int | None = device.used if device is not None else None
        if memory_used is None and exclusive and usage is not None:
            memory_used = usage.memory_used  # a whole card: the GPU's figure is the container's
        share: float | None = tenant_stats.share if tenant_stats is not None else None
        if share is None and exclusive and usage is not None and usage.utilization is not None:
            share = usage.utilization / 100.0
        namespace, pod, container = ref
        return ContainerGPU(
            key=record.key, mode=record.mode, gpu=index, uuid=uuid, namespace=namespace, pod=pod,
            container=container, tenant=record.tenant,
            core_request=record.core_request / 100.0, core_limit=record.core_limit / 100.0,
            memory_limit=memory_limit, memory_used=memory_used,
            memory_peak=device.peak if device is not None else None,
            oom_denials=device.oom_denials if device is not None else None,
            share=share, tenant_stats=tenant_stats,
            memory_unattributed=device.unattributed if device is not None else None,
        )

    def _with_gpu_time(self, row: ContainerGPU, stats: dict[str, object] | None, whole_cards: bool, now: float,
                       out: dict[tuple[str, str], _GPUTime]) -> ContainerGPU:
        """The row with its GPU-time counter advanced to `now` (module doc); records the state in `out`."""
        key = (row.key, row.uuid)
        prev = self._gpu_time.get(key)
        cur: _GPUTime | None = None
        if row.tenant_stats is not None and stats is not None:
            doc = stats["tenants"][row.tenant]  # type: ignore[index]  (tenant_stats came from it)
            try:
                cur = _GPUTime(now, float(doc["held_ms_total"]) / 1000.0, "tenant")
            except (KeyError, TypeError, ValueError):
                cur = None  # a scheduler without the counter: no series rather than a guess
        elif whole_cards and row.share is not None:
            total = 0.0
            if prev is not None and prev.source == "card":
                total = prev.total_s + (prev.busy + row.share) / 2 * max(0.0, now - prev.at)
            cur = _GPUTime(now, total, "card", busy=row.share)
        if cur is None:
            if prev is not None:  # no figure this time (scheduler or NVML silent): go on from the last one
                out[key] = prev
            return row
        out[key] = cur
        return replace(row, gpu_time_s=cur.total_s)


def _whole_cards(record: ContainerRecord) -> bool:
    """The container owns its GPUs: pGPU, or vGPU whole cards (a multiple of 100 cores, no token tenant)."""
    return record.mode == "pgpu" or (record.mode == "vgpu" and record.tenant is None and record.core_request >= 100)


def allocated(snapshot: NodeSnapshot) -> dict[str, tuple[float, int]]:
    """Per GPU UUID: (core requests as a ratio of the GPU, memory limits in bytes) of its containers."""
    out: dict[str, tuple[float, int]] = {}
    for row in snapshot.containers:
        cores, memory = out.get(row.uuid, (0.0, 0))
        out[row.uuid] = (cores + row.core_request, memory + (row.memory_limit or 0))
    return out


def gpu_modes(snapshot: NodeSnapshot) -> dict[str, str]:
    """Per GPU UUID the sharing mode: its containers' (a GPU serves one mode), else the node agent's."""
    modes = {g.uuid: snapshot.mode for g in snapshot.gpus}
    for row in snapshot.containers:
        modes[row.uuid] = row.mode
    return modes
