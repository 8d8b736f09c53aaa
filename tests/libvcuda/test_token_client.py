"""libvcuda's token client against a scripted scheduler (token_scheduler's own
ZMTP endpoint, driven by the test), for orderings a real daemon produces only
by chance."""

from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path

from shimtest import parse

from token_scheduler import wire
from token_scheduler.wire import ClientState, MsgType
from token_scheduler.zmtp_router import Peer, RouterEndpoint


class ScriptedScheduler:
    """One tenant endpoint; the test decides what to answer and when."""

    def __init__(self, path: Path) -> None:
        self.endpoint = RouterEndpoint(path, 256)
        self.peer: Peer | None = None
        self.seq = 0
        self.queued: list[wire.Message] = []  # read together with an earlier one

    def next(self, timeout_s: float) -> wire.Message | None:
        """The next client message, or None after timeout_s or once the client hung up."""
        if self.queued:
            return self.queued.pop(0)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            watched = [self.endpoint] + ([self.peer] if self.peer else [])
            ready, _, _ = select.select(watched, [], [], left)
            if self.endpoint in ready:
                self.peer = (self.endpoint.accept() or [self.peer])[0]
            if self.peer is not None and self.peer in ready:
                messages = self.peer.read()
                if self.peer.closed:
                    return None
                self.queued += [wire.decode_client(frames[1]) for frames in messages]
                if self.queued:
                    return self.queued.pop(0)
        return None

    def send(self, payload: bytes) -> None:
        assert self.peer is not None
        self.seq += 1
        assert self.endpoint.send(self.peer.identity, payload)

    def close(self) -> None:
        self.endpoint.close()


def test_a_late_pong_to_a_ping_before_the_request_does_not_ask_twice(tmp_path: Path, cuprobe: Path,
                                                                     shim: Path, sim_env: dict[str, str]) -> None:
    """A scheduler that lost a waiting client's request (it restarted) answers the client's
    PINGs late, two at once, both IDLE. The first makes the client ask again; the second was
    sent before that request and says nothing of it: asking a second time would be a
    duplicate REQUEST, which a scheduler refuses once the first is granted."""
    sched = ScriptedScheduler(tmp_path / "t.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
    # A timeout of 2 s: the client PINGs every 100 ms of silence and is not "lost" meanwhile.
    env.update(sim_env, LD_PRELOAD=str(shim), VCUDA_LEDGER=str(tmp_path / "t.ledger"),
               VCUDA_SCHEDULER=f"ipc://{tmp_path}/t.sock", VCUDA_SCHEDULER_TIMEOUT_MS="2000")
    proc = subprocess.Popen([str(cuprobe), "init", "ctx", "spin:1000:200:10"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = sched.next(30)
        assert first is not None and first.type == MsgType.REQUEST, first
        pings = []
        while len(pings) < 2:  # unanswered, it PINGs again after each 100 ms of silence
            msg = sched.next(5)
            assert msg is not None and msg.type == MsgType.PING, msg
            pings.append(msg.fields[0])
        for nonce in pings:
            sched.send(wire.encode_pong(sched.seq, nonce, 7, ClientState.IDLE, 0))
        requests = 0
        deadline = time.monotonic() + 0.5  # under the next PING, answered WAITING all the same
        while (msg := sched.next(deadline - time.monotonic())) is not None:
            if msg.type == MsgType.REQUEST:
                requests += 1
            elif msg.type == MsgType.PING:
                sched.send(wire.encode_pong(sched.seq, msg.fields[0], 7, ClientState.WAITING, 0))
        assert requests == 1, f"{requests} REQUESTs after two stale IDLE answers"
        # Granted, it runs its work to the end: the one request was enough.
        sched.send(wire.encode_grant(sched.seq, (7 << 32) | 1, 1_000_000, 1000))
        while sched.next(10) is not None:
            pass
        out, err = proc.communicate(timeout=30)
        assert next(d for d in parse(out) if d["cmd"] == "spin")["rc"] == "0", err
    finally:
        proc.kill()
        proc.communicate()
        sched.close()
