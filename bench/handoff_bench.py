"""Token handoff latency with C clients (libvcuda's ZMTP code), next to the Python clients.

    python3 bench/handoff_bench.py [--handoffs 5000] [--runs 1] [--no-python]

Builds bench/c/handoff.c against libvcuda/src/zmtp.c, starts a token
scheduler daemon (window 2 s) in a short temp dir, adds two tenants (request
50, limit 100) and runs the program: RELEASE(MORE) sent by one client -> GRANT
received by the next, CLOCK_MONOTONIC, 200 warm-up handoffs excluded. Both
shapes of C client are run: one thread per client blocking in its own recv
(as in libvcuda) and one thread polling both connections (the shape of the
Python clients in bench/scheduler_bench.py, whose handoff_latency() gives the
Python figure).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from scheduler_bench import handoff_latency  # noqa: E402

from token_scheduler.admin_client import AdminClient  # noqa: E402
from token_scheduler.policy import percentile  # noqa: E402
from token_scheduler.testing import spawn_daemon  # noqa: E402


def build(out_dir: Path) -> Path:
    binary = out_dir / "handoff"
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Ilibvcuda/include", "-Ilibvcuda/src",
                    "bench/c/handoff.c", "libvcuda/src/zmtp.c", "-o", str(binary), "-lpthread"],
                   cwd=REPO, check=True)
    return binary


def c_handoff(binary: Path, handoffs: int, poll: bool) -> dict[str, float]:
    """One daemon, two tenants, one run of the C program; its JSON result."""
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="vh"))
    daemon = spawn_daemon(directory, "--window", "2s")
    admin = AdminClient(directory / "admin.sock")
    try:
        admin.wait_ready(15)
        endpoints = []
        for name in ("a", "b"):
            reply = admin.call("add", tenant=name, request=50, limit=100)
            assert reply["ok"], reply
            endpoints.append(str(reply["endpoint"]))
        cmd = [str(binary), *endpoints, str(handoffs), *(["--poll"] if poll else [])]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"{binary.name} failed ({out.returncode}): {out.stderr.strip()}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        admin.close()
        daemon.kill()
        daemon.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def python_handoff(handoffs: int) -> dict[str, float]:
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="vh"))
    try:
        samples = sorted(handoff_latency(directory / "d", handoffs))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"p50_us": percentile(samples, 0.5) / 1e3, "p99_us": percentile(samples, 0.99) / 1e3,
            "mean_us": statistics.fmean(samples) / 1e3}


def line(label: str, r: dict[str, float]) -> str:
    return f"handoff ({label}): p50 {r['p50_us']:.1f} us, p99 {r['p99_us']:.1f} us, mean {r['mean_us']:.1f} us"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handoffs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=1, help="repeat each measurement (fresh daemon each time)")
    parser.add_argument("--no-python", action="store_true", help="skip the Python-client figure")
    args = parser.parse_args()
    build_dir = Path(tempfile.mkdtemp(dir="/tmp", prefix="vhb"))
    try:
        binary = build(build_dir)
        print(f"## Token handoff, RELEASE(MORE) sent -> next GRANT received, {args.handoffs} handoffs, "
              f"2 tenants 50/50 (goal p50 <= 50 us, p99 <= 200 us)")
        for _ in range(args.runs):
            threads = c_handoff(binary, args.handoffs, poll=False)
            polled = c_handoff(binary, args.handoffs, poll=True)
            print(line("C clients, ZMTP, thread per client", threads))
            print(line("C clients, ZMTP, one polling thread", polled))
            for label, r in (("thread per client", threads), ("polling", polled)):
                if r["self_grants"]:
                    print(f"  {label}: {r['self_grants']} of {r['handoffs']} GRANTs went back to the releaser "
                          f"(policy); to the other client only: p50 {r['other_p50_us']:.1f} us, "
                          f"p99 {r['other_p99_us']:.1f} us")
            if not args.no_python:
                print(line("Python clients, pyzmq", python_handoff(args.handoffs)))
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
