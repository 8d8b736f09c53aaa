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
