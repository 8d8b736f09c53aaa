"""The handoff floor: what passing a token through any Python process costs on this machine.

    python3 bench/handoff_floor.py DIR      # serves DIR/a.sock and DIR/b.sock until SIGTERM

A stand-in for the token scheduler with no policy at all: the same ZMTP
endpoints (token_scheduler.zmtp_router) and frames (token_scheduler.wire), one
epoll loop, a FIFO queue and one token. bench/handoff_bench.py runs the same C
clients against it and against the real scheduler, alternately, so that the
scheduler's own cost per handoff (its figure minus this one) is measured apart
from the machine's process wake-ups, which on a small virtual machine vary by
tens of microseconds from run to run with where the processes happen to run.
It answers what bench/c/handoff.c sends: REQUEST, RELEASE (MORE), PING.
"""

from __future__ import annotations

import select
import signal
import sys
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from token_scheduler import wire  # noqa: E402
from token_scheduler.wire import ClientState, MsgType  # noqa: E402
from token_scheduler.zmtp_router import RouterEndpoint  # noqa: E402

QUANTUM_US, GRACE_US = 50_000, 10_000


def serve(directory: Path) -> None:
    endpoints = [RouterEndpoint(directory / f"{name}.sock", 4096) for name in ("a", "b")]
    poll = select.epoll()
    listeners = {ep.fileno(): ep for ep in endpoints}
    peers = {}
    for fd in listeners:
        poll.register(fd, select.EPOLLIN)
    holder = None                      # (endpoint, identity)
    queue: deque = deque()             # (endpoint, identity, seq)
    lease = 0
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))

    def grant(endpoint: RouterEndpoint, identity: bytes, seq: int) -> None:
        nonlocal holder, lease
        lease += 1
        holder = (endpoint, identity)
        endpoint.send(identity, wire.encode_grant(seq, lease, QUANTUM_US, GRACE_US))

    while not stopping:
        for fd, _events in poll.poll(0.5):
            if fd in listeners:
                for peer in listeners[fd].accept():
                    peers[peer.fileno()] = (listeners[fd], peer)
                    poll.register(peer.fileno(), select.EPOLLIN)
                continue
            endpoint, peer = peers[fd]
            for frames in peer.read():
                msg = wire.decode_client(frames[1])
                me = (endpoint, frames[0])
                if msg.type == MsgType.REQUEST:
                    if holder is None:
                        grant(endpoint, frames[0], msg.seq)
                    else:
                        queue.append((endpoint, frames[0], msg.seq))
                elif msg.type == MsgType.RELEASE:
                    holder = None
                    if msg.flags & wire.FLAG_MORE:
                        queue.append((endpoint, frames[0], msg.seq))
                    if queue:
                        grant(*queue.popleft())
                elif msg.type == MsgType.PING:
                    state = ClientState.HOLDING if holder == me else (
                        ClientState.WAITING if any(q[:2] == me for q in queue) else ClientState.IDLE)
                    endpoint.send(frames[0], wire.encode_pong(msg.seq, msg.fields[0], 1, state, 0))
            if peer.closed:
                poll.unregister(fd)
                del peers[fd]
                endpoint.drop(peer)
    for endpoint in endpoints:
        endpoint.close()


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
