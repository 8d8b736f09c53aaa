"""Simulated device memory: exhaustion, per-process books, context overhead."""

from __future__ import annotations

import os
import struct
import subprocess
import time

from py_vcuda.sim import GiB, MiB, SimConfig, SimReader

OOM = 2
INVALID_VALUE = 1
INVALID_CONTEXT = 201


def test_memory_runs_out_and_frees(tool, sim: SimConfig) -> None:
    out = tool("init", "primary", "0", "info", "fill", "100M", "info", "free", "info",
               "freebad")
    by = {(ln.cmd, i): ln for i, ln in enumerate(out)}
    info0, fill, info1, free, info2, bad = (by[k] for k in sorted(by, key=lambda k: k[1])[2:])
    total = 1 * GiB
    assert info0.rest == [str(total - 64 * MiB), str(total)]  # the context's overhead
    # (1 GiB - 64 MiB) / 100 MiB -> 9 chunks fit, the 10th is refused.
    assert (fill.rc, fill.rest) == (OOM, ["9"])
    assert int(info1.rest[0]) == total - 64 * MiB - 9 * 100 * MiB
    assert free.rc == 0 and int(info2.rest[0]) == int(info1.rest[0]) + 100 * MiB
    assert bad.rc == INVALID_VALUE  # a pointer the driver never gave


def test_context_overhead_per_context(tool, sim: SimConfig) -> None:
    # The 10M allocation is made in the second context and goes with it.
    out = tool("init", "ctx", "0", "info", "ctx", "0", "alloc", "10M", "info", "destroy",
               "info", "destroy", "info")
    infos = [(ln.rc, int(ln.rest[0])) for ln in out if ln.cmd == "info"]
    total = 1 * GiB
    assert infos == [(0, total - 64 * MiB), (0, total - 138 * MiB), (0, total - 64 * MiB),
                     (INVALID_CONTEXT, 0)]
    with SimReader(sim.state_path) as r:
        assert r.device(0).used == 0


def test_per_process_accounting_and_exit_reclaim(children, sim: SimConfig) -> None:
    a = children.spawn("init", "primary", "0", "alloc", "300M", "ready")
    b = children.spawn("init", "primary", "0", "alloc", "200M", "alloc", "100M", "ready")
    children.ready(a)
    children.ready(b)
    with SimReader(sim.state_path) as r:
        procs = {p.pid: p for p in r.processes(0)}
        assert procs[a.pid].used == 300 * MiB + 64 * MiB
        assert procs[b.pid].used == 300 * MiB + 64 * MiB
        assert procs[a.pid].contexts == 1
        assert r.device(0).used == 2 * (364 * MiB)
        assert r.device(0).processes == 2
    children.release(a)
    children.release(b)
    with SimReader(sim.state_path) as r:  # normal exit returns everything at once
        assert r.device(0).used == 0
        assert r.processes(0) == []


def test_sigkilled_process_memory_is_reclaimed(tool, children) -> None:
    hog = children.spawn("init", "primary", "0", "alloc", "800M", "ready")
    children.ready(hog)
    assert tool("init", "primary", "0", "alloc", "500M")[-1].rc == OOM
    hog.kill()  # SIGKILL, never waited for: a zombie holds no GPU memory either
    deadline = time.monotonic() + 1.0  # the kill lands asynchronously; 1 s is the bound
    while (rc := tool("init", "primary", "0", "alloc", "500M")[-1].rc) and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    assert rc == 0
    assert hog.poll() is None or hog.returncode == -9


def test_bad_state_file_is_refused(tool, sim: SimConfig) -> None:
    sim.state_path.write_bytes(b"this is not a simulator state file" * 10)
    proc = subprocess.run([str(tool.exe), "init"], env={**os.environ, **sim.env()},
                          capture_output=True, text=True, check=False)
    assert "init 803" in proc.stdout
    assert str(sim.state_path) in proc.stderr and "not a vcuda simulator state" in proc.stderr


def test_state_version_mismatch_is_refused(tool, sim: SimConfig) -> None:
    sim.state_path.write_bytes(struct.pack("<QII", 0x4D49534144554356, 99, 4096) + bytes(4080))
    proc = subprocess.run([str(tool.exe), "init"], env={**os.environ, **sim.env()},
                          capture_output=True, text=True, check=False)
    assert "init 803" in proc.stdout
    assert "version 99" in proc.stderr and str(sim.state_path) in proc.stderr


def test_every_allocation_api_is_charged(build_sim, sim: SimConfig) -> None:
    exe = build_sim("sim_memory.c")
    proc = subprocess.run([str(exe)], env={**os.environ, **sim.env()}, capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "done 0" in proc.stdout
    with SimReader(sim.state_path) as r:
        assert r.device(0).used == 0


def test_forked_child_starts_over(tool) -> None:
    out = tool("init", "primary", "0", "alloc", "100M", "fork", "200M", "info")
    lines = {ln.cmd: ln for ln in out}
    assert lines["child-stale"].rc == 3  # CUDA_ERROR_NOT_INITIALIZED until cuInit
    # The child has its own context and memory next to the parent's ...
    assert lines["child"].rc == 0
    assert int(lines["child"].rest[0]) == 1 * GiB - 2 * 64 * MiB - 300 * MiB
    # ... and returns them when it exits.
    assert lines["info"].rest == [str(1 * GiB - 64 * MiB - 100 * MiB), str(1 * GiB)]
