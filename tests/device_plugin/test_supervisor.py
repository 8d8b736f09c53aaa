"""Helper processes: the supervisor keeps going whatever a child raises; token schedulers
stop with the agent, on a normal shutdown and when the agent is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from node_state.supervisor import Supervisor
from py_vcuda.sim import GiB, SimConfig


class FlakyChild:
    """Fails its first `failures` starts with `error`, then runs."""

    def __init__(self, name: str, failures: int, error: Exception) -> None:
        self.name = name
        self.failures = failures
        self.error = error
        self.starts = 0
        self.running = False

    def start(self) -> None:
        self.starts += 1
        if self.starts <= self.failures:
            raise self.error
        self.running = True

    def alive(self) -> bool:
        return self.running

    def after_start(self) -> None: ...

    def stop(self) -> None:
        self.running = False
        raise RuntimeError("stopping fails too")   # the others must be stopped all the same


def test_a_child_raising_anything_is_retried_and_the_others_start(dp):
    broken = FlakyChild("broken", 2, KeyError("a bug, not an OSError"))
    fine = FlakyChild("fine", 0, OSError())
    last = FlakyChild("last", 0, OSError())
    sup = Supervisor([broken, fine, last], poll_s=0.02, max_backoff_s=0.05)
    sup.start()
    try:
        assert fine.running and last.running   # the first child's exception did not stop the start loop
        dp.wait_for(lambda: broken.running, timeout=30, what="the broken child started on a retry")
        assert broken.starts == 3 and sup.restarts["broken"] == 2
    finally:
        sup.stop()
    assert not any(c.running for c in (broken, fine, last))


def alive(pid: int) -> bool:
    """Running: neither gone nor a zombie waiting for a parent that never reaps it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_schedulers_stop_with_the_agent(agent_factory, kubelet, dp):
    agent = agent_factory("vgpu", gpus=2)
    pids = [s.pid for s in agent.schedulers.values()]
    assert len(pids) == 2 and all(pid is not None and alive(pid) for pid in pids)
    agent.stop()
    assert not any(alive(pid) for pid in pids if pid is not None)


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(p) for p in (task / "children").read_text().split()]
    return out


def test_schedulers_end_when_the_agent_is_killed(kubelet, short_dir, dp):
    sim = SimConfig(state_path=short_dir / "sim", devices=2, memory=2 * GiB)
    proc = dp.spawn_plugin(short_dir, sim, "--mode", "vgpu", "--without-api-server")
    try:
        kubelet.latest_devices("tencent.com/vcuda-core")   # registered: both schedulers answered
        scheds = dp.wait_for(lambda: [c for c in children(proc.pid) if alive(c)], what="scheduler processes")
        assert len(scheds) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        dp.wait_for(lambda: not any(alive(c) for c in scheds), timeout=30, what="orphaned schedulers to end")
    finally:
        dp.stop_plugin(proc, short_dir)


def test_lifeline_child_that_outlived_its_parent_at_start_exits():
    """The parent died between fork and the child's prctl: the child sees another parent and quits."""
    proc = subprocess.run([sys.executable, "-m", "node_state.lifeline", "1", "this_module_is_never_run"],
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
