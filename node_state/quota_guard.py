"""What the node daemons do about a container that gets around its quota, from each memory
reconciler pass (py_vcuda.memory_reconciler.Pass):

- **escapes**: a GPU process of a container that holds a share of the GPU, without libvcuda
  mapped (a static binary, a process started around the preload). ``--on-escape=kill``
  (default) sends it SIGKILL, guarded against pid reuse by its start time; ``report`` leaves
  it running. Either way: one warning log line, one ``GPUQuotaEscape`` Event on its pod, one
  count in ``vcuda_quota_escapes_total`` per process, however many passes see it.
- **over the limit**: a container whose processes hold more on a GPU (NVML) than its ledger's
  limit for OVER_LIMIT_PASSES passes running. ``--on-over-limit=report`` (default) reports it;
  ``kill`` also sends SIGKILL to its processes on that GPU. One ``GPUQuotaOverLimit`` Event and
  one count in ``vcuda_quota_over_limit_total`` per stretch above the limit.

The kill happens in the pass that finds the process, so an escape is ended within two
reconciler intervals of its first GPU allocation (it shows in NVML at most one interval before
the next pass starts). Events go through an EventSink (kube_contract.events.EventRecorder);
without an API server, or for a container no pod is known for, the log line stands alone.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kube_contract.events import PodRef
from node_state.layout import ContainerRecord
from node_state.options import KILL, OVER_LIMIT_PASSES, REPORT, guard_action
from py_vcuda.memory_reconciler import GPUProcess, Pass
from py_vcuda.native import SHIM
from py_vcuda.procfs import ProcError, ProcFS

log = logging.getLogger(__name__)

ESCAPE_REASON = "GPUQuotaEscape"
OVER_LIMIT_REASON = "GPUQuotaOverLimit"
FORGET_PASSES = 10      # an escape not seen for this many passes is forgotten (its pid may come back as another)

# What was done, the `action` label of the metrics.
KILLED, REPORTED, KILL_FAILED = "killed", "reported", "kill-failed"


class EventSink(Protocol):
    """Where Events go (kube_contract.events.EventRecorder)."""

    def warn(self, pod: PodRef, reason: str, message: str) -> None: ...


@dataclass(frozen=True)
class Subject:
    """The container a count is about, as its metric labels name it."""

    key: str            # the container's record key (the `tenant` label)
    uuid: str
    mode: str
    namespace: str
    pod: str
    container: str


class QuotaGuard:
    """The memory reconciler's `on_pass`: acts on escapes and containers over their limit."""

    def __init__(self, records: Callable[[], Iterable[ContainerRecord]], procfs: ProcFS, *,
                 on_escape: str = KILL, on_over_limit: str = REPORT, events: EventSink | None = None) -> None:
        self.records = records
        self.procfs = procfs
        self.on_escape = guard_action(on_escape)   # ValueError: neither kill nor report
        self.on_over_limit = guard_action(on_over_limit)
        self.events = events
        self._lock = threading.Lock()
        self._escapes: Counter[tuple[Subject, str]] = Counter()
        self._over_limit: Counter[tuple[Subject, str]] = Counter()
        self._handled: dict[tuple[int, int], int] = {}      # (host pid, start time) -> last pass it was seen
        self._above: dict[tuple[Path, str], int] = {}       # (ledger, GPU) -> passes running above the limit
        # (host pid, start time) -> the pass that found the escape and acted on it (until it is forgotten)
        self.acted_in: dict[tuple[int, int], int] = {}

    def __call__(self, found: Pass) -> None:
        for proc in found.processes:
            if proc.escaped:
                self._escape(proc, found.number)
        self._handled = {k: n for k, n in self._handled.items() if found.number - n < FORGET_PASSES}
        self.acted_in = {k: n for k, n in self.acted_in.items() if k in self._handled}
        above: dict[tuple[Path, str], int] = {}
        for f in found.findings:
            if f.limit is None or f.physical <= f.limit:
                continue
            key = (f.ledger, f.uuid)
            above[key] = self._above.get(key, 0) + 1
            if above[key] == OVER_LIMIT_PASSES:
                procs = [p for p in found.processes if p.ledger == f.ledger and p.uuid == f.uuid]
                self._over(f.keys, f.uuid, f.physical, f.limit, procs)
        self._above = above

    # -- counts, for the exporter ----------------------------------------------------------------

    def escape_counts(self) -> dict[tuple[Subject, str], int]:
        """Escaped processes by (container and GPU, action) since the start."""
        with self._lock:
            return dict(self._escapes)

    def over_limit_counts(self) -> dict[tuple[Subject, str], int]:
        """Stretches above the limit by (container and GPU, action) since the start."""
        with self._lock:
            return dict(self._over_limit)

    # -- acting ------------------------------------------------------------------------------------

    def _escape(self, proc: GPUProcess, number: int) -> None:
        ident = (proc.host_pid, proc.start_time)
        known = ident in self._handled
        self._handled[ident] = number
        if known:
            return
        self.acted_in[ident] = number
        record = self._record(proc.keys)
        who = _describe(record, proc.keys)
        what = (f"process {proc.ns_pid} (host pid {proc.host_pid}, {proc.comm}) uses GPU {proc.uuid} without "
                f"{SHIM}, outside its container's quota")
        if self.on_escape == KILL:
            action, outcome = self._kill(proc)
        else:
            action, outcome = REPORTED, "left running (--on-escape=report)"
        log.warning("quota escape in %s: %s; %s", who, what, outcome)
        self._count(self._escapes, record, proc.keys, proc.uuid, action)
        self._event(record, ESCAPE_REASON, f"{what}: {outcome}")

    def _over(self, keys: tuple[str, ...], uuid: str, physical: int, limit: int, procs: list[GPUProcess]) -> None:
        record = self._record(keys)
        what = (f"its processes hold {_mib(physical)} on GPU {uuid}, above its limit of {_mib(limit)}, for "
                f"{OVER_LIMIT_PASSES} memory reconciler passes")
        if self.on_over_limit == KILL and procs:
            results = [self._kill(p) for p in procs]
            action = KILLED if all(a == KILLED for a, _ in results) else KILL_FAILED
            outcome = "; ".join(f"process {p.ns_pid} (host pid {p.host_pid}, {p.comm}): {o}"
                                for p, (_, o) in zip(procs, results, strict=True))
        else:
            action, outcome = REPORTED, "reported (--on-over-limit=report)"
        log.warning("%s is over its memory limit: %s; %s", _describe(record, keys), what, outcome)
        self._count(self._over_limit, record, keys, uuid, action)
        self._event(record, OVER_LIMIT_REASON, f"{what}: {outcome}")

    def _kill(self, proc: GPUProcess) -> tuple[str, str]:
        """(action, what happened)."""
        try:
            self.procfs.kill(proc.host_pid, proc.start_time)
        except ProcError as exc:
            if exc.reason in ("exited", "reused"):
                return KILLED, "it had exited already"
            return KILL_FAILED, f"NOT killed: {exc}"
        return KILLED, "killed (SIGKILL)"

    def _record(self, keys: tuple[str, ...]) -> ContainerRecord | None:
        return next((r for r in self.records() if r.key in keys), None)

    def _count(self, counter: Counter[tuple[Subject, str]], record: ContainerRecord | None,
               keys: tuple[str, ...], uuid: str, action: str) -> None:
        subject = Subject(record.key, uuid, record.mode, record.namespace, record.pod, record.container) \
            if record is not None else Subject(keys[0], uuid, "", "", "", "")
        with self._lock:
            counter[(subject, action)] += 1

    def _event(self, record: ContainerRecord | None, reason: str, message: str) -> None:
        if self.events is None:
            return   # no API server: the log line is the record
        if record is None or not (record.namespace and record.pod):
            log.info("no Event %s: the container's pod is not known", reason)
            return
        container = f"container {record.container}: " if record.container else ""
        self.events.warn(PodRef(record.namespace, record.pod, record.pod_uid), reason, container + message)


def _describe(record: ContainerRecord | None, keys: tuple[str, ...]) -> str:
    if record is None or not record.pod:
        return f"container {','.join(keys)}"
    return f"container {record.key} ({record.namespace}/{record.pod}:{record.container})"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"
