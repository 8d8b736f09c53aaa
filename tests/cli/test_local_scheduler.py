"""`vcuda run --core` on a bare machine: the local token scheduler is started once, however many
runs start together, and comes back by itself when it dies, with the quota enforced again."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vcudacli import local_scheduler_dir, vcuda_popen

from py_vcuda.launch import SchedulerKeeper
from py_vcuda.sim import SimReader
from token_scheduler import dirlock
from token_scheduler.admin_client import AdminClient
from token_scheduler.dirlock import holder_pid

pytestmark = pytest.mark.timeout(120)


def daemons_serving(directory: Path) -> list[int]:
    """Live token_scheduler processes started for `directory`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"token_scheduler" in argv and str(directory).encode() in argv:
            pids.append(int(entry.name))
    return pids


def wait_for(what: str, probe, timeout_s: float = 30.0):  # noqa: ANN001, ANN201  (test helper)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def stats_or_none(admin: AdminClient) -> dict | None:
    try:
        return admin.call("stats", timeout_s=0.3)
    except TimeoutError:
        return None


@pytest.mark.parametrize("on_loss", ["block", "run"])
@pytest.mark.parametrize("loss", ["killed", "hung"])
def test_run_recovers_a_lost_scheduler(tmp_path: Path, runtime_env: dict[str, str], on_loss: str,
                                       loss: str) -> None:
    """The local scheduler lost mid-run: the run continues through a new scheduler that holds it to
    its 30 % again. killed (SIGKILL): within the reconnect time plus 1 s. hung (SIGSTOP: alive, still
    holding its directory's lock, answering nothing, so no successor could start): the run kills it
    after HUNG_AFTER_S without an answer."""
    reconnect_ms = 2000
    env = {**runtime_env, "VCUDA_SCHEDULER_TIMEOUT_MS": str(reconnect_ms), "VCUDA_ON_SCHEDULER_LOSS": on_loss}
    state = tmp_path / "sim"
    run = vcuda_popen("run", "--simulate", "--sim-state", str(state), "--core", "30", "--",
                      sys.executable, "-m", "py_vcuda.probe", "spin", "--seconds", "14", env=env)
    directory = local_scheduler_dir(runtime_env, simulated=True)
    admin = AdminClient(directory / "admin.sock")
    old = None
    try:
        tenant = f"run-{run.pid}"

        def granted() -> dict | None:
            stats = stats_or_none(admin)
            ok = stats and stats["tenants"].get(tenant, {}).get("grants", 0) > 0
            return stats if ok else None

        epoch = wait_for("the run's first grant", granted)["epoch"]
        time.sleep(1.0)
        (old,) = daemons_serving(directory)
        os.kill(old, signal.SIGKILL if loss == "killed" else signal.SIGSTOP)
        lost = time.monotonic()
        # A new scheduler (another epoch) grants the run's token again.
        wait_for("a new scheduler granting the run",
                 lambda: (s := granted()) is not None and s["epoch"] != epoch)
        recovered_s = time.monotonic() - lost
        # hung: HUNG_AFTER_S of silence, a ping timeout, the kill and the start
        bound = reconnect_ms / 1000 + 1 if loss == "killed" else SchedulerKeeper.HUNG_AFTER_S + 0.5 + 4
        assert recovered_s <= bound, f"recovered after {recovered_s:.2f} s"
        assert old not in daemons_serving(directory) and daemons_serving(directory) == [holder_pid(directory)]
        time.sleep(1.5)  # the simulated GPU's last second lies wholly after the recovery
        with SimReader(state) as sim:
            busy = sim.busy_in_window(0, 1_000_000_000) / 1e9
        assert 0.15 <= busy <= 0.45, f"GPU busy {busy:.0%} of the last second, limit 30 %"
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        assert "starting it again" in err
        if loss == "hung":
            assert f"(pid {old}) has not answered" in err and "killed it" in err
    finally:
        admin.close()
        if old is not None and loss == "hung":
            with contextlib.suppress(ProcessLookupError):
                os.kill(old, signal.SIGKILL)
        if run.poll() is None:
            run.kill()
            run.wait()


def test_runs_started_together_share_one_scheduler(runtime_env: dict[str, str]) -> None:
    """Four runs with a fresh runtime dir at the same instant: one scheduler serves all four."""
    runs = [vcuda_popen("run", "--core", "20", "--", sys.executable, "-c", "import time; time.sleep(6)",
                        env=runtime_env) for _ in range(4)]
    directory = local_scheduler_dir(runtime_env, simulated=False)
    admin = AdminClient(directory / "admin.sock")
    try:
        def all_listed() -> bool:
            try:
                listed = admin.call("list", timeout_s=0.3)["tenants"]
            except TimeoutError:
                return False
            return {t["tenant"] for t in listed} == {f"run-{r.pid}" for r in runs}

        wait_for("all four runs registered with one scheduler", all_listed)
        # Every daemon that lost the start-up race exits; the winner stays for later runs.
        wait_for("the losers to exit", lambda: len(daemons_serving(directory)) == 1, timeout_s=10)
        assert daemons_serving(directory) == [holder_pid(directory)]
        for run in runs:
            _, err = run.communicate(timeout=60)
            assert run.returncode == 0, err
        assert len(daemons_serving(directory)) == 1
    finally:
        admin.close()
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()


def test_a_lock_held_by_another_program_is_left_alone(short_dir: Path) -> None:
    """Only a token_scheduler daemon of the directory is ever killed: not a process that merely
    holds the lock file, whatever the pid file says."""
    directory = short_dir / "sched"
    directory.mkdir()
    script = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
              "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)")
    # its command line even names the directory, like a daemon's
    other = subprocess.Popen([sys.executable, "-c", script, str(directory / dirlock.LOCK_FILE), "--dir",
                              str(directory)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline() == "locked\n"
        (directory / dirlock.LOCK_FILE).write_text(f"{other.pid}\n")
        assert dirlock.lock_holder(directory) == other.pid
        assert not dirlock.is_daemon_for(other.pid, directory)
        assert dirlock.stop_hung_daemon(directory) is None
        time.sleep(0.2)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
    assert dirlock.lock_holder(directory) is None
