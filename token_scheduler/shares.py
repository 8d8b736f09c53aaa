"""Shares of GPU time over every interval of a given length, from a tenant's
cumulative GPU time: what "within its limit over any 100 ms" is checked with.

The cumulative time C is piecewise linear between the points given (exact for
hold intervals, interpolated between samples), so C(t) - C(t - H) is extreme
where t or t - H is a point: those are the intervals examined.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence


def cumulative(intervals: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (time, GPU time so far) points of sorted, non-overlapping hold intervals."""
    points: list[tuple[int, int]] = []
    total = 0
    for start, end in intervals:
        points.append((start, total))
        total += end - start
        points.append((end, total))
    return points


def _at(times: list[int], values: list[int], t: int) -> float:
    """C(t), linear between points, flat outside them."""
    i = bisect_right(times, t)
    if i == 0:
        return values[0]
    if i == len(times):
        return values[-1]
    t0, t1 = times[i - 1], times[i]
    return values[i - 1] + (values[i] - values[i - 1]) * (t - t0) / (t1 - t0)


def share_between(points: Sequence[tuple[int, int]], start: int, end: int) -> float:
    """The share of [start, end] the GPU time in `points` covers."""
    if not points:
        return 0.0
    times = [t for t, _ in points]
    values = [v for _, v in points]
    return (_at(times, values, end) - _at(times, values, start)) / (end - start)


def extreme_shares(points: Sequence[tuple[int, int]], horizon: int, start: int, end: int) -> tuple[float, float]:
    """(lowest, highest) share of every interval [t - horizon, t] within [start, end]."""
    if end - start < horizon:
        raise ValueError("the span is shorter than the horizon")
    if not points:
        return 0.0, 0.0
    times = [t for t, _ in points]
    values = [v for _, v in points]
    candidates = {start + horizon, end}
    for t in times:
        candidates.update((t, t + horizon))
    low, high = float("inf"), 0.0
    for t in candidates:
        if start + horizon <= t <= end:
            share = (_at(times, values, t) - _at(times, values, t - horizon)) / horizon
            low, high = min(low, share), max(high, share)
    return low, high
