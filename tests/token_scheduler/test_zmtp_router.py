"""The daemon's own ZMTP ROUTER side, against libzmq DEALERs and raw sockets."""

from __future__ import annotations

import socket
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from token_scheduler.zmtp_router import GREETING, RouterEndpoint, encode_message

READY = b"\x04\x1c\x05READY\x0bSocket-Type\x00\x00\x00\x06DEALER"


@pytest.fixture
def router() -> Iterator[RouterEndpoint]:
    directory = Path(tempfile.mkdtemp(prefix="vz", dir="/tmp"))
    endpoint = RouterEndpoint(directory / "s.sock", 4096)
    yield endpoint
    endpoint.close()
    directory.rmdir()


def pump(router: RouterEndpoint, until, timeout_s: float = 5.0) -> list[list[bytes]]:  # type: ignore[no-untyped-def]
    """Accept and read until `until(messages)` holds; returns every message read."""
    messages: list[list[bytes]] = []
    deadline = time.monotonic() + timeout_s
    while not until(messages):
        assert time.monotonic() < deadline, f"timed out; got {messages}"
        router.accept()
        for peer in list(router.peers.values()):
            messages += peer.read()
            if peer.closed:
                router.drop(peer)
        time.sleep(0.002)
    return messages


def test_libzmq_dealers_get_their_own_replies(router: RouterEndpoint) -> None:
    ctx = zmq.Context()
    try:
        dealers = [ctx.socket(zmq.DEALER) for _ in range(3)]
        for i, d in enumerate(dealers):
            d.connect(f"ipc://{router.path}")
            d.send(b"hello %d" % i)
        msgs = pump(router, lambda m: len(m) == 3)
        assert len({m[0] for m in msgs}) == 3  # a routing id per connection
        for identity, body in msgs:
            assert router.send(identity, b"re: " + body)
        for i, d in enumerate(dealers):
            assert d.poll(2000) and d.recv() == b"re: hello %d" % i
        big = b"x" * 300  # 8-byte size form both ways
        dealers[0].send(big)
        (identity, body), = pump(router, lambda m: len(m) == 1)
        assert body == big and router.send(identity, big)
        assert dealers[0].poll(2000) and dealers[0].recv() == big
        dealers[1].send_multipart([b"a", b"b"])
        (msg,) = pump(router, lambda m: len(m) == 1)
        assert msg[1:] == [b"a", b"b"]  # multi-part is delivered whole; the daemon refuses it
    finally:
        ctx.destroy(0)


def test_send_to_a_gone_peer_fails(router: RouterEndpoint) -> None:
    ctx = zmq.Context()
    d = ctx.socket(zmq.DEALER)
    d.connect(f"ipc://{router.path}")
    d.send(b"x")
    ((identity, _),) = pump(router, lambda m: len(m) == 1)
    d.close(0)
    ctx.term()
    pump(router, lambda _m: not router.peers)
    assert not router.send(identity, b"late")


def raw_peer(router: RouterEndpoint, greeting: bytes) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(router.path))
    s.sendall(greeting)
    return s


@pytest.mark.parametrize(("desc", "payload"), [
    ("http", b"GET / HTTP/1.1\r\n\r\n" + b"x" * 64),
    ("bad mechanism", GREETING[:12] + b"CURVE".ljust(20, b"\0") + GREETING[32:]),
    ("message before READY", GREETING + encode_message([b"hi"])),
    ("reserved flags", GREETING + READY + b"\x80\x01x"),
    ("oversized frame", GREETING + READY + b"\x02" + struct.pack(">Q", 1 << 20)),
    ("too many frames", GREETING + READY + b"\x01\x01x" * 17 + b"\x00\x01x"),
    ("wrong socket type", GREETING + b"\x04\x1a\x05READY\x0bSocket-Type\x00\x00\x00\x04PAIR"),
])
def test_protocol_violations_close_the_connection(router: RouterEndpoint, desc: str, payload: bytes) -> None:
    s = raw_peer(router, payload)
    try:
        pump(router, lambda _m: router.peers == {} and s.fileno() >= 0 and _closed(s))
    finally:
        s.close()


def _closed(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        while True:
            data = s.recv(4096)
            if not data:
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_ping_command_gets_pong(router: RouterEndpoint) -> None:
    ping = b"\x04\x0b\x04PING\x00\x0aabcd"
    s = raw_peer(router, GREETING + READY + ping)
    try:
        pump(router, lambda _m: any(p.ready for p in router.peers.values()))
        s.settimeout(2)
        data = b""
        while b"PONG" not in data:
            data += s.recv(4096)
        assert data.endswith(b"\x04PONGabcd")
    finally:
        s.close()
