"""The short-horizon records (token_scheduler/horizon.py) and the interval shares
the horizon checks use (token_scheduler/shares.py), one rule at a time."""

from __future__ import annotations

import pytest

from token_scheduler.horizon import Frame, RateBucket, Trail
from token_scheduler.shares import cumulative, extreme_shares, share_between

MS = 1_000_000


def bucket() -> RateBucket:
    """10 %, idle credit up to 4 ms, owed credit up to 100 ms, debt down to 50 ms; at t=0."""
    return RateBucket(10, 4 * MS, 100 * MS, 50 * MS, 0)


@pytest.mark.parametrize(
    ("desc", "now", "waiting_since", "level"),
    [("starts with the idle credit", 0, None, 4 * MS),
     ("idle time earns no more", 1000 * MS, None, 4 * MS),
     ("waiting earns past it", 100 * MS, 0, 14 * MS),
     ("idle, then waiting: only the wait counts beyond", 200 * MS, 100 * MS, 14 * MS),
     ("owed credit stops at the cap", 5000 * MS, 0, 100 * MS)],
)
def test_credit(desc: str, now: int, waiting_since: int | None, level: int) -> None:
    assert bucket().level(now, waiting_since) == level


def test_holding_spends_and_earns_and_debt_stops_at_the_floor() -> None:
    b = bucket()
    b.settle(0, 0)
    assert b.level_holding(10 * MS, 0) == 4 * MS - 10 * MS + 1 * MS
    b.charge(0, 10 * MS)
    assert b.level(10 * MS, None) == -5 * MS
    assert b.ns_until_even(10 * MS, 10 * MS) == 50 * MS
    b.charge(10 * MS, 500 * MS)
    assert b.level(500 * MS, None) == -50 * MS


def test_a_late_report_is_spent_without_earning() -> None:
    b = bucket()
    b.charge(0, 10 * MS)
    b.charge(5 * MS, 7 * MS)  # before the last charge's end
    assert b.level(10 * MS, None) == -7 * MS


def test_restart_forgets_credit_and_debt() -> None:
    b = bucket()
    b.charge(0, 30 * MS)
    b.restart(50, 200 * MS, 30 * MS)
    assert b.level(30 * MS, None) == 0 and b.level(40 * MS, 30 * MS) == 5 * MS


@pytest.mark.parametrize(
    ("desc", "low", "held"),
    [("all", 0, 30 * MS), ("from inside a hold", 15 * MS, 25 * MS), ("between holds", 25 * MS, 20 * MS),
     ("after the last", 60 * MS, 0)],
)
def test_trail_held_since(desc: str, low: int, held: int) -> None:
    trail = Trail(1000 * MS)
    trail.add(10 * MS, 20 * MS)
    trail.add(30 * MS, 50 * MS)
    assert trail.held_since(low) == held


def test_trail_sheds_and_forgets_the_old() -> None:
    trail = Trail(100 * MS)
    for i in range(200):  # 1 ms every 10 ms for 2 s
        trail.add(i * 10 * MS, i * 10 * MS + MS)
    assert trail.held_since(1_900 * MS) == 10 * MS
    assert trail.shed_until(1_900 * MS, 3 * MS) == 1_920 * MS + MS
    assert len(trail.ends) < 200  # compacted


def test_trail_places_a_late_hold_at_the_newest_end() -> None:
    trail = Trail(1000 * MS)
    trail.add(100 * MS, 110 * MS)
    trail.add(50 * MS, 55 * MS)
    assert trail.held_since(104 * MS) == 6 * MS + 5 * MS


def frame_at(at: int | None, used: int = 0) -> Frame:
    """A 100 ms frame of a 10 % share that began at `at`, `used` ns of it charged."""
    frame = Frame(100 * MS, 10 * MS, 8 * MS)
    frame.at, frame.used = at, used
    return frame


@pytest.mark.parametrize(
    ("desc", "frame", "now", "used", "wait"),
    [("no frame yet: at once", frame_at(None), 5 * MS, 50 * MS, 0),
     ("within its budget: at once", frame_at(0, 10 * MS), 20 * MS, 18 * MS, 0),
     ("its budget spent: the next frame, less the early margin", frame_at(0, 10 * MS), 20 * MS, 19 * MS, 72 * MS),
     ("within the margin: at once", frame_at(0, 10 * MS), 95 * MS, 19 * MS, 0)],
)
def test_frame_wait(desc: str, frame: Frame, now: int, used: int, wait: int) -> None:
    assert frame.wait(now, used, 18 * MS, 8 * MS) == wait


@pytest.mark.parametrize(
    ("desc", "frame", "now", "since", "at", "carry"),
    [("the first grant begins a frame", frame_at(None), 7 * MS, 0, 7 * MS, 0),
     ("within the frame: nothing changes", frame_at(0, 13 * MS), 50 * MS, 40 * MS, 0, 0),
     ("early: the next frame, on the grid, 3 ms over its share", frame_at(0, 13 * MS), 93 * MS, 90 * MS, 100 * MS,
      3 * MS),
     ("late within the tolerance: on the grid, 1 ms under", frame_at(0, 9 * MS), 125 * MS, 90 * MS, 100 * MS, -MS),
     ("later: where it is served, owed its share of 30 ms", frame_at(0, 10 * MS), 130 * MS, 90 * MS, 130 * MS,
      -3 * MS),
     ("much later: owed at most the carry cap", frame_at(0, 10 * MS), 900 * MS, 90 * MS, 900 * MS, -8 * MS),
     ("back from idle: where it is served, no carry", frame_at(0, 13 * MS), 5000 * MS, 4990 * MS, 5000 * MS, 0)],
)
def test_frame_start(desc: str, frame: Frame, now: int, since: int, at: int, carry: int) -> None:
    used = frame.used
    frame.start(now, 8 * MS, 25 * MS, since, True)
    assert (frame.at, frame.carry) == (at, carry)
    assert frame.used == (used if desc.startswith("within") else 0)


def test_a_frame_served_late_behind_an_elastic_tenant_is_owed_twice_the_carry_cap() -> None:
    """Late because an elastic tenant held the token (not its own pace): owed up to twice the
    carry cap (the policy's allowance), so that the lease after it makes up more of it."""
    frame = frame_at(0, 10 * MS)
    frame.start(900 * MS, 8 * MS, 25 * MS, 90 * MS, True, behind_elastic=True)
    assert (frame.at, frame.carry) == (900 * MS, -16 * MS)
    frame = frame_at(0, 10 * MS)
    frame.start(130 * MS, 8 * MS, 25 * MS, 90 * MS, True, behind_elastic=True)
    assert frame.carry == -3 * MS  # what it is owed, when less


def test_a_frame_served_late_above_its_request_owes_nothing() -> None:
    """An elastic tenant above its request was rightly served after a neighbour within its
    own: its next lease makes up none of the time lost."""
    frame = frame_at(0, 10 * MS)
    frame.start(130 * MS, 8 * MS, 25 * MS, 90 * MS, False)
    assert (frame.at, frame.carry) == (130 * MS, 0)


def test_frame_carry_adds_up_within_the_allowance() -> None:
    """Frames over and under their share add up: the carry is the sum, at most 8 ms."""
    frame = frame_at(0)
    carries = []
    for i, used in enumerate([14, 20, 6, 5, 10], start=1):
        frame.used = used * MS
        frame.start(i * 100 * MS, 8 * MS, 25 * MS, i * 100 * MS - MS, True)
        carries.append(frame.carry // MS)
    assert carries == [4, 8, 4, -1, -1]  # 4 + 10 = 14 is capped at 8


def test_shares_over_every_interval() -> None:
    points = cumulative([(0, 10 * MS), (100 * MS, 110 * MS), (150 * MS, 200 * MS)])
    assert share_between(points, 0, 200 * MS) == pytest.approx(70 / 200)
    low, high = extreme_shares(points, 100 * MS, 0, 200 * MS)
    assert low == pytest.approx(0.10) and high == pytest.approx(0.60)
    with pytest.raises(ValueError):
        extreme_shares(points, 300 * MS, 0, 200 * MS)
