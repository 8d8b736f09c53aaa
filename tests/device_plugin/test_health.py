"""HealthMonitor against the simulator: XIDs, ignored XIDs, lost GPUs, recovery, prompt stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from node_state.health import DEFAULT_IGNORED_XIDS, HealthMonitor, parse_xid_list
from py_vcuda.nvml import NVML, GPUInfo
from py_vcuda.sim import GiB, SimConfig, SimReader, nvml_session


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)
    return value


@dataclass
class Changes:
    """on_change calls, in order."""

    seen: list[tuple[str, bool, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, uuid: str, healthy: bool, reason: str) -> None:
        with self.lock:
            self.seen.append((uuid, healthy, reason))

    def of(self, uuid: str) -> list[tuple[bool, str]]:
        with self.lock:
            return [(h, r) for u, h, r in self.seen if u == uuid]


class CountingNVML:
    """The real session, counting probes: a test can wait for whole monitor cycles."""

    def __init__(self, nvml: NVML) -> None:
        self.nvml, self.probes = nvml, 0

    def probe(self, index: int) -> bool:
        self.probes += 1
        return self.nvml.probe(index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.nvml, name)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    nvml: CountingNVML
    sim: SimReader
    gpus: list[GPUInfo]
    changes: Changes
    clock: FakeClock
    monitors: list[HealthMonitor] = field(default_factory=list)

    def monitor(self, **kw: Any) -> HealthMonitor:
        kw.setdefault("poll_ms", 50)
        m = HealthMonitor(self.nvml, self.gpus, self.changes, clock=self.clock, **kw)  # type: ignore[arg-type]
        self.monitors.append(m)
        m.start()
        return m

    def cycles(self, n: int = 2) -> None:
        """Waits until the monitor has probed every GPU n more times."""
        target = self.nvml.probes + n * len(self.gpus)
        wait_for(lambda: self.nvml.probes >= target, f"{n} monitor cycles")


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    cfg = SimConfig(state_path=tmp_path / "state", devices=2, memory=1 * GiB)
    with nvml_session(cfg) as nvml, SimReader(cfg.state_path) as sim:
        r = Rig(CountingNVML(nvml), sim, nvml.gpus(), Changes(), FakeClock())
        yield r
        for m in r.monitors:
            m.stop()


def test_critical_xid_marks_unhealthy_then_recovers_after_quiet_time(rig: Rig) -> None:
    m = rig.monitor(recover_after_s=30)
    a, b = rig.gpus
    rig.cycles(1)  # the watch is registered before the first probe cycle ends
    rig.sim.inject_xid(0, 48)
    wait_for(lambda: rig.changes.of(a.uuid), "the XID's transition")
    assert rig.changes.of(a.uuid) == [(False, "critical XID 48")]
    assert not m.healthy(a.uuid) and m.healthy(b.uuid)

    rig.clock.now += 29  # probes pass, but not quiet long enough
    rig.cycles()
    assert not m.healthy(a.uuid)
    rig.clock.now += 2
    wait_for(lambda: m.healthy(a.uuid), "recovery")
    assert rig.changes.of(a.uuid)[-1] == (True, "probe passes, no critical XID for 30 s")
    assert rig.changes.of(b.uuid) == []


def test_a_new_xid_restarts_the_quiet_time(rig: Rig) -> None:
    m = rig.monitor(recover_after_s=30)
    a = rig.gpus[0]
    rig.cycles(1)
    rig.sim.inject_xid(0, 79)
    wait_for(lambda: not m.healthy(a.uuid), "unhealthy")
    rig.clock.now += 20
    rig.sim.inject_xid(0, 94)
    rig.cycles()  # the second XID has been read by now (one wait per cycle)
    rig.clock.now += 20  # 40 s after the first, 20 s after the second
    rig.cycles()
    assert not m.healthy(a.uuid)
    rig.clock.now += 11
    wait_for(lambda: m.healthy(a.uuid), "recovery")
    assert [h for h, _ in rig.changes.of(a.uuid)] == [False, True]


def test_ignored_xids_keep_the_gpu_healthy(rig: Rig) -> None:
    m = rig.monitor()
    a, b = rig.gpus
    rig.cycles(1)
    for xid in sorted(DEFAULT_IGNORED_XIDS):
        rig.sim.inject_xid(0, xid)
    rig.sim.inject_xid(1, 62)  # a barrier: seen after (or with) the ignored ones
    wait_for(lambda: rig.changes.of(b.uuid), "the barrier XID")
    assert rig.changes.of(a.uuid) == []
    assert m.healthy(a.uuid)


def test_custom_ignore_list(rig: Rig) -> None:
    m = rig.monitor(ignored_xids=parse_xid_list("48"))
    a = rig.gpus[0]
    rig.cycles(1)
    rig.sim.inject_xid(0, 48)
    rig.sim.inject_xid(0, 13)  # not in this list: critical here
    wait_for(lambda: rig.changes.of(a.uuid), "a transition")
    assert rig.changes.of(a.uuid) == [(False, "critical XID 13")]
    assert not m.healthy(a.uuid)


def test_lost_gpu_is_unhealthy_until_it_answers_again(rig: Rig) -> None:
    m = rig.monitor(recover_after_s=30)
    a, b = rig.gpus
    rig.sim.set_lost(1)
    wait_for(lambda: not m.healthy(b.uuid), "lost GPU unhealthy")
    assert rig.changes.of(b.uuid) == [(False, "GPU is lost: NVML does not reach it")]
    rig.cycles()
    assert len(rig.changes.of(b.uuid)) == 1  # one transition, not one per probe
    rig.sim.set_lost(1, False)
    wait_for(lambda: m.healthy(b.uuid), "recovery")  # no XID: back as soon as it answers
    assert rig.changes.of(b.uuid)[-1] == (True, "probe passes")
    assert rig.changes.of(a.uuid) == []


def test_a_gpu_lost_at_start_is_watched_once_it_is_back(rig: Rig) -> None:
    b = rig.gpus[1]
    rig.sim.set_lost(1)  # its XID events cannot be registered now
    m = rig.monitor()
    wait_for(lambda: not m.healthy(b.uuid), "lost GPU unhealthy")
    rig.sim.set_lost(1, False)
    wait_for(lambda: m.healthy(b.uuid), "recovery")
    rig.cycles(1)  # the watch is reopened right after the recovering probe
    rig.sim.inject_xid(1, 48)
    wait_for(lambda: not m.healthy(b.uuid), "the XID of a re-watched GPU")
    assert rig.changes.of(b.uuid)[-1] == (False, "critical XID 48")


def test_stop_is_prompt_even_with_a_long_poll(rig: Rig) -> None:
    m = rig.monitor(poll_ms=2000)
    rig.cycles(1)
    t0 = time.monotonic()
    m.stop()
    assert time.monotonic() - t0 < 10  # within one poll (2 s), with room for a loaded machine
    assert not any(t.name == "vcuda-gpu-health" and t.is_alive() for t in threading.enumerate())


class FakeWatch:
    def __init__(self, events: list[tuple[str, int]]) -> None:
        self.events, self.unwatched = events, {}

    def wait(self, timeout_ms: int) -> list[tuple[str, int]]:
        out, self.events = self.events, []
        if not out:
            time.sleep(timeout_ms / 1000)
        return out

    def close(self) -> None:
        pass


class FakeNVML:
    def __init__(self, events: list[tuple[str, int]]) -> None:
        self.watch = FakeWatch(events)

    def watch_xids(self, uuids: object) -> FakeWatch:
        return self.watch

    def probe(self, index: int) -> bool:
        return True


def test_an_xid_nvml_does_not_tie_to_a_gpu_marks_all_unhealthy() -> None:
    gpus = [GPUInfo(i, f"GPU-{i}", "x", 1, i, None) for i in range(3)]
    changes = Changes()
    m = HealthMonitor(FakeNVML([("", 48)]), gpus, changes, poll_ms=20,  # type: ignore[arg-type]
                      recover_after_s=3600)
    m.start()
    try:
        wait_for(lambda: len(changes.seen) == 3, "three transitions")
        assert sorted(changes.seen) == [(g.uuid, False, "critical XID 48") for g in gpus]
    finally:
        m.stop()


@pytest.mark.parametrize(("text", "expected"), [
    ("13,31,43", {13, 31, 43}),
    (" 13 , 31 ,", {13, 31}),
    ("", set()),
    ("109", {109}),
])
def test_parse_xid_list(text: str, expected: set[int]) -> None:
    assert parse_xid_list(text) == expected


@pytest.mark.parametrize("text", ["13;31", "x", "-1", "1.5", "13,,junk"])
def test_parse_xid_list_rejects_junk(text: str) -> None:
    with pytest.raises(ValueError, match="is not a non-negative integer"):
        parse_xid_list(text)


def test_default_ignored_xids_are_nvidias() -> None:
    assert frozenset({13, 31, 43, 45, 68, 109}) == DEFAULT_IGNORED_XIDS
