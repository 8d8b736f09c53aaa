"""Protocol fuzzing against a running daemon: it answers or drops, never dies, and the
tenant next door keeps getting the GPU."""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from token_scheduler import wire
from token_scheduler.policy import MS, SECOND, PolicyConfig
from token_scheduler.testing import AdminClient, TenantClient, daemon_thread, spawn_daemon
from token_scheduler.wire import MsgType

VALID = [
    lambda r: wire.encode_request(r.getrandbits(32), r.getrandbits(32), r.getrandbits(20)),
    lambda r: wire.encode_release(r.getrandbits(32), r.getrandbits(64), r.getrandbits(64),
                                  r.random() < 0.5),
    lambda r: wire.encode_renew(r.getrandbits(32), r.getrandbits(64), r.getrandbits(64)),
    lambda r: wire.encode_ping(r.getrandbits(32), r.getrandbits(64)),
    lambda r: wire.encode_report(r.getrandbits(32), r.getrandbits(32), r.getrandbits(64)),
]
SERVER = [
    lambda r: wire.encode_grant(1, r.getrandbits(64), 1, 1),
    lambda r: wire.encode_revoke(1, r.getrandbits(64), r.getrandbits(32)),
    lambda r: wire.encode_budget(1, r.getrandbits(32), r.getrandbits(32)),
]


def malformed(r: random.Random) -> bytes:
    """One hostile frame; mostly invalid, sometimes valid-but-out-of-order."""
    kind = r.randrange(8)
    base = r.choice(VALID)(r)
    if kind == 0:
        return r.randbytes(r.randrange(64))
    if kind == 1:  # bit flips in a valid frame
        frame = bytearray(base)
        for _ in range(r.randint(1, 3)):
            frame[r.randrange(len(frame))] ^= 1 << r.randrange(8)
        return bytes(frame)
    if kind == 2:  # truncated or padded
        return base[: r.randrange(len(base))] if r.random() < 0.5 else base + r.randbytes(9)
    if kind == 3:  # any type, any flags, any body length field
        body = r.randbytes(r.randrange(40))
        return wire.HEADER.pack(b"VCTS", 1, r.randrange(256), r.getrandbits(16),
                                r.getrandbits(32), r.getrandbits(32) if r.random() < 0.3
                                else len(body)) + body
    if kind == 4:  # other versions
        return base[:4] + bytes([r.choice([0, 2, 255])]) + base[5:]
    if kind == 5:  # server frames sent by a client
        return r.choice(SERVER)(r)
    if kind == 6:  # header says huge body
        return base[:12] + struct.pack("<I", 0xFFFFFFFF) + base[16:]
    return base  # valid shape: stale leases, pings, the odd request


def cycle(client: TenantClient, budget_s: float) -> float:
    start = time.monotonic()
    lease = client.acquire(budget_s).fields[0]
    client.release(lease, 100_000)
    return time.monotonic() - start


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_fuzz_100k_frames_against_daemon_process(short_dir: Path) -> None:
    directory = short_dir / "sched"
    proc = spawn_daemon(directory, "--window", "1s", "--quantum-max", "5ms", "--grace", "5ms")
    context = zmq.Context()
    try:
        admin = AdminClient(directory / "admin.sock", context)
        admin.wait_ready(15)
        fuzz_ep = admin.call("add", tenant="fuzz", request=50)["endpoint"]
        # `high`: a fuzz holder is revoked when it asks, and ignoring that costs it the lease.
        good = TenantClient(str(admin.call("add", tenant="good", request=50,
                                           priority="high")["endpoint"]), context)
        fuzzers = [TenantClient(str(fuzz_ep), context) for _ in range(4)]
        rng = random.Random(20240601)
        sent = replies = 0
        worst = 0.0
        while sent < 100_000:
            fuzzer = fuzzers[sent % len(fuzzers)]
            frame = malformed(rng)
            try:
                if rng.random() < 0.002:
                    fuzzer.sock.send_multipart([frame, b"x"], zmq.NOBLOCK)
                else:
                    fuzzer.sock.send(frame, zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                pass
            while fuzzer.sock.poll(0):
                fuzzer.sock.recv()
                replies += 1
            if sent % 2000 == 0:
                # The fuzz tenant may hold a lease it never releases: at most one
                # quantum + grace each time, so the good tenant waits little.
                worst = max(worst, cycle(good, 2.0))
        assert proc.poll() is None, "daemon died"
        assert replies > 50_000
        assert worst < 0.5
        stats = admin.call("stats")["tenants"]
        assert stats["fuzz"]["errors"] > 50_000  # type: ignore[index]
        assert stats["good"]["errors"] == 0  # type: ignore[index]
        for _ in range(20):
            assert cycle(good, 2.0) < 0.5
    finally:
        proc.kill()
        proc.wait(10)
        context.destroy(linger=0)


@pytest.mark.timeout(60)
def test_hypothesis_frames_against_daemon(short_dir: Path) -> None:
    config = PolicyConfig(window_ns=SECOND, quantum_max_ns=5 * MS, grace_ns=5 * MS)
    context = zmq.Context()
    with daemon_thread(short_dir / "sched", config) as daemon:
        admin = AdminClient(daemon.directory / "admin.sock", context)
        admin.wait_ready()
        fuzzer = TenantClient(str(admin.call("add", tenant="f", request=50)["endpoint"]),
                              context)
        good = TenantClient(str(admin.call("add", tenant="g", request=50,
                                           priority="high")["endpoint"]), context)

        @settings(max_examples=300, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(st.one_of(st.binary(max_size=80),
                         st.builds(lambda t, f, n, b: wire.HEADER.pack(b"VCTS", 1, t, f, n,
                                                                       len(b)) + b,
                                   st.integers(0, 255), st.integers(0, 0xFFFF),
                                   st.integers(0, 2**32 - 1), st.binary(max_size=32))))
        def send(frame: bytes) -> None:
            fuzzer.send_raw(frame)
            fuzzer.ping(0xFEED)  # answered after the frame: read up to its PONG
            while True:
                msg = fuzzer.recv(2000)
                assert msg is not None, "daemon stopped answering"
                assert msg.type in (MsgType.ERROR, MsgType.PONG, MsgType.GRANT, MsgType.REVOKE)
                if msg.type == MsgType.PONG and msg.fields[0] == 0xFEED:
                    break

        send()
        assert cycle(good, 2.0) < 0.5
        assert admin.call("ping")["ok"]
    context.destroy(linger=0)
