"""Cost of one memory reconciler pass, per container (issue 12's figure).

    python3 bench/reconciler_bench.py [--containers 1,8,32] [--procs 1] [--passes 40]

Setup: one simulated GPU; for each container a ledger and --procs processes
(tests/c/sim_tool under libvcuda, each with a context and 1 MiB of lazily
loaded kernel code, so every pass has an unattributed figure to keep) living
in a simulated pid namespace (VCUDA_SIM_HOST_PID_OFFSET), and a fake host
/proc that maps their host pids back (NSpid, stat, cgroup), as the node
agent's view of the host would. The reconciler runs in this process on the
simulator's NVML, the way the node agent runs it.

Per container count: wall time of a pass (p50 / p95 over --passes, one after
another), CPU time of a pass (thread CPU, p50), and both divided by the
containers. Alongside, the NVML query alone (nvmlDeviceGetComputeRunningProcesses
through pynvml, p50), which a pass does once per GPU: the rest is /proc reads
(three files per GPU process) and ledger reads/writes (per container).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from simcontainers import Container, FakeProc  # noqa: E402
from simtool import Children  # noqa: E402

from py_vcuda import native  # noqa: E402
from py_vcuda.memory_reconciler import MemoryReconciler  # noqa: E402
from py_vcuda.procfs import ProcFS  # noqa: E402
from py_vcuda.sim import GiB, MiB, SimConfig, nvml_session  # noqa: E402

SCRIPT = ("init", "primary", "0", "module", "vcudasim-module;kernel k code=1Mi", "fn", "k", "run", "0", "ready")


def build_tool(out: Path) -> Path:
    lib = native.lib_dir()
    exe = out / "sim_tool"
    c = REPO / "tests" / "c"
    subprocess.run([os.environ.get("CC", "cc"), "-std=gnu11", "-O2", f"-I{REPO / 'libvcuda' / 'include'}",
                    f"-I{c}", f"-I{REPO / 'gpusim' / 'src'}", f"-I{REPO / 'gpusim' / 'include'}", "-o", str(exe),
                    str(c / "sim_tool.c"), str(c / "sim_tool_mem.c"), f"-L{lib}", "-lvcuda-sim-cuda",
                    f"-Wl,-rpath,{lib}", "-ldl", "-lpthread"], check=True)
    return exe


def measure(n: int, procs: int, passes: int, tool: Path, work: Path) -> dict[str, float]:
    sim = SimConfig(state_path=work / f"state-{n}", memory=512 * GiB, context_overhead=64 * MiB)
    fake = FakeProc(work / f"proc-{n}")
    kids = Children(tool, sim.env())
    try:
        containers = [Container(f"c{i}", work / f"c{i}-{n}.ledger", offset=100_000 * (i + 1)) for i in range(n)]
        started = [(c, kids.spawn(*SCRIPT, env=c.env(8 * GiB))) for c in containers for _ in range(procs)]
        for c, p in started:
            kids.ready(p)
            fake.add(p.pid, p.pid + c.offset)
        with nvml_session(sim) as nvml:
            uuid = nvml.gpu(0).uuid
            accounts = [c.account(uuid) for c in containers]
            rec = MemoryReconciler(lambda: accounts, nvml, procfs=ProcFS(fake.root))
            found = rec.reconcile()  # warm: maps the ledgers, writes the unattributed figures
            assert all(f.charged + f.unattributed >= f.physical for f in found), found
            wall, cpu, query = [], [], []
            for _ in range(passes):
                t0, c0 = time.perf_counter(), time.thread_time()
                rec.reconcile()
                wall.append(time.perf_counter() - t0)
                cpu.append(time.thread_time() - c0)
                t0 = time.perf_counter()
                nvml.processes(uuid)
                query.append(time.perf_counter() - t0)
            rec.stop()
    finally:
        kids.close()
    wall.sort()
    return {"wall_p50": statistics.median(wall), "wall_p95": wall[int(0.95 * (len(wall) - 1))],
            "cpu_p50": statistics.median(cpu), "nvml_p50": statistics.median(query)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--containers", default="1,8,32", help="comma list of container counts")
    ap.add_argument("--procs", type=int, default=1, help="GPU processes per container")
    ap.add_argument("--passes", type=int, default=40)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="recbench"))
    try:
        tool = build_tool(work)
        print(f"{'containers':>10} {'procs':>6} {'pass p50':>10} {'pass p95':>10} {'cpu p50':>9} "
              f"{'per container':>14} {'cpu/container':>14} {'NVML query':>11}")
        for n in (int(v) for v in args.containers.split(",")):
            r = measure(n, args.procs, args.passes, tool, work)
            print(f"{n:>10} {n * args.procs:>6} {r['wall_p50'] * 1e3:>8.2f}ms {r['wall_p95'] * 1e3:>8.2f}ms "
                  f"{r['cpu_p50'] * 1e3:>7.2f}ms {r['wall_p50'] / n * 1e6:>12.0f}us "
                  f"{r['cpu_p50'] / n * 1e6:>12.0f}us {r['nvml_p50'] * 1e6:>9.0f}us")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
