"""Compute quotas on the GPU simulator, side by side in one run: saturating
tenants with unequal requests (configured vs achieved share of the GPU's work),
the aggregate busy fraction at 50/50, and a latency-sensitive tenant's token
wait next to a saturating one.

Each tenant is `python -m py_vcuda.probe spin` (2 ms kernels) under
libvcuda with its own ledger and scheduler endpoint; one token_scheduler
daemon (window 2 s) decides. Run: python bench/compute_bench.py (after
`pip install .`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from py_vcuda.launch import Tenant, tenant_env
from py_vcuda.sim import SimConfig
from token_scheduler.testing import AdminClient, spawn_daemon

SCENARIOS = [(50, 50), (30, 70), (10, 20, 30, 40), (5, 5, 10, 10, 15, 15, 20, 20)]


def run_tenants(tmp: Path, requests: tuple[int, ...], seconds: float) -> tuple[list[float], float, dict]:
    directory = Path(tempfile.mkdtemp(prefix="vcb", dir="/tmp"))
    daemon = spawn_daemon(directory, "--window", "2s")
    admin = AdminClient(directory / "admin.sock")
    try:
        admin.wait_ready()
        base = {**os.environ, **SimConfig(state_path=tmp / f"sim-{len(requests)}").env()}
        procs = []
        for i, r in enumerate(requests):
            endpoint = admin.call("add", tenant=f"t{i}", request=r)["endpoint"]
            env = tenant_env(Tenant(), base, tmp / f"t{i}-{len(requests)}.ledger")
            env["VCUDA_SCHEDULER"] = str(endpoint)
            procs.append(subprocess.Popen([sys.executable, "-m", "py_vcuda.probe", "spin", "--seconds",
                                           str(seconds)], env=env, stdout=subprocess.PIPE, text=True))
        results = [json.loads(p.communicate(timeout=seconds + 60)[0].strip().splitlines()[-1]) for p in procs]
        stats = admin.call("stats")
    finally:
        admin.close()
        daemon.kill()
        daemon.wait()
    total = sum(r["busy_us"] for r in results)
    wall = max(r["wall_us"] for r in results)
    return [100 * r["busy_us"] / total for r in results], total / wall, stats


def alone_busy(tmp: Path, seconds: float) -> float:
    base = {**os.environ, **SimConfig(state_path=tmp / "sim-alone").env()}
    env = tenant_env(Tenant(), base, tmp / "alone.ledger")
    out = subprocess.run([sys.executable, "-m", "py_vcuda.probe", "spin", "--seconds", str(seconds)], env=env,
                         capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return result["busy_us"] / result["wall_us"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each scenario")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vcuda-bench-") as d:
        tmp = Path(d)
        alone = alone_busy(tmp, args.seconds)
        print(f"one process alone, no scheduler: GPU busy {alone:.3f} of the time (the workload's own gaps)")
        print(f"saturating tenants, {args.seconds:.0f} s each (share of the GPU's work)")
        print(f"  {'tenants':>7}  {'configured':<36}{'achieved':<52}{'max err':>8}{'busy':>7}{'vs alone':>9}")
        for requests in SCENARIOS:
            shares, busy, _ = run_tenants(tmp, requests, args.seconds)
            err = max(abs(s - r) for s, r in zip(shares, requests, strict=True))
            print(f"  {len(requests):>7}  {' / '.join(map(str, requests)):<36}"
                  f"{' / '.join(f'{s:.1f}' for s in shares):<52}{err:>7.2f}p{busy:>7.3f}{busy / alone:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
