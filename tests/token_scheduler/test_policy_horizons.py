"""Requests and limits at every horizon (issue 31), on the fake clock: the
scenarios of the issue driven by the simulation with the daemon's defaults
(window 10 s, quanta 1..50 ms), each tenant's share over every 1 s and every
100 ms interval checked against its request and limit, and the exact figures
the policy gives today pinned.

Shares are measured from 1 s after a tenant starts to 1 s before the end of
the run (a lease still running at the end is not recorded yet).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from token_scheduler.policy import HIGH, MS, SECOND, Grant, Policy, PolicyConfig
from token_scheduler.simulate import (
    FakeClock,
    ScriptedOverruns,
    SimResult,
    SimTenant,
    Simulation,
    mix_tenants,
    random_mix,
    with_high_tenant,
)

CFG = PolicyConfig(short_horizon=True)  # the daemon's defaults otherwise
WINDOW_ONLY = replace(CFG, short_horizon=False)
END = 35 * SECOND
ULP = 1e-9  # shares are ratios of nanoseconds in floating point


@dataclass(frozen=True)
class Case:
    desc: str
    tenants: tuple[SimTenant, ...]
    late: tuple[SimTenant, ...] = ()  # registered at their active_from, not at 0
    # Exact shares (percent) over the last 10 s: tenant -> share.
    shares: tuple[tuple[str, float], ...] = ()


CASES = [
    Case("steady: A 50/50 and B 13/13 busy from the start",
         (SimTenant("A", 50, 50), SimTenant("B", 13, 13)),
         shares=(("A", 50.0), ("B", 13.0))),
    Case("idle-then-busy: B registered, idle 20 s (two windows), then busy",
         (SimTenant("A", 50, 50), SimTenant("B", 13, 13, active_from=20 * SECOND)),
         shares=(("A", 50.0), ("B", 13.0))),
    Case("fresh: B registered as it starts, A busy for 20 s",
         (SimTenant("A", 50, 50),), late=(SimTenant("B", 13, 13, active_from=20 * SECOND),),
         shares=(("A", 50.0), ("B", 13.0))),
    Case("elastic: B 13 request 60 limit busy; A idle 20 s, then busy",
         (SimTenant("A", 50, 50, active_from=20 * SECOND), SimTenant("B", 13, 60)),
         shares=(("A", 50.0), ("B", 50.0))),
    Case("three tenants 20/30/50 busy",
         (SimTenant("A", 20, 20), SimTenant("B", 30, 30), SimTenant("C", 50, 50)),
         shares=(("A", 20.0), ("B", 30.0), ("C", 50.0))),
]


def simulate(case: Case, config: PolicyConfig) -> SimResult:
    sim = Simulation(config, list(case.tenants), keep_grants=True)
    for spec in sorted(case.late, key=lambda s: s.active_from):
        sim.run(spec.active_from)
        sim.add_tenant(spec)
    return sim.run(END)


def measured(spec: SimTenant) -> tuple[int, int]:
    return spec.active_from + SECOND, END - SECOND


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.desc.split(":")[0])
def test_limit_holds_over_any_second_and_any_100ms(case: Case) -> None:
    result = simulate(case, CFG)
    for spec in case.tenants + case.late:
        start, end = measured(spec)
        assert 100 * result.extreme_shares(spec.name, SECOND, start, end)[1] <= spec.limit + 1, spec.name
        assert 100 * result.extreme_shares(spec.name, 100 * MS, start, end)[1] <= spec.limit + 10, spec.name


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.desc.split(":")[0])
def test_request_holds_over_any_second_and_any_100ms(case: Case) -> None:
    """A busy tenant capped at its request gets it at every horizon, whatever the others
    did before. (An elastic tenant's share is its request plus what is idle.)"""
    result = simulate(case, CFG)
    for spec in case.tenants + case.late:
        start, end = measured(spec)
        low_1s = 100 * result.extreme_shares(spec.name, SECOND, start, end)[0]
        low_100ms = 100 * result.extreme_shares(spec.name, 100 * MS, start, end)[0]
        assert low_1s >= spec.request - 2, spec.name
        assert low_100ms >= spec.request / 2, spec.name


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.desc.split(":")[0])
def test_long_horizon_shares_are_those_of_the_window_policy(case: Case) -> None:
    new, old = simulate(case, CFG), simulate(case, WINDOW_ONLY)
    for name, share in case.shares:
        got = 100 * new.share(name, END - 11 * SECOND, END - SECOND)
        assert got == pytest.approx(share, abs=0.05), name
        assert got == pytest.approx(100 * old.share(name, END - 11 * SECOND, END - SECOND), abs=1.0), name


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.desc.split(":")[0])
def test_a_capped_tenant_settles_at_its_limit_after_its_first_second(case: Case) -> None:
    """No on/off cycle: each second's share of a capped busy tenant is its limit (when
    the GPU has room for it), from its second second on."""
    result = simulate(case, CFG)
    for spec in case.tenants + case.late:
        if spec.request != spec.limit:
            continue
        for at in range(spec.active_from + SECOND, END - SECOND, SECOND):
            assert abs(100 * result.share(spec.name, at, at + SECOND) - spec.limit) <= 2, (spec.name, at)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.desc.split(":")[0])
def test_grants_cost_at_most_twice_the_window_policy(case: Case) -> None:
    new, old = simulate(case, CFG), simulate(case, WINDOW_ONLY)
    assert len(new.grants) <= 2 * len(old.grants)


def test_the_window_policy_alone_lets_an_idle_tenant_burst() -> None:
    """What the checks above catch: with the window alone, B back from idle runs at
    ~100 % and A, well within its request, starves; then B is blocked for seconds."""
    result = simulate(CASES[1], WINDOW_ONLY)
    start = 20 * SECOND
    assert 100 * result.extreme_shares("B", SECOND, start, END - SECOND)[1] > 13 + 1
    assert 100 * result.extreme_shares("A", SECOND, start, END - SECOND)[0] < 50 - 2
    assert min(result.share("B", t, t + SECOND) for t in range(start, start + 6 * SECOND, SECOND)) == 0


def test_both_starting_at_once_leave_no_hole() -> None:
    """Two tenants registered and busy at the same instant: while A's first leases are
    short (its burst still being learned), B's leases stay on their frames, so its
    100 ms floor holds from its first second (it waited 125 ms once, repeated by the
    1 s window for 3 s, before frames)."""
    result = simulate(CASES[0], CFG)
    assert 100 * result.extreme_shares("B", 100 * MS, SECOND, 4 * SECOND)[0] == pytest.approx(13.0)


@pytest.mark.parametrize("burst_ms", [4, 50, 100])
def test_priority_unchanged_beside_a_deep_queue_trainer(burst_ms: int) -> None:
    """bench/latency_bench.py's case: a bursty `high` inference (request 60, half its
    time busy) beside a trainer (request 40) draining 1 ms after a revocation; limits
    100, so only the request side of the short horizons applies: the same waits and
    shares as before. A burst of 50 ms and more once exhausted the idle credit (then
    the allowance alone) and the inference waited a trainer's lease."""
    tenants = [SimTenant("infer", 60, 100, burst_ns=burst_ms * MS, idle_ns=burst_ms * MS, priority=HIGH),
               SimTenant("train", 40, 100, drain_ns=MS)]
    results = []
    for config in (CFG, WINDOW_ONLY):
        sim = Simulation(config, tenants)
        sim.run(12 * SECOND)
        sim.result.max_wait_ns["infer"] = 0
        results.append(sim.run(24 * SECOND))
    new, old = results
    assert new.max_wait_ns["infer"] <= CFG.budget_high_ns
    assert new.max_wait_ns["infer"] == old.max_wait_ns["infer"]
    for name in ("infer", "train"):
        assert new.share(name, 12 * SECOND, 22 * SECOND) == pytest.approx(old.share(name, 12 * SECOND, 22 * SECOND),
                                                                          abs=0.01)


# --- the rules, one at a time -------------------------------------------------------

def make(*tenants: tuple[str, int, int]) -> tuple[Policy, FakeClock]:
    clock = FakeClock(1_000 * SECOND)
    policy = Policy(CFG, clock)
    for name, request, limit in tenants:
        policy.add_tenant(name, request, limit)
    clock.advance(CFG.window_ns)
    return policy, clock


def hold(policy: Policy, clock: FakeClock, tenant: str) -> int:
    """Request, get the grant, hold it to its end wanting more, release; returns the quantum."""
    policy.request(tenant, b"1", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == tenant
    clock.advance(grant.quantum_ns)
    policy.release(tenant, b"1", grant.lease_id, grant.quantum_ns, True)
    return grant.quantum_ns


def ran_a_moment_ago(policy: Policy, clock: FakeClock, tenant: str) -> None:
    """The tenant holds the token for 1 ms and wants no more: it counts as present (its
    limit fills rounds: `Policy._capped_room`) for the longest horizon."""
    policy.request(tenant, b"9", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == tenant
    clock.advance(MS)
    policy.release(tenant, b"9", grant.lease_id, MS, False)


def test_a_capped_lease_is_its_limit_of_100ms() -> None:
    policy, clock = make(("b", 13, 13), ("a", 50, 100))
    assert [hold(policy, clock, "a") // MS for _ in range(5)] == [10, 15, 22, 33, 50]  # a saturating burst
    policy.client_gone("a", b"1")
    # 13 ms a frame: the first lease (the initial burst estimate, 10 ms) was 3 short, made
    # up over the next two (the carry, at most 4 ms a lease; the burst estimate grows to 15).
    assert [quantum for _, quantum in serve(policy, clock, "b", [whole] * 5)] == [10, 15, 14, 13, 13]


def test_idle_time_earns_only_the_allowance() -> None:
    """A capped tenant idle for long starts with half the allowance of credit: after
    one lease it waits until its pace is even again."""
    policy, clock = make(("b", 20, 20))
    assert hold(policy, clock, "b") == 10 * MS  # the initial burst estimate
    policy.request("b", b"1", 0)
    assert policy.dispatch() is None
    # credit 4 ms - 10 ms held + 2 ms earned meanwhile = -4 ms: even after 20 ms at 20 %
    assert policy.next_deadline() == clock.now + 20 * MS


def test_the_100ms_horizon_holds_back_a_second_lease() -> None:
    """10 % + the allowance is 18 ms per 100 ms: a second 10 ms lease must wait until
    2 ms of the first have left the 100 ms before its end, 82 ms after the first ended
    (its pace alone would allow it after 50 ms). The limits fill the GPU (an 85 % tenant
    beside it that ran a moment ago), so its next frame may start early, by half its share
    (5 ms) at most: at 95 ms, 85 after the first ended (the allowance, at 92, before a
    tenant whose request is its limit started no more than half its share early)."""
    policy, clock = make(("b", 10, 10), ("other", 85, 85))
    ran_a_moment_ago(policy, clock, "other")
    assert hold(policy, clock, "b") == 10 * MS
    policy.request("b", b"1", 0)
    assert policy.dispatch() is None
    assert policy.next_deadline() == clock.now + 85 * MS


def test_with_room_to_spare_a_frame_starts_an_eighth_of_its_share_early_at_most() -> None:
    """Alone, a 10 % tenant's limits leave the GPU idle 90 % of the time: its next lease
    waits for its next frame but 1.25 ms (an eighth of its 10 ms), 88.75 ms after the first
    ended, not the allowance early (where a neighbour's hold happened to end), which would
    leave 108 ms between two leases and a 100 ms interval with 2 of its 10 ms."""
    policy, clock = make(("b", 10, 10))
    assert hold(policy, clock, "b") == 10 * MS
    policy.request("b", b"1", 0)
    assert policy.dispatch() is None
    assert policy.next_deadline() == clock.now + 88_750_000


def test_credit_from_idle_does_not_start_a_frame_early() -> None:
    """Back from idle, the same tenant is below its request now (idle time earned it the
    allowance and its request's share of 100 ms, 18 ms; its first lease spent 9), but what
    it idled for is not owed: its next frame starts an eighth of its share early, as a new
    tenant's. Only credit it came to be owed while busy starts a frame earlier (up to the
    allowance: `test_capped_tenants_behind_holds_that_vary_keep_their_requests`)."""
    policy, clock = make(("b", 10, 10))
    assert hold(policy, clock, "b") == 10 * MS
    policy.request("b", b"1", 0)
    assert policy.dispatch() is None
    assert policy.next_deadline() == clock.now + 88_750_000


def serve(policy: Policy, clock: FakeClock, tenant: str, holds: list[Callable[[int], int]],
          not_before: dict[int, int] | None = None) -> list[tuple[float, float]]:
    """Lease after lease to one client that always wants more, each served as soon as the
    policy allows (lease i not before `not_before[i]` ns after the first) and held for
    holds[i](quantum); returns (start ms after the first, quantum ms) of each."""
    t0 = clock.now
    served = []
    for i, held in enumerate(holds):
        policy.request(tenant, b"1", 0)
        clock.set(t0 + (not_before or {}).get(i, 0))
        grant = policy.dispatch()
        while grant is None:
            clock.set(policy.next_deadline())  # type: ignore[arg-type]
            grant = policy.dispatch()
        served.append(((clock.now - t0) / MS, grant.quantum_ns / MS))
        clock.advance(held(grant.quantum_ns))
        policy.release(tenant, b"1", grant.lease_id, held(grant.quantum_ns), True)
    return served


def whole(quantum: int) -> int:
    return quantum


@pytest.mark.parametrize(("late_ms", "starts"), [(5, [0, 105, 197, 295, 395, 495]),
                                                 (30, [0, 130, 225, 325, 425, 525])])
def test_a_lease_served_late_keeps_its_frame_on_the_grid(late_ms: int, starts: list[int]) -> None:
    """10 % is 10 ms a 100 ms frame; the limits fill the GPU (an 85 % tenant beside it that
    ran a moment ago: an idle one does not count). Served 5 ms late, the frame stays on the
    grid: the 100 ms horizon holds the next lease back 5 ms less the allowance's room, the
    one after is in phase again (5 ms early: a lease may start half its share before its
    frame, up to the allowance). Served later than a quarter frame, its phase moves to where
    it was served."""
    policy, clock = make(("b", 10, 10), ("other", 85, 85))
    ran_a_moment_ago(policy, clock, "other")
    served = serve(policy, clock, "b", [whole] * 6, {1: (100 + late_ms) * MS})
    assert [start for start, _ in served] == starts


@pytest.mark.parametrize(("late_ms", "starts"), [(2, [0, 102, 198.75, 298.75, 398.75, 498.75]),
                                                 (5, [0, 105, 203.75, 303.75, 403.75, 503.75])])
def test_with_room_to_spare_a_lease_served_late_moves_its_grid_past_a_quarter_of_its_share(
        late_ms: int, starts: list[float]) -> None:
    """Alone, a 10 % tenant keeps its grid within a quarter of its share (2.5 ms): served 2 ms
    late it stays in phase, its next lease 1.25 ms early (an eighth of its share); served 5 ms
    late, its grid moves there, so that a neighbour that keeps running that late into its
    grid point does not make every other gap between its leases 5 ms longer."""
    policy, clock = make(("b", 10, 10))
    served = serve(policy, clock, "b", [whole] * 6, {1: (100 + late_ms) * MS})
    assert [start for start, _ in served] == starts


def test_a_lease_holds_its_frames_share_past_its_overrun() -> None:
    """Holders that run 3 ms past every lease get leases of 7 ms: 10 ms a frame. The first
    frame's 3 ms over is made up in the second (4 ms + 3): 20 ms in two frames. (The limits
    fill the GPU, as above: frames start up to half their share early.)"""
    policy, clock = make(("b", 10, 10), ("other", 85, 85))
    ran_a_moment_ago(policy, clock, "other")
    served = serve(policy, clock, "b", [lambda q: q + 3 * MS] * 5)
    assert served == [(0, 10), (95, 4), (195, 7), (295, 7), (395, 7)]


@pytest.mark.parametrize(("free", "late_ms", "charged_ms", "next_ms"), [
    (False, 0, 10, 93.5), (False, 1, 11, 93.5), (False, 12, 11, 101),
    (True, 0, 10, 93.5), (True, 1, 10, 93.5), (True, 12, 10, 101),
])
def test_a_grant_that_reaches_its_holder_late_is_charged_at_most_a_handoff_more_than_the_hold(
        free: bool, late_ms: int, charged_ms: int, next_ms: float) -> None:
    """The grant reached b `late_ms` after it was sent (its process woken late by a busy CPU):
    the scheduler saw the lease that much longer than b held it. Handed on from other's
    lease, b is charged its 10 ms hold and at most 1 ms of the way, and its next lease is on
    its grid (93.5 ms after the grant: up to half its share early, the limits filling the
    GPU), or, its hold 12 ms late, where the 100 ms horizon lets it (101 ms). Charged the
    whole way (22 ms), it waited until 138.5 ms: a 13 % tenant with nothing on the GPU for
    more than 100 ms. Lent from a free token (`free`: a dispatch after other's release lent
    it to nobody), the way took no one's turn and b is charged its hold alone: charged 1 ms
    of the way a lease, a 13/13 tenant beside a 50/50 one got 12.2 % of an H200 over 10 s."""
    policy, clock = make(("b", 13, 13), ("other", 85, 85))
    ran_a_moment_ago(policy, clock, "other")
    if free:
        assert policy.dispatch() is None
        clock.advance(MS)
    used = policy.usage_ns("b")
    policy.request("b", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "b" and grant.quantum_ns == 10 * MS
    clock.advance(late_ms * MS + grant.quantum_ns)
    policy.release("b", b"1", grant.lease_id, grant.quantum_ns, True)
    assert policy.usage_ns("b") - used == charged_ms * MS
    assert policy.dispatch() is None
    assert policy.next_deadline() == grant.granted_at + next_ms * MS


def test_the_capped_tenant_whose_frame_ends_first_goes_first() -> None:
    """a's frames start at 0, b's at 50 ms. At 150 ms both wait: b since 60 ms (owed
    more), a since 140 ms, its frame due to end at 200 ms, b's at 250 ms. a goes first,
    so both fit their frames; served in the order they were owed, a would wait for b's
    lease."""
    policy, clock = make(("a", 20, 20), ("b", 20, 20))
    t0 = clock.now
    for name, client, at in (("a", b"1", 0), ("b", b"2", 50 * MS)):
        clock.set(t0 + at)
        policy.request(name, client, 0)
        grant = policy.dispatch()
        assert grant is not None and grant.tenant == name
        clock.advance(10 * MS)
        policy.release(name, client, grant.lease_id, 10 * MS, False)
    policy.request("b", b"2", 0)
    clock.set(t0 + 140 * MS)
    policy.request("a", b"1", 0)
    clock.set(t0 + 150 * MS)
    owed = {name: t.short.due.level(clock.now, next(iter(t.waiting.values())).since)  # type: ignore[union-attr]
            for name, t in policy.tenants.items()}
    assert owed["b"] > owed["a"] > 0
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "a"


@pytest.mark.parametrize(("busy_before", "first"), [(True, "b"), (False, "a")])
def test_a_capped_tenant_below_half_its_request_while_busy_goes_first(busy_before: bool, first: str) -> None:
    """a (50/50) and b (13/13), capped alone. b held 13 ms at 0 (or nothing: back from idle),
    a 50 ms at 20 ms, b 3 ms of its 13 ms lease at 100 ms (its process paused). At 125 ms both
    wait; a's next frame ends first (220 ms, its lease 50 ms; b's at 200 ms). Busy before, b is
    below half its request over the last 100 ms by no doing of its own: it goes first, with the
    rest of its frame. Back from idle, it holds what it asked for, and a goes first."""
    policy, clock = make(("a", 50, 50), ("b", 13, 13))
    t0 = clock.now
    leases = [("a", b"1", 20 * MS, 50 * MS, 50 * MS), ("b", b"2", 100 * MS, 3 * MS, 13 * MS)]
    if busy_before:
        leases.insert(0, ("b", b"2", 0, 13 * MS, 13 * MS))
    for name, client, at, held, predicted in leases:
        clock.set(t0 + at)
        policy.request(name, client, predicted)
        grant = policy.dispatch()
        assert grant is not None and grant.tenant == name
        clock.advance(held)
        policy.release(name, client, grant.lease_id, held, False)
    clock.set(t0 + 125 * MS)
    policy.request("a", b"1", 50 * MS)
    policy.request("b", b"2", 13 * MS)
    grant = policy.dispatch()
    assert grant is not None and (grant.tenant, grant.quantum_ns) == (first, {"a": 50 * MS, "b": 10 * MS}[first])


def test_a_tenant_below_its_request_revokes_an_elastic_holder_above_its_own() -> None:
    """b (60 %) works 30 ms, then pauses 5 ms; a (40 %, limit 70) is always busy. Each
    pause lent a its frame's lease, 50 ms, and b waited for all of it: 37.5 % against
    its 60 (the window policy: 37.3). Revoked once it is above its request, a keeps 40."""
    tenants = [SimTenant("a", 40, 70), SimTenant("b", 60, 100, burst_ns=30 * MS, idle_ns=5 * MS)]
    result = Simulation(CFG, tenants, keep_grants=True).run(12 * SECOND)
    start, end = 2 * SECOND, 12 * SECOND
    assert 100 * result.share("b", start, end) == pytest.approx(60.0, abs=0.5)
    assert 100 * result.share("a", start, end) == pytest.approx(40.0, abs=0.5)
    assert 100 * result.extreme_shares("b", SECOND, start, end)[0] >= 58


@pytest.mark.parametrize("drain_ms", [0, 15, 20])
def test_an_elastic_tenant_in_a_capped_ones_gaps_ends_its_lease_by_that_ones_frame(drain_ms: int) -> None:
    """a (40 %, limit 70) busy alone, then b (60/60) too: a fills the 20 ms gaps between b's
    30 ms leases. It was lent its frame's whole lease there, revoked at b's frame, then
    drained: with drains of 15 and 20 ms it got 43.2 and 44.8 % of the last 6 s, with a 2 s
    window (on the simulator with the CPU short, up to 47.7 % of the window). Above its
    request, its lease now ends by b's frame."""
    tenants = [SimTenant("a", 40, 70, drain_ns=drain_ms * MS),
               SimTenant("b", 60, 60, drain_ns=drain_ms * MS, active_from=3 * SECOND)]
    result = Simulation(replace(CFG, window_ns=2 * SECOND), tenants).run(12 * SECOND)  # as tests/libvcuda
    start, end = 5 * SECOND, 11 * SECOND  # not the last second: a lease in force at the end
    assert 100 * result.share("a", start, end) == pytest.approx(40.0, abs=0.1)
    assert 100 * result.share("b", start, end) == pytest.approx(60.0, abs=0.1)
    assert 100 * result.extreme_shares("b", SECOND, start, end)[0] >= 59.5
    assert 100 * result.extreme_shares("b", 100 * MS, start, end)[0] >= 50


def test_elastic_frames_fit_the_limit_and_allowance_over_100ms() -> None:
    """An elastic tenant's leases, one a frame at its limit of it, hold at most its limit and
    the allowance in any 100 ms, at every limit: 50 ms leases in 71 ms frames at 70 % held
    79 ms in some (the cap: 78), so its 100 ms cut them even with no overrun. Frames of one
    longest lease are kept where they fit (above its request it takes idle time, which comes
    in the gaps others leave, one a frame of theirs)."""
    policy = Policy(CFG, FakeClock())
    horizon = CFG.horizons_ns[0]
    for limit in range(1, 100):
        frame = policy._frame_ns(1, limit)
        share = limit * frame // 100
        whole, rest = divmod(horizon, frame)
        assert whole * share + min(share, rest) <= limit * horizon // 100 + CFG.allowance_ns, limit
    assert policy._frame_ns(1, 60) > 80 * MS and policy._frame_ns(1, 80) > 60 * MS
    assert policy._frame_ns(1, 70) == 50 * MS


def test_a_lease_never_starts_before_the_gap_its_frame_leaves() -> None:
    """A frame's lease may start early, up to the allowance (8 ms) while the capped limits fill
    the GPU; in 12.5 ms frames of a 75/75 tenant (quanta up to 10 ms) the gap after its share
    is 3.1 ms, and a lease that started earlier than that began before the frame before had
    ended: its leases ran back to back up to its horizons' caps, 75.75 % of a 2 s window beside
    a bursty 1/35 and an elastic 23/47 tenant (75.7-75.8 % of every second). Now 75.45: what is
    left is its catching up on frames served late within the grid's tolerance."""
    config = replace(CFG, window_ns=2 * SECOND, quantum_max_ns=10 * MS, grace_ns=5 * MS)
    tenants = [SimTenant("t0", 1, 35, burst_ns=2 * MS, idle_ns=3 * MS), SimTenant("t1", 75, 75, processes=2),
               SimTenant("t2", 23, 47, idle_ns=3 * MS)]
    sim = Simulation(config, tenants)
    t1 = sim.policy.tenants["t1"].short
    assert t1 is not None and t1.frame.length - t1.frame.share < config.allowance_ns
    result = sim.run(8 * SECOND)
    assert 100 * result.share("t1", SECOND // 2, 5 * SECOND // 2) <= 75.5
    assert 100 * result.share("t1", 4 * SECOND, 8 * SECOND) == pytest.approx(75.0, abs=0.1)


def test_frames_of_a_tenant_whose_request_is_its_limit_tile_the_shortest_horizon() -> None:
    """A 60 % tenant runs two 30 ms leases a 100 ms (not one 50 ms lease every 83 ms, which put
    67 ms in some 100 ms intervals, left 1 ms of the allowance for overruns there, cut its leases
    short and got it 57.3 %, 55.7 in its worst second, beside a 40 % one). Both get their share
    over every second, and the 40 % one over every 100 ms."""
    tenants = [SimTenant("a", 60, 60), SimTenant("b", 40, 40)]
    result = Simulation(CFG, tenants, keep_grants=True).run(12 * SECOND)
    start, end = 2 * SECOND, 12 * SECOND
    assert 100 * result.share("a", start, end) == pytest.approx(60.0, abs=0.1)
    assert 100 * result.share("b", start, end) == pytest.approx(40.0, abs=0.1)
    assert 100 * result.extreme_shares("a", SECOND, start, end)[0] >= 59.5
    assert 100 * result.extreme_shares("b", 100 * MS, start, end)[0] == pytest.approx(40.0)
    assert {g.quantum_ns for g in result.grants if g.tenant == "a" and g.granted_at >= start} == {30 * MS}


def test_a_new_high_tenant_does_not_keep_the_token_on_credit_it_never_waited_for() -> None:
    """A `high` and a `normal` tenant, 50 % each, start at once, both always busy. A new
    tenant was credited as one back from a long idle (the allowance and its request's
    share of 100 ms): the `high` one, below its request on that credit, ran first for
    131 ms. Starting with the allowance only, b waits at most one lease, as with the
    window policy."""
    tenants = [SimTenant("a", 50, 100, priority="high"), SimTenant("b", 50, 100)]
    result = Simulation(CFG, tenants, keep_grants=True).run(2 * SECOND)
    assert result.max_wait_ns["b"] <= CFG.quantum_max_ns


def test_a_capped_tenant_revoked_for_a_high_one_keeps_its_request() -> None:
    """A `high` 10/100 tenant's 3 ms bursts, 40 ms apart, revoke a busy 50/50 tenant's
    lease: the rest of that frame is the 50/50 one's at once, however little. Left for
    its next frame as any lease that ended early (a pause of its own), it was owed only
    up to the carry: 48.9 % over 10 s and 46.8 in its worst second beside an elastic
    13/60 tenant."""
    tenants = [SimTenant("a", 50, 50), SimTenant("b", 13, 60),
               SimTenant("c", 10, 100, burst_ns=3 * MS, idle_ns=40 * MS, priority=HIGH)]
    result = Simulation(CFG, tenants).run(30 * SECOND)
    start, end = 20 * SECOND, 30 * SECOND
    assert 100 * result.share("a", start, end) == pytest.approx(50.0, abs=0.1)
    assert 100 * result.extreme_shares("a", SECOND, start, end)[0] >= 48.0
    assert 100 * result.extreme_shares("a", 100 * MS, start, end)[0] >= 25.0
    assert 100 * result.share("c", start, end) == pytest.approx(7.0, abs=0.1)  # all it asks


def test_one_long_overrun_does_not_shorten_the_leases_after_it() -> None:
    """A process's first lease drains what it queued before it knew its kernels' length:
    here 25 ms past a 10 ms lease. One outlier is not a trend: from the fourth frame the
    30 % tenant's leases are its share again (the room kept for the worst overrun kept
    them at 21-23 ms for the 16 leases it is remembered), the first of them with up to
    2 ms of what the short ones before it owed."""
    policy, clock = make(("a", 30, 30))
    served = serve(policy, clock, "a", [lambda q: q + 25 * MS] + [whole] * 6)
    assert all(29 <= quantum <= 32 for _, quantum in served[4:]), served


def test_a_capped_tenant_whose_work_ends_just_before_its_lease_keeps_its_share() -> None:
    """A 40 % process that reaches a synchronize at 90 % of every lease and asks again at
    once is saturating: within a second its leases grow to 44-45 ms, 40 ms held a frame. Sampled as its
    burst, each hold made the next lease 10 % shorter (5 ms after a second)."""
    policy, clock = make(("a", 40, 40))
    served = serve(policy, clock, "a", [lambda q: q * 9 // 10] * 12)
    assert all(39 <= quantum * 0.9 <= 41 for _, quantum in served[9:]), served
    starts = [start for start, _ in served[8:]]
    assert [b - a for a, b in itertools.pairwise(starts)] == [100, 100, 100], served   # one lease a frame


def test_a_lease_that_ended_early_leaves_the_rest_of_its_frame() -> None:
    """A 50 % tenant whose process paused 20 ms into its 50 ms lease gets the other 30 ms
    of its frame at once, then its next frame as before."""
    policy, clock = make(("a", 50, 50))
    served = serve(policy, clock, "a", [whole] * 6 + [lambda q: 20 * MS, whole, whole])
    (paused, lease), (rest, rest_lease), (after, _) = served[6:]
    assert (rest - paused, rest_lease) == (20, lease - 20)
    assert 92 <= after - paused <= 100


def test_a_pair_at_its_limits_keeps_half_its_requests_in_every_100ms_after_its_first_second() -> None:
    """A 30/30 and a 60/60 tenant whose holds run 2 ms past their leases (the simulator's pair,
    whose 30 % tenant had 12-14 ms in some 100 ms just after its first second in 3 runs of 20).
    In its first second the 30/30 one's first frame came in two leases (its burst still
    learned), so at 1.02 s its limit over 1 s cuts its lease to 15.5 ms, and the rest waits
    for that limit until past the frame's half. As a second lease there (12.5 ms at 1.08 s) it
    left the next frame's lease over L + allowance in some 100 ms, which waited: 12.5 ms in some
    100 ms. Now the rest comes with the next frame's lease (34 ms); the 60/60 one's lease before
    it ends by the latest start that keeps the 30/30 one half its request and a millisecond
    (25.5 ms, not 28): 16 ms in every 100 ms (15 with no spare)."""
    tenants = [SimTenant("a", 30, 30, overrun_ns=2 * MS), SimTenant("b", 60, 60, overrun_ns=2 * MS)]
    result = Simulation(CFG, tenants, keep_grants=True).run(3 * SECOND)
    holds = [(start / MS, (end - start) / MS) for start, end in result.hold["a"] if SECOND <= start < 1200 * MS]
    assert holds == [(1022.25, 17.5), (1123.75, 34.0)]
    before = [g.quantum_ns / MS for g in result.grants if g.tenant == "b" and 1090 * MS < g.granted_at < 1124 * MS]
    assert before == [25.5]
    end = 3 * SECOND - 200 * MS
    assert 100 * result.extreme_shares("a", 100 * MS, SECOND, end)[0] == 16.0
    assert 100 * result.extreme_shares("a", SECOND, SECOND, end)[0] == pytest.approx(28.75)


def test_a_capped_lease_leaves_a_spare_above_half_of_a_neighbours_request() -> None:
    """A 50/50 tenant's holds run 0-2 ms past its leases, a 13/13 one's 3 ms past and 3 ms
    short in turn. Bounded to leave the 13/13 one exactly half its request, a 50/50 lease that
    ran past its bound by more than its worst recent overrun left it 6.3 ms in some 100 ms;
    with a millisecond of spare, 7.3, and the 50/50 one keeps its request over every second."""
    tenants = [SimTenant("A", 50, 50), SimTenant("B", 13, 13)]
    scripts = {"A": [MS, 1_500_000, 0, 2 * MS], "B": [3 * MS, -3 * MS]}
    result = ScriptedOverruns(CFG, tenants, scripts, handoff_ns=200_000).run(5 * SECOND)
    start, end = SECOND, 5 * SECOND - 200 * MS
    assert round(100 * result.extreme_shares("B", 100 * MS, start, end)[0], 2) == 7.3
    assert round(100 * result.extreme_shares("A", SECOND, start, end)[0], 2) == 48.42
    for spec in tenants:
        assert 100 * result.extreme_shares(spec.name, SECOND, start, end)[1] <= spec.limit + 1, spec.name


def test_capped_tenants_do_not_shorten_each_others_leases_in_turn() -> None:
    """A capped tenant's lease ends by when another capped one must start (above) only if it
    keeps three quarters of its length: down to a quarter, a 43/43 and a 47/47 tenant beside an
    8/81 one shortened each other's leases in turn, their rests came later and were cut again,
    and they got 39.3 % each over 10 s (the elastic one 21.2)."""
    tenants = mix_tenants([(8, 81), (43, 43), (47, 47)], [True] * 3, CFG.window_ns)
    result = Simulation(CFG, tenants).run(2 * CFG.window_ns)
    shares = [round(100 * result.share(t.name, CFG.window_ns, 2 * CFG.window_ns), 1) for t in tenants]
    assert shares == [pytest.approx(9.9, abs=0.1), 43.0, 47.0]


def test_stats_count_the_token_free_while_tenants_wait_held_back() -> None:
    """`held_back_ms`: how long the token sat free while tenants waited, every one held
    back by its horizons (what the simulator's shortfall was measured with); time the
    token is lent, or a tenant does not wait, counts nothing."""
    policy, clock = make(("b", 10, 10), ("c", 10, 10))
    hold(policy, clock, "b")  # b's next lease may start 88.75 ms later (its frame's, 1.25 ms early)
    policy.request("b", b"1", 0)
    assert policy.dispatch() is None
    clock.advance(30 * MS)
    assert policy.stats()["held_back_ms"] == 30  # an interval still open counts up to now
    policy.request("c", b"2", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "c" and grant.quantum_ns == 10 * MS
    clock.advance(10 * MS)
    policy.release("c", b"2", grant.lease_id, 10 * MS, False)
    assert policy.dispatch() is None
    clock.set(policy.next_deadline())  # type: ignore[arg-type]
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "b"
    stats = policy.stats()
    assert stats["held_back_ms"] == 30 + 48.75
    tenants = stats["tenants"]
    assert isinstance(tenants, dict)
    assert tenants["b"]["held_back_ms"] == 78.75 and tenants["c"]["held_back_ms"] == 0


def test_waiting_behind_others_is_owed_but_idling_is_not() -> None:
    policy, clock = make(("a", 50, 50), ("b", 50, 100))
    credit_idle = policy.tenants["a"].short.due.level(clock.now, None)  # type: ignore[union-attr]
    policy.request("a", b"1", 0)
    waiting_since = clock.now
    clock.advance(100 * MS)
    credit_waiting = policy.tenants["a"].short.due.level(clock.now, waiting_since)  # type: ignore[union-attr]
    assert credit_idle == CFG.allowance_ns + 50 * MS  # + its request's share of 100 ms
    assert credit_waiting == credit_idle + 50 * MS
    assert policy.tenants["b"].short.due.level(clock.now + 10 * SECOND, None) == credit_idle  # type: ignore[union-attr]


def test_live_update_starts_short_horizons_afresh() -> None:
    """The new quota holds over every interval from the change on: time held at the old
    rate does not block a lowered limit for the next second, and is not owed either."""
    policy, clock = make(("a", 90, 90))
    for _ in range(10):  # 50 ms every 60 ms: over 10 % for the last second
        hold(policy, clock, "a")
        clock.advance(10 * MS)
    policy.update_tenant("a", 10, 10)
    policy.request("a", b"1", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.quantum_ns == 10 * MS
    assert policy.tenants["a"].short.due.level(clock.now, clock.now) == 0  # type: ignore[union-attr]


class VaryingOverrun(Simulation):
    """Each lease's holder runs past its quantum by 0 to 8 ms (seeded by `seed`), as real
    holders draining their in-flight work do."""

    seed = 1

    def _start(self, grant: Grant) -> None:
        if not hasattr(self, "rnd"):
            self.rnd = random.Random(self.seed)
        self._procs[grant.client].tenant.overrun_ns = self.rnd.randrange(8 * MS)
        super()._start(grant)


def test_limits_hold_and_little_is_lost_with_overruns_that_vary() -> None:
    """The expected overrun a capped lease leaves room for is the typical one, not the
    worst: the worst made every lease wait for room it did not use (93.6 % of the GPU
    used by three tenants whose limits add up to 100 %). Leases on frames, as long as
    each tenant's holds past them leave its share of a frame, and shortened rather than
    delayed at the 1 s horizon, use 99.7 % of it: served in the order their frames end,
    each lease shorter or longer by what the frames before held over or under their
    share (99.0 % in the order they were owed with no carry, 95.4 % with leases that kept
    no phase and lost what a neighbour's overrun delayed them by)."""
    tenants = [SimTenant("A", 20, 20), SimTenant("B", 30, 30), SimTenant("C", 50, 50)]
    result = VaryingOverrun(CFG, tenants, keep_grants=True).run(END)
    start, end = 5 * SECOND, END - SECOND
    for spec in tenants:
        assert 100 * result.extreme_shares(spec.name, SECOND, start, end)[1] <= spec.limit + 1, spec.name
        assert 100 * result.extreme_shares(spec.name, 100 * MS, start, end)[1] <= spec.limit + 10, spec.name
    assert sum(100 * result.share(s.name, start, end) for s in tenants) == pytest.approx(99.7, abs=0.05)
    for spec in tenants:  # the frames' carry: the holds' variation does not add up over a second
        assert 100 * result.extreme_shares(spec.name, SECOND, start, end)[0] >= spec.request - 2.6, spec.name


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_capped_tenants_behind_holds_that_vary_keep_their_requests(seed: int) -> None:
    """The monitoring tests' GPU 0 (a 2 s window, a 30/30 and a 60/60 tenant) on a loaded
    node, where holds run 0 to 8 ms past their leases. Each tenant's frames started late
    behind the other's overruns, and only an eighth of its share early: the token sat free
    between them 14.5 % of the run, and they got 28.4-28.9 and 56.9-57.7 % over 10 s (the
    window alone 30.0-30.8 and 60.2-60.7, with worst seconds of 18.6-24.3 and 46.0-55.5). A
    tenant owed credit while busy starts its frame up to that much early (the allowance at
    most): within 1 pp of its request over 10 s (29.8-30.0 and 59.4-59.6 in six seeds), and
    3 pp in its worst second (27.2-27.8 and 57.1-57.8)."""
    config = replace(CFG, window_ns=2 * SECOND)
    tenants = [SimTenant("a", 30, 30), SimTenant("b", 60, 60)]
    sim = VaryingOverrun(config, tenants)
    sim.seed = seed
    result = sim.run(20 * SECOND)
    start, end = 10 * SECOND, 19 * SECOND
    for spec in tenants:
        assert 100 * result.share(spec.name, start, end) >= spec.request - 1, spec.name
        low, high = result.extreme_shares(spec.name, SECOND, start, end)
        assert spec.request - 3 <= 100 * low and 100 * high <= spec.limit + 1, spec.name


class HoldsOnKernels(Simulation):
    """Each hold ends at a kernel boundary (2 ms) 3 ms before or after its lease's end, at
    random (seeded): what the simulator's and the H100's traces show of a process that
    synchronizes every 20 ms, whose shim closes the gate a learnt drain before the end."""

    seed = 1

    def _hold(self, quantum: int) -> int:
        return 2 * MS * round((quantum + self.rnd.choice([-3, 3]) * MS) / (2 * MS))

    def _start(self, grant: Grant) -> None:
        if not hasattr(self, "rnd"):
            self.rnd = random.Random(self.seed)
        self._procs[grant.client].tenant.overrun_ns = self._hold(grant.quantum_ns) - grant.quantum_ns
        super()._start(grant)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_tenant_with_short_frames_keeps_its_grid_behind_a_longer_lease(seed: int) -> None:
    """A 60/60 tenant's frames are 50 ms, its 30 ms leases 20 ms apart; its 30/30 neighbour's
    lease is 30 ms, so one of its frames each round is served about 10 ms late, past a
    quarter of its share. Its grid moved each time and drifted a round later: rounds of about
    110 ms, the token free 11.1-11.6 % of the run where 10 % is left, 29.2-29.4 and 58.6-58.9 %
    over 10 s, worst seconds 26.4-26.6 and 54.2-56.7 (the simulator: 28.2-28.8 and 55.9-57.2
    over 10 s; the H100, 28.1 and 56.3). Half its share of tolerance keeps its grid: 29.9-30.0
    and 59.9, worst seconds 27.6-28.4 and 58.0-58.4."""
    tenants = [SimTenant("a", 30, 30), SimTenant("b", 60, 60)]
    sim = HoldsOnKernels(CFG, tenants, handoff_ns=200_000)
    sim.seed = seed
    result = sim.run(20 * SECOND)
    start, end = 5 * SECOND, 19 * SECOND
    for spec in tenants:
        assert 100 * result.share(spec.name, start, end) >= spec.request - 0.3, spec.name
        # Holds up to 3 ms past a lease, more than the expected overrun the horizons leave
        # room for: 61.2 % in one second of seed 3 with either tolerance.
        assert 100 * result.extreme_shares(spec.name, SECOND, start, end)[1] <= spec.limit + 1.5, spec.name
    assert 100 * result.extreme_shares("b", SECOND, start, end)[0] >= 57.5
    assert 100 * sim.policy.held_back_ns / (20 * SECOND) < 10.5


class HoldsAsTraced(HoldsOnKernels):
    """Each hold ends past its lease's end by one of the deciles of what the simulator's
    trace of a 30/30 and 60/60 pair showed (holds end where the process synchronizes and
    its queue drains: 4 ms before to 8 ms after), at random (seeded)."""

    overruns_us = (-4100, -700, 300, 900, 1500, 2000, 2700, 4400, 6500, 8000)

    def _hold(self, quantum: int) -> int:
        return max(MS, quantum + 1000 * self.rnd.choice(self.overruns_us))


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(("small", "large", "lows"), [(30, 60, (27.8, 56.5)), (35, 55, (32.0, 51.8))])
def test_a_short_frame_late_by_its_neighbours_overrun_keeps_its_grid(
        seed: int, small: int, large: int, lows: tuple[float, float]) -> None:
    """A 60/60 tenant's 30 ms leases leave 20 ms gaps; its 30/30 neighbour's lease fills one
    and runs past it by its overrun, up to 8 ms on the simulator. With half its share (15 ms)
    of tolerance the grid moved a few times a second and the pair's worst seconds were
    26.8-27.6 and 56.9-57.4 % (a 35/35 and 55/55 pair: 30.5-32.7 and 51.3-51.4); with the
    gap its frame leaves (20 ms; 22.5 at 55 %), 27.9-28.5 and 56.9-58.0 (32.5-33.5 and
    52.0-53.0)."""
    tenants = [SimTenant("a", small, small), SimTenant("b", large, large)]
    sim = HoldsAsTraced(CFG, tenants, handoff_ns=200_000)
    sim.seed = seed
    result = sim.run(20 * SECOND)
    start, end = 5 * SECOND, 19 * SECOND
    for spec, low in zip(tenants, lows, strict=True):
        assert 100 * result.share(spec.name, start, end) >= spec.request - 0.5, spec.name
        worst, best = result.extreme_shares(spec.name, SECOND, start, end)
        # Holds up to 8 ms past a lease, more than the horizons leave room for: 61.02 % in
        # one second of seed 3 (56.02 for the 55/55 tenant).
        assert 100 * worst >= low and 100 * best <= spec.limit + 1.5, spec.name


def test_elastic_tenants_at_their_requests_do_not_revoke_each_other_in_turn() -> None:
    """Seven busy tenants, five of them elastic, requests adding up to 100: each hovers at
    its request. An elastic holder was revoked the moment it went above its request, for
    one that had just gone below its own and was then revoked in turn: leases of
    microseconds, over 6 000 grants in the first 0.4 s (the fake clock's revocations cost
    nothing; on a GPU each costs a drain). A holder now keeps the token for at least the
    shortest lease (1 ms), so there is at most one grant a millisecond."""
    config = replace(CFG, window_ns=2 * SECOND, quantum_min_ns=1 * MS, quantum_max_ns=10 * MS, grace_ns=5 * MS)
    quotas = [(14, 89), (27, 35), (15, 92), (5, 5), (6, 96), (29, 90), (4, 21)]
    tenants = [SimTenant(f"t{i}", r, lim, processes=1 + i % 2) for i, (r, lim) in enumerate(quotas)]
    result = Simulation(config, tenants, keep_grants=True).run(3 * SECOND)
    start, end = SECOND, 3 * SECOND
    grants = sum(1 for g in result.grants if start <= g.granted_at < end)
    assert grants * SECOND // (end - start) <= SECOND // config.quantum_min_ns, f"{grants // 2} grants a second"
    for tenant, (request, _) in zip(tenants, quotas, strict=True):
        assert 100 * result.share(tenant.name, start, end) == pytest.approx(request, abs=0.5)


@pytest.mark.parametrize(("quotas", "least"), [
    # An elastic tenant whose frame is one longest lease (52 % in 96 ms frames) beside a 48/48
    # one ran 50 ms in every 100 ms: 50.0 %, the GPU 98 % busy, the token free meanwhile.
    ([(1, 52), (48, 48)], [51.5, 47.9]),
    # 17/18 and 51/84, both elastic: 17.1 and 77.9 %, the GPU 95 % busy.
    ([(17, 18), (51, 84)], [16.9, 81.5]),
    # 11/11 beside two uncapped tenants' 50 ms leases: served up to 48 ms late, its grid moved
    # each time and owed 4 of the 5.3 ms it lost: 9.3 %.
    ([(11, 11), (20, 100), (68, 100)], [10.9, 20.0, 67.0]),
])
def test_mixes_of_capped_and_elastic_tenants_keep_requests_and_the_gpu_busy(
        quotas: list[tuple[int, int]], least: list[float]) -> None:
    """All busy. The token is lent, while every waiting tenant waits for its frame, to an
    elastic one below its limit (`Policy._filler`); a capped tenant delayed by an elastic
    tenant's lease is owed up to the allowance (`Frame.start`). The window policy gives 51.5/48.1,
    18.0/81.6 and 11.5/21.0/67.4."""
    tenants = [SimTenant(f"t{i}", r, lim) for i, (r, lim) in enumerate(quotas)]
    result = Simulation(CFG, tenants).run(20 * SECOND)
    start, end = 10 * SECOND, 20 * SECOND
    shares = [100 * result.share(t.name, start, end) for t in tenants]
    assert all(share >= low for share, low in zip(shares, least, strict=True)), shares
    assert sum(shares) >= 99.5, shares
    for tenant in tenants:
        assert 100 * result.extreme_shares(tenant.name, SECOND, start, end)[1] <= tenant.limit + 1


@pytest.mark.parametrize(("limit", "overrun_ms"), [(63, 0), (87, 0), (88, 0), (52, 4), (70, 8), (75, 8), (80, 4)])
def test_an_elastic_tenant_busy_alone_gets_its_limit(limit: int, overrun_ms: int) -> None:
    """Request 1, busy alone: its frames hold its limit. It got 82.6 % of 87 (84.4 of 88): a
    filler lease just before its own frame's start left its 100 ms room for 38 of the next
    lease's 50 ms, and what that cut was owed to the frame after (the carry), whose lease,
    lengthened to 54 ms, was cut again. Now a tenant alone gets no filler (the GPU idles for
    its own frames' sake) and what a longer horizon cut is not owed. With leases that run
    over: 49.8 % of 52, 73.0 of 75 and 70.3 of 80, every other lease cut by its 100 ms, once
    the frame after a cut one was owed the cut lease's overrun; at 75 %, frames of one longest
    lease exceed the 100 ms cap even without one, and tile the horizon now. The window policy
    gives 63.2, 86.8 and 87.8."""
    result = Simulation(CFG, [SimTenant("a", 1, limit, overrun_ns=overrun_ms * MS)]).run(20 * SECOND)
    start, end = 10 * SECOND, 20 * SECOND
    assert limit - 1.5 <= 100 * result.share("a", start, end) <= limit + 0.1
    assert 100 * result.extreme_shares("a", SECOND, start, end)[1] <= limit + 1


def shortest_horizon_lows(quotas: list[tuple[int, int]], busy: list[bool]) -> list[float]:
    """Each busy tenant's least GPU time over any 100 ms of its second window, in percent (an idle
    one bursts 1 ms once at the start)."""
    window = CFG.window_ns
    tenants = mix_tenants(quotas, busy, window)
    result = Simulation(CFG, tenants).run(2 * window)
    return [round(100 * result.extreme_shares(t.name, 100 * MS, window, 2 * window - 200 * MS)[0], 2)
            for t, b in zip(tenants, busy, strict=True) if b]


@pytest.mark.parametrize(("quotas", "busy", "lows"), [
    # An uncapped 87/100 tenant at its request, so below it now and then: its 50 ms leases ran
    # past the 13/13 one's grid point, whose frames came 115 ms apart (nothing in some 100 ms).
    ([(13, 13), (87, 100)], [True, True], [13.0, 87.0]),
    # A 7/100 one's 47 ms lease, lent 6 ms before the 25/25 one's grid point: 0.0.
    ([(66, 70), (7, 100), (25, 25)], [True, True, True], [35.0, 1.0, 19.0]),
])
def test_an_elastic_lease_ends_by_the_grid_of_a_waiting_tenant_below_its_request(
        quotas: list[tuple[int, int]], busy: list[bool], lows: list[float]) -> None:
    """An elastic tenant's lease ends by the grid point of a tenant below its request that
    waits for its frame, whether the elastic tenant is above its own request or below it now
    (its credit toward its request is often a little above zero while it holds its request
    on average)."""
    assert shortest_horizon_lows(quotas, busy) == lows


def test_a_tenant_whose_request_is_its_limit_starts_in_time_for_half_of_it_in_every_100ms() -> None:
    """Frames alone would let a 20/20 tenant's lease start as late as its frame's end less
    the lease: beside elastic tenants with a lot of credit (an uncapped 73/100 one owed more
    than a frame goes first), its leases came up to 135 ms apart and it had nothing in some
    100 ms. Among tenants below their requests it now goes by the earlier of that and the
    latest start that keeps half its request in the 100 ms before it: 12 ms there at least."""
    assert shortest_horizon_lows([(2, 79), (20, 20), (2, 2), (73, 100)], [True, True, False, True]) == [0.0, 12.0, 50.0]


@pytest.mark.parametrize(("quotas", "busy", "lows"), [
    # An uncapped 23/100 tenant's 50 ms lease, lent 20 ms before the 40/40 one's grid point,
    # ran 30 ms past it: 10 ms in some 100 ms.
    ([(23, 100), (40, 40), (17, 100), (18, 80)], [True] * 4, [0.0, 32.0, 0.0, 0.0]),
    # Bounded by the grid point itself, the 10/23 tenant's leases were cut into pieces that spent
    # its 100 ms allowance: 17.8 % of its 23, the GPU 5.2 pp below what the limits allow.
    ([(10, 23), (1, 1), (19, 100), (67, 67)], [True, False, False, True], [23.0, 67.0]),
])
def test_an_elastic_lease_leaves_a_tenant_at_its_request_half_of_it_in_every_100ms(
        quotas: list[tuple[int, int]], busy: list[bool], lows: list[float]) -> None:
    """A waiting tenant whose request is its limit, at its request now (not below it): an
    elastic lease ends by the latest start that keeps it half its request in every 100 ms."""
    assert shortest_horizon_lows(quotas, busy) == lows


def test_an_idle_tenants_limit_does_not_fill_the_round() -> None:
    """Beside an idle 72/81 tenant, a busy 28/28 one counted as in a round its limits fill: its
    frames started the allowance early, its second's limit then cut its leases (24 and 12 ms),
    and it had 12 ms in some 100 ms. Only the tenants present count (`Policy._capped_room`)."""
    assert shortest_horizon_lows([(28, 28), (72, 81)], [True, False]) == [28.0]


def test_elastic_tenants_whose_frames_do_not_tile_keep_the_gpu_busy() -> None:
    """A 26/60 tenant's frames are 83 ms, one 50 ms lease each; a 1/30 one's 100 ms. With
    room to spare, each kept its grid within an eighth of its share early and a quarter of it
    late: every other round the token sat free while both waited for their grids, 12.7 % of
    the time, and they got 56.7 and 30.0 %. Elastic tenants start early and keep their grids
    as in a full round."""
    window = CFG.window_ns
    tenants = [SimTenant("a", 26, 60), SimTenant("b", 1, 30)]
    result = Simulation(CFG, tenants).run(2 * window)
    assert [round(100 * result.share(t.name, window, 2 * window), 1) for t in tenants] == [59.9, 30.0]


def test_random_mixes_keep_limits_each_second_requests_and_the_gpu_busy() -> None:
    """120 mixes of busy and idle tenants (a fixed seed), the daemon's defaults: no tenant
    above its limit + 1 pp in any second, every busy one within 1.5 pp of its request over
    the last 10 s, and the GPU within 1.5 pp of what the busy tenants' limits allow. Before
    the fillers and the owed time behind elastic tenants, 300 such mixes had 16 where the
    GPU idled below that and 2 busy tenants up to 5.5 pp below their requests.

    A busy tenant whose request is its limit (it asks no more than its request) keeps at
    least R - 2 pp in every second and R / 2 in every 100 ms (the issue's goals; 78 such
    tenants here). Before elastic leases ended by the grid of a tenant below its request
    whatever the elastic tenant's own credit, and by when a tenant at its request must start
    to keep half of it, before such tenants' leases were ordered by that and started no more
    than half their share early, and while an idle tenant's limit counted in the round, 5
    missed the first (by up to 0.8) and 12 the second, by up to 11.4 pp: a 30/30 tenant had
    nothing in some 100 ms."""
    rng = random.Random(31)
    window = CFG.window_ns
    for _ in range(120):
        quotas, busy = random_mix(rng)
        tenants = mix_tenants(quotas, busy, window)
        result = Simulation(CFG, tenants).run(2 * window)
        start, end = window, 2 * window
        shares = [100 * result.share(t.name, start, end) for t in tenants]
        for tenant, share, b in zip(tenants, shares, busy, strict=True):
            assert 100 * result.extreme_shares(tenant.name, SECOND, start, end)[1] <= tenant.limit + 1, quotas
            assert not b or share >= tenant.request - 1.5, (quotas, busy, shares)
            if b and tenant.request == tenant.limit:
                # Up to a lease before the run's end: the last one is cut there.
                lows = [100 * result.extreme_shares(tenant.name, h, start, end - 200 * MS)[0]
                        for h in (SECOND, 100 * MS)]
                assert lows[0] >= tenant.request - 2 - ULP, (quotas, busy, tenant.name, lows)
                assert lows[1] >= tenant.request / 2 - ULP, (quotas, busy, tenant.name, lows)
        working = [t for t, b in zip(tenants, busy, strict=True) if b]
        allowed = min(100, sum(t.limit for t in working))
        assert sum(shares) >= allowed - 1.5, (quotas, busy, shares)


def test_a_high_tenant_beside_a_random_mix_uses_no_more_than_its_request() -> None:
    """`with_high_tenant` (bench/mix_bench.py --high): the others' requests leave room for
    the `high` tenant's, and its bursts keep within its request."""
    rng = random.Random(5)
    for _ in range(50):
        quotas, _busy = random_mix(rng)
        scaled, high = with_high_tenant(rng, quotas)
        assert sum(r for r, _ in scaled) + high.request <= 100
        assert all(r <= lim and (lim == r) == (old_lim == old_r)
                   for (r, lim), (old_r, old_lim) in zip(scaled, quotas, strict=True))
        assert high.priority == HIGH and high.limit == 100
        assert high.burst_ns is not None and 100 * high.burst_ns <= high.request * (high.burst_ns + high.idle_ns)
