"""The daemon over real ZeroMQ sockets, with Python clients standing in for libvcuda."""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from token_scheduler import wire
from token_scheduler.daemon import Daemon
from token_scheduler.errors import ErrorCode
from token_scheduler.policy import MS, SECOND, PolicyConfig
from token_scheduler.simulate import FakeClock
from token_scheduler.testing import AdminClient, TenantClient, daemon_thread
from token_scheduler.wire import MsgType

pytestmark = pytest.mark.timeout(30)


def add(admin: AdminClient, name: str, request: int, limit: int | None = None) -> str:
    reply = admin.call("add", tenant=name, request=request,
                       **({} if limit is None else {"limit": limit}))
    assert reply["ok"], reply
    return str(reply["endpoint"])


def test_admin_socket_is_private(admin: AdminClient, daemon: object) -> None:
    directory = daemon.directory  # type: ignore[attr-defined]
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "admin.sock").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("desc", "fields", "fragment"),
    [
        ("unknown op", {"op": "explode"}, "unknown op"),
        ("missing tenant", {"op": "add", "request": 10}, "missing field 'tenant'"),
        ("bad name", {"op": "add", "tenant": "../x", "request": 10}, "bad tenant name"),
        ("request 0", {"op": "add", "tenant": "t", "request": 0}, "request"),
        ("limit < request", {"op": "add", "tenant": "t", "request": 20, "limit": 10}, "below"),
        ("string request", {"op": "add", "tenant": "t", "request": "10"}, "must be int"),
        ("overcommit", {"op": "add", "tenant": "t", "request": 95}, "sum to"),
        ("update unknown", {"op": "update", "tenant": "zz", "request": 5}, "no tenant"),
        ("remove unknown", {"op": "remove", "tenant": "zz"}, "no tenant"),
    ],
)
def test_admin_rejects_bad_requests(admin: AdminClient, desc: str, fields: dict,
                                    fragment: str) -> None:
    add(admin, "base", 10)
    op = fields.pop("op")
    reply = admin.call(op, **fields)
    assert not reply["ok"] and fragment in str(reply["error"]), desc


def test_admin_survives_garbage(admin: AdminClient, zctx: zmq.Context) -> None:
    raw = zctx.socket(zmq.REQ)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(admin.endpoint)
    for payload in (b"\xff\xfe", b"[1,2]", b"{", b"null"):
        raw.send(payload)
        assert raw.poll(2000)
        assert b'"ok": false' in raw.recv()
    raw.send_multipart([b"{}", b"{}"])
    assert raw.poll(2000) and b'"ok": false' in raw.recv()
    raw.close(0)
    assert admin.call("ping")["ok"]


def test_grant_release_handoff_between_tenants(admin: AdminClient, zctx: zmq.Context) -> None:
    a = TenantClient(add(admin, "a", 50), zctx)
    b = TenantClient(add(admin, "b", 50), zctx)
    grant = a.acquire()
    lease, quantum_us, grace_us = grant.fields
    assert quantum_us >= 1000 and grace_us == 5000
    b.request()
    assert b.recv(0) is None  # exclusive: b waits while a holds
    a.release(lease, 100_000, more=False)
    grant_b = b.wait_grant(2)
    assert grant_b.fields[0] != lease
    b.release(grant_b.fields[0], 1000)
    stats = admin.call("stats")["tenants"]
    assert stats["a"]["grants"] == 1 and stats["b"]["grants"] == 1  # type: ignore[index]


def test_charges_name_each_tenants_holds_on_the_daemons_clock(admin: AdminClient, zctx: zmq.Context) -> None:
    a = TenantClient(add(admin, "a", 50), zctx)
    add(admin, "b", 50)
    before = time.monotonic_ns()
    lease = a.acquire().fields[0]
    time.sleep(0.002)
    a.release(lease, 2 * MS)
    a.ping(1)
    a.expect(MsgType.PONG)  # the release has been handled
    after = time.monotonic_ns()
    reply = admin.call("charges")
    assert reply["ok"], reply
    holds = reply["tenants"]
    assert holds["b"] == []  # type: ignore[index]
    [[start, end]] = holds["a"]  # type: ignore[index]
    assert before <= start < end <= after and end - start >= 2 * MS
    assert admin.call("charges", since_ns=end)["tenants"] == {"a": [], "b": []}
    bad = admin.call("charges", since_ns="soon")
    assert not bad["ok"] and "must be int" in str(bad["error"])


def test_identity_comes_from_the_socket(admin: AdminClient, zctx: zmq.Context) -> None:
    a = TenantClient(add(admin, "a", 50), zctx)
    b = TenantClient(add(admin, "b", 50), zctx)
    lease = a.acquire().fields[0]
    b.release(lease, 0)  # b knows a's lease id, but speaks on its own socket
    err = b.expect(MsgType.ERROR)
    assert err.fields == (ErrorCode.STALE_LEASE, lease)
    a.ping(1)
    pong = a.expect(MsgType.PONG)
    assert pong.fields[2] == wire.ClientState.HOLDING and pong.fields[3] == lease


def test_a_pong_to_a_ping_before_the_request_does_not_ask_twice(admin: AdminClient, zctx: zmq.Context) -> None:
    """A PONG still queued from a PING sent before the REQUEST (as after an ERROR ended the
    previous wait) says IDLE of that earlier time: the client must not REQUEST again, or the
    scheduler refuses the second REQUEST once the first is granted."""
    a = TenantClient(add(admin, "a", 50), zctx)
    a.ping()  # while idle: its PONG(IDLE) is queued, unread
    assert a.sock.poll(2000)
    lease = a.acquire(3).fields[0]
    a.ping(0xFEED)  # answered after anything a second REQUEST would have brought
    while (msg := a.expect(MsgType.PONG)).fields[0] != 0xFEED:
        pass
    assert msg.fields[2] == wire.ClientState.HOLDING and msg.fields[3] == lease


def test_processes_of_one_tenant_share_it(admin: AdminClient, zctx: zmq.Context) -> None:
    endpoint = add(admin, "a", 50)
    p1, p2 = TenantClient(endpoint, zctx), TenantClient(endpoint, zctx)
    lease = p1.acquire().fields[0]
    p2.release(lease, 0)  # another process of the same tenant cannot release it
    assert p2.expect(MsgType.ERROR).fields[0] == ErrorCode.STALE_LEASE
    p2.request()
    p1.release(lease, 10, more=False)
    assert p2.wait_grant(2).type == MsgType.GRANT


@pytest.mark.parametrize(
    ("desc", "frame", "code"),
    [
        ("short", b"abc", ErrorCode.MALFORMED),
        ("wrong version", b"VCTS\x09" + wire.encode_ping(5, 0)[5:], ErrorCode.BAD_VERSION),
        ("unknown type", wire.HEADER.pack(b"VCTS", 1, 42, 0, 5, 0), ErrorCode.UNKNOWN_TYPE),
        ("server type", wire.encode_grant(5, 1, 1, 1), ErrorCode.UNKNOWN_TYPE),
        ("stale release", wire.encode_release(5, 99, 0, False), ErrorCode.STALE_LEASE),
        ("renew nothing", wire.encode_renew(5, 99, 0), ErrorCode.STALE_LEASE),
    ],
)
def test_bad_frames_get_error_replies(admin: AdminClient, zctx: zmq.Context, desc: str,
                                      frame: bytes, code: ErrorCode) -> None:
    client = TenantClient(add(admin, "a", 50), zctx)
    client.send_raw(frame)
    err = client.expect(MsgType.ERROR)
    assert err.fields[0] == code, desc


def test_multipart_and_oversized_do_not_hurt(admin: AdminClient, zctx: zmq.Context) -> None:
    bad = TenantClient(add(admin, "bad", 50), zctx)
    good = TenantClient(add(admin, "good", 50), zctx)
    bad.sock.send_multipart([wire.encode_ping(1, 0), b"extra"])
    assert bad.expect(MsgType.ERROR).fields[0] == ErrorCode.MALFORMED
    bad.send_raw(b"\0" * 100_000)  # over MAXMSGSIZE: libzmq drops that connection
    lease = good.acquire().fields[0]
    good.release(lease, 1)


def test_request_while_holding_is_an_error(admin: AdminClient, zctx: zmq.Context) -> None:
    client = TenantClient(add(admin, "a", 50), zctx)
    lease = client.acquire().fields[0]
    client.request()
    err = client.expect(MsgType.ERROR)
    assert err.fields == (ErrorCode.BAD_STATE, lease)


def test_renew_when_alone_then_denied(admin: AdminClient, zctx: zmq.Context) -> None:
    a = TenantClient(add(admin, "a", 50), zctx)
    b = TenantClient(add(admin, "b", 50), zctx)
    # Both idle long enough for their credit toward their requests to reach its idle cap
    # (the allowance and half of 100 ms): else a, added first, is owed what it idled for
    # before b was added, comes first, and is renewed while its hold is under half that gap.
    time.sleep(0.15)
    lease = a.acquire().fields[0]
    a.renew(lease, 0)
    assert a.expect(MsgType.GRANT).fields[0] == lease
    b.request()
    # b's request must have reached the scheduler before a's renewal (two sockets: no order
    # between them; a 1 ms sleep lost that race once on a loaded machine).
    deadline = time.monotonic() + 2
    while admin.call("stats")["tenants"]["b"]["waiting"] == 0:  # type: ignore[index]
        assert time.monotonic() < deadline, "b's request never reached the scheduler"
        time.sleep(0.001)
    a.renew(lease, 0)
    assert a.expect(MsgType.ERROR).fields[0] == ErrorCode.RENEW_DENIED


def test_a_capped_tenants_grant_says_no_renewal(admin: AdminClient, zctx: zmq.Context) -> None:
    """Under short horizons a capped tenant's lease is what its frame allows, so its GRANT
    carries NO_RENEW; an uncapped tenant's does not (alone, it keeps its lease by renewing)."""
    capped = TenantClient(add(admin, "capped", 30), zctx)
    uncapped = TenantClient(add(admin, "uncapped", 30, 100), zctx)
    grant = capped.acquire()
    assert grant.flags & wire.FLAG_NO_RENEW
    capped.release(grant.fields[0], 1 * MS)
    assert not uncapped.acquire().flags & wire.FLAG_NO_RENEW


def test_silent_holder_lease_expires(admin: AdminClient, zctx: zmq.Context) -> None:
    a = TenantClient(add(admin, "a", 50), zctx)
    b = TenantClient(add(admin, "b", 50), zctx)
    quantum_us, grace_us = a.acquire().fields[1:]
    start = time.monotonic()
    b.request()
    b.wait_grant(2)
    waited = time.monotonic() - start
    assert waited <= (quantum_us + grace_us) / 1e6 + 0.05
    assert admin.call("stats")["tenants"]["a"]["expiries"] == 1  # type: ignore[index]


def test_dead_waiter_is_skipped(admin: AdminClient, zctx: zmq.Context) -> None:
    a = TenantClient(add(admin, "a", 40), zctx)
    dead = TenantClient(add(admin, "b", 40), zctx)
    live = TenantClient(add(admin, "c", 20), zctx)
    lease = a.acquire().fields[0]
    dead.request()
    live.request()
    time.sleep(0.05)
    dead.close()  # the process exits while waiting
    time.sleep(0.05)
    a.release(lease, 0)
    assert live.wait_grant(0.5).type == MsgType.GRANT  # not a quantum lost on the dead one


def test_live_update_and_remove(admin: AdminClient, zctx: zmq.Context) -> None:
    endpoint = add(admin, "a", 10, 10)
    reply = admin.call("update", tenant="a", request=30)
    assert reply == {"ok": True, "tenant": "a", "request": 30, "limit": 30, "priority": "normal"}
    assert admin.call("list")["tenants"] == [
        {"tenant": "a", "request": 30, "limit": 30, "priority": "normal", "endpoint": endpoint}]
    client = TenantClient(endpoint, zctx)
    client.acquire()
    assert admin.call("remove", tenant="a")["ok"]
    assert admin.call("list")["tenants"] == []
    assert admin.call("add", tenant="a", request=5)["ok"]  # the name can come back


def test_limit_enforced_end_to_end(admin: AdminClient, zctx: zmq.Context) -> None:
    """A lone greedy tenant with limit 30 % gets about 30 % of a 1 s window."""
    client = TenantClient(add(admin, "greedy", 10, 30), zctx)
    end = time.monotonic() + 1.5
    grant = client.acquire()
    while time.monotonic() < end:
        lease, quantum_us, _ = grant.fields
        time.sleep(quantum_us / 1e6)
        client.release(lease, quantum_us * 1000, more=True)
        grant = client.wait_grant(2)
    share = admin.call("stats")["tenants"]["greedy"]["share"]  # type: ignore[index]
    assert 0.2 <= share <= 0.36


def test_disconnected_holder_frees_the_token_at_once(short_dir: Path, zctx: zmq.Context) -> None:
    """A holder whose connection closes (its process died) is not waited for: with a
    60 s quantum, the next tenant is granted at once and the lease never expires."""
    config = PolicyConfig(window_ns=120 * SECOND, quantum_min_ns=60 * SECOND, quantum_max_ns=60 * SECOND,
                          grace_ns=5 * MS)
    with daemon_thread(short_dir / "sched", config):
        admin = AdminClient(short_dir / "sched" / "admin.sock", zctx)
        admin.wait_ready()
        a = TenantClient(add(admin, "a", 50), zctx)
        b = TenantClient(add(admin, "b", 50), zctx)
        assert a.acquire().fields[1] == 60_000_000
        b.request()
        assert b.recv(100) is None
        a.close()
        assert b.wait_grant(10).type == MsgType.GRANT
        stats = admin.call("stats")["tenants"]
        assert stats["a"]["expiries"] == 0 and stats["b"]["grants"] == 1  # type: ignore[index]
        admin.close()


def test_a_waiting_client_is_answered_while_it_waits(short_dir: Path, zctx: zmq.Context) -> None:
    """Liveness is not lease time (issue 31): however long a client waits for its turn (here
    behind a 60 s lease), each PING it sends is answered at once with a PONG saying WAITING,
    so a client counts only silence as a lost scheduler, never the wait."""
    config = PolicyConfig(window_ns=120 * SECOND, quantum_min_ns=60 * SECOND, quantum_max_ns=60 * SECOND,
                          grace_ns=5 * MS)
    with daemon_thread(short_dir / "sched", config) as daemon:
        admin = AdminClient(short_dir / "sched" / "admin.sock", zctx)
        admin.wait_ready()
        a = TenantClient(add(admin, "a", 50), zctx)
        b = TenantClient(add(admin, "b", 50), zctx)
        lease = a.acquire().fields[0]
        b.request()
        for nonce in (1, 2, 2**64 - 1):
            b.ping(nonce)
            pong = b.expect(MsgType.PONG)
            assert pong.fields == (nonce, daemon.policy.epoch, wire.ClientState.WAITING, 0)
        b.send_raw(wire.encode_ping(9, 0)[:-1])  # a short PING is an error, and changes nothing
        assert b.expect(MsgType.ERROR).fields[0] == ErrorCode.MALFORMED
        b.ping(4)
        assert b.expect(MsgType.PONG).fields[2] == wire.ClientState.WAITING
        a.release(lease, 1000)
        assert b.wait_grant(2).type == MsgType.GRANT
        admin.close()


# --- priority, revocation, in-flight budget ------------------------------------------------------


def test_budget_comes_before_the_grant_and_follows_a_high_tenant(daemon: Daemon, admin: AdminClient,
                                                                 zctx: zmq.Context) -> None:
    cfg = daemon.policy.config
    a = TenantClient(add(admin, "a", 40), zctx)
    a.request()
    budget = a.recv(2000, keep_budget=True)
    assert budget is not None and budget.type == MsgType.BUDGET
    assert budget.fields == (cfg.normal_budget_ns // 1000, cfg.idle_ns // 1000)
    lease = a.expect(MsgType.GRANT).fields[0]
    assert admin.call("add", tenant="h", request=20, priority="high")["ok"]
    mid = a.recv(2000, keep_budget=True)  # told mid-lease: a high tenant may now wait for it
    assert mid is not None and mid.type == MsgType.BUDGET
    assert mid.fields[0] == cfg.budget_high_ns // 1000
    a.release(lease, 1000, more=True)
    assert a.recv(2000, keep_budget=True).type == MsgType.GRANT  # unchanged: not told again
    assert admin.call("stats")["tenants"]["a"]["budget_us"] == cfg.budget_high_ns / 1000


def test_high_request_revokes_the_normal_holder(daemon: Daemon, admin: AdminClient, zctx: zmq.Context) -> None:
    cfg = daemon.policy.config
    normal = TenantClient(add(admin, "n", 40, 100), zctx)
    high = TenantClient(str(admin.call("add", tenant="h", request=60, priority="high")["endpoint"]), zctx)
    lease = normal.acquire().fields[0]
    high.request()
    revoke = normal.expect(MsgType.REVOKE)
    assert revoke.fields[:2] == (lease, cfg.budget_high_ns // 1000)
    assert high.recv(0) is None  # the token is still the holder's until it releases
    normal.release(lease, 2_000_000, more=True)
    assert high.wait_grant(2).type == MsgType.GRANT
    stats = admin.call("stats")["tenants"]
    assert stats["n"]["revocations"] == 1 and stats["n"]["waiting"] == 1
    assert stats["h"]["preempt_wait_us"]["samples"] == 1


def test_a_holder_ignoring_a_revocation_loses_the_token(daemon: Daemon, admin: AdminClient,
                                                        zctx: zmq.Context) -> None:
    cfg = daemon.policy.config
    normal = TenantClient(add(admin, "n", 40, 100), zctx)
    high = TenantClient(str(admin.call("add", tenant="h", request=60, priority="high")["endpoint"]), zctx)
    lease = normal.acquire().fields[0]
    start = time.monotonic()
    high.request()
    normal.expect(MsgType.REVOKE)  # ... and never releases
    assert high.wait_grant(2).type == MsgType.GRANT
    waited_ms = (time.monotonic() - start) * 1000
    reclaim_ms = (cfg.budget_high_ns + cfg.revoke_grace_ns) / MS
    assert reclaim_ms <= waited_ms < reclaim_ms + 200  # not a whole lease: 10 ms quantum + 5 ms grace
    assert admin.call("stats")["tenants"]["n"]["revoke_reclaims"] == 1
    normal.release(lease, 30_000_000)  # late: accepted, the overrun charged
    assert normal.recv(200) is None


def test_a_high_holder_that_dies_frees_the_token(admin: AdminClient, zctx: zmq.Context) -> None:
    high = TenantClient(str(admin.call("add", tenant="h", request=60, priority="high")["endpoint"]), zctx)
    normal = TenantClient(add(admin, "n", 40, 100), zctx)
    high.acquire()
    normal.request()
    assert normal.recv(0) is None  # a high holder is not revoked
    high.close()  # the process died: its connection closes
    assert normal.wait_grant(2).type == MsgType.GRANT


def test_reports_reach_the_stats(admin: AdminClient, zctx: zmq.Context) -> None:
    client = TenantClient(add(admin, "a", 40), zctx)
    client.report(7, 3_000_000)
    client.ping(9)
    client.expect(MsgType.PONG)  # in order: the REPORT was handled
    stats = admin.call("stats")["tenants"]["a"]
    assert (stats["budget_hits"], stats["budget_wait_ms"]) == (7, 3.0)


def test_admin_priority(daemon: Daemon, admin: AdminClient) -> None:
    reply = admin.call("add", tenant="t", request=10, priority="urgent")
    assert not reply["ok"] and "priority must be one of high, normal" in str(reply["error"])
    assert not admin.call("add", tenant="t", request=10, priority=1)["ok"]
    add(admin, "t", 10)
    assert admin.call("update", tenant="t", priority="high")["priority"] == "high"
    assert not admin.call("update", tenant="t", priority="low")["ok"]
    assert admin.call("list")["tenants"][0]["priority"] == "high"
    saved = json.loads((daemon.directory / "tenants.json").read_text())
    assert saved["tenants"][0]["priority"] == "high"


def test_turns_held_up_by_the_host_are_counted_as_stalls(short_dir: Path) -> None:
    """A turn that wakes 5 ms or more past its timeout, or takes that long, was held up by the
    host: `stats` counts it and keeps when and how long, so that a share that fell short can
    be told from a node that stalled. A turn on time is none."""
    clock = FakeClock(1_000 * SECOND)
    daemon = Daemon(short_dir / "sched", "0", PolicyConfig(), clock=clock)
    daemon.idle_poll_ms = 1
    try:
        daemon.start()
        sleeps = iter([1 * MS, 21 * MS, 2 * MS])

        def poll(timeout_s: float) -> list[tuple[int, int]]:
            clock.advance(next(sleeps))  # on time, then 20 ms past the 1 ms timeout, then 1 ms past
            return []

        daemon._epoll = _PollStub(poll, daemon._epoll)  # type: ignore[assignment]
        for _ in range(3):
            daemon.turn()
        stats = daemon.stats()
    finally:
        daemon.close()
    assert stats["stall_count"] == 1
    assert stats["stalls"] == [[(1_000 * SECOND + 2 * MS) / 1e6, 20.0]]


class _PollStub:
    """An epoll whose poll() is `poll`; everything else is the real one's."""

    def __init__(self, poll: Callable[[float], list[tuple[int, int]]], real: object) -> None:
        self.poll, self._real = poll, real

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)
