"""`vcuda run --core` and the GPU's local scheduler over time: tenants of runs killed by SIGKILL are
pruned by the next run, and the scheduler's directory leaves room for its sockets under a long
XDG_RUNTIME_DIR and a GPU given by UUID."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from vcudacli import local_scheduler_dir, vcuda, vcuda_popen

from node_state.layout import ContainerRecord, gpu_key
from py_vcuda import launch
from token_scheduler import dirlock
from token_scheduler.admin_client import AdminClient
from token_scheduler.daemon import MAX_IPC_PATH

pytestmark = pytest.mark.timeout(120)

SIM_UUID = "GPU-5157a0c0-0000-4000-8000-000000000000"   # the simulator's GPU 0 (gpusim/src/config.c)
LIST_TENANTS = ("import json, os; from token_scheduler.admin_client import AdminClient; "
                "sock = os.environ['VCUDA_SCHEDULER'].removeprefix('ipc://').split('/tenants/')[0]; "
                "print(json.dumps(AdminClient(sock + '/admin.sock').call('list')['tenants']))")


def stop_schedulers(runtime: Path) -> None:
    """Kill the token schedulers started under `runtime`, by pid, each only if it is one for its directory."""
    for directory in runtime.glob("**/vcuda-*/scheduler-*"):
        pid = dirlock.lock_holder(directory)
        if pid is not None and dirlock.is_daemon_for(pid, directory):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private runtime dir, for the runs and for launch in this process; its schedulers are killed after."""
    path = Path(tempfile.mkdtemp(prefix="vc", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(path))
    yield path
    stop_schedulers(path)
    shutil.rmtree(path, ignore_errors=True)


def long_dir(parent: Path, length: int) -> Path:
    path = parent / ("d" * (length - len(str(parent)) - 1))
    path.mkdir()
    assert len(str(path)) == length
    return path


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def listed(admin: AdminClient) -> dict[str, int]:
    return {t["tenant"]: t["request"] for t in admin.call("list")["tenants"]}


def wait_for(what: str, probe, timeout_s: float = 30.0) -> None:  # noqa: ANN001  (test helper)
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def record(name: str) -> Path:
    """A bare run's record, as launch writes it, for a run that never got to remove it."""
    return launch.local_layout().write_record(ContainerRecord(
        key=name, mode="vgpu", resource="", device_ids=(), gpus=(), core_request=60, core_limit=60,
        memory_limit=None, tenant=name))


def test_a_killed_runs_tenant_is_pruned_by_the_next_run(tmp_path: Path, runtime: Path) -> None:
    """The scheduler outlives runs and saves its tenants: a run killed by SIGKILL (60 %) would hold its
    share forever and refuse the next 30 %. The next run removes it, its record too, and the tenant
    of a pid now reused by a process that is no `vcuda run`; it leaves a live run's tenant and every
    tenant not named run-<pid> alone."""
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    admin = launch.ensure_scheduler("0", simulated=True)
    live = vcuda_popen("run", "--simulate", "--sim-state", str(tmp_path / "sim"), "--core", "10", "--",
                       sys.executable, "-c", "import time; time.sleep(60)", env=env)
    try:
        wait_for("the live run's tenant", lambda: f"run-{live.pid}" in listed(admin))
        gone, reused = dead_pid(), os.getpid()   # this pid: alive, but pytest, not a `vcuda run`
        for name, request in ((f"run-{gone}", 60), (f"run-{reused}", 5), ("plugin-ab12", 5), ("run-nightly", 5)):
            assert admin.call("add", tenant=name, request=request)["ok"]
        stale = record(f"run-{gone}")
        out = vcuda("run", "--simulate", "--sim-state", str(tmp_path / "sim"), "--core", "30", "--",
                    sys.executable, "-c", LIST_TENANTS, env=env)
        assert out.returncode == 0, out.stderr
        assert f"vcuda run: removed tenant run-{gone} of a run that is gone (pid {gone})" in out.stderr
        assert f"removed tenant run-{reused} " in out.stderr
        assert out.stderr.count("removed tenant") == 2, out.stderr
        during = {t["tenant"] for t in json.loads(out.stdout.strip().splitlines()[-1])}
        kept = {f"run-{live.pid}", "plugin-ab12", "run-nightly"}
        (itself,) = during - kept   # the new run's own tenant
        assert kept <= during and itself not in (f"run-{gone}", f"run-{reused}")
        assert not stale.exists()
        assert launch.local_layout().container_dir(f"run-{live.pid}").is_dir()
        assert live.poll() is None
    finally:
        live.kill()
        live.wait()
        admin.close()


def test_runs_pruning_at_once_do_not_fail(tmp_path: Path, runtime: Path) -> None:
    """Two runs start together and both see the dead run's tenant: one removes it, the other's remove
    finds it gone, and both run."""
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    admin = launch.ensure_scheduler("0", simulated=True)
    gone = dead_pid()
    try:
        assert admin.call("add", tenant=f"run-{gone}", request=60)["ok"]
        results: list[subprocess.CompletedProcess] = []

        def one() -> None:
            results.append(vcuda("run", "--simulate", "--sim-state", str(tmp_path / "sim"), "--core", "30",
                                 "--", sys.executable, "-c", "import time; time.sleep(1)", env=env))

        threads = [threading.Thread(target=one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
        assert sum(r.stderr.count(f"removed tenant run-{gone} ") for r in results) == 1
        assert listed(admin) == {}
    finally:
        admin.close()


def test_prune_ignores_a_tenant_removed_meanwhile() -> None:
    """The race in one step: the list names a tenant another run removes before this one does."""
    gone = dead_pid()

    class Racing:
        def call(self, op: str, timeout_s: float = 5.0, **fields: object) -> dict[str, object]:
            if op == "list":
                return {"ok": True, "tenants": [{"tenant": f"run-{gone}", "request": 60}]}
            return {"ok": False, "error": f"no tenant 'run-{gone}'"}

    assert launch.prune_dead_runs(Racing()) == []  # type: ignore[arg-type]


def test_is_vcuda_run(tmp_path: Path) -> None:
    """A `vcuda run` is `python -m py_vcuda run` or a `vcuda` executable's `run`; nothing else."""
    script = tmp_path / "vcuda"
    script.write_text("#!/bin/sh\nsleep 30\n")
    script.chmod(0o755)
    procs = [subprocess.Popen([str(script), sub]) for sub in ("run", "top")]
    try:
        time.sleep(0.2)   # past the exec
        assert launch.is_vcuda_run(procs[0].pid)
        assert not launch.is_vcuda_run(procs[1].pid)
        assert not launch.is_vcuda_run(os.getpid())
        assert not launch.is_vcuda_run(dead_pid())
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_scheduler_dir_keys_are_short_and_stable(runtime: Path) -> None:
    """An index keeps its name (tests and people know scheduler-gpu-0); a UUID is named by the node
    agent's short hash: stable, and distinct for UUIDs that share a long prefix."""
    assert launch.scheduler_dir("0", simulated=True) == local_scheduler_dir({"XDG_RUNTIME_DIR": str(runtime)}, True)
    assert launch.scheduler_dir("1", simulated=False).name == "scheduler-gpu-1"
    other = "GPU-5157a0c0-0001-4000-8000-000000000001"
    mig = "MIG-c0a36a8e-0a5f-5d2b-8f53-9a2b8cfe0dd1"
    keys = [launch.scheduler_dir(u, simulated=False).name for u in (SIM_UUID, other, mig)]
    assert len(set(keys)) == 3 and all(len(k) == len("scheduler-gpu-") + 10 for k in keys)
    assert keys[0] == f"scheduler-gpu-{gpu_key(SIM_UUID)}"   # one name for a GPU, as the node agent's


def test_run_on_a_gpu_uuid_under_a_long_runtime_dir(tmp_path: Path, runtime: Path) -> None:
    """A 30-character XDG_RUNTIME_DIR (like /run/user/1000 plus a little) and --gpu as a UUID: the
    UUID spelled out in the directory name pushed the tenant's socket past 107 bytes."""
    base = long_dir(runtime, 30)
    env = {"XDG_RUNTIME_DIR": str(base)}
    out = vcuda("run", "--simulate", "--sim-state", str(tmp_path / "sim"), "--core", "30", "--gpu", SIM_UUID,
                "--", sys.executable, "-c", "import os; print(os.environ['VCUDA_SCHEDULER'])", env=env)
    assert out.returncode == 0, out.stderr
    endpoint = out.stdout.strip().splitlines()[-1].removeprefix("ipc://")
    assert endpoint.startswith(str(base)) and len(endpoint) <= MAX_IPC_PATH


def test_a_runtime_dir_too_long_for_sockets_is_named(tmp_path: Path, runtime: Path) -> None:
    """Where no socket path could fit, the run says which path and where its directory comes from,
    before starting anything."""
    base = long_dir(runtime, 60)
    out = vcuda("run", "--simulate", "--sim-state", str(tmp_path / "sim"), "--core", "30", "--", "true",
                env={"XDG_RUNTIME_DIR": str(base)})
    assert out.returncode == 1
    assert f"XDG_RUNTIME_DIR={base}" in out.stderr and "/tenants/run-" in out.stderr, out.stderr
    assert f"over the {MAX_IPC_PATH}" in out.stderr
    assert not list(base.glob("vcuda-*/scheduler-*")) and not list(base.glob("vcuda-*/containers/*"))
