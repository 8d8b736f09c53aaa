"""Token scheduler figures: handoff latency, grants/s, and simulated shares.

    PYTHONPATH=. python3 bench/scheduler_bench.py [--handoffs 5000] [--seconds 2]

1. Handoff latency: one client RELEASEs (with MORE), the next GRANT arrives at
   a client of another tenant; p50/p99 over many handoffs (daemon in its own
   process, clients in this one, ipc sockets).
2. Grants per second with 8 and 64 tenants, each with one always-busy client
   that releases the moment it is granted.
3. Shares: the policy on a fake clock, 2/4/8 saturating tenants with unequal
   requests, configured vs achieved over the last window; the busy fraction
   when every handoff costs the measured p50 of (1).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from token_scheduler import wire  # noqa: E402
from token_scheduler.policy import PolicyConfig, percentile  # noqa: E402
from token_scheduler.simulate import SimTenant, Simulation  # noqa: E402
from token_scheduler.testing import AdminClient, TenantClient, spawn_daemon  # noqa: E402
from token_scheduler.wire import MsgType  # noqa: E402


def add_tenants(admin: AdminClient, count: int, context: zmq.Context) -> list[TenantClient]:
    clients = []
    for i in range(count):
        reply = admin.call("add", tenant=f"t{i}", request=max(1, 100 // count), limit=100)
        assert reply["ok"], reply
        clients.append(TenantClient(str(reply["endpoint"]), context))
    return clients


def handoff_latency(directory: Path, handoffs: int) -> list[int]:
    """Nanoseconds from a RELEASE(MORE) being sent to the next GRANT being received."""
    context = zmq.Context()
    proc = spawn_daemon(directory)
    try:
        admin = AdminClient(directory / "admin.sock", context)
        admin.wait_ready(15)
        clients = add_tenants(admin, 2, context)
        poller = zmq.Poller()
        by_sock = {}
        for client in clients:
            poller.register(client.sock, zmq.POLLIN)
            by_sock[client.sock] = client
        holder = clients[0]
        lease = holder.acquire().fields[0]
        clients[1].request()
        samples = []
        for i in range(handoffs + 200):
            start = time.perf_counter_ns()
            holder.release(lease, 1000, more=True)
            events = poller.poll(2000)
            got = time.perf_counter_ns()
            assert events, "no grant"
            holder = by_sock[events[0][0]]
            msg = wire.decode_server(holder.sock.recv())
            assert msg.type == MsgType.GRANT, msg
            lease = msg.fields[0]
            if i >= 200:  # warm-up excluded
                samples.append(got - start)
        return samples
    finally:
        proc.kill()
        proc.wait(10)
        context.destroy(linger=0)


def grants_per_second(directory: Path, tenants: int, seconds: float) -> float:
    context = zmq.Context()
    proc = spawn_daemon(directory)
    try:
        admin = AdminClient(directory / "admin.sock", context)
        admin.wait_ready(15)
        clients = add_tenants(admin, tenants, context)
        poller = zmq.Poller()
        by_sock = {}
        for client in clients:
            poller.register(client.sock, zmq.POLLIN)
            by_sock[client.sock] = client
            client.request()
        grants = 0
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            for sock, _ in poller.poll(1000):
                client = by_sock[sock]
                msg = wire.decode_server(sock.recv())
                if msg.type == MsgType.GRANT:
                    grants += 1
                    client.release(msg.fields[0], 1000, more=True)
        return grants / (time.perf_counter() - start)
    finally:
        proc.kill()
        proc.wait(10)
        context.destroy(linger=0)


def share_table(handoff_ns: int) -> None:
    config = PolicyConfig()  # daemon defaults: window 10 s, quanta 1..50 ms, grace 10 ms
    window = config.window_ns
    cases = [[30, 70], [10, 20, 30, 40], [5, 5, 10, 10, 15, 15, 20, 20]]
    print("\n## Shares (policy on a fake clock, saturating tenants, limit = request,"
          " last 10 s of 30 s)")
    print("| tenants | configured % | achieved % | max abs error pp |")
    print("|---|---|---|---|")
    for requests in cases:
        tenants = [SimTenant(f"t{i}", r, r) for i, r in enumerate(requests)]
        result = Simulation(config, tenants).run(3 * window)
        achieved = [100 * result.share(f"t{i}", 2 * window, 3 * window)
                    for i in range(len(requests))]
        error = max(abs(a - r) for a, r in zip(achieved, requests, strict=True))
        print(f"| {len(requests)} | {' / '.join(map(str, requests))} | "
              f"{' / '.join(f'{a:.2f}' for a in achieved)} | {error:.2f} |")
    tenants = [SimTenant("a", 50, 100), SimTenant("b", 50, 100)]
    result = Simulation(config, tenants, handoff_ns=handoff_ns).run(3 * window)
    busy = sum(result.share(n, 2 * window, 3 * window) for n in ("a", "b"))
    print(f"\nBusy fraction, 2 saturating tenants 50/50, each handoff costing the measured "
          f"p50 ({handoff_ns / 1000:.0f} us): {busy:.4f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handoffs", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tsb-", dir="/tmp"))
    try:
        samples = sorted(handoff_latency(root / "h", args.handoffs))
        p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
        print("## Token handoff (RELEASE sent -> next GRANT received, Python clients, ipc)")
        print(f"handoffs {len(samples)}: p50 {p50 / 1000:.1f} us, p99 {p99 / 1000:.1f} us, "
              f"mean {statistics.fmean(samples) / 1000:.1f} us "
              f"(goal p50 <= 50 us, p99 <= 200 us)")
        print("\n## Grants per second (one busy client per tenant, release on grant)")
        for count in (8, 64):
            rate = grants_per_second(root / f"g{count}", count, args.seconds)
            print(f"{count} tenants: {rate:,.0f} grants/s")
        share_table(p50)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
