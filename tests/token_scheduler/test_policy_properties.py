"""Property tests of the policy, driven by the fake-clock simulation.

Window 2 s, quanta 1..10 ms: one quantum is 0.5 pp of the window, so the
tolerances below are a couple of quanta, not loose percentages.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from token_scheduler.policy import MS, SECOND, PolicyConfig
from token_scheduler.simulate import SimTenant, Simulation

W = 2 * SECOND
CFG = PolicyConfig(window_ns=W, quantum_min_ns=1 * MS, quantum_max_ns=10 * MS, grace_ns=5 * MS)
QUANTUM_PP = 100 * (CFG.quantum_max_ns + CFG.grace_ns) / W
# Over the window, a limit holds to one lease past it (the window's rule) and, with short
# horizons, to the allowance over each of the longest horizon's intervals in it (a tenant
# whose frames start early runs at limit + allowance over every second): 0.8 pp here.
LIMIT_PP = max(QUANTUM_PP, 100 * CFG.allowance_ns * (W // max(CFG.horizons_ns)) / W)
# Shares are exact ratios of nanoseconds, compared in floating point: 100 * 0.145 is
# 14.499999999999998, which put a share of exactly 14.5 % (request 16) 1.5000000000000018 pp
# off against a bound of 1.5. The bounds allow for that rounding, nothing more.
ULP = 1e-9
# The same examples on every run (`derandomize`): one that fails then fails every time, and
# CI never fails on a case no commit brought. New ones are searched for by hand, at ten times
# this many examples a property and random seeds; what that finds becomes an @example, a
# plain test, or a known miss (xfail, strict) below.
PROPS = settings(max_examples=60, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])


@st.composite
def partitions(draw: st.DrawFn, total: int = 100) -> list[int]:
    """2..8 whole-percent requests, each >= 1, summing to `total`."""
    n = draw(st.integers(2, 8))
    cuts = sorted(draw(st.lists(st.integers(1, total - 1), min_size=n - 1, max_size=n - 1,
                                unique=True)))
    return [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]


@st.composite
def quotas(draw: st.DrawFn) -> list[tuple[int, int]]:
    """(request, limit) pairs with requests summing to at most 100."""
    requests = draw(partitions())
    spare = draw(st.integers(0, len(requests) - 1))
    requests = [max(1, r - 1) if i < spare else r for i, r in enumerate(requests)]
    return [(r, draw(st.integers(r, 100))) for r in requests]


def share(sim_result: object, name: str, start: int, end: int) -> float:
    return 100 * sim_result.share(name, start, end)  # type: ignore[attr-defined]


@PROPS
@given(partitions(), st.data())
def test_saturated_shares_converge_to_requests(requests: list[int], data: st.DataObject) -> None:
    limits = [data.draw(st.integers(r, 100)) for r in requests]
    check_saturated_shares(requests, limits)


@pytest.mark.parametrize(("requests", "limits"), [
    # An elastic 51/62 tenant among seven busy ones got 49.4 % when its frames' leases could
    # start early only by the gap after their share, as a capped tenant's now do.
    ([1, 12, 51, 1, 7, 6, 14, 8], [35, 62, 62, 1, 68, 100, 66, 65]),
])
def test_saturated_shares_converge_to_requests_in_mixes_found_before(requests: list[int],
                                                                      limits: list[int]) -> None:
    check_saturated_shares(requests, limits)


def test_saturated_shares_converge_to_requests_six_elastic_tenants() -> None:
    """Six elastic tenants whose requests add up to 100 (found at 600 examples a property):
    ordered by their frames' deadlines, which hold their limits' shares, all of them looked
    late below their requests and went in turn, a lease each; the 32/66 tenant got 33.8 %
    and the 36/82 one 34.3 over this window. Elastic tenants now go by how long they are
    owed."""
    check_saturated_shares([23, 32, 1, 4, 36, 4], [91, 66, 84, 37, 82, 34])


def check_saturated_shares(requests: list[int], limits: list[int]) -> None:
    tenants = [SimTenant(f"t{i}", r, lim) for i, (r, lim) in enumerate(zip(requests, limits,
                                                                           strict=True))]
    result = Simulation(CFG, tenants).run(3 * W)
    for i, r in enumerate(requests):
        assert abs(share(result, f"t{i}", 2 * W, 3 * W) - r) <= 2 * QUANTUM_PP + ULP


@PROPS
@given(quotas(), st.lists(st.booleans(), min_size=8, max_size=8), st.integers(1, 30))
# 75/75 beside 1/35 and 23/47: 75.75 % of a window, 75.7-75.8 of every second.
@example(pairs=[(1, 35), (75, 75), (23, 47)], saturating=[False, True, True, False, False, False, False, False],
         burst_ms=2)
def test_never_above_limit(pairs: list[tuple[int, int]], saturating: list[bool],
                           burst_ms: int) -> None:
    tenants = [
        SimTenant(f"t{i}", r, lim, burst_ns=None if saturating[i] else burst_ms * MS,
                  idle_ns=3 * MS, processes=1 + i % 2)
        for i, (r, lim) in enumerate(pairs)
    ]
    result = Simulation(CFG, tenants).run(4 * W)
    for i, (_, lim) in enumerate(pairs):
        for end in range(W, 4 * W + 1, W // 4):
            assert share(result, f"t{i}", end - W, end) <= lim + LIMIT_PP + ULP


@PROPS
@given(quotas(), st.data())
def test_work_conservation(pairs: list[tuple[int, int]], data: st.DataObject) -> None:
    """Idle tenants' time goes to the busy ones, up to their limits; the GPU idles
    only when every busy tenant is at its limit."""
    busy = [data.draw(st.booleans()) for _ in pairs]
    busy[0] = True
    tenants = [SimTenant(f"t{i}", r, lim, burst_ns=None if busy[i] else 1 * MS,
                         idle_ns=W * 10) for i, (r, lim) in enumerate(pairs)]
    result = Simulation(CFG, tenants).run(3 * W)
    total = sum(share(result, f"t{i}", 2 * W, 3 * W) for i in range(len(pairs)))
    cap = min(100, sum(lim for (_, lim), b in zip(pairs, busy, strict=True) if b))
    assert total >= cap - 2 * QUANTUM_PP - ULP


@PROPS
@given(quotas(), st.lists(st.integers(1, 40), min_size=8, max_size=8))
@example(pairs=[(1, 1)] * 7 + [(93, 93)], bursts_ms=[1, 1, 11, 1, 2, 1, 1, 1])
# A capped tenant's first frame: its deadline moved with the clock, and t0 (1/1, busy from
# the start) waited 2.48 s for its first lease behind neighbours with fixed deadlines.
@example(pairs=[(1, 1), (1, 1), (1, 4), (1, 44), (1, 46), (32, 76), (44, 67), (19, 21)], bursts_ms=[1] * 8)
def test_starvation_free(pairs: list[tuple[int, int]], bursts_ms: list[int]) -> None:
    """Every tenant's oldest waiting process is served within one window (+ one lease),
    whatever the others do: a tenant at its limit waits at most until its window sheds.
    A tenant's processes are served in the order they asked, so a process may first wait
    for each sibling ahead of it: with k processes, at most k such turns (hypothesis found
    a tenant of 3 processes at a 1 % limit whose last one waited 2.08 s, over one turn)."""
    tenants = [
        SimTenant(f"t{i}", r, lim, burst_ns=None if i % 3 == 0 else bursts_ms[i] * MS,
                  idle_ns=bursts_ms[-1 - i] * MS, processes=1 + i % 3)
        for i, (r, lim) in enumerate(pairs)
    ]
    result = Simulation(CFG, tenants).run(3 * W)
    for i, tenant in enumerate(tenants):
        assert result.hold[f"t{i}"], f"t{i} never ran"
        turn = W + CFG.quantum_max_ns + CFG.grace_ns
        assert result.max_wait_ns[f"t{i}"] <= tenant.processes * turn


@PROPS
@given(partitions(), st.randoms(use_true_random=False))
def test_live_update_takes_effect_within_one_window(requests: list[int], rnd: object) -> None:
    tenants = [SimTenant(f"t{i}", r, r) for i, r in enumerate(requests)]
    sim = Simulation(CFG, tenants)
    sim.run(2 * W)
    new = list(requests)
    rnd.shuffle(new)  # type: ignore[attr-defined]
    for i, r in enumerate(new):
        sim.policy.update_tenant(f"t{i}", r, r)
    result = sim.run(3 * W)
    for i, r in enumerate(new):
        assert abs(share(result, f"t{i}", 2 * W, 3 * W) - r) <= 2 * QUANTUM_PP + ULP
