"""The container ledger: shared by processes, reclaimed after crashes, exact under load."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from shimtest import OVERHEAD, MiB, Runner, parse

from py_vcuda.ledger import Ledger, LedgerError

LIMIT = 1024 * MiB


def start_holding(cuprobe: Path, env: dict[str, str], commands: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen([str(cuprobe), *commands, "hold"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc


def wait_holding(proc: subprocess.Popen) -> list[dict[str, str]]:
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "holding":
            return parse("".join(lines))
        lines.append(line)
    raise AssertionError(f"probe ended early: {proc.stderr.read() if proc.stderr else ''}")


def resume(procs: list[subprocess.Popen]) -> list[list[dict[str, str]]]:
    """Let probes waiting at `hold` go on, together, to their next `hold`."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
    return [wait_holding(p) for p in procs]


def finish(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=30)


@pytest.fixture
def probe_env(shim: Path, sim_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
    env.update(sim_env, LD_PRELOAD=str(shim), VCUDA_LEDGER=str(tmp_path / "ledger"),
               VCUDA_MEMORY_LIMIT=str(LIMIT))
    return env


def sim_used(env: dict[str, str], pids: list[int]) -> int:
    from py_vcuda.sim import SimReader

    with SimReader(env["VCUDA_SIM_STATE"]) as sim:
        return sum(p.used for p in sim.processes(0) if p.pid in pids)


@pytest.mark.parametrize("n", [2, 8])
def test_processes_share_one_quota(cuprobe: Path, probe_env: dict[str, str], n: int) -> None:
    # Every process holds its context before any of them fills the quota.
    procs = [start_holding(cuprobe, probe_env, ["init", "ctx", "hold", f"fill:{16 * MiB}"]) for _ in range(n)]
    try:
        assert all(wait_holding(p)[-1]["rc"] == "0" for p in procs)
        fills = resume(procs)
        allocated = sum(16 * MiB * int(next(d for d in f if d["cmd"] == "fill")["count"]) for f in fills)
        used = sim_used(probe_env, [p.pid for p in procs])
        # The simulator's own record: never above the quota, and equal to the ledger.
        assert used <= LIMIT
        assert used == allocated + n * OVERHEAD
        with Ledger(probe_env["VCUDA_LEDGER"]) as ledger:
            (dev,) = ledger.devices()
            assert dev.used == used
            assert dev.limit == LIMIT
            assert dev.oom_denials >= n
            assert LIMIT - used < 16 * MiB  # the quota is really used up
    finally:
        for p in procs:
            finish(p)
    with Ledger(probe_env["VCUDA_LEDGER"]) as ledger:
        assert ledger.devices()[0].used == 0


def test_sigkilled_process_memory_is_reclaimed(cuprobe: Path, probe_env: dict[str, str],
                                               run_probe: Runner) -> None:
    holder = start_holding(cuprobe, probe_env, ["init", "ctx", f"alloc:{LIMIT - OVERHEAD}"])
    wait_holding(holder)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    started = time.monotonic()
    res = run_probe(["init", "ctx", f"alloc:{LIMIT - OVERHEAD}"], env={"VCUDA_MEMORY_LIMIT": str(LIMIT),
                                                                       "VCUDA_LEDGER": probe_env["VCUDA_LEDGER"]})
    assert res.rc("alloc") == 0, res.stderr
    assert time.monotonic() - started < 1.0


def test_stress_threads_and_processes(cuprobe: Path, probe_env: dict[str, str]) -> None:
    """4 processes x 32 threads allocate and free at random for 30 s (every API);
    at the end the ledger equals what the simulator holds for them."""
    procs = [start_holding(cuprobe, probe_env, ["--via=proc", "init", "ctx", "hold", "stress:32:30:8388608"])
             for _ in range(4)]
    try:
        assert all(wait_holding(p)[-1]["rc"] == "0" for p in procs)
        results = resume(procs)
        ops = sum(int(next(d for d in r if d["cmd"] == "stress")["ops"]) for r in results)
        denied = sum(int(next(d for d in r if d["cmd"] == "stress")["denied"]) for r in results)
        assert ops > 10_000
        assert denied > 0, "the quota must have been hit under load"
        used = sim_used(probe_env, [p.pid for p in procs])
        with Ledger(probe_env["VCUDA_LEDGER"]) as ledger:
            assert ledger.devices()[0].used == used == 4 * OVERHEAD
            assert ledger.devices()[0].peak <= LIMIT
    finally:
        for p in procs:
            finish(p)


def test_fork_child_gets_its_own_slot(run_probe: Runner, probe_env: dict[str, str]) -> None:
    res = run_probe(["init", "ctx", f"alloc:{100 * MiB}", "fork:1048576", "info"],
                    env={"VCUDA_MEMORY_LIMIT": str(LIMIT), "VCUDA_LEDGER": probe_env["VCUDA_LEDGER"]})
    assert res.returncode == 0, res.stderr
    assert res.rc("fork") == 0
    # The child's exit (which skips destructors) did not take the parent's usage with it.
    assert res.get("info", "free") == LIMIT - OVERHEAD - 100 * MiB
    with Ledger(probe_env["VCUDA_LEDGER"]) as ledger:
        ledger.reclaim_dead()
        assert ledger.devices()[0].used == 0  # both exited


@pytest.mark.parametrize("value", ["abc", "-1", "5Qi", "1.5.3Gi", ""])
def test_bad_limit_fails_first_call_clearly(run_probe: Runner, value: str) -> None:
    if value == "":
        pytest.skip("empty means unset")
    res = run_probe(["init", "ctx", "alloc:1024"], env={"VCUDA_MEMORY_LIMIT": value})
    assert res.returncode == 0, "the application must not crash"
    assert res.rc("init") == 3
    assert res.rc("alloc") != 0, "never silently unlimited"
    errors = [line for line in res.stderr.splitlines() if line.startswith("vcuda: error:")]
    assert len(errors) == 1, res.stderr
    assert "VCUDA_MEMORY_LIMIT" in errors[0] and value in errors[0]


def test_bad_per_device_limit(run_probe: Runner) -> None:
    res = run_probe(["init"], env={"VCUDA_MEMORY_LIMIT_0": "lots"})
    assert res.rc("init") == 3
    assert "VCUDA_MEMORY_LIMIT_0" in res.stderr


@pytest.mark.parametrize("content", [b"", b"not a ledger at all" * 100, b"\0" * 4096])
def test_foreign_ledger_is_refused(run_probe: Runner, tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "foreign"
    path.write_bytes(content)
    if not content:
        pytest.skip("an empty file is a fresh ledger")
    res = run_probe(["init", "ctx", "alloc:1024"], env={"VCUDA_LEDGER": str(path)})
    assert res.rc("init") == 3
    assert str(path) in res.stderr
    with pytest.raises(LedgerError, match=str(path)):
        Ledger(path)


def test_nvml_shows_the_quota(shim: Path, probe_env: dict[str, str], cuprobe: Path) -> None:
    import sys

    holder = start_holding(cuprobe, probe_env, ["init", "ctx", f"alloc:{100 * MiB}"])
    wait_holding(holder)
    code = (
        "import ctypes, os\n"
        "lib = ctypes.CDLL(os.environ['VCUDA_REAL_LIBNVML'])\n"
        "class Mem(ctypes.Structure):\n"
        "    _fields_ = [('total', ctypes.c_ulonglong), ('free', ctypes.c_ulonglong), ('used', ctypes.c_ulonglong)]\n"
        "assert lib.nvmlInit_v2() == 0\n"
        "h = ctypes.c_void_p(); assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0\n"
        "m = Mem(); assert lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) == 0\n"
        "print(m.total, m.free, m.used)\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], env=probe_env, capture_output=True,
                             text=True, timeout=30)
    finally:
        finish(holder)
    assert out.returncode == 0, out.stderr
    total, free, used = map(int, out.stdout.split())
    assert total == LIMIT
    assert used == OVERHEAD + 100 * MiB
    assert free == total - used


def test_limit_changed_in_the_ledger_applies_to_running_processes(cuprobe: Path,
                                                                  probe_env: dict[str, str]) -> None:
    """A live quota change (the device plugin's Ledger.set_limit) reaches a process that is
    already running, and wins over a later process's own VCUDA_MEMORY_LIMIT."""
    proc = start_holding(cuprobe, probe_env, ["init", "ctx", f"alloc:{256 * MiB}", "hold", f"alloc:{512 * MiB}"])
    try:
        assert wait_holding(proc)[-1]["rc"] == "0"
        with Ledger(probe_env["VCUDA_LEDGER"]) as ledger:
            (dev,) = ledger.devices()
            assert dev.limit == LIMIT
            ledger.set_limit(dev.uuid, 512 * MiB)  # below 256 MiB held + overhead + 512 MiB more
        (after,) = resume([proc])
        assert after[-1]["cmd"] == "alloc" and after[-1]["rc"] == "2"  # CUDA_ERROR_OUT_OF_MEMORY
    finally:
        finish(proc)
    env = dict(probe_env, VCUDA_MEMORY_LIMIT=str(4 * LIMIT))
    out = subprocess.run([str(cuprobe), "init", "ctx", "info"], env=env, capture_output=True, text=True,
                         timeout=60)
    info = next(d for d in parse(out.stdout) if d["cmd"] == "info")
    assert int(info["total"]) == 512 * MiB, out.stderr  # the pinned limit, not 4 GiB
