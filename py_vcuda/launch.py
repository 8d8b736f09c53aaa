"""Running a command under quotas on this machine (`vcuda run`).

While the command runs, a memory reconciler (py_vcuda.memory_reconciler)
keeps the run's ledger at no less than what NVML says its processes hold,
whatever no hook charged (lazy module code, context growth); without NVML
(no GPU here) there is nothing to reconcile and it does not start."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from node_state.layout import SCHEDULER_DIR_KEY, ContainerRecord, NodeLayout, gpu_key, ledger_in
from py_vcuda import native
from py_vcuda.memory_reconciler import Account, MemoryReconciler
from py_vcuda.nvml import NVML, NVMLUnavailable, open_with_env
from token_scheduler import dirlock
from token_scheduler.admin_client import AdminClient
from token_scheduler.daemon import MAX_IPC_PATH, SOCKET_NAME


@dataclass
class Tenant:
    """What one `vcuda run` asks for."""

    memory: int | None = None                  # bytes per visible GPU; None: unlimited
    memory_per_device: dict[int, int] = field(default_factory=dict)
    gpu: str | None = None                     # index or UUID; None: all visible
    ledger: Path | None = None                 # None: a fresh one for this run
    log_level: str | None = None
    core_request: int | None = None            # percent of GPU time guaranteed; None: no compute quota
    core_limit: int | None = None              # percent cap; None: = request
    priority: str = "normal"                   # token-scheduler class: high | normal


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = Path(base) / f"vcuda-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


class SchedulerError(RuntimeError):
    """The local token scheduler could not be started or refused the tenant."""


def scheduler_dir(gpu: str, simulated: bool) -> Path:
    """The GPU's local scheduler directory. A UUID is named by its short hash (node_state's gpu_key):
    spelled out, its 40 characters push the tenants' socket paths past what unix sockets allow."""
    try:
        key = gpu_key(gpu)
    except ValueError:  # an index (or a short UUID prefix): short already
        key = "".join(c if c.isalnum() or c in "-_" else "_" for c in gpu)
    return runtime_dir() / f"scheduler-{'sim-' if simulated else ''}gpu-{key}"


def _longest_pid() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    except (OSError, ValueError):
        return 4_194_303  # PID_MAX_LIMIT - 1 on 64-bit Linux


def check_socket_room(directory: Path) -> None:
    """Fail clearly if the longest tenant socket a `vcuda run` may create under `directory` would not fit
    a unix socket path: otherwise the scheduler refuses the add, or zmq fails with a bare ENAMETOOLONG."""
    longest = directory / "tenants" / f"run-{_longest_pid()}" / SOCKET_NAME
    if len(str(longest)) > MAX_IPC_PATH:
        base = os.environ.get("XDG_RUNTIME_DIR")
        source = f"XDG_RUNTIME_DIR={base}" if base else f"XDG_RUNTIME_DIR unset, so {tempfile.gettempdir()}"
        raise SchedulerError(
            f"the token scheduler's socket path {longest} would be {len(str(longest))} bytes, over the "
            f"{MAX_IPC_PATH} a unix socket allows; the runtime directory {runtime_dir()} comes from {source}: "
            f"point XDG_RUNTIME_DIR at a directory at least {len(str(longest)) - MAX_IPC_PATH} characters shorter")


def start_scheduler(gpu: str, simulated: bool, timeout_s: float = 10.0) -> AdminClient:
    """Start the GPU's local token scheduler (detached, outliving this run) and wait until one answers.

    Safe to race: the daemon locks its directory, so of several started at once one serves
    and the others exit (token_scheduler.dirlock); whichever serves answers here.
    """
    directory = scheduler_dir(gpu, simulated)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(directory / "scheduler.log", "ab") as log:
        subprocess.Popen([sys.executable, "-m", "token_scheduler", "--gpu", gpu, "--dir", str(directory)],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    admin = AdminClient(directory / "admin.sock")
    try:
        admin.wait_ready(timeout_s)
    except TimeoutError:
        admin.close()
        log_path = directory / "scheduler.log"
        raise SchedulerError(f"the token scheduler for GPU {gpu} did not start; see {log_path}") from None
    return admin


def ensure_scheduler(gpu: str, simulated: bool, timeout_s: float = 10.0) -> AdminClient:
    """The GPU's local token scheduler: the running one, else a new one (start_scheduler)."""
    admin = AdminClient(scheduler_dir(gpu, simulated) / "admin.sock")
    try:
        admin.call("ping", timeout_s=0.3)
        return admin
    except TimeoutError:
        admin.close()
    return start_scheduler(gpu, simulated, timeout_s)


class SchedulerKeeper:
    """Keeps a run's local scheduler alive: on bare metal nobody else supervises it.

    check() pings it. When it does not answer and no process holds its directory's lock, it is
    gone: a new one is started at once, which restores the saved tenant list (this run included, on
    the same socket path), so the shim reconnects by itself and the quota holds again. When the lock
    is still held, the daemon is alive but hung (stopped, stuck) and no successor could start: after
    HUNG_AFTER_S without an answer it is killed (token_scheduler.dirlock.stop_hung_daemon, which
    touches only a token_scheduler daemon of this directory) and a new one started.
    """

    PING_TIMEOUT_S = 0.5
    HUNG_AFTER_S = 3.0   # a loaded machine may delay a reply by a ping or two; not by seconds

    def __init__(self, gpu: str, simulated: bool, tenant: str, request: int, limit: int, priority: str,
                 admin: AdminClient) -> None:
        self.gpu, self.simulated = gpu, simulated
        self.tenant, self.request, self.limit, self.priority = tenant, request, limit, priority
        self.admin = admin
        self.silent_since: float | None = None   # monotonic time of the first unanswered ping

    def check(self) -> None:
        try:
            self.admin.call("ping", timeout_s=self.PING_TIMEOUT_S)
            self.silent_since = None
            return
        except TimeoutError:
            pass
        now = time.monotonic()
        if self.silent_since is None:
            self.silent_since = now
        directory = scheduler_dir(self.gpu, self.simulated)
        holder = dirlock.lock_holder(directory)
        if holder is not None:
            if now - self.silent_since < self.HUNG_AFTER_S:
                return   # alive: give it a little longer
            killed = dirlock.stop_hung_daemon(directory)
            if killed is None:
                print(f"vcuda run: the token scheduler for GPU {self.gpu} does not answer, and the lock on "
                      f"{directory} is held by pid {holder}, which is not a token_scheduler daemon for it; "
                      "leaving it alone", file=sys.stderr)
                self.silent_since = now   # say it again after another HUNG_AFTER_S, not every check
                return
            print(f"vcuda run: the token scheduler for GPU {self.gpu} (pid {killed}) has not answered for "
                  f"{now - self.silent_since:.1f} s; killed it, starting it again", file=sys.stderr)
        else:
            print(f"vcuda run: the token scheduler for GPU {self.gpu} does not answer; starting it again",
                  file=sys.stderr)
        self.admin.close()
        try:
            self.admin = start_scheduler(self.gpu, self.simulated)
            self.silent_since = None
            listed = self.admin.call("list").get("tenants", [])
            if not any(isinstance(t, dict) and t.get("tenant") == self.tenant for t in listed):
                # Its saved list lost us (deleted, or written before our add): register again.
                self.admin.call("add", tenant=self.tenant, request=self.request, limit=self.limit,
                                priority=self.priority)
        except (SchedulerError, TimeoutError) as exc:
            print(f"vcuda run: {exc}; trying again", file=sys.stderr)  # next check retries
            self.admin.close()   # closing twice is harmless; calling a closed one is not
            self.admin = AdminClient(directory / "admin.sock")


# A `vcuda run`'s tenant: run-<its pid> (run() below)
_RUN_TENANT = re.compile(r"run-([1-9][0-9]*)")


def is_vcuda_run(pid: int) -> bool:
    """Whether process `pid` is a `vcuda run` (`python -m py_vcuda run ...` or `vcuda run ...`)."""
    argv = dirlock.process_argv(pid)
    if argv is None:
        return False   # gone
    for i, arg in enumerate(argv[:-1]):
        if arg == "py_vcuda" or arg.endswith("/py_vcuda/__main__.py") or os.path.basename(arg) == "vcuda":
            return argv[i + 1] == "run"   # the top-level parser has no option that takes a value
    return False


def prune_dead_runs(admin: AdminClient) -> list[str]:
    """Remove the tenants of `vcuda run`s that are gone: killed by SIGKILL, a run never reaches the finally
    that removes its tenant, and the scheduler (which outlives runs and saves its list) would count its
    request against every later run forever. Also removes such a run's record directory. Touches only
    run-<pid> tenants whose pid is gone or now a process that is no `vcuda run` (reused); returns those."""
    try:
        listed = admin.call("list").get("tenants", [])
    except TimeoutError:
        return []   # best effort: the add that follows says what is wrong
    own = os.getpid()
    pruned = []
    for entry in listed if isinstance(listed, list) else []:
        name = entry.get("tenant") if isinstance(entry, dict) else None
        match = _RUN_TENANT.fullmatch(name) if isinstance(name, str) else None
        if match is None:
            continue   # the device plugin's, the demo's, ...: not ours to judge
        pid = int(match.group(1))
        # Our own name before our add: left by an earlier run that had our pid.
        if pid != own and is_vcuda_run(pid):
            continue
        try:
            reply = admin.call("remove", tenant=name)
        except TimeoutError:
            continue
        if not reply.get("ok"):
            continue   # another run pruned it first
        if pid != own:   # with our pid, the record directory is ours, written just now
            shutil.rmtree(local_layout().container_dir(name), ignore_errors=True)
        print(f"vcuda run: removed tenant {name} of a run that is gone (pid {pid})", file=sys.stderr)
        pruned.append(name)
    return pruned


def tenant_env(tenant: Tenant, base: Mapping[str, str], ledger: Path) -> dict[str, str]:
    """The environment a command needs to run under the shim with `tenant`'s quotas."""
    env = dict(base)
    shim = str(native.lib_path(native.SHIM))
    preload = env.get("LD_PRELOAD", "")
    if shim not in preload.split():
        env["LD_PRELOAD"] = f"{shim} {preload}".strip()
    if tenant.memory is not None:
        env["VCUDA_MEMORY_LIMIT"] = str(tenant.memory)
    for index, limit in tenant.memory_per_device.items():
        env[f"VCUDA_MEMORY_LIMIT_{index}"] = str(limit)
    if tenant.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = tenant.gpu
    if tenant.log_level:
        env["VCUDA_LOG_LEVEL"] = tenant.log_level
    env["VCUDA_LEDGER"] = str(ledger)
    if tenant.core_request is not None:
        env["VCUDA_CORE_REQUEST"] = str(tenant.core_request)
        env["VCUDA_CORE_LIMIT"] = str(tenant.core_limit or tenant.core_request)
    return env


def local_layout() -> NodeLayout:
    """Where `vcuda run` describes its runs, in the node agent's format, for `vcuda top` and the exporter."""
    return NodeLayout(runtime_dir())


def _write_record(command: Sequence[str], tenant: Tenant, name: str, scheduler: Path | None) -> Path:
    limit = tenant.core_limit or tenant.core_request
    extra = {SCHEDULER_DIR_KEY: str(scheduler)} if scheduler is not None else {}
    record = ContainerRecord(
        key=name, mode="vgpu", resource="", device_ids=(), gpus=(),  # GPUs: whatever its ledger sees
        core_request=tenant.core_request or 0, core_limit=limit or 100, memory_limit=tenant.memory,
        tenant=name if scheduler is not None else None, priority=tenant.priority,
        container=shlex.join(command)[:120],
        created=time.time(), extra=extra)
    return local_layout().write_record(record)


def run(command: Sequence[str], tenant: Tenant, base_env: Mapping[str, str] | None = None) -> int:
    """Run `command` under the quotas; returns its exit status (128+N for signal N)."""
    name = f"run-{os.getpid()}"
    own_ledger = tenant.ledger is None
    base = os.environ if base_env is None else base_env
    simulated = "VCUDA_SIM_STATE" in base
    sched = scheduler_dir(tenant.gpu or "0", simulated) if tenant.core_request is not None else None
    if sched is not None:
        check_socket_room(sched)
    record_dir = _write_record(command, tenant, name, sched)
    own_path = ledger_in(record_dir)
    ledger = tenant.ledger or own_path
    if tenant.ledger is not None:  # a shared ledger: readers find it through the record's directory
        own_path.symlink_to(tenant.ledger.resolve())
    env = tenant_env(tenant, base, ledger)
    keeper = None
    if tenant.core_request is not None:
        gpu = tenant.gpu or "0"
        limit = tenant.core_limit or tenant.core_request
        try:
            admin = ensure_scheduler(gpu, simulated=simulated)
        except BaseException:
            shutil.rmtree(record_dir, ignore_errors=True)
            raise
        prune_dead_runs(admin)
        reply = admin.call("add", tenant=name, request=tenant.core_request, limit=limit,
                           priority=tenant.priority)
        if not reply.get("ok"):
            admin.close()
            shutil.rmtree(record_dir, ignore_errors=True)
            raise SchedulerError(f"the token scheduler refused the compute quota: {reply.get('error')}")
        env["VCUDA_SCHEDULER"] = str(reply["endpoint"])
        keeper = SchedulerKeeper(gpu, simulated, name, tenant.core_request, limit, tenant.priority, admin)
    memory = _MemoryWatch(name, ledger, env)
    try:
        return _supervise(command, env, keeper.check if keeper is not None else None, memory.start)
    finally:
        memory.stop()
        if keeper is not None:
            with contextlib.suppress(TimeoutError):
                keeper.admin.call("remove", tenant=name)
            keeper.admin.close()
        if own_ledger:
            ledger.unlink(missing_ok=True)
        shutil.rmtree(record_dir, ignore_errors=True)


class _MemoryWatch:
    """The run's memory reconciler: its account is the run's ledger and the command's process tree."""

    def __init__(self, name: str, ledger: Path, env: Mapping[str, str]) -> None:
        self.name, self.ledger, self.env = name, ledger, env
        self.nvml: NVML | None = None
        self.reconciler: MemoryReconciler | None = None

    def start(self, root_pid: int) -> None:
        try:
            self.nvml = open_with_env(self.env)
        except NVMLUnavailable:
            return  # no GPU driver here: nothing holds GPU memory to reconcile
        except Exception as exc:  # the hooks still hold the quota; say what is missing on top
            print(f"vcuda run: warning: memory reconciler off, NVML failed: {exc}", file=sys.stderr)
            return
        account = Account(key=self.name, ledger=self.ledger, root_pid=root_pid)
        self.reconciler = MemoryReconciler(lambda: [account], self.nvml)
        self.reconciler.start()

    def stop(self) -> None:
        if self.reconciler is not None:
            self.reconciler.stop()
        if self.nvml is not None:
            self.nvml.close()


# How often a run with a compute quota checks that its scheduler answers (SchedulerKeeper).
WATCH_INTERVAL_S = 0.25


def _supervise(command: Sequence[str], env: dict[str, str], watch: Callable[[], None] | None,
               started: Callable[[int], None] = lambda pid: None) -> int:
    try:
        proc = subprocess.Popen(list(command), env=env)
    except FileNotFoundError:
        raise SystemExit(f"vcuda run: command not found: {command[0]}") from None
    started(proc.pid)
    # The child gets terminal signals itself; pass on the ones sent to us alone.
    forwarded = (signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda sig, _f: proc.send_signal(sig)) for s in forwarded}
    try:
        while True:
            try:
                status = proc.wait(WATCH_INTERVAL_S if watch is not None else None)
                break
            except subprocess.TimeoutExpired:
                pass
            except KeyboardInterrupt:
                continue  # the child saw the SIGINT too; wait for it to finish
            if watch is not None:
                with contextlib.suppress(KeyboardInterrupt):
                    watch()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return status if status >= 0 else 128 - status
