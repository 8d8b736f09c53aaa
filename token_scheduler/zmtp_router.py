"""A ZeroMQ ROUTER endpoint (ZMTP 3.0, NULL mechanism, ipc) for the tenant sockets.

Why not pyzmq here: libzmq moves every message through its I/O thread, two
extra thread wake-ups per hop; on this 2-core machine a pyzmq ROUTER echo
costs ~70 us round trip against ~30 us for a plain unix socket, which alone
broke the 50 us handoff goal. The tenant protocol is tiny (one short frame
per message), so the daemon speaks ZMTP itself on non-blocking unix sockets
polled in its own loop. Peers are unchanged: libvcuda's C client and pyzmq
DEALER sockets connect as before (tests use both). The admin socket stays pyzmq.

What a libzmq ROUTER does and this one does too: a routing id per connection
(5 bytes, 0x00 + counter; a peer's own `Identity` property is ignored), peers that
send a frame over the size limit are disconnected, sends to a gone peer fail
at once (ROUTER_MANDATORY), PING commands get a PONG. One difference by design:
a peer's disconnection is reported (`Peer.closed`), so the daemon frees a dead
holder's lease at once instead of waiting for its expiry.
"""

from __future__ import annotations

import errno
import itertools
import socket
import struct
from pathlib import Path

FLAG_MORE, FLAG_LONG, FLAG_COMMAND = 0x01, 0x02, 0x04
MAX_FRAMES = 16          # per message; more is a protocol abuse, not a message
MAX_OUTBUF = 256 * 1024  # queued replies to a peer that stopped reading: then drop it
GREETING = (b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0")
            + b"\0" + b"\0" * 31)
assert len(GREETING) == 64


def _command(name: bytes, body: bytes = b"") -> bytes:
    payload = bytes([len(name)]) + name + body
    if len(payload) > 255:
        return bytes([FLAG_COMMAND | FLAG_LONG]) + struct.pack(">Q", len(payload)) + payload
    return bytes([FLAG_COMMAND, len(payload)]) + payload


def _properties(body: bytes) -> dict[bytes, bytes]:
    """ZMTP metadata: (name-len:1, name, value-len:4 BE, value)*; ValueError if malformed."""
    props: dict[bytes, bytes] = {}
    i = 0
    while i < len(body):
        n = body[i]
        name = body[i + 1:i + 1 + n]
        i += 1 + n
        if len(name) != n or i + 4 > len(body):
            raise ValueError("truncated property")
        (vlen,) = struct.unpack_from(">I", body, i)
        i += 4
        if i + vlen > len(body):
            raise ValueError("truncated property value")
        props[name.lower()] = body[i:i + vlen]
        i += vlen
    return props


READY = _command(b"READY", bytes([11]) + b"Socket-Type" + struct.pack(">I", 6) + b"ROUTER")


class Peer:
    """One connected process: handshake state, input buffer, queued output."""

    def __init__(self, sock: socket.socket, identity: bytes, max_msg: int) -> None:
        self.sock = sock
        self.identity = identity
        self.max_msg = max_msg
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.greeted = False   # the peer's 64-byte greeting arrived
        self.ready = False     # the peer's READY arrived: messages may flow
        self.closed = False
        self.watching_output = False  # the daemon's epoll set waits for writability (outbuf backed up)
        self.frames: list[bytes] = []  # frames of a message still missing its last one

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> list[list[bytes]]:
        """Complete messages now readable; sets `closed` on EOF or a protocol violation."""
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return []
        except OSError:
            self.closed = True
            return []
        if not data:
            self.closed = True
            return []
        self.inbuf += data
        messages: list[list[bytes]] = []
        try:
            self._parse(messages)
        except ValueError:
            self.closed = True
        return messages

    def _parse(self, messages: list[list[bytes]]) -> None:
        buf = self.inbuf
        pos = 0
        if not self.greeted:
            if len(buf) < 64:
                # Check what we have early: a non-ZMTP peer is dropped at once.
                if buf[:1] not in (b"", b"\xff"):
                    raise ValueError("not a ZMTP greeting")
                return
            if buf[0] != 0xFF or buf[9] & 0x01 != 0x01 or buf[10] < 3 or bytes(buf[12:16]) != b"NULL":
                raise ValueError("unsupported ZMTP greeting")
            self.greeted = True
            pos = 64
        while True:
            if len(buf) - pos < 2:
                break
            flags = buf[pos]
            if flags & ~(FLAG_MORE | FLAG_LONG | FLAG_COMMAND):
                raise ValueError("reserved frame flags")
            if flags & FLAG_LONG:
                if len(buf) - pos < 9:
                    break
                (size,) = struct.unpack_from(">Q", buf, pos + 1)
                head = 9
            else:
                size = buf[pos + 1]
                head = 2
            if size > self.max_msg:
                raise ValueError("frame over the size limit")
            if len(buf) - pos - head < size:
                break
            body = bytes(buf[pos + head:pos + head + size])
            pos += head + size
            if flags & FLAG_COMMAND:
                self._command(body)
                continue
            if not self.ready:
                raise ValueError("message before READY")
            self.frames.append(body)
            if len(self.frames) > MAX_FRAMES:
                raise ValueError("too many frames in one message")
            if not flags & FLAG_MORE:
                messages.append([self.identity, *self.frames])
                self.frames = []
        del buf[:pos]

    def _command(self, body: bytes) -> None:
        if not body or len(body) < 1 + body[0]:
            raise ValueError("malformed command")
        name = body[1:1 + body[0]]
        rest = body[1 + body[0]:]
        if name == b"READY":
            if self.ready:
                raise ValueError("second READY")
            props = _properties(rest)
            if props.get(b"socket-type") != b"DEALER":
                raise ValueError("only DEALER peers are served")
            self.ready = True
        elif name == b"PING" and len(rest) >= 2:
            self.send_raw(_command(b"PONG", rest[2:2 + 16]))  # echo the ping context
        # ERROR, PONG and unknown commands: nothing to do

    def send_raw(self, data: bytes) -> bool:
        if self.outbuf:
            self.outbuf += data
        else:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self.closed = True
                return False
            if sent < len(data):
                self.outbuf += data[sent:]
        if len(self.outbuf) > MAX_OUTBUF:
            self.closed = True
            return False
        return True

    def flush(self) -> None:
        """Write queued output (the socket became writable)."""
        try:
            sent = self.sock.send(self.outbuf)
        except BlockingIOError:
            return
        except OSError:
            self.closed = True
            return
        del self.outbuf[:sent]

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def encode_message(frames: list[bytes]) -> bytes:
    out = bytearray()
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        more = FLAG_MORE if i < last else 0
        if len(frame) > 255:
            out += bytes([more | FLAG_LONG]) + struct.pack(">Q", len(frame))
        else:
            out += bytes([more, len(frame)])
        out += frame
    return bytes(out)


class RouterEndpoint:
    """A listening ipc socket and its connected peers, by routing id."""

    _ids = itertools.count(1)

    def __init__(self, path: Path, max_msg: int) -> None:
        self.path = path
        self.max_msg = max_msg
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK
                                      | socket.SOCK_CLOEXEC)
        try:
            self.listener.bind(str(path))
            self.listener.listen(128)
        except OSError:
            self.listener.close()
            raise
        self.peers: dict[bytes, Peer] = {}

    def fileno(self) -> int:
        return self.listener.fileno()

    def accept(self) -> list[Peer]:
        """Every pending connection, greeted (greeting and READY sent at once)."""
        new: list[Peer] = []
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return new
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return new  # out of descriptors: the peer retries; do not spin here
                raise
            conn.setblocking(False)
            identity = b"\0" + struct.pack(">I", next(self._ids) & 0xFFFFFFFF)
            peer = Peer(conn, identity, self.max_msg)
            if peer.send_raw(GREETING + READY):
                self.peers[identity] = peer
                new.append(peer)
            else:
                conn.close()

    def send(self, identity: bytes, payload: bytes) -> bool:
        """Queue one single-frame message; False if that peer is gone (ROUTER_MANDATORY)."""
        peer = self.peers.get(identity)
        if peer is None or peer.closed:
            return False
        return peer.send_raw(encode_message([payload]))

    def drop(self, peer: Peer) -> None:
        self.peers.pop(peer.identity, None)
        peer.close()

    def close(self) -> None:
        for peer in list(self.peers.values()):
            peer.close()
        self.peers.clear()
        self.listener.close()
        self.path.unlink(missing_ok=True)
