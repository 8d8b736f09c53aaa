"""The health monitor's verdicts reach kubelet: every logical device of a failed
GPU goes Unhealthy in a fresh ListAndWatch list, and comes back when it recovers.
(The monitor itself, NVML XID events, is tested in test_health*.)"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path


class FakeMonitor:
    def __init__(self, inventory, on_change: Callable[[str, bool, str], None]) -> None:  # type: ignore[no-untyped-def]
        self.gpus = inventory.gpus
        self.on_change = on_change
        self.running = False

    def start(self) -> None:
        self.running = True

    def stop(self) -> None:
        self.running = False


def health_by_gpu(devices) -> dict[str, set[str]]:  # type: ignore[no-untyped-def]
    out: dict[str, set[str]] = {}
    for d in devices:
        out.setdefault(d.ID.split("::")[0], set()).add(d.health)
    return out


def test_failed_gpu_marks_all_its_devices_and_recovers(agent_factory, kubelet, dp):
    monitors: list[FakeMonitor] = []

    def factory(inventory, on_change):  # type: ignore[no-untyped-def]
        monitors.append(FakeMonitor(inventory, on_change))
        return monitors[-1]

    agent = agent_factory("vgpu", gpus=2, health_factory=factory)
    a, b = dp.gpu(0).uuid, dp.gpu(1).uuid
    core = kubelet.wait_registered("tencent.com/vcuda-core")
    memory = kubelet.wait_registered("tencent.com/vcuda-memory")
    dp.wait_for(lambda: core.lists and memory.lists, what="first lists")
    (monitor,) = monitors
    assert monitor.running and [g.uuid for g in monitor.gpus] == [a, b]

    n_core, n_mem = len(core.lists), len(memory.lists)
    monitor.on_change(b, False, "XID 79: fallen off the bus")
    dp.wait_for(lambda: len(core.lists) > n_core and len(memory.lists) > n_mem, what="resend")
    assert health_by_gpu(core.lists[-1]) == {a: {"Healthy"}, b: {"Unhealthy"}}
    assert health_by_gpu(memory.lists[-1]) == {a: {"Healthy"}, b: {"Unhealthy"}}
    assert len(core.lists[-1]) == 200   # the full list every time

    n_core = len(core.lists)
    monitor.on_change(b, False, "XID 79 again")   # no change: no resend needed
    monitor.on_change(b, True, "passed health checks")
    dp.wait_for(lambda: len(core.lists) > n_core and health_by_gpu(core.lists[-1])[b] == {"Healthy"},
                what="recovery")
    agent.stop()
    assert not monitor.running


def test_ignored_xids_unset_empty_and_listed(dp):
    """--ignored-xids unset keeps NVIDIA's list; "" ignores none (every XID fails the GPU); a list is that list."""
    from node_state.health import DEFAULT_IGNORED_XIDS, nvml_health

    def ignored(text: str | None) -> frozenset[int]:
        return nvml_health(None, text)(dp.inventory(1), lambda *_: None).ignored_xids  # type: ignore[arg-type]

    assert ignored(None) == DEFAULT_IGNORED_XIDS and 13 in DEFAULT_IGNORED_XIDS
    assert ignored("") == frozenset()
    assert ignored("48, 79") == {48, 79}
    cfg = dp.plugin_config(Path(tempfile.gettempdir()), "vgpu", ignored_xids="")
    assert cfg.ignored_xids == ""   # "" survives configuration as a value, distinct from unset (None)
