"""Time slicing between processes: the simulated GPU runs one process's
kernels at a time, round-robin in slices (VCUDA_SIM_TIMESLICE_US, 2 ms by
default), as a GPU without MPS does; within a process, in launch order.
A deep launch queue in one process does not make another wait for all of it."""

from __future__ import annotations

import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from py_vcuda.sim import SimConfig, SimReader

MS = 1_000_000  # ns


def waits(lines: list[Any], cmd: str = "sync") -> list[float]:
    """Milliseconds each `cmd` line reports (sim_tool prints time spent)."""
    return [float(line.rest[0]) for line in lines if line.cmd == cmd and line.rc == 0]


def start(children: Any, *cmds: str) -> subprocess.Popen[str]:
    """A child that runs cmds up to its first `ready` and stops there."""
    proc = children.spawn(*cmds)
    children.ready(proc)
    return proc


def busy(r: SimReader) -> dict[int, int]:
    return {p.pid: p.busy_ns for p in r.processes(0)}


def test_short_kernel_beside_a_deep_queue_waits_about_one_slice(children: Any, sim: SimConfig) -> None:
    # 200 kernels of 2 ms queued at once (400 ms), as PyTorch eager mode does.
    deep = start(children, "init", "primary", "0", "launch", "200", "2000", "ready", "sync")
    short = start(children, "init", "primary", "0", "ready",
                  *("launch", "1", "500", "sync") * 10, "ready")
    assert short.stdin
    short.stdin.write("\n")
    short.stdin.flush()
    lines = children.ready(short)
    with SimReader(sim.state_path) as r:
        left = {p.pid: p.pending_ns for p in r.processes(0)}[deep.pid]
    syncs = waits(lines)
    assert len(syncs) == 10
    # One slice of the other process (2 ms) + its own 0.5 ms, 10 ms for a loaded
    # machine; FIFO across processes would make it up to 400 ms.
    assert statistics.median(syncs) <= 2 + 0.5 + 10, syncs
    assert max(syncs) <= 50, syncs
    assert left > 200 * MS, "the deep queue drained first: the test measured nothing"
    children.release(short)


def test_saturating_processes_share_equally(children: Any, sim: SimConfig) -> None:
    # Three deep queues with different kernel sizes: slices are time, not kernels.
    kernels = ("10000", "2500", "1000")
    counts = ("100", "400", "1000")  # 1 s each
    procs = [start(children, "init", "primary", "0", "launch", n, us, "ready", "sync")
             for n, us in zip(counts, kernels, strict=True)]
    with SimReader(sim.state_path) as r:
        t0 = r.now_ns()
        b0 = busy(r)
        time.sleep(0.4)
        b1 = busy(r)
        t1 = r.now_ns()
        pending = {p.pid: p.pending_ns for p in r.processes(0)}
    got = {p.pid: b1[p.pid] - b0[p.pid] for p in procs}
    total = sum(got.values())
    assert all(pending[p.pid] > 0 for p in procs), ("a queue ran dry inside the window", pending)
    assert total <= t1 - t0  # one kernel at a time: never busier than the wall clock
    assert total >= 0.95 * (t1 - t0)  # and never idle with work queued
    shares = [got[p.pid] / total for p in procs]
    assert all(abs(s - 1 / 3) <= 0.03 for s in shares), shares


def test_frequent_synchroniser_keeps_its_turn_beside_a_deep_queue(children: Any, sim: SimConfig) -> None:
    # The tenant: 4 kernels of 2 ms, synchronize, again; beside 1000 x 2 ms queued.
    deep = start(children, "init", "primary", "0", "launch", "1000", "2000", "ready", "sync")
    sync4 = start(children, "init", "primary", "0", "ready", *("launch", "4", "2000", "sync") * 25, "ready")
    assert sync4.stdin
    with SimReader(sim.state_path) as r:
        b0, t0 = busy(r), r.now_ns()
        sync4.stdin.write("\n")
        sync4.stdin.flush()
        children.ready(sync4)
        b1, t1 = busy(r), r.now_ns()
    mine, other = b1[sync4.pid] - b0[sync4.pid], b1[deep.pid] - b0[deep.pid]
    assert mine == 100 * 2 * MS
    # Round robin halves the GPU while it has work (FIFO: it would wait 2 s for
    # the deep queue first). Its host side (wake-up, launches) costs it some.
    assert mine / (t1 - t0) >= 0.25, (mine, t1 - t0)
    assert other > 0
    children.release(sync4)


def test_event_times_include_other_processes_slices(children: Any, sim: SimConfig) -> None:
    start(children, "init", "primary", "0", "launch", "200", "2000", "ready", "sync")  # 400 ms
    # 4 kernels of 1 ms between two events, beside the deep queue: the events
    # time when the work ran, interleaved with the other process's slices.
    out = start(children, "init", "primary", "0", "stream", "ready", "event", "launch", "4", "1000", "event",
                "sync", "elapsed", "event", "sleep", "30", "event", "elapsed", "ready")
    assert out.stdin
    out.stdin.write("\n")
    out.stdin.flush()
    lines = children.ready(out)
    (busy, idle), (sync,) = waits(lines, "elapsed"), waits(lines, "sync")
    assert 4 + 2 <= busy <= sync + 2, (busy, sync)  # at least one foreign slice inside
    assert 29 <= idle <= 60, idle  # events on an idle stream complete when recorded
    children.release(out)


def test_kernels_of_one_process_run_in_launch_order(tool: Callable[..., list[Any]]) -> None:
    # A long kernel on one stream, then a short one on another: the short one
    # completes after the long one, however the streams are synchronised.
    out = tool("init", "primary", "0", "stream", "launch", "1", "60000", "stream", "launch", "1", "1000",
               "sync")
    assert 60 <= waits(out)[0] < 90, out


def test_a_thousand_launches_queue_without_blocking(children: Any, sim: SimConfig) -> None:
    proc = start(children, "init", "primary", "0", "stream", "launch", "1000", "1000", "ready", "sync")
    with SimReader(sim.state_path) as r:
        me = {p.pid: p for p in r.processes(0)}[proc.pid]
        drain = r.device(0).busy_until_ns - r.now_ns()
    assert me.kernels == 1000
    assert me.pending_ns > 700 * MS  # launching took well under 300 ms: nothing waited
    assert abs(drain - me.pending_ns) <= 100 * MS
    out = children.release(proc)
    assert 600 <= waits(out)[0] <= 1100, out


def test_launch_beyond_the_default_queue_blocks(tool: Callable[..., list[Any]]) -> None:
    out = tool("init", "primary", "0", "stream", "launch", "1100", "1000", "sync")
    launch, sync = out[-2], out[-1]
    # 76 launches beyond the 1024 queued each wait for a completion (1 ms each)
    assert launch.rc == 0 and 70 <= float(launch.rest[0]) < 200, launch
    assert 950 <= float(sync.rest[0]) < 1100, sync


def test_killed_process_work_stops_running(children: Any, sim: SimConfig,
                                           tool: Callable[..., list[Any]]) -> None:
    victim = start(children, "init", "primary", "0", "launch", "500", "2000", "ready", "sync")  # 1 s
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    # Round robin with the dead queue would take 100 ms, FIFO 1 s.
    out = tool("init", "primary", "0", "launch", "1", "50000", "sync")
    assert 50 <= waits(out)[0] < 80, out
    with SimReader(sim.state_path) as r:
        time.sleep(0.05)
        assert r.busy_in_window(0, 40 * MS) == 0
        assert r.device(0).busy_until_ns <= r.now_ns()
        assert r.processes(0) == []


def test_exit_drops_queued_work(children: Any, sim: SimConfig) -> None:
    proc = start(children, "init", "primary", "0", "launch", "100", "10000", "ready")  # 1 s, never synced
    children.release(proc)
    with SimReader(sim.state_path) as r:
        dev = r.device(0)
        assert dev.kernels == 100 and dev.busy_ns < 500 * MS
        assert dev.busy_until_ns <= r.now_ns()


def test_timeslice_is_configurable(tool: Callable[..., list[Any]], sim: SimConfig) -> None:
    sim.timeslice_us = 500
    tool("init")
    with SimReader(sim.state_path) as r:
        assert r.config().timeslice_us == 500
    sim.reset()
    out = tool("init", env={"VCUDA_SIM_TIMESLICE_US": "5"})
    assert out[0].rc != 0


@pytest.mark.parametrize("slice_us", [1000, 20000])
def test_waits_are_bounded_by_the_slice(children: Any, sim: SimConfig, slice_us: int) -> None:
    sim.timeslice_us = slice_us
    children.env = sim.env()
    start(children, "init", "primary", "0", "launch", "400", "2500", "ready", "sync")  # 1 s
    short = start(children, "init", "primary", "0", "ready", *("launch", "1", "100", "sync", "sleep", "3") * 20,
                  "ready")
    assert short.stdin
    short.stdin.write("\n")
    short.stdin.flush()
    syncs = waits(children.ready(short))
    assert statistics.median(syncs) <= slice_us / 1000 + 0.1 + 10, syncs
    assert max(syncs) <= slice_us / 1000 + 40, syncs
    if slice_us >= 20000:  # a long slice shows: some waits are most of it
        assert max(syncs) >= 5, syncs
    children.release(short)
