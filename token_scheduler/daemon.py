"""The per-GPU scheduler daemon: sockets and event loop around the policy.

One ROUTER endpoint per tenant (DIR/tenants/<name>/sched.sock, ZMTP spoken by
zmtp_router, see there why not libzmq): a message's tenant is the socket it
arrived on, its process is the connection's routing id; a closed connection
frees what that process held. One pyzmq REP socket for the admin
(DIR/admin.sock, DIR is 0700). A single thread
waits on them all in one epoll set with no sleeps: a RELEASE is answered by the
next GRANT in the same loop turn, and the only timers (lease expiry, limit
re-check) come from the policy's next deadline.

The handoff (RELEASE in, GRANT out) is the latency that matters, so that path
is kept lean: epoll rather than zmq.Poller (which rebuilds its poll set and
converts flags on every call), and a peer's epoll registration changes only
when its output backs up. What is left costs ~7 us over a relay with no policy
(bench/handoff_bench.py). After every decision the policy is asked whether a
waiting `high` tenant preempts the holder (a REVOKE frame), and each client is
told the in-flight budget (a BUDGET frame) before a GRANT whenever it changed
since it was last told, and at once while it holds the token. The admin socket joins the set through its ZMQ_FD,
whose readiness only means "look at ZMQ_EVENTS": it is drained until
ZMQ_EVENTS says no more.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import select
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq

from . import admin, dirlock, state, wire
from .errors import ErrorCode, PolicyError
from .policy import NORMAL, Policy, PolicyConfig, validate_priority, validate_quota
from .record import Recorder
from .wire import MsgType, WireError
from .zmtp_router import Peer, RouterEndpoint

log = logging.getLogger("token_scheduler")

TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
SOCKET_NAME = "sched.sock"
ADMIN_SOCKET = "admin.sock"
MAX_IPC_PATH = 107  # sun_path minus the terminating NUL
IDLE_POLL_MS = 500  # wake this often with nothing due, to notice a stop request
# A turn that wakes this long past its timeout, or takes this long, was held up by the host (a busy
# CPU, a blocked write), not by the policy: every tenant's handoff waited that long. `stats` keeps
# the last STALLS_KEPT of them, so that a share that fell short can be told from a node that stalled.
STALL_NS = 5_000_000
STALLS_KEPT = 64
TENANT_MAX_MSG = 4096  # larger frames make libzmq drop the sender's connection
ADMIN_MAX_MSG = 65536
_IN = select.EPOLLIN
_IN_OUT = select.EPOLLIN | select.EPOLLOUT
_INPUT_EVENTS = select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP


class AdminRefused(ValueError):
    """An admin request that is well-formed but not allowed (message for the caller)."""


@dataclass
class Endpoint:
    name: str
    path: Path
    socket: RouterEndpoint

    @property
    def url(self) -> str:
        return f"ipc://{self.path}"


class Daemon:
    """Owns the sockets of one GPU's scheduler; call start(), serve(), close()."""

    def __init__(
        self,
        directory: Path,
        gpu: str,
        config: PolicyConfig,
        context: zmq.Context | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        epoch: int | None = None,
        record: Path | None = None,
    ) -> None:
        self.directory = Path(directory).absolute()
        self.gpu = gpu
        self.clock = clock
        self.policy = Policy(config, clock, epoch or secrets.randbelow(2**32 - 1) + 1)
        # Every call into the policy and its clock readings, for a later replay (--record).
        self._recorder = Recorder(record, self.policy) if record is not None else None
        self._own_context = context is None
        self.context = context or zmq.Context()
        self._endpoints: dict[str, Endpoint] = {}
        # fd -> (endpoint, peer or None for the listener); the admin socket's ZMQ_FD is _admin_fd
        self._by_fd: dict[int, tuple[Endpoint, Peer | None]] = {}
        self._epoll = select.epoll()
        self._admin: zmq.Socket | None = None
        self._admin_fd = -1
        self._lock_fd = -1
        self.idle_poll_ms = IDLE_POLL_MS
        # The (budget, idle) each client was last told in a BUDGET frame, by (tenant, routing id).
        self._told_budget: dict[tuple[str, bytes], tuple[int, int]] = {}
        self._stalls: deque[tuple[int, int]] = deque(maxlen=STALLS_KEPT)  # (when it began, ns)
        self.stall_count = 0

    # --- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Create and lock DIR, restore saved tenants, bind every socket.

        Raises dirlock.DirectoryBusy, before touching DIR's contents, if another daemon serves it.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # admin socket and state are root's alone
        self._lock_fd = dirlock.acquire(self.directory)
        (self.directory / "tenants").mkdir(exist_ok=True)
        for spec in state.load(self.directory, self.gpu):
            self.policy.add_tenant(spec.name, spec.request, spec.limit, spec.priority)
            self._open_endpoint(spec.name)
        admin_sock = self.context.socket(zmq.REP)
        admin_sock.setsockopt(zmq.LINGER, 0)
        admin_sock.setsockopt(zmq.MAXMSGSIZE, ADMIN_MAX_MSG)
        self._bind(admin_sock, self.directory / ADMIN_SOCKET, 0o600)
        self._admin = admin_sock
        self._admin_fd = admin_sock.getsockopt(zmq.FD)
        self._epoll.register(self._admin_fd, _IN)
        log.info("scheduler for GPU %s in %s: %d tenants restored, epoch %08x",
                 self.gpu, self.directory, len(self._endpoints), self.policy.epoch)

    def close(self) -> None:
        if self._recorder is not None:
            self._recorder.close()
        for endpoint in list(self._endpoints.values()):
            endpoint.socket.close()
        self._endpoints.clear()
        self._by_fd.clear()
        if self._admin is not None:
            with contextlib.suppress(OSError):
                self._epoll.unregister(self._admin_fd)
            self._admin.close(0)
            self._admin = None
            self._admin_fd = -1
        self._epoll.close()
        if self._own_context:
            self.context.term()
        if self._lock_fd >= 0:  # last: a successor may take DIR only once our sockets are gone
            os.close(self._lock_fd)
            self._lock_fd = -1

    def serve(self, should_stop: Callable[[], bool]) -> None:
        """Run the event loop until should_stop() is true (checked every turn)."""
        while not should_stop():
            self.turn()

    def turn(self) -> None:
        """One wait and everything it delivered; public for tests and benches."""
        timeout_s = self._timeout_s()
        asleep = self.clock()
        try:
            ready = self._epoll.poll(timeout_s)
        except InterruptedError:  # a signal: the caller's should_stop() decides
            return
        woke = self.clock()
        if not ready:  # woken by the timeout: anything past it is the host's
            self._note_stall(asleep + int(timeout_s * 1e9), woke)
        for fd, events in ready:
            if fd == self._admin_fd:
                self._serve_admin()
                continue
            entry = self._by_fd.get(fd)
            if entry is None:  # closed earlier in this turn
                continue
            endpoint, peer = entry
            if peer is None:
                self._accept(endpoint)
            else:
                self._serve_peer(endpoint, peer, events)
        self._dispatch()
        self._note_stall(woke, self.clock())

    def _note_stall(self, start: int, end: int) -> None:
        if end - start >= STALL_NS:
            self.stall_count += 1
            self._stalls.append((start, end - start))

    def _timeout_s(self) -> float:
        deadline = self.policy.next_deadline()
        if deadline is None:
            return self.idle_poll_ms / 1000
        wait_ns = deadline - self.clock()
        # Whole milliseconds, rounded up (epoll's resolution): never wake before the deadline.
        return max(0, min(self.idle_poll_ms, -(-wait_ns // 1_000_000))) / 1000

    # --- tenant sockets -----------------------------------------------------------

    @staticmethod
    def _claim_path(path: Path) -> None:
        if len(str(path)) > MAX_IPC_PATH:
            raise AdminRefused(f"socket path too long for ipc ({len(str(path))} bytes): {path}")
        path.unlink(missing_ok=True)  # left by a killed predecessor

    def _bind(self, sock: zmq.Socket, path: Path, mode: int) -> None:
        self._claim_path(path)
        sock.bind(f"ipc://{path}")
        os.chmod(path, mode)

    def _open_endpoint(self, name: str) -> Endpoint:
        folder = self.directory / "tenants" / name
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)
        path = folder / SOCKET_NAME
        self._claim_path(path)
        sock = RouterEndpoint(path, TENANT_MAX_MSG)
        # Any process of the container may connect: the mount is the access control.
        os.chmod(path, 0o666)
        endpoint = Endpoint(name, path, sock)
        self._endpoints[name] = endpoint
        self._by_fd[sock.fileno()] = (endpoint, None)
        self._epoll.register(sock.fileno(), _IN)
        return endpoint

    def _close_endpoint(self, name: str) -> None:
        endpoint = self._endpoints.pop(name)
        for peer in list(endpoint.socket.peers.values()):
            self._unwatch(peer)
        self._unwatch(endpoint.socket)
        endpoint.socket.close()
        with contextlib.suppress(OSError):  # not empty or mounted somewhere: leave it
            endpoint.path.parent.rmdir()

    def _accept(self, endpoint: Endpoint) -> None:
        for peer in endpoint.socket.accept():
            self._by_fd[peer.fileno()] = (endpoint, peer)
            peer.watching_output = bool(peer.outbuf)
            self._epoll.register(peer.fileno(), _IN_OUT if peer.outbuf else _IN)

    def _unwatch(self, sock: Peer | RouterEndpoint) -> None:
        fd = sock.fileno()
        if self._by_fd.pop(fd, None) is not None:
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)

    def _serve_peer(self, endpoint: Endpoint, peer: Peer, events: int) -> None:
        if events & select.EPOLLOUT:
            peer.flush()
        if events & _INPUT_EVENTS:
            for frames in peer.read():  # one read of at most 64 KiB bounds a turn
                try:
                    self._handle(endpoint, frames)
                except Exception:  # a bug must cost one message, never the daemon
                    log.exception("internal error on tenant %s", endpoint.name)
                    error = wire.encode_error(0, ErrorCode.INTERNAL, "internal error")
                    self._send(endpoint, frames[0], error)
        self._settle(endpoint, peer)

    def _settle(self, endpoint: Endpoint, peer: Peer) -> None:
        """Drop a closed peer (freeing what it held) or poll it for output it still owes."""
        if self._by_fd.get(peer.fileno(), (None, None))[1] is not peer:
            return  # already dropped
        if peer.closed:
            self._unwatch(peer)
            endpoint.socket.drop(peer)
            # The process is gone (or broke the protocol): its lease and place in line go too.
            self.policy.client_gone(endpoint.name, peer.identity)
            self._told_budget.pop((endpoint.name, peer.identity), None)
            return
        backed_up = bool(peer.outbuf)
        if backed_up != peer.watching_output:  # rare: only a peer that stopped reading
            peer.watching_output = backed_up
            self._epoll.modify(peer.fileno(), _IN_OUT if backed_up else _IN)

    def _handle(self, endpoint: Endpoint, frames: list[bytes]) -> None:
        client = frames[0]
        name = endpoint.name
        if len(frames) != 2:
            self.policy.note_error(name)
            self._send(endpoint, client, wire.encode_error(
                0, ErrorCode.MALFORMED, "expected exactly one frame per message (DEALER)"))
            return
        try:
            msg = wire.decode_client(frames[1])
        except WireError as err:
            self.policy.note_error(name)
            self._send(endpoint, client, wire.encode_error(err.seq, err.code, err.message, err.ref))
            return
        try:
            if msg.type == MsgType.RELEASE:
                lease_id, held_ns = msg.fields
                more = bool(msg.flags & wire.FLAG_MORE)
                self.policy.release(name, client, lease_id, held_ns, more, msg.seq)
                self._dispatch()
            elif msg.type == MsgType.REQUEST:
                _pid, _reserved, predicted_us = msg.fields
                self.policy.request(name, client, predicted_us * 1000, msg.seq)
                self._dispatch()
            elif msg.type == MsgType.RENEW:
                grant = self.policy.renew(name, client, msg.fields[0], msg.seq)
                self._send_grant(endpoint, grant.client, grant.lease_id, grant.quantum_ns, msg.seq)
            elif msg.type == MsgType.REPORT:
                hits, _reserved, wait_ns = msg.fields
                self.policy.report(name, hits, wait_ns)
            else:  # PING
                client_state, lease_id = self.policy.client_state(name, client)
                self._send(endpoint, client, wire.encode_pong(
                    msg.seq, msg.fields[0], self.policy.epoch, wire.ClientState(client_state),
                    lease_id))
        except PolicyError as err:
            self.policy.note_error(name)
            self._send(endpoint, client, wire.encode_error(msg.seq, err.code, err.message, err.ref))

    def _send(self, endpoint: Endpoint, client: bytes, payload: bytes) -> bool:
        """False if the client is gone or stopped reading (like ROUTER_MANDATORY)."""
        ok = endpoint.socket.send(client, payload)
        peer = endpoint.socket.peers.get(client)
        if peer is not None and (peer.closed or peer.outbuf):
            self._settle(endpoint, peer)
        return ok

    def _send_grant(
        self, endpoint: Endpoint, client: bytes, lease_id: int, quantum_ns: int, seq: int
    ) -> bool:
        budget = (self.policy.budget_ns(endpoint.name), self.policy.idle_ns(endpoint.name))
        key = (endpoint.name, client)
        if self._told_budget.get(key) != budget:
            self._told_budget[key] = budget
            self._send(endpoint, client, wire.encode_budget(seq, budget[0] // 1000, budget[1] // 1000))
        frame = wire.encode_grant(seq, lease_id, quantum_ns // 1000, self.policy.config.grace_ns // 1000,
                                  no_renew=not self.policy.renewable(endpoint.name))
        return self._send(endpoint, client, frame)

    def _dispatch(self) -> None:
        while (grant := self.policy.dispatch()) is not None:
            endpoint = self._endpoints[grant.tenant]
            if self._send_grant(endpoint, grant.client, grant.lease_id, grant.quantum_ns,
                                grant.seq):
                break
            log.debug("tenant %s: client gone before its grant", grant.tenant)
            self.policy.client_gone(grant.tenant, grant.client)
        revoke = self.policy.preempt()
        if revoke is not None:
            frame = wire.encode_revoke(0, revoke.lease_id, revoke.budget_ns // 1000)
            log.debug("tenant %s: lease %x revoked", revoke.tenant, revoke.lease_id)
            if not self._send(self._endpoints[revoke.tenant], revoke.client, frame):
                self.policy.client_gone(revoke.tenant, revoke.client)
                self._dispatch()

    def _tell_holder_budget(self) -> None:
        """The budget changed (a `high` tenant came or went): the holder learns it mid-lease."""
        lease = self.policy.lease
        if lease is None:
            return
        key = (lease.tenant, lease.client)
        budget = (self.policy.budget_ns(lease.tenant), self.policy.idle_ns(lease.tenant))
        if self._told_budget.get(key, budget) != budget:
            self._told_budget[key] = budget
            self._send(self._endpoints[lease.tenant], lease.client,
                       wire.encode_budget(0, budget[0] // 1000, budget[1] // 1000))

    # --- admin ---------------------------------------------------------------------

    def _serve_admin(self) -> None:
        """Every admin request queued now: ZMQ_FD fires once per change, not once per message."""
        sock = self._admin
        assert sock is not None
        while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            reply = admin.handle(self, frames)
            try:
                sock.send(reply, zmq.NOBLOCK)
            except zmq.ZMQError:
                log.warning("admin client went away before its reply")

    def _check_total(self, name: str, request: int) -> None:
        others = sum(t.request for t in self.policy.tenants.values() if t.name != name)
        if others + request > 100:
            raise AdminRefused(
                f"requests would sum to {others + request}% > 100%: a request is a guarantee")

    def _save(self) -> None:
        specs = [state.TenantSpec(t.name, t.request, t.limit, t.priority)
                 for t in self.policy.tenants.values()]
        state.save(self.directory, self.gpu, specs)

    def add_tenant(self, name: str, request: int, limit: int,
                   priority: str = NORMAL) -> dict[str, object]:
        if not TENANT_NAME.match(name):
            raise AdminRefused(f"bad tenant name {name!r} (letters, digits, _ . -; max 63)")
        if name in self._endpoints:
            raise AdminRefused(f"tenant {name!r} exists (use update)")
        validate_quota(request, limit)
        validate_priority(priority)
        self._check_total(name, request)
        endpoint = self._open_endpoint(name)
        self.policy.add_tenant(name, request, limit, priority)
        try:
            self._save()
        except OSError:
            self.policy.remove_tenant(name)
            self._close_endpoint(name)
            raise
        self._tell_holder_budget()  # a `high` tenant shrinks the others' budgets
        log.info("tenant %s added: request %d%% limit %d%% priority %s", name, request, limit,
                 priority)
        return {"tenant": name, "endpoint": endpoint.url, "socket": str(endpoint.path)}

    def update_tenant(self, name: str, request: int | None, limit: int | None,
                      priority: str | None = None) -> dict[str, object]:
        tenant = self.policy.tenants.get(name)
        if tenant is None:
            raise AdminRefused(f"no tenant {name!r}")
        old = (tenant.request, tenant.limit, tenant.priority)
        request = tenant.request if request is None else request
        limit = max(tenant.limit, request) if limit is None else limit
        priority = tenant.priority if priority is None else priority
        validate_quota(request, limit)
        validate_priority(priority)
        self._check_total(name, request)
        self.policy.update_tenant(name, request, limit, priority)
        try:
            self._save()
        except OSError:
            self.policy.update_tenant(name, *old)
            raise
        self._tell_holder_budget()
        self._dispatch()  # a tenant that became `high` while waiting may preempt the holder
        log.info("tenant %s updated: request %d%% limit %d%% priority %s", name, request, limit,
                 priority)
        return {"tenant": name, "request": request, "limit": limit, "priority": priority}

    def remove_tenant(self, name: str) -> dict[str, object]:
        if name not in self._endpoints:
            raise AdminRefused(f"no tenant {name!r}")
        self.policy.remove_tenant(name)
        self._close_endpoint(name)
        self._told_budget = {k: v for k, v in self._told_budget.items() if k[0] != name}
        self._save()
        self._tell_holder_budget()
        self._dispatch()  # its lease may have been the one in force
        log.info("tenant %s removed", name)
        return {"tenant": name}

    def list_tenants(self) -> list[dict[str, object]]:
        return [{"tenant": t.name, "request": t.request, "limit": t.limit,
                 "priority": t.priority, "endpoint": self._endpoints[t.name].url}
                for t in self.policy.tenants.values()]

    def charges(self, since_ns: int) -> dict[str, object]:
        """Each tenant's charged holds ending after `since_ns` (the daemon's clock), within
        the window, as [start, end] pairs in ns."""
        return {"tenants": {name: [[start, end] for start, end in holds]
                            for name, holds in self.policy.charges(since_ns).items()}}

    def stats(self) -> dict[str, object]:
        """The policy's figures, and the daemon's stalls: how many turns woke STALL_NS or more
        past their timeout or took that long, and the last STALLS_KEPT of them as [when (the
        daemon's clock, ms), how long (ms)]."""
        stalls = [[start / 1e6, length / 1e6] for start, length in self._stalls]
        return {"gpu": self.gpu, **self.policy.stats(), "stall_count": self.stall_count, "stalls": stalls}
