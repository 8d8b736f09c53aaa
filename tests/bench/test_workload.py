"""bench/workload.py's BusySampler keeps only samples it can time: a read held up past
SAMPLE_SPAN_NS is dropped and counted, never stamped with the time it ended."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import workload  # noqa: E402


@dataclass
class Proc:
    pid: int
    busy_ns: int


class SlowEveryThirdRead:
    """A simulator reader whose every third read is held up 5 ms after it read the state:
    the moment it read is logged, to check each kept sample's time against it."""

    reads: list[int] = []

    def __init__(self, _path: Path) -> None:
        pass

    def processes(self, _device: int) -> list[Proc]:
        read_at = time.monotonic_ns()
        SlowEveryThirdRead.reads.append(read_at)
        if len(SlowEveryThirdRead.reads) % 3 == 0:
            time.sleep(0.005)
        return [Proc(7, read_at)]

    def close(self) -> None:
        pass


def test_a_read_held_up_is_dropped_and_the_others_are_timed_to_their_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "SimReader", SlowEveryThirdRead)
    SlowEveryThirdRead.reads = []
    with workload.BusySampler(Path("unused"), 0.002) as sampler:
        time.sleep(0.2)
    reads = len(SlowEveryThirdRead.reads)
    assert reads >= 9
    assert sampler.dropped >= reads // 3 - 1  # every third read, and those a busy CPU held up
    assert len(sampler.samples) + sampler.dropped == reads
    for at, busy in sampler.samples:  # the fake's busy count is the moment of its read
        assert abs(at - busy[7]) <= workload.SAMPLE_SPAN_NS


def test_served_log_keeps_every_stretch_once_at_its_longest_and_sees_a_ring_that_turned_over() -> None:
    log = workload.ServedLog()
    log.add([(0, 5), (10, 12)])
    log.add([(0, 5), (10, 15), (20, 21)])  # the newest stretch grew, one more began
    assert log.points() == [(0, 0), (5, 5), (10, 5), (15, 10), (20, 10), (21, 11)]
    assert not log.lost
    ring = [(100 + 10 * i, 105 + 10 * i) for i in range(workload.STRETCHES)]
    log.add(ring)  # full, and its oldest is newer than the newest read: some were never read
    assert log.lost
    full = workload.ServedLog()
    full.add(ring)
    full.add(ring[1:] + [(2000, 2001)])  # turned over by one, the one dropped was read
    assert not full.lost


class OneReadHeldUp(SlowEveryThirdRead):
    """The fifth read is held up 60 ms: the host took the sampler's CPU away."""

    def processes(self, _device: int) -> list[Proc]:
        SlowEveryThirdRead.reads.append(time.monotonic_ns())
        if len(SlowEveryThirdRead.reads) == 5:
            time.sleep(0.06)
        return [Proc(7, 0)]


def test_a_sampler_held_up_past_its_turn_says_when(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "SimReader", OneReadHeldUp)
    SlowEveryThirdRead.reads = []
    with workload.BusySampler(Path("unused"), 0.002) as sampler:
        time.sleep(0.2)
    reads = SlowEveryThirdRead.reads
    assert any(first <= reads[4] < last and last - first >= 60_000_000 for first, last in sampler.held_up)
