"""Priority classes, revocation and the in-flight budget in the pure policy (fake clock),
then the guarantees they must keep, driven by the simulation."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from token_scheduler.errors import ErrorCode, PolicyError
from token_scheduler.policy import HIGH, MS, NORMAL, SECOND, Policy, PolicyConfig, validate_priority
from token_scheduler.simulate import FakeClock, SimTenant, Simulation

CFG = PolicyConfig(window_ns=1 * SECOND, quantum_min_ns=1 * MS, quantum_max_ns=20 * MS, grace_ns=5 * MS,
                   budget_ns=4 * MS, budget_high_ns=1 * MS, revoke_grace_ns=2 * MS)


def make(*tenants: tuple[str, int, int, str]) -> tuple[Policy, FakeClock]:
    clock = FakeClock(1_000 * SECOND)
    policy = Policy(CFG, clock, epoch=3)
    for name, request, limit, priority in tenants:
        policy.add_tenant(name, request, limit, priority)
    clock.advance(CFG.window_ns)  # full-length windows
    return policy, clock


def use(policy: Policy, clock: FakeClock, tenant: str, ns: int) -> None:
    """`tenant` holds the token for `ns` (it must be free)."""
    policy.request(tenant, b"use", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == tenant
    clock.advance(ns)
    policy.release(tenant, b"use", grant.lease_id, ns, False)


@pytest.mark.parametrize("value", ["HIGH", "low", "", None, 1])
def test_unknown_priority_names_the_accepted_ones(value: object) -> None:
    with pytest.raises(ValueError, match="one of high, normal"):
        validate_priority(value)
    policy, _ = make()
    with pytest.raises(ValueError, match="one of high, normal"):
        policy.add_tenant("t", 10, 10, value)  # type: ignore[arg-type]


def test_high_below_request_is_served_before_normal_below_request() -> None:
    policy, _ = make(("n", 50, 100, NORMAL), ("h", 20, 100, HIGH))
    policy.request("n", b"n", 0)  # larger deficit, and waiting first
    policy.request("h", b"h", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "h"


def test_above_request_a_high_tenant_gets_no_more_than_its_turn() -> None:
    """Spare time goes to the least used, whatever the class: priority never buys time."""
    policy, clock = make(("n", 10, 100, NORMAL), ("h", 10, 100, HIGH))
    use(policy, clock, "h", 300 * MS)  # both above request, h used more
    use(policy, clock, "n", 200 * MS)
    policy.request("h", b"h", 0)
    policy.request("n", b"n", 0)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "n"


def test_high_request_revokes_a_normal_holder_once() -> None:
    policy, clock = make(("n", 40, 100, NORMAL), ("h", 60, 100, HIGH))
    policy.request("n", b"n", 0)
    lease = policy.dispatch()
    assert lease is not None and policy.preempt() is None  # nobody high waits
    clock.advance(3 * MS)
    policy.request("h", b"h", 0)
    revoke = policy.preempt()
    assert revoke is not None
    assert (revoke.tenant, revoke.client, revoke.lease_id) == ("n", b"n", lease.lease_id)
    assert revoke.budget_ns == CFG.budget_high_ns  # a normal tenant next to a high one
    assert policy.preempt() is None  # already revoked
    assert policy.next_deadline() == clock.now + CFG.budget_high_ns + CFG.revoke_grace_ns
    with pytest.raises(PolicyError) as err:  # a revoked lease is not renewed
        policy.renew("n", b"n", lease.lease_id)
    assert err.value.code == ErrorCode.RENEW_DENIED
    clock.advance(700_000)  # the holder drains its in-flight work and releases
    policy.release("n", b"n", lease.lease_id, 3_700_000, True)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "h"
    stats = policy.stats()["tenants"]
    assert stats["n"]["revocations"] == 1 and stats["n"]["revoke_reclaims"] == 0
    assert stats["h"]["preempt_wait_us"]["samples"] == 1
    assert stats["h"]["preempt_wait_us"]["max"] == pytest.approx(700)
    assert stats["n"]["waiting"] == 1  # MORE: queued again behind the high tenant


def test_a_revoked_burst_does_not_shrink_the_quantum() -> None:
    policy, clock = make(("n", 40, 100, NORMAL), ("h", 60, 100, HIGH))
    burst = policy.tenants["n"].burst_ns
    policy.request("n", b"n", 0)
    lease = policy.dispatch()
    assert lease is not None
    clock.advance(MS)
    policy.request("h", b"h", 0)
    assert policy.preempt() is not None
    policy.release("n", b"n", lease.lease_id, MS, True)
    assert policy.tenants["n"].burst_ns == burst


@pytest.mark.parametrize(
    ("desc", "tenants", "used", "revoked"),
    [
        ("high never revokes high", (("a", 40, 100, HIGH), ("h", 60, 100, HIGH)), {}, False),
        ("high at its limit revokes nobody", (("n", 40, 100, NORMAL), ("h", 20, 20, HIGH)),
         {"h": 300 * MS}, False),
        ("high above request never takes a normal below its request",
         (("n", 50, 100, NORMAL), ("h", 10, 100, HIGH)), {"h": 300 * MS, "n": 100 * MS}, False),
        ("high above request, less used than the normal holder above its own",
         (("n", 10, 100, NORMAL), ("h", 10, 100, HIGH)), {"h": 200 * MS, "n": 400 * MS}, True),
        ("high above request, more used than the normal holder",
         (("n", 10, 100, NORMAL), ("h", 10, 100, HIGH)), {"h": 400 * MS, "n": 200 * MS}, False),
        ("high below request, normal holder below its own", (("n", 50, 100, NORMAL), ("h", 50, 100, HIGH)),
         {}, True),
    ],
)
def test_revocation_follows_the_dispatch_order(desc: str, tenants: tuple, used: dict[str, int],
                                               revoked: bool) -> None:
    policy, clock = make(*tenants)
    for name, ns in used.items():
        use(policy, clock, name, ns)
    holder, waiter = tenants[0][0], tenants[1][0]
    policy.request(holder, b"holder", 0)
    assert policy.dispatch() is not None
    policy.request(waiter, b"waiter", 0)
    assert (policy.preempt() is not None) == revoked, desc


def test_a_holder_that_ignores_the_revocation_is_reclaimed() -> None:
    policy, clock = make(("n", 40, 100, NORMAL), ("h", 60, 100, HIGH))
    policy.request("n", b"n", 0)
    lease = policy.dispatch()
    assert lease is not None
    clock.advance(2 * MS)
    policy.request("h", b"h", 0)
    assert policy.preempt() is not None
    clock.advance(CFG.budget_high_ns + CFG.revoke_grace_ns - 1)
    assert policy.dispatch() is None  # not yet
    clock.advance(1)
    grant = policy.dispatch()
    assert grant is not None and grant.tenant == "h"
    stats = policy.stats()["tenants"]["n"]
    assert stats["revoke_reclaims"] == 1 and stats["expiries"] == 1
    # charged up to the reclaim; a late RELEASE adds its real hold (overrun)
    assert stats["usage_ms"] == pytest.approx(5.0)
    clock.advance(4 * MS)
    policy.release("n", b"n", lease.lease_id, 9 * MS, False)
    assert policy.stats()["tenants"]["n"]["usage_ms"] == pytest.approx(9.0)


def test_budgets_follow_who_could_be_kept_waiting() -> None:
    policy, _ = make(("a", 30, 100, NORMAL), ("b", 30, 100, NORMAL))
    assert policy.budget_ns("a") == policy.budget_ns("b") == CFG.budget_ns
    policy.add_tenant("h", 20, 100, HIGH)
    assert policy.budget_ns("a") == policy.budget_ns("b") == CFG.budget_high_ns
    assert policy.budget_ns("h") == CFG.budget_ns  # nobody revokes it, no other high waits for it
    policy.update_tenant("b", 30, 100, HIGH)
    assert policy.budget_ns("h") == policy.budget_ns("b") == CFG.budget_high_ns
    policy.remove_tenant("h")
    policy.update_tenant("b", 30, 100, NORMAL)
    assert policy.budget_ns("a") == CFG.budget_ns
    assert policy.idle_ns("a") == CFG.idle_ns
    policy.update_tenant("a", 30, 100, HIGH)
    assert policy.idle_ns("a") == CFG.idle_high_ns


def test_normal_budget_is_at_most_a_quarter_quantum() -> None:
    config = PolicyConfig(window_ns=SECOND, quantum_max_ns=8 * MS, budget_ns=10 * MS)
    assert config.normal_budget_ns == 2 * MS
    with pytest.raises(ValueError):
        PolicyConfig(budget_ns=MS, budget_high_ns=2 * MS)


def test_client_reports_add_up() -> None:
    policy, _ = make(("a", 30, 100, NORMAL))
    policy.report("a", 3, 2 * MS)
    policy.report("a", 2, MS)
    stats = policy.stats()["tenants"]["a"]
    assert (stats["budget_hits"], stats["budget_wait_ms"]) == (5, 3.0)


# --- guarantees, on the fake-clock simulation ---------------------------------------------------

W = 2 * SECOND
SIM_CFG = PolicyConfig(window_ns=W, quantum_min_ns=1 * MS, quantum_max_ns=10 * MS, grace_ns=5 * MS,
                       budget_ns=2 * MS, budget_high_ns=1 * MS)
PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(st.integers(5, 90), st.integers(0, 100), st.integers(1, 3))
def test_a_saturating_high_tenant_cannot_push_a_normal_one_below_its_request(
        normal_request: int, high_spare: int, normals: int) -> None:
    high_request = max(1, (100 - normal_request) * high_spare // 100)
    tenants = [SimTenant("high", high_request, 100, priority=HIGH, drain_ns=MS)]
    tenants += [SimTenant(f"n{i}", normal_request // normals or 1, 100, drain_ns=MS) for i in range(normals)]
    result = Simulation(SIM_CFG, tenants).run(3 * W)
    for spec in tenants[1:]:
        assert 100 * result.share(spec.name, 2 * W, 3 * W) >= spec.request - 1.0
    assert 100 * result.share("high", 2 * W, 3 * W) >= high_request - 1.0


@PROPS
@given(st.integers(1, 8), st.integers(2, 40), st.integers(10, 60))
def test_a_bursty_high_tenant_is_served_at_once_and_the_trainer_gets_the_rest(
        burst_ms: int, idle_ms: int, high_request: int) -> None:
    """Work conservation and latency together: the high tenant (demand below its request)
    waits at most the trainer's drain for each burst; the trainer gets everything else."""
    high = SimTenant("high", high_request, 100, burst_ns=burst_ms * MS, idle_ns=idle_ms * MS, priority=HIGH)
    trainer = SimTenant("train", 100 - high_request, 100, drain_ns=MS)
    demand = burst_ms / (burst_ms + idle_ms)
    sim = Simulation(SIM_CFG, [high, trainer])
    sim.run(W)  # past the first window, while shares are measured over the tenants' young age
    sim.result.max_wait_ns["high"] = 0
    result = sim.run(3 * W)
    if 100 * demand < high_request - 2:  # its use stays below its request: it always preempts
        assert result.max_wait_ns["high"] <= MS
    high_share = result.share("high", 2 * W, 3 * W)
    assert result.share("train", 2 * W, 3 * W) >= 1 - high_share - 0.01
