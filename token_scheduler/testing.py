"""Python stand-ins for the libvcuda token client and the admin, plus daemon runners.

Used by tests and bench/scheduler_bench.py. TenantClient follows the client
state machine of PROTOCOL.md, including recovery after a daemon restart.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq

from . import wire
from .admin_client import AdminClient  # noqa: F401  (re-exported for tests)
from .daemon import Daemon
from .policy import PolicyConfig
from .wire import ClientState, Message, MsgType

REPO_ROOT = Path(__file__).resolve().parents[1]


class ErrorReply(Exception):
    """The scheduler answered with an ERROR frame."""

    def __init__(self, msg: Message) -> None:
        code, ref = msg.fields
        super().__init__(f"error {code}: {msg.text} (ref {ref})")
        self.code = code
        self.ref = ref
        self.msg = msg


class TenantClient:
    """One process of a tenant: a DEALER on the tenant's endpoint."""

    def __init__(self, endpoint: str, context: zmq.Context | None = None) -> None:
        self.context = context or zmq.Context.instance()
        self.sock = self.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RECONNECT_IVL, 20)
        self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, 200)
        self.sock.connect(endpoint)
        self.seq = 0
        self.epoch: int | None = None
        self.budget_us: int | None = None  # the last in-flight budget the scheduler sent
        # Nonces of the PINGs sent since the last REQUEST or RELEASE(MORE): only their PONGs tell
        # whether that request was lost. A PONG to an older PING describes the state before it.
        self._pings_since_ask: set[int] = set()

    def close(self) -> None:
        self.sock.close(0)

    def _next_seq(self) -> int:
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        return self.seq

    def send_raw(self, frame: bytes) -> None:
        self.sock.send(frame)

    def request(self, predicted_us: int = 0) -> None:
        self._pings_since_ask.clear()
        self.sock.send(wire.encode_request(self._next_seq(), os.getpid(), predicted_us))

    def release(self, lease_id: int, held_ns: int, more: bool = False) -> None:
        if more:
            self._pings_since_ask.clear()
        self.sock.send(wire.encode_release(self._next_seq(), lease_id, held_ns, more))

    def renew(self, lease_id: int, held_ns: int) -> None:
        self.sock.send(wire.encode_renew(self._next_seq(), lease_id, held_ns))

    def ping(self, nonce: int | None = None) -> None:
        """PING; the nonce is the frame's seq unless given (as libvcuda's)."""
        seq = self._next_seq()
        nonce = seq if nonce is None else nonce
        self._pings_since_ask.add(nonce)
        self.sock.send(wire.encode_ping(seq, nonce))

    def report(self, budget_hits: int, budget_wait_ns: int) -> None:
        self.sock.send(wire.encode_report(self._next_seq(), budget_hits, budget_wait_ns))

    def recv(self, timeout_ms: int, keep_budget: bool = False) -> Message | None:
        """The next server frame, or None after timeout_ms. BUDGET frames are noted in
        `budget_us` and skipped unless `keep_budget`."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left_ms = max(0, round((deadline - time.monotonic()) * 1000))
            if not self.sock.poll(left_ms):
                return None
            msg = wire.decode_server(self.sock.recv())
            if msg.type == MsgType.BUDGET:
                self.budget_us = msg.fields[0]
                if not keep_budget:
                    continue
            return msg

    def expect(self, msg_type: MsgType, timeout_ms: int = 2000) -> Message:
        msg = self.recv(timeout_ms)
        if msg is None:
            raise TimeoutError(f"no {msg_type.name} within {timeout_ms} ms")
        if msg.type == MsgType.ERROR and msg_type != MsgType.ERROR:
            raise ErrorReply(msg)
        if msg.type != msg_type:
            raise AssertionError(f"expected {msg_type.name}, got {msg.type.name}")
        return msg

    def wait_grant(self, timeout_s: float, ping_every_s: float = 0.1) -> Message:
        """Wait for a GRANT after REQUEST or RELEASE(MORE).

        While waiting, PING now and then: a PONG saying IDLE means the request
        was lost (daemon restarted), so REQUEST again, as PROTOCOL.md asks; but
        only the PONG to a PING sent after the request. One to an earlier PING
        (still queued when an ERROR or GRANT ended the previous wait) says IDLE
        of the time before the request: asking again would make a second request,
        which the scheduler refuses once the first is granted.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no GRANT")
            msg = self.recv(int(min(left, ping_every_s) * 1000) + 1)
            if msg is None:
                self.ping()
                continue
            if msg.type == MsgType.GRANT:
                return msg
            if msg.type == MsgType.PONG:
                self.epoch = msg.fields[1]
                if msg.fields[2] == ClientState.IDLE and msg.fields[0] in self._pings_since_ask:
                    self.request()
                continue
            raise ErrorReply(msg)

    def acquire(self, timeout_s: float = 5.0, predicted_us: int = 0) -> Message:
        self.request(predicted_us)
        return self.wait_grant(timeout_s)


@contextmanager
def daemon_thread(
    directory: Path, config: PolicyConfig, gpu: str = "0"
) -> Iterator[Daemon]:
    """Run a Daemon in a background thread (its own zmq context) until the block ends."""
    context = zmq.Context()
    daemon = Daemon(directory, gpu, config, context=context)
    daemon.idle_poll_ms = 20  # notice the stop request quickly
    stop = threading.Event()
    started = threading.Event()
    failure: list[BaseException] = []

    def main() -> None:
        try:
            daemon.start()
        except BaseException as exc:  # report to the caller's thread
            failure.append(exc)
            started.set()
            return
        started.set()
        daemon.serve(stop.is_set)

    thread = threading.Thread(target=main, name="token-scheduler", daemon=True)
    thread.start()
    started.wait(10)
    if failure:
        raise failure[0]
    try:
        yield daemon
    finally:
        stop.set()
        thread.join(5)
        daemon.close()
        context.term()


def spawn_daemon(directory: Path, *extra: str, gpu: str = "0") -> subprocess.Popen[bytes]:
    """Start `python -m token_scheduler` as a child process (for SIGKILL tests, benches)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "token_scheduler", "--gpu", gpu, "--dir", str(directory),
           "--log-level", "warning", *extra]
    return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
