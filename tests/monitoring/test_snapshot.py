"""NodeReader without a simulator: stand-in token schedulers (ZeroMQ REP on the admin socket path) and a
stand-in NVML, so the cases that matter are exact — rows with the same names, malformed scheduler
replies, and the GPU-time counter under an injected clock."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from monitoring.snapshots import GiB, MiB
from prometheus_client.parser import text_string_to_metric_families

from node_state import metrics_text
from node_state.layout import SCHEDULER_DIR_KEY, ContainerRecord, NodeLayout, ledger_in
from node_state.metrics import snapshot_metrics
from node_state.metrics_snapshot import NodeReader
from py_vcuda.ledger import Ledger
from py_vcuda.nvml import GPUInfo, GPUUsage

UUID0 = "GPU-00000000-0000-4000-8000-000000000000"
UUID1 = "GPU-00000000-0001-4000-8000-000000000001"
COMMAND = "python3 train.py"


class FakeScheduler:
    """Answers every admin request on `<directory>/admin.sock` with `reply()` (bytes), in its own thread."""

    def __init__(self, directory: Path, reply: Callable[[], bytes]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.endpoint = f"ipc://{directory / 'admin.sock'}"
        self.reply = reply
        self.requests = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _serve(self) -> None:
        sock = zmq.Context.instance().socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.endpoint)
        self._ready.set()
        try:
            while not self._stop.is_set():
                if sock.poll(20):
                    sock.recv()
                    self.requests += 1
                    sock.send(self.reply())
        finally:
            sock.close(0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def tenant_doc(share: float, usage_ms: float, **extra: object) -> dict[str, object]:
    return {"request": 30, "limit": 50, "share": share, "usage_ms": usage_ms, "grants": 7, "overruns": 1,
            "waiting": 0, "wait_us": {"p99": 1500.0},
            "wait_histogram": {"le_s": [0.001, 0.01], "counts": [3, 4, 0], "sum_s": 0.02}, **extra}


def stats_reply(tenants: dict[str, object], window_s: float = 10.0) -> bytes:
    return json.dumps({"ok": True, "gpu": UUID0, "window_s": window_s, "epoch": 1, "holder": None,
                       "tenants": tenants}).encode()


def run_record(layout: NodeLayout, key: str, *, sched: Path | None, uuid: str = UUID0) -> ContainerRecord:
    """A `vcuda run` record as py_vcuda.launch writes it (no pod names, the command as container, GPUs from
    the ledger), with its ledger."""
    record = ContainerRecord(key=key, mode="vgpu", resource="", device_ids=(), gpus=(), core_request=30,
                             core_limit=50, memory_limit=GiB, tenant=key if sched else None, container=COMMAND,
                             extra={SCHEDULER_DIR_KEY: str(sched)} if sched else {})
    directory = layout.write_record(record)
    with Ledger(ledger_in(directory), create=True) as ledger:
        ledger.set_limit(uuid, GiB)
    return record


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeNVML:
    """Two GPUs; utilization (percent) of GPU 0 set by the test."""

    def __init__(self) -> None:
        self.utilization = 0.0

    def gpus(self) -> list[GPUInfo]:
        return [GPUInfo(0, UUID0, "Fake GPU", 16 * GiB, 0, None), GPUInfo(1, UUID1, "Fake GPU", 16 * GiB, 1, None)]

    def usage(self, index: int) -> GPUUsage:
        util = self.utilization if index == 0 else 0.0
        return GPUUsage(util, 2 * GiB, 16 * GiB, None, None)


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="vc", dir="/tmp"))  # ipc paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def samples_of(text: str, name: str) -> list[dict[str, str]]:
    return [s.labels for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_two_bare_metal_runs_of_one_command_are_two_series(root: Path) -> None:
    layout = NodeLayout(root / "n")
    run_record(layout, "run-101", sched=None)
    run_record(layout, "run-202", sched=None)
    reader = NodeReader(layout, mode="vgpu", node="node-a")
    try:
        snap = reader.snapshot()
    finally:
        reader.close()
    assert [(r.key, r.container, r.namespace, r.pod) for r in snap.containers] == [
        ("run-101", COMMAND, "", ""), ("run-202", COMMAND, "", "")]
    text = metrics_text.render(snapshot_metrics(snap)).decode()
    limits = samples_of(text, "vcuda_container_memory_limit_bytes")
    assert sorted(s["tenant"] for s in limits) == ["run-101", "run-202"]
    # without `tenant` the two label sets would be one series (Prometheus keeps only one of them)
    assert len({tuple(sorted((k, v) for k, v in s.items() if k != "tenant")) for s in limits}) == 1
    for name in {s.name for f in text_string_to_metric_families(text) for s in f.samples}:
        series = [tuple(sorted(labels.items())) for labels in samples_of(text, name)]
        assert len(series) == len(set(series)), f"{name}: duplicate series"
    promtool = shutil.which("promtool")
    if promtool is not None:
        proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


MALFORMED = [
    pytest.param(b"not json", id="not-json"),
    pytest.param(b"[1, 2]", id="not-an-object"),
    pytest.param(b'{"ok": false, "error": "busy"}', id="refused"),
    pytest.param(b'{"ok": true, "window_s": 10, "tenants": []}', id="tenants-not-an-object"),
    pytest.param(b'{"ok": true, "window_s": "ten", "tenants": {}}', id="window-not-a-number"),
    pytest.param(b'{"ok": true, "tenants": {}}', id="no-window"),
    pytest.param(json.dumps({"ok": True, "window_s": 10, "tenants": {"run-2": [1, 2]}}).encode(),
                 id="tenant-not-an-object"),
    pytest.param(json.dumps({"ok": True, "window_s": 10, "tenants": {"run-2": {"share": "x"}}}).encode(),
                 id="tenant-fields"),
    pytest.param(stats_reply({"run-2": tenant_doc(0.1, 100, wait_us=[1])}), id="wait-us-not-an-object"),
    pytest.param(stats_reply({"run-2": tenant_doc(0.1, 100, wait_histogram={"le_s": [1], "counts": [1]})}),
                 id="histogram-lengths"),
]


@pytest.mark.parametrize("garbage", MALFORMED)
def test_a_malformed_scheduler_reply_costs_only_its_own_tenants(root: Path, garbage: bytes) -> None:
    layout = NodeLayout(root / "n")
    good = FakeScheduler(root / "s1", lambda: stats_reply({"run-1": tenant_doc(0.3, 3000)}))
    replies = [garbage, stats_reply({"run-2": tenant_doc(0.2, 2000)})]
    bad = FakeScheduler(root / "s2", lambda: replies[0] if bad.requests <= 1 else replies[1])
    run_record(layout, "run-1", sched=root / "s1")
    run_record(layout, "run-2", sched=root / "s2")
    reader = NodeReader(layout, mode="vgpu", node="node-a", admin_timeout_s=2.0)
    try:
        snap = reader.snapshot()
        rows = {r.key: r for r in snap.containers}
        assert rows["run-1"].tenant_stats is not None and rows["run-1"].tenant_stats.grants == 7
        assert rows["run-2"].tenant_stats is None and rows["run-2"].memory_limit == GiB
        assert len(snap.errors) == 1 and ("s2" in snap.errors[0] or "run-2" in snap.errors[0]), snap.errors
        text = metrics_text.render(snapshot_metrics(snap)).decode()
        assert [s["tenant"] for s in samples_of(text, "vcuda_container_token_grants_total")] == ["run-1"]
        assert len(samples_of(text, "vcuda_container_core_request_ratio")) == 2
        # the next reply is well formed: read again, no restart needed
        again = {r.key: r for r in reader.snapshot().containers}
        assert again["run-2"].tenant_stats is not None and again["run-2"].tenant_stats.share == 0.2
    finally:
        reader.close()
        good.stop()
        bad.stop()


def test_gpu_time_counter_of_a_tenant(root: Path) -> None:
    """A vGPU tenant's counter is the scheduler's lifetime hold time; a silent scheduler costs the series,
    and a scheduler without the counter gives none (no guessing)."""
    layout = NodeLayout(root / "n")
    doc: dict[str, object] = {"run-1": tenant_doc(0.5, 1000, held_ms_total=1000)}
    broken = [False]
    scheduler = FakeScheduler(root / "s1", lambda: b"garbage" if broken[0] else stats_reply(doc))
    run_record(layout, "run-1", sched=root / "s1")
    clock = Clock()
    reader = NodeReader(layout, mode="vgpu", node="node-a", clock=clock, admin_timeout_s=2.0)

    def gpu_time() -> float | None:
        (row,) = reader.snapshot().containers
        return row.gpu_time_s

    try:
        assert gpu_time() == pytest.approx(1.0)
        clock.now += 30
        doc["run-1"] = tenant_doc(0.5, 5000, held_ms_total=16_000)   # the window forgets, the counter does not
        assert gpu_time() == pytest.approx(16.0)
        broken[0] = True
        clock.now += 5
        assert gpu_time() is None
        broken[0] = False
        doc["run-1"] = tenant_doc(0.5, 5000)
        assert gpu_time() is None
        doc["run-1"] = tenant_doc(0.5, 5000, held_ms_total=90_000)
        assert gpu_time() == pytest.approx(90.0)
        text = metrics_text.render(snapshot_metrics(reader.snapshot())).decode()
        (labels,) = samples_of(text, "vcuda_container_gpu_time_seconds_total")
        assert labels["tenant"] == "run-1"
    finally:
        reader.close()
        scheduler.stop()


def test_gpu_time_counter_of_whole_cards(root: Path) -> None:
    """pGPU and whole-card vGPU containers: NVML utilization integrated over time (trapezoids)."""
    layout = NodeLayout(root / "n")
    layout.write_record(ContainerRecord(key="c-pgpu", mode="pgpu", resource="nvidia.com/gpu", device_ids=(UUID0,),
                                        gpus=(UUID0,), core_request=100, core_limit=100, memory_limit=None))
    layout.write_record(ContainerRecord(key="c-frac", mode="vgpu", resource="r", device_ids=("x",), gpus=(UUID1,),
                                        core_request=30, core_limit=30, memory_limit=512 * MiB))
    layout.write_record(ContainerRecord(key="c-whole", mode="vgpu", resource="r", device_ids=("y",), gpus=(UUID1,),
                                        core_request=100, core_limit=100, memory_limit=None))
    nvml = FakeNVML()
    clock = Clock()
    reader = NodeReader(layout, mode="pgpu", node="node-a", nvml=nvml, clock=clock)  # type: ignore[arg-type]

    def rows() -> dict[str, float | None]:
        return {r.key: r.gpu_time_s for r in reader.snapshot().containers}

    try:
        nvml.utilization = 100.0
        assert rows() == {"c-pgpu": 0.0, "c-frac": None, "c-whole": 0.0}  # no token tenant: no share to count
        clock.now += 10
        nvml.utilization = 50.0
        assert rows()["c-pgpu"] == pytest.approx(7.5)
        clock.now += 4
        assert rows()["c-pgpu"] == pytest.approx(9.5)
        whole = next(r for r in reader.snapshot().containers if r.key == "c-whole")
        assert whole.share == 0.0 and whole.memory_limit == 16 * GiB  # the card is the container's
    finally:
        reader.close()
