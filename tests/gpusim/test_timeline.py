"""The execution timeline: kernels take the time their launch asks for, all
processes share one device (one kernel at a time; test_timeslice.py has how
they are interleaved), waits sleep until completion."""

from __future__ import annotations

import os
import subprocess
import time

from py_vcuda.sim import SimConfig, SimReader


def test_streams_events_graphs(build_sim, sim: SimConfig) -> None:
    import os

    exe = build_sim("sim_sync.c")
    proc = subprocess.run([str(exe)], env={**os.environ, **sim.env()}, capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "done 0" in proc.stdout


def test_two_processes_serialised_on_one_timeline(children, sim: SimConfig) -> None:
    # Each process: 20 kernels x 10 ms, then waits. Alone: 0.2 s; together: 0.4 s.
    script = ("init", "primary", "0", "ready", "launch", "20", "10000", "sync", "ready")
    a, b = children.spawn(*script), children.spawn(*script)
    children.ready(a)
    children.ready(b)
    t0 = time.monotonic()
    assert a.stdin and b.stdin
    a.stdin.write("\n")
    a.stdin.flush()
    b.stdin.write("\n")
    b.stdin.flush()
    children.ready(a)
    children.ready(b)
    wall = time.monotonic() - t0
    assert 0.39 <= wall < 0.6, wall
    with SimReader(sim.state_path) as r:
        procs = {p.pid: p for p in r.processes(0)}
        for p in (a, b):
            assert procs[p.pid].busy_ns == 200_000_000
            assert procs[p.pid].kernels == 20
        dev = r.device(0)
        assert dev.busy_ns == 400_000_000 and dev.kernels == 40
        assert r.busy_in_window(0, 1_000_000_000) >= 390_000_000
    children.release(a)
    children.release(b)
    with SimReader(sim.state_path) as r:  # totals keep exited processes' time
        assert r.device(0).busy_ns == 400_000_000
        assert r.processes(0) == []


def test_service_stretches_say_when_each_process_ran(children, sim: SimConfig) -> None:
    """vcudasim_served: stretches of one process never overlap another's, lie within the
    run, add up to its busy time, and the two processes alternate in time slices."""
    script = ("init", "primary", "0", "ready", "launch", "10", "10000", "sync", "ready")
    a, b = children.spawn(*script), children.spawn(*script)
    children.ready(a)
    children.ready(b)
    t0 = time.monotonic_ns()
    for p in (a, b):
        assert p.stdin
        p.stdin.write("\n")
        p.stdin.flush()
    children.ready(a)
    children.ready(b)
    t1 = time.monotonic_ns()
    with SimReader(sim.state_path) as r:
        served = {p.pid: r.served(p.pid) for p in (a, b)}
        assert r.served(1) == []  # no such process
    for stretches in served.values():
        assert sum(end - start for start, end in stretches) == 100_000_000
        assert all(t0 <= start < end <= t1 for start, end in stretches)
    both = sorted((start, end, pid) for pid, stretches in served.items() for start, end in stretches)
    assert all(e <= s for (_, e, _), (s, _, _) in zip(both, both[1:], strict=False))
    owners = [pid for _, _, pid in both]
    assert sum(1 for x, y in zip(owners, owners[1:], strict=False) if x != y) >= 5  # time slices
    children.release(a)
    children.release(b)


def test_full_stream_blocks_the_launcher(tool, sim: SimConfig) -> None:
    sim.max_pending = 4
    out = tool("init", "primary", "0", "stream", "launch", "10", "30000", "sync")
    launch, sync = out[-2], out[-1]
    # Launches 5..10 each wait for a completion: about 6 x 30 ms before the
    # last launch returns; then 4 kernels remain queued.
    assert launch.rc == 0 and 170 <= float(launch.rest[0]) < 260, launch
    assert 100 <= float(sync.rest[0]) < 140, sync


def test_default_queue_does_not_block(tool) -> None:
    out = tool("init", "primary", "0", "launch", "100", "10000", "sync")
    assert float(out[-2].rest[0]) < 50  # 100 launches of 10 ms return at once
    assert 950 <= float(out[-1].rest[0]) < 1100


def test_synchronize_spins_unless_the_context_blocks(tool) -> None:
    """As the driver's: a synchronize in a default context busy-waits (here the last
    VCUDA_SIM_SPIN_US of it, 5 ms), one in a CU_CTX_SCHED_BLOCKING_SYNC context sleeps:
    through 20 waits for 10 ms kernels the spinning thread wants a CPU for about 100 ms,
    the sleeping one uses next to none."""
    waits = ["launch", "1", "10000", "sync"] * 20

    def cpu_and_runnable_ms(ctx: str) -> tuple[float, float]:
        """The waiting thread's CPU time through the waits, and its time runnable (on a CPU or
        waiting for one)."""
        out = tool("init", ctx, "0", "sched", *waits, "sched", env={"VCUDA_SIM_SPIN_US": "5000"})
        assert all(line.rc == 0 for line in out), out
        for sync in (line for line in out if line.cmd == "sync"):
            # No return before the kernel's 10 ms, counted from its launch: the time in sync alone is
            # shorter when the tool was preempted between the two. Under 100 ms: a wake-up late on a
            # loaded machine is not what this test is about; one oversleeping by far still fails it.
            assert float(sync.rest[1]) >= 9.5 and float(sync.rest[0]) < 100, out
        before, after = (line for line in out if line.cmd == "sched")
        cpu = float(after.rest[0]) - float(before.rest[0])
        return cpu, cpu + float(after.rest[1]) - float(before.rest[1])

    _, spinning = cpu_and_runnable_ms("ctx")
    blocking, _ = cpu_and_runnable_ms("bctx")
    # Runnable time, not CPU time: a spinning thread is runnable all through its spin, but on a
    # loaded machine (CI's two shared cores) it waits for a CPU for part of it.
    assert spinning >= 60, f"{spinning:.1f} ms runnable: the waits did not spin"
    assert blocking <= 30, f"{blocking:.1f} ms of CPU: the blocking waits spun"


def test_spin_setting_is_checked(tool, sim: SimConfig) -> None:
    proc = subprocess.run([str(tool.exe), "init"], env={**os.environ, **sim.env(), "VCUDA_SIM_SPIN_US": "lots"},
                          capture_output=True, text=True, timeout=20, check=False)
    assert "init 1" in proc.stdout and "VCUDA_SIM_SPIN_US must be 0..1000000, not lots" in proc.stderr
