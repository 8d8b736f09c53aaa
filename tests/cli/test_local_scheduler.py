"""`vcuda run --core` on a bare machine: the local token scheduler is started once, however many
runs start together, and comes back by itself when it dies, with the quota enforced again."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from vcudacli import local_scheduler_dir, vcuda_popen

from py_vcuda.sim import SimReader
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
def test_run_recovers_a_killed_scheduler(tmp_path: Path, runtime_env: dict[str, str], on_loss: str) -> None:
    """SIGKILL the local scheduler mid-run: the run continues within the reconnect time plus 1 s,
    through a new scheduler that holds it to its 30 % again."""
    reconnect_ms = 2000
    env = {**runtime_env, "VCUDA_SCHEDULER_TIMEOUT_MS": str(reconnect_ms), "VCUDA_ON_SCHEDULER_LOSS": on_loss}
    state = tmp_path / "sim"
    run = vcuda_popen("run", "--simulate", "--sim-state", str(state), "--core", "30", "--",
                      sys.executable, "-m", "py_vcuda.probe", "spin", "--seconds", "12", env=env)
    directory = local_scheduler_dir(runtime_env, simulated=True)
    admin = AdminClient(directory / "admin.sock")
    try:
        tenant = f"run-{run.pid}"

        def granted() -> dict | None:
            stats = stats_or_none(admin)
            ok = stats and stats["tenants"].get(tenant, {}).get("grants", 0) > 0
            return stats if ok else None

        epoch = wait_for("the run's first grant", granted)["epoch"]
        time.sleep(1.0)
        (old,) = daemons_serving(directory)
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        # A new scheduler (another epoch) grants the run's token again.
        wait_for("a new scheduler granting the run",
                 lambda: (s := granted()) is not None and s["epoch"] != epoch)
        recovered_s = time.monotonic() - killed
        assert recovered_s <= reconnect_ms / 1000 + 1, f"recovered after {recovered_s:.2f} s"
        assert old not in daemons_serving(directory)
        time.sleep(1.5)  # the simulated GPU's last second lies wholly after the recovery
        with SimReader(state) as sim:
            busy = sim.busy_in_window(0, 1_000_000_000) / 1e9
        assert 0.15 <= busy <= 0.45, f"GPU busy {busy:.0%} of the last second, limit 30 %"
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        assert "starting it again" in err
    finally:
        admin.close()
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
