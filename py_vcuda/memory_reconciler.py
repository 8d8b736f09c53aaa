"""The memory reconciler: keeps each ledger at no less than what its
processes physically hold on the GPU (DESIGN.md, "Charge what the driver
holds, not just the pointers").

libvcuda's hooks charge what they see. The driver also takes memory no hook
sees: module code loaded lazily at a kernel's first launch, context growth,
whatever a process without the shim allocates. At least once a second
(``interval_s``, default 0.5 s) the reconciler reads NVML's per-process usage,
maps NVML's host pids to accounts (a container's ledger, or one `vcuda run`'s)
and writes, per ledger and GPU, what the processes hold beyond what the hooks
charged into the ledger (``Ledger.set_unattributed``). It is part of the
ledger's ``used``, so later allocations must fit beneath it.

A host pid maps to an account by, in order:

1. its ledger slot: the pid the process sees (last ``NSpid`` entry of
   ``/proc/<host pid>/status``) and its start time name the slot libvcuda
   claimed for it in the container's ledger;
2. its cgroup, which names the pod of exactly one account on that GPU
   (a process of the container that runs without the shim);
3. on bare metal, descent from an account's root process (`vcuda run`'s child).

A process that matches none is not ours (another workload on a shared GPU).
One that cannot be mapped - its ``/proc`` entry unreadable, a pod with two
accounts on the GPU - is logged once and counted by (container, reason)
(``unmapped_counts``; the node agent exports it as
``vcuda_reconciler_unmapped_pids_total``); so is a ledger slot holding memory
on a GPU that no NVML process mapped to in two passes running (its pid
namespace unreadable from here, e.g. a kernel without ``NSpid``).

An account may require the shim (``Account.shim``: a container's share of
a GPU). Each of its GPU processes is then checked once for libvcuda in its
``/proc/<host pid>/maps``; one without it escapes the quota (a static
binary, a process started around the preload). The reconciler only finds
them: every pass ends with a ``Pass`` (every mapped GPU process, whether it
has the shim, each ledger's use against its limit) handed to ``on_pass``,
whose owner decides what to do (node_state.quota_guard). A process whose
maps cannot be read is reported (reason ``unverified``), never taken for an
escape: without its maps nothing says it lacks the shim.

Within a pass the ledger slots are read first, NVML next, the ledger totals
last: an allocation in flight (charged before the driver call, freed after
it) over-charges for one pass instead of under-charging.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from py_vcuda.ledger import Ledger, LedgerError, ProcessUsage
from py_vcuda.native import SHIM
from py_vcuda.nvml import ProcessMemory
from py_vcuda.procfs import ProcError, ProcFS, ProcIdentity

log = logging.getLogger("vcuda.reconciler")

DEFAULT_INTERVAL_S = 0.5
SLOT_MISSES = 2  # passes a charged ledger slot may go unseen before it is reported


class ProcessSource(Protocol):
    """NVML's per-process view of one GPU (py_vcuda.nvml.NVML)."""

    def processes(self, uuid: str) -> list[ProcessMemory]: ...


@dataclass(frozen=True)
class Account:
    """One ledger to keep honest: a container's, or one `vcuda run`'s."""

    key: str                      # container key or run name: what logs and metrics call it
    ledger: Path
    gpus: tuple[str, ...] = ()    # GPU UUIDs it may use; (): every device its ledger names
    pod_uid: str = ""             # Kubernetes: its processes' cgroup paths name this pod
    root_pid: int | None = None   # bare metal: host pid of its process tree's root
    shim: bool = False            # every GPU process of it must have libvcuda mapped (a share of a GPU)

    def on(self, uuid: str) -> bool:
        return not self.gpus or uuid in self.gpus


@dataclass(frozen=True)
class Finding:
    """One ledger on one GPU after a pass."""

    keys: tuple[str, ...]   # the accounts on this ledger
    ledger: Path
    uuid: str
    physical: int           # what NVML says their processes hold
    charged: int            # what the hooks charged (the ledger's used, less the unattributed part)
    unattributed: int       # written to the ledger: max(0, physical - charged)
    limit: int | None = None  # the ledger's limit on this GPU; None: unlimited


@dataclass(frozen=True)
class GPUProcess:
    """A GPU process mapped to a ledger in one pass."""

    host_pid: int
    ns_pid: int             # the pid it sees itself (in its container)
    start_time: int         # with host_pid, names the process across passes (pids are reused)
    comm: str
    uuid: str
    used: int               # what NVML says it holds on this GPU
    keys: tuple[str, ...]   # the accounts of its ledger
    ledger: Path
    shim: bool | None       # libvcuda mapped; None: not checked, or its maps unreadable

    @property
    def escaped(self) -> bool:
        """Runs without the shim although an account of its ledger requires it on this GPU."""
        return self.shim is False


@dataclass(frozen=True)
class Pass:
    """What one pass found, for `on_pass`."""

    number: int                         # passes so far, this one included
    findings: tuple[Finding, ...]
    processes: tuple[GPUProcess, ...]


@dataclass(frozen=True)
class _Unmapped:
    container: str          # the account key(s), "" when none can be named
    reason: str             # short code: exited, unreadable, ambiguous-slot, ambiguous-pod, slot-not-seen, unverified
    detail: str


@dataclass
class _Book:
    """A ledger and the accounts that share it."""

    path: Path
    accounts: list[Account]
    ledger: Ledger | None = None
    index: dict[str, int] | None = None   # GPU UUID -> device record index
    slots: tuple[ProcessUsage, ...] = ()

    @property
    def name(self) -> str:
        return ",".join(a.key for a in self.accounts)


class MemoryReconciler:
    """Reconciles `accounts()` every `interval_s` on a thread (`start`/`stop`), or once per `reconcile()`."""

    def __init__(self, accounts: Callable[[], Iterable[Account]], nvml: ProcessSource, *,
                 procfs: ProcFS | None = None, interval_s: float = DEFAULT_INTERVAL_S,
                 on_pass: Callable[[Pass], None] | None = None) -> None:
        if not 0 < interval_s <= 1.0:
            raise ValueError(f"reconcile interval must be in (0, 1] s, not {interval_s}")
        self.accounts = accounts
        self.nvml = nvml
        self.procfs = procfs or ProcFS()
        self.interval_s = interval_s
        self.on_pass = on_pass
        self.passes = 0
        self.last_pass_s = 0.0
        self._ledgers: dict[Path, tuple[int, Ledger]] = {}
        self._lock = threading.Lock()
        self._unmapped: Counter[tuple[str, str]] = Counter()
        self._reported: set[tuple[int, str]] = set()   # (host pid, reason) logged and counted
        self._misses: dict[tuple[Path, int, int, str], int] = {}
        self._silent_gpus: set[str] = set()
        self._shims: dict[tuple[int, int], bool | None] = {}   # (host pid, start time) -> libvcuda mapped
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the thread ------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="memory-reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        with self._lock:
            for _, ledger in self._ledgers.values():
                ledger.close()
            self._ledgers.clear()

    def _loop(self) -> None:
        while True:
            try:
                self.reconcile()
            except Exception:  # one bad pass (a ledger removed mid-read) must not end reconciling
                log.exception("memory reconciler pass failed")
            if self._stop.wait(self.interval_s):
                return

    def unmapped_counts(self) -> dict[tuple[str, str], int]:
        """Host pids that could not be mapped, by (container, reason), since the start."""
        with self._lock:
            return dict(self._unmapped)

    # -- one pass --------------------------------------------------------------

    def reconcile(self) -> list[Finding]:
        start = time.perf_counter()
        with self._lock:
            books = self._books(list(self.accounts()))
            slot_owner: dict[tuple[int, int], list[_Book]] = defaultdict(list)
            for book in books:
                for slot in book.slots:
                    slot_owner[(slot.pid, slot.start_time)].append(book)
            uuids = sorted({u for b in books for a in b.accounts for u in a.gpus} |
                           {u for b in books for u in (b.index or {})})
            physical: dict[tuple[Path, str], int] = defaultdict(int)
            seen_slots: set[tuple[Path, int, int, str]] = set()
            answered: list[str] = []
            present: set[int] = set()
            mapped: list[GPUProcess] = []
            for uuid in uuids:
                procs = self._processes(uuid)
                if procs is None:
                    continue
                answered.append(uuid)
                for proc in procs:
                    present.add(proc.pid)
                    book, ident = self._map(proc, uuid, books, slot_owner, seen_slots)
                    if book is None or ident is None:
                        continue
                    if proc.used:
                        physical[(book.path, uuid)] += proc.used
                    mapped.append(GPUProcess(proc.pid, ident.ns_pid, ident.start_time, ident.comm, uuid,
                                             proc.used or 0, tuple(a.key for a in book.accounts), book.path,
                                             self._shim(book, uuid, ident)))
            self._check_slots(books, answered, seen_slots)
            self._reported = {r for r in self._reported if r[0] in present or r[0] < 0}
            self._shims = {k: v for k, v in self._shims.items() if k[0] in present}
            findings = [f for book in books for f in self._true_up(book, answered, physical)]
            self.passes += 1
            self.last_pass_s = time.perf_counter() - start
            if self.on_pass is not None:
                self.on_pass(Pass(self.passes, tuple(findings), tuple(mapped)))
            return findings

    def _books(self, accounts: list[Account]) -> list[_Book]:
        by_path: dict[Path, _Book] = {}
        for account in accounts:
            path = Path(os.path.realpath(account.ledger))  # `vcuda run --ledger` runs share one
            by_path.setdefault(path, _Book(path, [])).accounts.append(account)
        for gone in set(self._ledgers) - set(by_path):
            self._ledgers.pop(gone)[1].close()
        for book in by_path.values():
            book.ledger = self._ledger(book.path)
            if book.ledger is not None:
                book.index = {d.uuid: d.index for d in book.ledger.devices()}
                book.slots = tuple(book.ledger.processes())
        return list(by_path.values())

    def _ledger(self, path: Path) -> Ledger | None:
        try:
            inode = os.stat(path).st_ino
        except OSError:
            return None  # not created yet (no process has started) or being removed
        cached = self._ledgers.get(path)
        if cached is not None and cached[0] == inode:
            return cached[1]
        if cached is not None:
            cached[1].close()
        try:
            self._ledgers[path] = (inode, Ledger(path))
        except LedgerError as exc:
            log.warning("memory reconciler cannot read %s: %s", path, exc)
            self._ledgers.pop(path, None)
            return None
        return self._ledgers[path][1]

    def _processes(self, uuid: str) -> list[ProcessMemory] | None:
        try:
            procs = self.nvml.processes(uuid)
        except Exception as exc:  # NVML errors are not one class; a lost GPU is the health check's to report
            if uuid not in self._silent_gpus:
                log.warning("memory reconciler: NVML lists no processes of GPU %s (%s); its ledgers keep "
                            "their last unattributed figure", uuid, exc)
                self._silent_gpus.add(uuid)
            return None
        self._silent_gpus.discard(uuid)
        return procs

    def _shim(self, book: _Book, uuid: str, ident: ProcIdentity) -> bool | None:
        """Whether the process has libvcuda mapped, where an account on this GPU requires it; read once
        per process (a preloaded library is never unloaded)."""
        if not any(a.shim and a.on(uuid) for a in book.accounts):
            return None
        key = (ident.host_pid, ident.start_time)
        if key not in self._shims:
            try:
                self._shims[key] = self.procfs.maps_library(ident.host_pid, SHIM)
            except ProcError as exc:
                self._shims[key] = None
                self._report(ident.host_pid, _Unmapped(book.name, "unverified", (
                    f"{exc}: whether host pid {ident.host_pid} ({ident.comm}) runs under {SHIM} is unknown, "
                    "so it is not treated as a quota escape")))
        return self._shims[key]

    def _map(self, proc: ProcessMemory, uuid: str, books: list[_Book],
             slot_owner: dict[tuple[int, int], list[_Book]],
             seen_slots: set[tuple[Path, int, int, str]]) -> tuple[_Book | None, ProcIdentity | None]:
        """The book the host pid's memory belongs to, and its identity; no book: not ours, or unmappable
        (then reported)."""
        try:
            ident = self.procfs.identity(proc.pid)
        except ProcError as exc:
            self._report(proc.pid, _Unmapped("", exc.reason, str(exc)))
            return None, None
        owners = slot_owner.get((ident.ns_pid, ident.start_time), [])
        decided, book = self._only(owners, proc.pid, "ambiguous-slot", f"host pid {proc.pid} (pid "
                                   f"{ident.ns_pid}, started {ident.start_time}) has a slot in several ledgers")
        if decided:
            if book is not None:
                seen_slots.add((book.path, ident.ns_pid, ident.start_time, uuid))
            return book, ident
        on_gpu = [b for b in books if any(a.on(uuid) for a in b.accounts)]
        pods = [b for b in on_gpu if any(a.pod_uid and _names_pod(ident.cgroup, a.pod_uid) for a in b.accounts)]
        decided, book = self._only(pods, proc.pid, "ambiguous-pod", f"host pid {proc.pid} runs without the "
                                   f"shim in a pod with several accounts on GPU {uuid}: cannot tell which")
        if decided:
            return book, ident
        roots = {a.root_pid: b for b in on_gpu for a in b.accounts if a.root_pid}
        if roots:
            for pid in (proc.pid, *self.procfs.ancestors(proc.pid)):
                if pid in roots:
                    return roots[pid], ident
        return None, ident

    def _only(self, candidates: list[_Book], host_pid: int, reason: str, detail: str) -> tuple[bool, _Book | None]:
        """(whether the candidates decide, the book): one is the answer; several are reported, no book."""
        if len(candidates) > 1:
            self._report(host_pid, _Unmapped(",".join(b.name for b in candidates), reason, detail))
        return bool(candidates), candidates[0] if len(candidates) == 1 else None

    def _report(self, host_pid: int, what: _Unmapped) -> None:
        if (host_pid, what.reason) in self._reported:
            return
        self._reported.add((host_pid, what.reason))
        self._unmapped[(what.container, what.reason)] += 1
        who = f"container {what.container}" if what.container else "no container"
        if what.reason == "unverified":
            log.warning("memory reconciler cannot check a GPU process (%s): %s", who, what.detail)
            return
        log.warning("memory reconciler cannot map a GPU process (%s, %s): %s; its memory is not in any "
                    "ledger", who, what.reason, what.detail)

    def _check_slots(self, books: list[_Book], answered: list[str],
                     seen_slots: set[tuple[Path, int, int, str]]) -> None:
        misses: dict[tuple[Path, int, int, str], int] = {}
        for book in books:
            for uuid in answered:
                index = (book.index or {}).get(uuid)
                if index is None:
                    continue
                for slot in book.slots:
                    key = (book.path, slot.pid, slot.start_time, uuid)
                    if not slot.used[index] or key in seen_slots:
                        continue
                    misses[key] = self._misses.get(key, 0) + 1
                    if misses[key] == SLOT_MISSES:
                        self._report(-slot.pid, _Unmapped(book.name, "slot-not-seen", (
                            f"ledger {book.path} charges process {slot.pid} (started {slot.start_time}) "
                            f"{slot.used[index]} bytes on GPU {uuid}, but no NVML process maps to it")))
        self._misses = misses

    def _true_up(self, book: _Book, answered: list[str],
                 physical: dict[tuple[Path, str], int]) -> Iterable[Finding]:
        if book.ledger is None:
            return
        devices = {d.uuid: d for d in book.ledger.devices()}  # read after NVML: see the module doc
        keys = tuple(a.key for a in book.accounts)
        for uuid in answered:
            held = physical.get((book.path, uuid), 0)
            device = devices.get(uuid)
            if device is None and not held:
                continue
            charged = device.used - device.unattributed if device is not None else 0
            want = max(0, held - charged)
            if device is None or want != device.unattributed:
                try:
                    book.ledger.set_unattributed(uuid, want)
                except LedgerError as exc:
                    log.warning("memory reconciler: %s", exc)
                    continue
                if device is None or abs(want - device.unattributed) >= 1 << 20:
                    log.info("ledger %s (%s), GPU %s: processes hold %d bytes, hooks charged %d: "
                             "%d unattributed", book.path, ",".join(keys), uuid, held, charged, want)
            yield Finding(keys, book.path, uuid, held, charged, want, device.limit if device is not None else None)


def _names_pod(cgroup: str, pod_uid: str) -> bool:
    """Whether a /proc/<pid>/cgroup text places the process in this pod.

    The kubelet names pod cgroups after the UID, with '_' for '-' under the
    systemd driver (``kubepods-burstable-pod1234_abcd.slice``) and as is under
    cgroupfs (``/kubepods/burstable/pod1234-abcd``)."""
    return f"pod{pod_uid}" in cgroup or f"pod{pod_uid.replace('-', '_')}" in cgroup
