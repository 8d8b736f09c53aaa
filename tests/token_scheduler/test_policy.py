"""Policy unit tests on a fake clock: each rule of DESIGN.md, one case at a time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from token_scheduler.errors import ErrorCode, PolicyError
from token_scheduler.policy import MS, SECOND, Policy, PolicyConfig, UsageWindow
from token_scheduler.simulate import FakeClock

CFG = PolicyConfig(window_ns=1 * SECOND, quantum_min_ns=1 * MS, quantum_max_ns=20 * MS,
                   grace_ns=5 * MS)


def make(*tenants: tuple[str, int, int], config: PolicyConfig = CFG,
         young: bool = False) -> tuple[Policy, FakeClock]:
    """Policy with tenants whose window is already full length (unless young)."""
    clock = FakeClock(1_000 * SECOND)
    policy = Policy(config, clock, epoch=7)
    for name, request, limit in tenants:
        policy.add_tenant(name, request, limit)
    if not young:
        clock.advance(config.window_ns)
    return policy, clock


def hold(policy: Policy, clock: FakeClock, tenant: str, client: bytes, ns: int,
         more: bool = False) -> None:
    """Request, get the grant, hold for ns, release."""
    policy.request(tenant, client, 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == tenant and grant.client == client
    clock.advance(ns)
    policy.release(tenant, client, grant.lease_id, ns, more)


@pytest.mark.parametrize(
    ("desc", "req", "limit"),
    [("zero request", 0, 10), ("limit below request", 50, 40), ("over 100", 10, 101),
     ("float", 10.5, 20), ("bool", True, 20)],
)
def test_quota_validation(desc: str, req: object, limit: object) -> None:
    policy, _ = make()
    with pytest.raises(ValueError):
        policy.add_tenant("t", req, limit)  # type: ignore[arg-type]


def test_token_is_exclusive() -> None:
    policy, _ = make(("a", 50, 50), ("b", 50, 50))
    policy.request("a", b"1", 0)
    policy.request("b", b"1", 0)
    first = policy.dispatch()
    assert first is not None
    assert policy.dispatch() is None  # held: nobody else
    assert policy.lease is not None and policy.lease.lease_id == first.lease_id


def test_lease_ids_carry_epoch() -> None:
    policy, _ = make(("a", 10, 10))
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.lease_id >> 32 == 7


def test_largest_deficit_first_with_the_window_alone() -> None:
    """The window policy (short_horizon off): below request means a deficit over the
    whole window, idle time included (issue 31: the cause of the burst after idle)."""
    policy, clock = make(("small", 10, 100), ("big", 60, 100), config=replace(CFG, short_horizon=False))
    hold(policy, clock, "big", b"1", 50 * MS)  # big: 50 of 600 ms due; small: 0 of 100
    policy.request("big", b"1", 0)
    policy.request("small", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "big"  # deficit 550 > 100


def test_longest_owed_first() -> None:
    """Short horizons: below request means credit earned at the request's rate now, idle
    time earning the allowance and R % of 100 ms at most; the tenant owed the longest
    time at its rate first, not the largest amount."""
    policy, clock = make(("small", 10, 100), ("big", 60, 100), config=replace(CFG, short_horizon=True))
    hold(policy, clock, "big", b"1", 5 * MS)  # big: 68 - 5 + 3 = 66 ms owed, 110 ms at 60 %
    policy.request("big", b"1", 0)
    policy.request("small", b"1", 0)  # small: 18 ms owed, 180 ms at 10 %
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "small"


def test_least_usage_first_when_all_above_request() -> None:
    policy, clock = make(("a", 5, 100), ("b", 5, 100))
    clock.advance(SECOND)
    hold(policy, clock, "a", b"1", 200 * MS)
    hold(policy, clock, "b", b"1", 100 * MS)
    policy.request("a", b"1", 0)
    policy.request("b", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "b"


def test_limit_blocks_and_rechecks() -> None:
    policy, clock = make(("a", 10, 10))
    clock.advance(SECOND)
    hold(policy, clock, "a", b"1", 150 * MS)  # 15 % of the window, limit 10 %
    policy.request("a", b"1", 0)
    assert policy.dispatch() is None
    blocked = clock.now
    deadline = policy.next_deadline()
    assert deadline is not None and deadline > clock.now
    clock.set(deadline)
    while policy.dispatch() is None:  # at most a few re-checks
        clock.set(policy.next_deadline())  # type: ignore[arg-type]
    assert clock.now - deadline < 100 * MS
    assert policy.usage_ns("a") <= 100 * MS
    # The token sat free all that time, `a` held back by its limit.
    assert policy.stats()["held_back_ms"] == (clock.now - blocked) / MS


def test_a_decision_that_holds_every_waiter_back_stands_until_a_change_or_its_recheck(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon calls `dispatch` after every message and at the end of every turn. While
    every waiter is held back, a call before the recheck with nothing changed (a REPORT or a
    PING woke the daemon, or its second look in a turn) does not decide again; a new request
    decides at once, and so does the recheck."""
    policy, clock = make(("a", 10, 10), ("b", 50, 100))
    clock.advance(SECOND)
    hold(policy, clock, "a", b"1", 150 * MS)  # over its limit: held back
    decisions: list[int] = []
    decide = policy._pick_short

    def counted(now: int) -> tuple[object, ...]:
        decisions.append(now)
        return decide(now)
    monkeypatch.setattr(policy, "_pick_short", counted)
    policy.request("a", b"1", 0)
    assert policy.dispatch() is None and len(decisions) == 1
    recheck = policy.next_deadline()
    assert recheck is not None and recheck > clock.now + 10 * MS
    clock.set(recheck - 10 * MS)
    policy.report("a", 0, 0)
    assert policy.dispatch() is None and policy.dispatch() is None
    assert len(decisions) == 1
    policy.request("b", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "b" and len(decisions) == 2
    clock.advance(MS)
    policy.release("b", b"1", grant.lease_id, MS, False)
    assert policy.dispatch() is None and len(decisions) == 3  # the release changed things
    clock.set(policy.next_deadline())  # type: ignore[arg-type]
    policy.dispatch()
    assert len(decisions) == 4


def test_work_conserving_past_request() -> None:
    policy, clock = make(("a", 10, 100), ("idle", 80, 100))
    clock.advance(SECOND)
    hold(policy, clock, "a", b"1", 500 * MS)  # far past its request
    policy.request("a", b"1", 0)
    assert policy.dispatch() is not None  # nobody else wants it: still served


def test_charges_list_each_tenants_holds_within_the_window() -> None:
    policy, clock = make(("a", 50, 100), ("b", 50, 100))
    start = clock()
    hold(policy, clock, "a", b"1", 5 * MS)
    hold(policy, clock, "b", b"1", 3 * MS)
    assert policy.charges(0) == {"a": [(start, start + 5 * MS)], "b": [(start + 5 * MS, start + 8 * MS)]}
    assert policy.charges(start + 5 * MS) == {"a": [], "b": [(start + 5 * MS, start + 8 * MS)]}
    clock.advance(CFG.window_ns - 2 * MS)  # a's hold has left the window, b's not yet
    assert policy.charges(0) == {"a": [], "b": [(start + 5 * MS, start + 8 * MS)]}


def test_lease_expires_and_late_release_charges_overrun() -> None:
    policy, clock = make(("a", 50, 100), ("b", 50, 100))
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None
    policy.request("b", b"1", 0)
    clock.advance(grant.quantum_ns + CFG.grace_ns)
    nxt = policy.dispatch()
    assert nxt is not None and nxt.tenant == "b"
    charged = policy.usage_ns("a")
    assert charged == grant.quantum_ns + CFG.grace_ns
    clock.advance(30 * MS)
    policy.release("a", b"1", grant.lease_id, grant.quantum_ns + 25 * MS, more=False)
    assert policy.usage_ns("a") == grant.quantum_ns + 25 * MS
    stats = policy.stats()["tenants"]["a"]  # type: ignore[index]
    assert stats["expiries"] == 1 and stats["overruns"] == 1


def test_dead_holder_costs_one_quantum_plus_grace() -> None:
    policy, clock = make(("a", 50, 100), ("b", 50, 100))
    policy.request("a", b"dead", 0)
    grant = policy.dispatch()
    assert grant is not None
    policy.request("b", b"1", 0)
    assert policy.next_deadline() == grant.expires_at + CFG.grace_ns
    clock.set(grant.expires_at + CFG.grace_ns)
    assert policy.dispatch() is not None


@pytest.mark.parametrize(
    ("desc", "tenant", "client", "lease_delta"),
    [("wrong lease id", "a", b"1", 1), ("other client", "a", b"2", 0),
     ("other tenant", "b", b"1", 0)],
)
def test_release_checks_ownership(desc: str, tenant: str, client: bytes, lease_delta: int) -> None:
    policy, _ = make(("a", 50, 50), ("b", 50, 50))
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None
    with pytest.raises(PolicyError) as info:
        policy.release(tenant, client, grant.lease_id + lease_delta, 0, False)
    assert info.value.code == ErrorCode.STALE_LEASE, desc
    assert policy.lease is not None  # untouched


def test_request_while_holding_is_bad_state() -> None:
    policy, _ = make(("a", 50, 50))
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    with pytest.raises(PolicyError) as info:
        policy.request("a", b"1", 0)
    assert info.value.code == ErrorCode.BAD_STATE and grant is not None
    assert info.value.ref == grant.lease_id


def test_repeated_request_keeps_place() -> None:
    policy, _ = make(("a", 50, 50))
    policy.request("a", b"1", 0)
    policy.request("a", b"2", 0)
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.client == b"1"


def test_release_more_requeues() -> None:
    policy, clock = make(("a", 50, 100))
    hold(policy, clock, "a", b"1", 3 * MS, more=True)
    assert policy.client_state("a", b"1") == (1, 0)
    assert policy.dispatch() is not None


def test_renew_only_when_uncontended() -> None:
    policy, clock = make(("a", 50, 100), ("b", 50, 100))
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None
    clock.advance(grant.quantum_ns - MS)
    renewed = policy.renew("a", b"1", grant.lease_id)
    assert renewed.lease_id == grant.lease_id and renewed.expires_at > grant.expires_at
    policy.request("b", b"1", 0)
    with pytest.raises(PolicyError) as info:
        policy.renew("a", b"1", grant.lease_id)
    assert info.value.code == ErrorCode.RENEW_DENIED


@pytest.mark.parametrize(("short_horizon", "requested", "limit", "renewable"),
                         [(True, 30, 30, False), (True, 30, 60, False), (True, 30, 100, True),
                          (False, 30, 30, True), (False, 30, 60, True)])
def test_which_leases_may_be_renewed(short_horizon: bool, requested: int, limit: int, renewable: bool) -> None:
    """Under short horizons a capped tenant's lease is what its frame allows (at its end it
    waits for its next frame): the GRANT says a RENEW would be denied."""
    policy = Policy(PolicyConfig(short_horizon=short_horizon), FakeClock())
    policy.add_tenant("a", requested, limit)
    assert policy.renewable("a") is renewable
    assert policy.renewable("gone") is True


def test_renew_when_the_holder_would_get_the_token_back_anyway() -> None:
    policy, clock = make(("inference", 60, 100), ("trainer", 40, 100))
    policy.update_tenant("inference", 60, 100, priority="high")
    hold(policy, clock, "trainer", b"t", 500 * MS)  # the trainer is above its request
    policy.request("inference", b"i", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "inference"
    policy.request("trainer", b"t", 0)
    clock.advance(grant.quantum_ns - MS)
    # Released now, the token would go straight back to the inference (below its request):
    # it keeps it, and the trainer's turn is unchanged.
    renewed = policy.renew("inference", b"i", grant.lease_id)
    assert renewed.lease_id == grant.lease_id and renewed.renewal
    assert policy.stats()["tenants"]["inference"]["renewals"] == 1  # type: ignore[index]
    # The inference past its request, the trainer below its own: the trainer comes first.
    clock.advance(700 * MS)
    with pytest.raises(PolicyError) as info:
        policy.renew("inference", b"i", grant.lease_id)
    assert info.value.code == ErrorCode.RENEW_DENIED


def test_renew_is_denied_when_another_process_of_the_tenant_waits() -> None:
    policy, clock = make(("a", 60, 100), ("b", 40, 100))
    hold(policy, clock, "b", b"1", 500 * MS)
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "a"
    policy.request("b", b"1", 0)
    assert policy.renew("a", b"1", grant.lease_id).renewal  # a comes before b
    policy.request("a", b"2", 0)
    with pytest.raises(PolicyError) as info:
        policy.renew("a", b"1", grant.lease_id)  # its other process's turn
    assert info.value.code == ErrorCode.RENEW_DENIED


def test_a_renewed_hold_is_no_overrun() -> None:
    policy, clock = make(("a", 50, 100))
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None
    held = 0
    for _ in range(5):
        clock.advance(grant.quantum_ns - MS)
        held += grant.quantum_ns - MS
        grant = policy.renew("a", b"1", grant.lease_id)
    clock.advance(MS)
    policy.release("a", b"1", grant.lease_id, held + MS, False)
    assert policy.stats()["tenants"]["a"]["overruns"] == 0  # type: ignore[index]
    policy.request("a", b"1", 0)
    again = policy.dispatch()
    assert again is not None and again.quantum_ns > CFG.quantum_min_ns  # not shrunk by an "overrun"


def test_renew_of_reclaimed_lease_says_expired() -> None:
    policy, clock = make(("a", 50, 100))
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None
    clock.advance(grant.quantum_ns + CFG.grace_ns)
    policy.dispatch()
    with pytest.raises(PolicyError) as info:
        policy.renew("a", b"1", grant.lease_id)
    assert info.value.code == ErrorCode.LEASE_EXPIRED


def test_quantum_grows_for_saturating_and_stays_in_bounds() -> None:
    policy, clock = make(("a", 50, 100))
    quanta = []
    for _ in range(20):
        policy.request("a", b"1", 0)
        grant = policy.dispatch()
        assert grant is not None
        quanta.append(grant.quantum_ns)
        clock.advance(grant.quantum_ns)
        policy.release("a", b"1", grant.lease_id, grant.quantum_ns, more=True)
        policy.client_gone("a", b"1")
    assert quanta[-1] == CFG.quantum_max_ns and quanta[0] < quanta[-1]
    assert all(CFG.quantum_min_ns <= q <= CFG.quantum_max_ns for q in quanta)


def test_quantum_shrinks_for_short_bursts() -> None:
    policy, clock = make(("a", 50, 100))
    for _ in range(20):
        hold(policy, clock, "a", b"1", 200_000)  # 0.2 ms bursts
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.quantum_ns < CFG.quantum_min_ns * 1.01


def test_predicted_burst_raises_quantum() -> None:
    policy, _ = make(("a", 50, 100))
    policy.request("a", b"1", 15 * MS)
    grant = policy.dispatch()
    assert grant is not None and grant.quantum_ns == 15 * MS


def test_client_gone_frees_token() -> None:
    policy, _ = make(("a", 50, 100), ("b", 50, 100))
    policy.request("a", b"1", 0)
    policy.request("b", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None
    policy.client_gone(grant.tenant, grant.client)
    nxt = policy.dispatch()
    assert nxt is not None and nxt.tenant != grant.tenant


def test_live_update_changes_next_decision() -> None:
    policy, clock = make(("a", 10, 10))
    clock.advance(SECOND)
    hold(policy, clock, "a", b"1", 150 * MS)
    policy.request("a", b"1", 0)
    assert policy.dispatch() is None
    policy.update_tenant("a", 20, 40)
    assert policy.dispatch() is not None


def test_remove_tenant_drops_lease_and_waiters() -> None:
    policy, _ = make(("a", 50, 100), ("b", 50, 100))
    policy.request("a", b"1", 0)
    policy.request("b", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None
    policy.remove_tenant(grant.tenant)
    assert policy.lease is None
    with pytest.raises(PolicyError) as info:
        policy.request(grant.tenant, b"1", 0)
    assert info.value.code == ErrorCode.TENANT_REMOVED


def test_too_many_waiting_clients() -> None:
    config = PolicyConfig(window_ns=SECOND, max_waiting_per_tenant=2)
    policy, _ = make(("a", 50, 100), config=config)
    policy.request("a", b"1", 0)
    policy.request("a", b"2", 0)
    with pytest.raises(PolicyError) as info:
        policy.request("a", b"3", 0)
    assert info.value.code == ErrorCode.TOO_MANY_CLIENTS


def test_young_tenant_small_request_not_starved() -> None:
    """Right after a (re)start a 10 % tenant is served before the 90 % one runs 8 s."""
    policy, clock = make(("big", 90, 100), ("small", 10, 100), young=True)
    hold(policy, clock, "big", b"1", 20 * MS)
    policy.request("big", b"1", 0)
    policy.request("small", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "small"


def test_stats_report_wait_percentiles() -> None:
    policy, clock = make(("a", 50, 100))
    for wait in (1, 2, 3, 4):
        policy.request("a", b"1", 0)
        clock.advance(wait * MS)
        grant = policy.dispatch()
        assert grant is not None
        policy.release("a", b"1", grant.lease_id, 0, False)
    stats = policy.stats()["tenants"]["a"]  # type: ignore[index]
    assert stats["grants"] == 4
    assert stats["wait_us"]["p50"] == 2000 and stats["wait_us"]["max"] == 4000
    hist = stats["wait_histogram"]
    assert sum(hist["counts"]) == 4 and hist["sum_s"] == pytest.approx(0.010)
    # 1 ms falls in the 1 ms bucket (le is inclusive), 2 ms in 2.5 ms, 3 and 4 ms in 5 ms.
    by_bound = dict(zip(hist["le_s"], hist["counts"], strict=False))
    assert (by_bound[0.001], by_bound[0.0025], by_bound[0.005]) == (1, 1, 2)


@pytest.mark.parametrize(
    ("desc", "intervals", "now", "window", "expected"),
    [
        ("inside", [(10, 20)], 30, 100, 10),
        ("cut by trailing edge", [(0, 20)], 110, 100, 10),
        ("dropped", [(0, 5)], 200, 100, 0),
        ("late overrun inserted out of order", [(50, 60), (10, 40)], 120, 100, 30),
    ],
)
def test_usage_window(desc: str, intervals: list[tuple[int, int]], now: int, window: int,
                      expected: int) -> None:
    usage = UsageWindow()
    for start, end in intervals:
        usage.add(start, end)
    assert usage.usage(now, window) == expected, desc


def test_overrunning_holder_gets_shorter_leases() -> None:
    """A holder that drains 10 ms past its lease gets quantum_max - 10 ms next time, so a
    waiter waits at most one quantum_max; once it stops overrunning the lease grows back."""
    policy, clock = make(("hog", 50, 100))
    qmax = CFG.quantum_max_ns
    for _ in range(3):
        policy.request("hog", b"1", qmax)
        grant = policy.dispatch()
        assert grant is not None
        clock.advance(grant.quantum_ns + 10 * MS)
        policy.release("hog", b"1", grant.lease_id, grant.quantum_ns + 10 * MS, False)
    policy.request("hog", b"1", qmax)
    grant = policy.dispatch()
    assert grant is not None and grant.quantum_ns == qmax - 10 * MS
    policy.release("hog", b"1", grant.lease_id, grant.quantum_ns, False)
    for _ in range(16):  # leases kept to: the overrun memory forgets
        policy.request("hog", b"1", qmax)
        grant = policy.dispatch()
        assert grant is not None
        clock.advance(grant.quantum_ns)
        policy.release("hog", b"1", grant.lease_id, grant.quantum_ns, False)
    policy.request("hog", b"1", qmax)
    grant = policy.dispatch()
    assert grant is not None and grant.quantum_ns == qmax


def test_lifetime_hold_counter_outlives_the_window_and_never_decreases() -> None:
    """stats' held_ms_total (charge-back) counts every hold since the tenant was added, the lease in
    force included up to its reclaim time, so it never goes down when a lease is reclaimed."""
    policy, clock = make(("a", 50, 100))
    for _ in range(5):
        hold(policy, clock, "a", b"1", 100 * MS)
        clock.advance(SECOND)  # each hold leaves the 1 s window before the next
    doc = policy.stats()["tenants"]["a"]  # type: ignore[index]
    assert doc["usage_ms"] == 0 and doc["held_ms_total"] == pytest.approx(500)
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None
    clock.advance(grant.quantum_ns // 2)
    assert policy.stats()["tenants"]["a"]["held_ms_total"] == pytest.approx(500 + grant.quantum_ns / 2 / MS)
    seen = []
    while policy.lease is not None:  # past expiry and grace: the silent holder's lease is reclaimed
        clock.advance(2 * MS)
        seen.append(policy.stats()["tenants"]["a"]["held_ms_total"])
        policy.dispatch()
        seen.append(policy.stats()["tenants"]["a"]["held_ms_total"])
    assert len(seen) > 4 and seen == sorted(seen)
    assert seen[-1] == pytest.approx(500 + (grant.quantum_ns + CFG.grace_ns) / MS)


def test_release_before_the_work_completed_charges_its_tail_and_the_next_holder_after_it() -> None:
    """A holder may release up to a handoff before its last work completes (held_ns past
    the release): it is charged to that work's end, the next holder only from there."""
    policy, clock = make(("a", 50, 100), ("b", 50, 100))
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None
    policy.request("b", b"1", 0)
    clock.advance(4 * MS)
    policy.release("a", b"1", grant.lease_id, 4 * MS + 300_000, more=False)
    assert policy.usage_ns("a") == 4 * MS + 300_000
    nxt = policy.dispatch()
    assert nxt is not None and nxt.tenant == "b"
    clock.advance(2 * MS)
    assert policy.usage_ns("b") == 2 * MS - 300_000
    policy.release("b", b"1", nxt.lease_id, 2 * MS, more=False)
    assert policy.usage_ns("b") == 2 * MS - 300_000
    assert policy.usage_ns("a") == 4 * MS + 300_000


def test_a_claimed_tail_is_charged_at_most_one_budget() -> None:
    policy, clock = make(("a", 50, 100))
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None
    clock.advance(1 * MS)
    policy.release("a", b"1", grant.lease_id, 10 * SECOND, more=False)
    assert policy.usage_ns("a") == 1 * MS + policy.budget_ns("a")


def test_a_reclaimed_holders_late_release_moves_the_next_holders_charge_past_its_overrun() -> None:
    """A holder that overran its lease (reclaimed, its RELEASE late) is charged its real hold;
    the tenant granted the token at the reclaim only from where that hold ended: the overlap
    is charged once, to the one that overran, not to both. The charge-back counter of the
    next holder never goes back meanwhile."""
    policy, clock = make(("a", 50, 100), ("b", 50, 100))
    policy.request("a", b"1", 0)
    late = policy.dispatch()
    assert late is not None and late.tenant == "a"
    policy.request("b", b"1", 0)
    clock.advance(late.quantum_ns + CFG.grace_ns)
    nxt = policy.dispatch()  # a's lease reclaimed, b granted
    assert nxt is not None and nxt.tenant == "b"
    clock.advance(2 * MS)
    shown = policy.stats()["tenants"]["b"]["held_ms_total"]  # type: ignore[index]
    assert shown == pytest.approx(2)
    clock.advance(1 * MS)
    overran = late.quantum_ns + CFG.grace_ns + 3 * MS  # a's work ran on 3 ms into b's lease
    policy.release("a", b"1", late.lease_id, overran, more=False)
    assert policy.usage_ns("a") == overran
    assert policy.usage_ns("b") == 0
    assert policy.stats()["tenants"]["b"]["held_ms_total"] >= shown  # type: ignore[index,operator]
    clock.advance(7 * MS)
    policy.release("b", b"1", nxt.lease_id, 10 * MS, more=False)
    assert policy.usage_ns("b") == 7 * MS
    assert policy.usage_ns("a") + policy.usage_ns("b") == overran + 7 * MS  # the wall time, once
    assert policy.stats()["tenants"]["b"]["held_ms_total"] == pytest.approx(7)  # type: ignore[index]
