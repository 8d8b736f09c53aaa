"""Token handoff latency with C clients (libvcuda's ZMTP code), next to the Python clients.

    python3 bench/handoff_bench.py [--handoffs 5000] [--runs 5] [--poll] [--hold-us N] [--no-python]

Builds bench/c/handoff.c against libvcuda/src/zmtp.c, starts a token
scheduler daemon (window 2 s) in a short temp dir, adds two tenants (request
50, limit 100) and runs the program: RELEASE(MORE) sent by one client -> GRANT
received by the next, CLOCK_MONOTONIC, 200 warm-up handoffs excluded. The
clients block in their own recv, one thread each, as in libvcuda (--poll: one
thread polls both connections, the shape of the Python clients).

Each run is paired with a run of the same clients against the floor
(bench/handoff_floor.py: one token passed through a Python relay with no
policy). On a 2-vCPU virtual machine the two process wake-ups of a handoff
cost 25 to 60 us depending on where the scheduler placed the three processes,
and a placement tends to last a whole run, so single runs swing; the pairs
separate the scheduler's own cost (scheduler - floor) from the machine's.
The pairs run twice: with the processes wherever Linux puts them, then all on
one CPU (no cross-CPU wake-up: the figure without the virtual machine's
cross-vCPU cost). Then the Python clients' figure (bench/scheduler_bench.py
handoff_latency()).

Back to back, every process in the chain stays awake and its caches warm.
--hold-us N makes each holder keep the token N us before it releases, as a
tenant running work does (an inference request: ~4 ms): the relay, the
scheduler and the next client have then gone to sleep when the handoff comes,
and each wake-up costs what it costs in production.
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from scheduler_bench import handoff_latency  # noqa: E402

from token_scheduler.admin_client import AdminClient  # noqa: E402
from token_scheduler.policy import percentile  # noqa: E402
from token_scheduler.testing import spawn_daemon  # noqa: E402

MAX_HOLD_US = 40_000  # bench/c/handoff.c's bound: a hold within the scheduler's largest quantum (50 ms)


def build(out_dir: Path) -> Path:
    binary = out_dir / "handoff"
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Ilibvcuda/include", "-Ilibvcuda/src",
                    "bench/c/handoff.c", "libvcuda/src/zmtp.c", "-o", str(binary), "-lpthread"],
                   cwd=REPO, check=True)
    return binary


def _run_client(binary: Path, endpoints: list[str], args: argparse.Namespace) -> dict[str, float]:
    cmd = [str(binary), *endpoints, str(args.handoffs), *(["--poll"] if args.poll else []),
           "--hold-us", str(args.hold_us)]
    held_s = (args.handoffs + 200) * args.hold_us / 1e6  # warm-up included
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120 + 2 * held_s)
    if out.returncode != 0:
        raise RuntimeError(f"{binary.name} failed ({out.returncode}): {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def c_handoff(binary: Path, args: argparse.Namespace) -> dict[str, float]:
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
        return _run_client(binary, endpoints, args)
    finally:
        admin.close()
        daemon.kill()
        daemon.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def floor_handoff(binary: Path, args: argparse.Namespace) -> dict[str, float]:
    """The same C program against bench/handoff_floor.py: a token relay with no policy."""
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="vf"))
    sockets = [directory / "a.sock", directory / "b.sock"]
    relay = subprocess.Popen([sys.executable, str(REPO / "bench" / "handoff_floor.py"), str(directory)])
    try:
        deadline = time.monotonic() + 15
        while not all(s.exists() for s in sockets):
            if relay.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("bench/handoff_floor.py did not start")
            time.sleep(0.01)
        return _run_client(binary, [f"ipc://{s}" for s in sockets], args)
    finally:
        relay.terminate()
        relay.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def python_handoff(handoffs: int) -> dict[str, float]:
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="vh"))
    try:
        samples = sorted(handoff_latency(directory / "d", handoffs))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"p50_us": percentile(samples, 0.5) / 1e3, "p99_us": percentile(samples, 0.99) / 1e3,
            "mean_us": statistics.fmean(samples) / 1e3}


def paired_runs(binary: Path, args: argparse.Namespace) -> list[tuple[dict[str, float], dict[str, float]]]:
    """(floor, scheduler) results, alternating, so that both see the same machine."""
    return [(floor_handoff(binary, args), c_handoff(binary, args)) for _ in range(args.runs)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handoffs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5,
                        help="floor/scheduler pairs, each with fresh processes (default 5)")
    parser.add_argument("--poll", action="store_true",
                        help="C clients in one polling thread instead of a thread per client")
    parser.add_argument("--hold-us", type=int, default=0, metavar="N",
                        help="each holder keeps the token N us before it releases, so that the "
                             "processes sleep between handoffs (default 0: back to back)")
    parser.add_argument("--no-python", action="store_true", help="skip the Python-client figure")
    args = parser.parse_args()
    if args.handoffs <= 0 or args.runs <= 0:
        parser.error("--handoffs and --runs must be positive")
    if not 0 <= args.hold_us <= MAX_HOLD_US:
        parser.error(f"--hold-us must be 0..{MAX_HOLD_US} (within the scheduler's largest quantum)")
    build_dir = Path(tempfile.mkdtemp(dir="/tmp", prefix="vhb"))
    try:
        binary = build(build_dir)
        shape = "one polling thread" if args.poll else "a thread per client, as in libvcuda"
        spacing = f"each held {args.hold_us} us" if args.hold_us else "back to back"
        print(f"## Token handoff, RELEASE(MORE) sent -> next GRANT received; C clients ({shape}), "
              f"{args.handoffs} handoffs per run, {spacing}, 2 tenants 50/50"
              + ("" if args.hold_us else " (goal p50 <= 50 us, p99 <= 200 us)"))
        print("floor = the same clients through bench/handoff_floor.py (a relay with no policy): what "
              "any Python process in the middle costs here; runs alternate so both see the same machine")
        everywhere = os.sched_getaffinity(0)
        layouts = [("as Linux places them", everywhere)]
        if len(everywhere) > 1:
            # Children inherit the affinity: daemon (or relay) and both clients on one CPU, no cross-CPU wake-up.
            layouts.append((f"all on CPU {min(everywhere)}", {min(everywhere)}))
        for label, cpus in layouts:
            os.sched_setaffinity(0, cpus)
            try:
                pairs = paired_runs(binary, args)
            finally:
                os.sched_setaffinity(0, everywhere)
            print(f"\n### processes {label}\n")
            print("| run | floor p50 | floor p99 | scheduler p50 | scheduler p99 | scheduler - floor (p50) |")
            print("|---|---|---|---|---|---|")
            for run, (floor, sched) in enumerate(pairs, 1):
                print(f"| {run} | {floor['p50_us']:.1f} us | {floor['p99_us']:.1f} us | {sched['p50_us']:.1f} us "
                      f"| {sched['p99_us']:.1f} us | {sched['p50_us'] - floor['p50_us']:+.1f} us |")
            med = statistics.median
            print(f"| median | {med(f['p50_us'] for f, _ in pairs):.1f} us "
                  f"| {med(f['p99_us'] for f, _ in pairs):.1f} us | {med(s['p50_us'] for _, s in pairs):.1f} us "
                  f"| {med(s['p99_us'] for _, s in pairs):.1f} us "
                  f"| {med(s['p50_us'] - f['p50_us'] for f, s in pairs):+.1f} us |")
            regrants = sum(s["self_grants"] for _, s in pairs)
            if regrants:
                print(f"\n{regrants} of {args.runs * args.handoffs} scheduler GRANTs went back to the releaser "
                      "(policy: it was below its share); they are counted as handoffs too")
        if not args.no_python:
            r = python_handoff(args.handoffs)
            print(f"\nPython clients (pyzmq DEALER, bench/scheduler_bench.py): p50 {r['p50_us']:.1f} us, "
                  f"p99 {r['p99_us']:.1f} us, mean {r['mean_us']:.1f} us")
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
