"""The exporter's output, parsed with Prometheus' text parser, against what the simulator,
the ledgers and the schedulers recorded for the tenants of conftest's scenario."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest
from monitoring.conftest import NODE, GiB, MiB, Node, wait_for
from monitoring.snapshots import SNAPSHOT, row
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from node_state import metrics_text
from node_state.metrics import snapshot_metrics, start_exporter
from node_state.metrics_snapshot import NodeReader, NodeSnapshot
from py_vcuda.ledger import Ledger
from token_scheduler.admin_client import AdminClient

SHARE_TOLERANCE = 0.08      # absolute, of the GPU's time: sampling edges of a 2 s window
# GPU-time counter against the simulator's busy time over an interval, as a fraction of the interval: the
# vGPU estimate lags the sliding window (2 s on GPU 0) by a part of it, the pGPU one samples NVML's utilization.
GPU_TIME_TOLERANCE = 0.1
Samples = dict[str, list[Sample]]


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        return resp.read().decode()


def scrape(port: int) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(scrape_text(port)):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def find(samples: Samples, name: str, **labels: str) -> list[Sample]:
    return [s for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]


def one(samples: Samples, name: str, **labels: str) -> float:
    hits = find(samples, name, **labels)
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples"
    return hits[0].value


@pytest.fixture(scope="module")
def exporter(node: Node) -> Iterator[int]:
    stop = start_exporter(port=0, addr="127.0.0.1", layout=node.layout, mode="vgpu", node=NODE,
                          pod_resources_socket=node.kubelet_socket, nvml=node.nvml)
    try:
        yield stop.port  # type: ignore[attr-defined]
    finally:
        stop()


def labels_of(node: Node, key: str) -> dict[str, str]:
    ns, pod, container = node.expected_names[key]
    return {"node": NODE, "namespace": ns, "pod": pod, "container": container,
            "tenant": node.tenants[key].record_key}


def test_every_container_appears_with_its_labels_and_quotas(node: Node, exporter: int) -> None:
    s = scrape(exporter)
    for t in node.tenants.values():
        labels = {**labels_of(node, t.key), "gpu": str(t.gpu), "uuid": node.uuids[t.gpu], "mode": t.mode}
        assert one(s, "vcuda_container_core_request_ratio", **labels) == pytest.approx(t.request / 100)
        assert one(s, "vcuda_container_core_limit_ratio", **labels) == pytest.approx(t.limit / 100)
        want_limit = t.memory_limit if t.memory_limit is not None else 4 * GiB  # pGPU: the whole card
        assert one(s, "vcuda_container_memory_limit_bytes", **labels) == want_limit
    # names resolved through pod-resources for records that lacked them
    assert find(s, "vcuda_container_core_request_ratio", namespace="team-b", pod="infer-0", container="server")
    assert find(s, "vcuda_container_core_request_ratio", namespace="team-c", pod="render-0", mode="pgpu")
    # two bare-metal runs of one command: the same names, two series told apart by `tenant`
    runs = find(s, "vcuda_container_memory_limit_bytes", namespace="", pod="", container="python3 train.py")
    assert sorted(smp.labels["tenant"] for smp in runs) == ["run-a", "run-b"]
    for name, samples in s.items():
        series = [tuple(sorted(smp.labels.items())) for smp in samples]
        assert len(series) == len(set(series)), f"{name}: two samples with one label set"


def test_gpu_metrics_match_nvml_and_allocations(node: Node, exporter: int) -> None:
    s = scrape(exporter)
    with node.reader() as sim:
        devices = sim.devices()
    for d in devices:
        labels = {"node": NODE, "gpu": str(d.index), "uuid": d.uuid}
        assert one(s, "vcuda_gpu_memory_total_bytes", **labels) == d.capacity
        assert one(s, "vcuda_gpu_info", **labels) == 1
        assert 0 <= one(s, "vcuda_gpu_utilization_ratio", **labels) <= 1
        assert one(s, "vcuda_gpu_temperature_celsius", **labels) > 0
        assert one(s, "vcuda_gpu_power_watts", **labels) > 0
        tenants = [t for t in node.tenants.values() if t.gpu == d.index]
        assert one(s, "vcuda_gpu_containers", **labels) == len(tenants)
        assert one(s, "vcuda_gpu_cores_allocated_ratio", **labels) == pytest.approx(
            sum(t.request for t in tenants) / 100)
    gpu_modes = {smp.labels["gpu"]: smp.labels["mode"] for smp in s["vcuda_gpu_info"]}
    assert gpu_modes == {"0": "vgpu", "1": "vgpu", "2": "pgpu", "3": "mps"}
    assert one(s, "vcuda_gpu_memory_allocated_bytes", gpu="3") == 3 * GiB
    assert one(s, "vcuda_scheduler_up", gpu="0") == 1
    assert not find(s, "vcuda_scheduler_up", gpu="2")  # pGPU: no scheduler


def test_memory_matches_ledgers_and_simulator(node: Node, exporter: int) -> None:
    held = [t for t in node.tenants.values() if t.mode == "vgpu" and t.holds]
    for t in held:  # the allocation happens before the spin starts
        wait_for(lambda t=t: find(scrape(exporter), "vcuda_container_memory_used_bytes", **labels_of(node, t.key))
                 and one(scrape(exporter), "vcuda_container_memory_used_bytes", **labels_of(node, t.key))
                 >= t.holds, 60, f"{t.key}'s allocation")
    s = scrape(exporter)
    with node.reader() as sim:
        for t in held:
            used = one(s, "vcuda_container_memory_used_bytes", **labels_of(node, t.key))
            with Ledger(node.layout.ledger_path(t.record_key)) as ledger:
                (device,) = ledger.devices()
            assert used == device.used
            # the simulator's own count for the process: the allocation plus its context
            (proc,) = [p for p in sim.processes(t.gpu) if p.pid == t.proc.pid]  # type: ignore[union-attr]
            assert abs(used - proc.used) <= 64 * MiB, (t.key, used, proc.used)
            assert t.holds <= used <= t.holds + 64 * MiB
        render = node.tenants["render"]
        gpu = sim.device(render.gpu)
        assert one(s, "vcuda_container_memory_used_bytes", **labels_of(node, "render")) == gpu.used
    full = labels_of(node, "full")
    wait_for(lambda: one(scrape(exporter), "vcuda_container_oom_denials_total", **full) >= 1, 60, "full's OOM")
    s = scrape(exporter)
    assert one(s, "vcuda_container_memory_used_bytes", **full) > 0.95 * 512 * MiB


def _busy(node: Node, gpu: int) -> dict[int, int]:
    with node.reader() as sim:
        return {p.pid: p.busy_ns for p in sim.processes(gpu)}


def test_shares_match_the_simulator(node: Node, exporter: int) -> None:
    """GPU 0's scheduler window is 2 s: the share over it against the simulator's busy time over 2 s."""
    tenants = [node.tenants["train"], node.tenants["infer"]]
    wait_for(lambda: all(find(scrape(exporter), "vcuda_container_gpu_time_share_ratio", **labels_of(node, t.key))
                         for t in tenants), 60, "shares")
    time.sleep(2.0)  # let the window fill with steady state
    before, t0 = _busy(node, 0), time.monotonic()
    time.sleep(2.0)  # one scheduler window
    s = scrape(exporter)
    after, t1 = _busy(node, 0), time.monotonic()
    for t in tenants:
        pid = t.proc.pid  # type: ignore[union-attr]
        measured = (after[pid] - before[pid]) / 1e9 / (t1 - t0)
        exported = one(s, "vcuda_container_gpu_time_share_ratio", **labels_of(node, t.key))
        assert abs(exported - measured) <= SHARE_TOLERANCE, (t.key, exported, measured)
        assert abs(exported - t.limit / 100) <= SHARE_TOLERANCE, (t.key, exported)
    render = one(s, "vcuda_container_gpu_time_share_ratio", **labels_of(node, "render"))
    assert render > 0.9  # a whole card, spinning: NVML's utilization


def test_token_wait_histogram_is_cumulative_and_matches_the_scheduler(node: Node, exporter: int) -> None:
    s = scrape(exporter)
    labels = labels_of(node, "train")
    buckets = sorted(find(s, "vcuda_container_token_wait_seconds_bucket", **labels),
                     key=lambda smp: float(smp.labels["le"]))
    values = [b.value for b in buckets]
    assert values == sorted(values) and buckets[-1].labels["le"] == "+Inf"
    count = one(s, "vcuda_container_token_wait_seconds_count", **labels)
    assert values[-1] == count > 0
    assert one(s, "vcuda_container_token_wait_seconds_sum", **labels) > 0
    grants = one(s, "vcuda_container_token_grants_total", **labels)
    assert grants >= count  # every wait ended in a grant


def _scheduler_tenants(node: Node, gpu: int) -> dict[str, dict]:
    admin = AdminClient(node.layout.scheduler_dir(node.uuids[gpu]) / "admin.sock")
    try:
        reply = admin.call("stats", timeout_s=10)
    finally:
        admin.close()
    assert reply.get("ok"), reply
    return reply["tenants"]  # type: ignore[return-value]


def _cumulative(histogram: dict) -> dict[float, int]:
    running, out = 0, {}
    for bound, count in zip([*histogram["le_s"], float("inf")], histogram["counts"], strict=True):
        running += count
        out[float(bound)] = running
    return out


def test_token_counters_and_waits_match_the_schedulers_stats(node: Node, exporter: int) -> None:
    """Grants, overruns and the wait histogram (every bucket, count and sum) against the schedulers' own
    `stats`, read just before and just after the scrape: the exported value lies between the two (exact,
    up to the text format's float repr); counters only grow, so the bracket is the tolerance."""
    tenants = [t for t in node.tenants.values() if t.mode == "vgpu" and not t.bare]
    wait_for(lambda: one(scrape(exporter), "vcuda_container_token_grants_total", **labels_of(node, "train")) > 0,
             60, "train's grants")
    before = {gpu: _scheduler_tenants(node, gpu) for gpu in (0, 1)}
    s = scrape(exporter)
    after = {gpu: _scheduler_tenants(node, gpu) for gpu in (0, 1)}
    eps = 1e-9
    for t in tenants:
        lo, hi, labels = before[t.gpu][t.key], after[t.gpu][t.key], labels_of(node, t.key)
        for metric, field in (("vcuda_container_token_grants_total", "grants"),
                              ("vcuda_container_token_overruns_total", "overruns"),
                              ("vcuda_container_token_renewals_total", "renewals"),
                              ("vcuda_container_token_revocations_total", "revocations"),
                              ("vcuda_container_token_revoke_reclaims_total", "revoke_reclaims"),
                              ("vcuda_container_inflight_budget_hits_total", "budget_hits")):
            assert lo[field] <= one(s, metric, **labels) <= hi[field], (t.key, metric, lo[field], hi[field])
        assert one(s, "vcuda_container_inflight_budget_seconds", **labels) == hi["budget_us"] / 1e6
        lo_cum, hi_cum = _cumulative(lo["wait_histogram"]), _cumulative(hi["wait_histogram"])
        buckets = find(s, "vcuda_container_token_wait_seconds_bucket", **labels, priority=t.priority)
        assert len(buckets) == 11
        for b in buckets:
            bound = float(b.labels["le"])
            assert lo_cum[bound] <= b.value <= hi_cum[bound], (t.key, bound, b.value, lo_cum[bound], hi_cum[bound])
        count = one(s, "vcuda_container_token_wait_seconds_count", **labels)
        assert lo_cum[float("inf")] <= count <= hi_cum[float("inf")], t.key
        total = one(s, "vcuda_container_token_wait_seconds_sum", **labels)
        assert lo["wait_histogram"]["sum_s"] - eps <= total <= hi["wait_histogram"]["sum_s"] + eps, t.key
        assert lo["grants"] <= hi["grants"]
    assert one(s, "vcuda_container_token_grants_total", **labels_of(node, "train")) > 0
    # "lat" is `high`: its bursts revoke "hog", whose budget is the small one next to a high tenant
    wait_for(lambda: one(scrape(exporter), "vcuda_container_token_revocations_total", **labels_of(node, "hog")) > 0,
             60, "hog's revocations")
    assert one(s, "vcuda_container_inflight_budget_seconds", **labels_of(node, "hog")) == 0.001


def _ledger_devices(node: Node) -> dict[str, object]:
    out = {}
    for t in node.tenants.values():
        path = node.layout.ledger_path(t.record_key)
        if path.exists():
            with Ledger(path) as ledger:
                (out[t.key],) = ledger.devices()
    return out


def test_oom_denials_match_the_ledgers(node: Node, exporter: int) -> None:
    """OOM denials of every container with a ledger, between the ledger's count before and after the scrape
    (exact: the counter only grows); `full` has run into its limit."""
    wait_for(lambda: one(scrape(exporter), "vcuda_container_oom_denials_total", **labels_of(node, "full")) >= 1,
             60, "full's OOM")
    before = _ledger_devices(node)
    s = scrape(exporter)
    after = _ledger_devices(node)
    assert set(before) == {t.key for t in node.tenants.values() if t.mode == "vgpu"}
    for key in before:
        exported = one(s, "vcuda_container_oom_denials_total", **labels_of(node, key))
        assert before[key].oom_denials <= exported <= after[key].oom_denials, key  # type: ignore[attr-defined]
    assert one(s, "vcuda_container_oom_denials_total", **labels_of(node, "train")) == 0


def test_gpu_memory_used_matches_the_simulator(node: Node, exporter: int) -> None:
    """NVML's memory used per GPU (the simulator's NVML) against the simulator's own count, read before and
    after the scrape: the exported value is one of the two or between them (exact)."""
    with node.reader() as sim:
        before = {d.index: d.used for d in sim.devices()}
    s = scrape(exporter)
    with node.reader() as sim:
        after = {d.index: d.used for d in sim.devices()}
    for gpu in before:
        exported = one(s, "vcuda_gpu_memory_used_bytes", gpu=str(gpu))
        assert min(before[gpu], after[gpu]) <= exported <= max(before[gpu], after[gpu]), (gpu, exported)
    # the tenants' own allocations are in it: GPU 0 holds train, infer and the two runs, each with a context
    assert before[0] >= (256 + 512 + 2 * 128) * MiB


def test_gpu_time_counter_matches_the_simulator(node: Node, exporter: int) -> None:
    """The GPU-time counter's increase over ~4 s against the simulator's busy time of the tenant's process:
    train and infer (token hold time, GPU 0's 2 s window, read every second) and render (a whole pGPU card,
    NVML utilization), within GPU_TIME_TOLERANCE of the interval."""
    keys = ["train", "infer", "render"]
    wait_for(lambda: all(find(scrape(exporter), "vcuda_container_gpu_time_seconds_total", **labels_of(node, k))
                         for k in keys), 60, "GPU-time counters")
    assert not find(scrape(exporter), "vcuda_container_gpu_time_seconds_total", mode="mps")
    time.sleep(2.0)  # steady state over a whole window

    def busy() -> dict[int, int]:
        return {**_busy(node, 0), **_busy(node, 2)}

    s0, b0, t0 = scrape(exporter), busy(), time.monotonic()
    for _ in range(4):
        time.sleep(1.0)  # at least one reading per scheduler window
        scrape(exporter)
    s1, b1, t1 = scrape(exporter), busy(), time.monotonic()
    for key in keys:
        pid = node.tenants[key].proc.pid  # type: ignore[union-attr]
        measured = (b1[pid] - b0[pid]) / 1e9
        labels = labels_of(node, key)
        exported = (one(s1, "vcuda_container_gpu_time_seconds_total", **labels)
                    - one(s0, "vcuda_container_gpu_time_seconds_total", **labels))
        assert abs(exported - measured) <= GPU_TIME_TOLERANCE * (t1 - t0), (key, exported, measured, t1 - t0)


def test_a_live_scrape_passes_promtool_check_metrics(node: Node, exporter: int) -> None:
    """Prometheus' own linter on a real scrape: names, suffixes (_total, units), HELP, TYPE."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing (Debian package prometheus; .ci/run installs it)")
    wait_for(lambda: find(scrape(exporter), "vcuda_container_gpu_time_seconds_total"), 60, "every family")
    text = scrape_text(exporter)
    families = {f.name for f in text_string_to_metric_families(text)}
    assert {"vcuda_container_token_wait_seconds", "vcuda_container_oom_denials", "vcuda_gpu_info"} <= families
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_a_hung_scheduler_does_not_hang_the_scrape(node: Node, exporter: int) -> None:
    import signal

    daemon = node.daemons[0]
    daemon.send_signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        s = scrape(exporter)
        first = time.monotonic() - start
        s = scrape(exporter)
        assert one(s, "vcuda_scheduler_up", gpu="0") == 0
        assert one(s, "vcuda_exporter_errors") >= 1
        assert not find(s, "vcuda_container_token_grants_total", gpu="0")
        assert find(s, "vcuda_container_token_grants_total", gpu="1")  # the other GPU is unaffected
        assert first < 10  # one admin timeout, not a hang
    finally:
        daemon.send_signal(signal.SIGCONT)
    wait_for(lambda: one(scrape(exporter), "vcuda_scheduler_up", gpu="0") == 1, 60, "scheduler back")


class _Fixed(Collector):
    def __init__(self, metrics: list) -> None:
        self.metrics = metrics

    def collect(self) -> list:
        return self.metrics


def _same_as_generate_latest(metrics: list) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(metrics))
    assert metrics_text.render(metrics) == generate_latest(registry)


def test_text_rendering_is_generate_latests(node: Node) -> None:
    reader = NodeReader(node.layout, mode="vgpu", node=NODE, nvml=node.nvml)
    try:
        metrics = snapshot_metrics(reader.snapshot(), 0.012)
    finally:
        reader.close()
    assert len(metrics) > 15
    _same_as_generate_latest(metrics)


def test_text_rendering_escapes_label_values() -> None:
    odd = row(key="c3", namespace="", pod="", container='sh -c "echo \\\\ done"\nnext', tenant=None,
              tenant_stats=None)
    snap = NodeSnapshot(SNAPSHOT.node, SNAPSHOT.mode, SNAPSHOT.gpus, (*SNAPSHOT.containers, odd), ())
    metrics = snapshot_metrics(snap)
    _same_as_generate_latest(metrics)
    families = list(text_string_to_metric_families(metrics_text.render(metrics).decode()))
    containers = {s.labels["container"] for f in families for s in f.samples if "container" in s.labels}
    assert odd.container in containers


def test_gzip_when_the_scraper_accepts_it(node: Node, exporter: int) -> None:
    """Prometheus sends Accept-Encoding: gzip; the body then comes compressed, and says so."""
    import gzip

    def get(headers: dict[str, str]) -> tuple[str | None, bytes]:
        req = urllib.request.Request(f"http://127.0.0.1:{exporter}/metrics", headers=headers)
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
            assert int(resp.headers["Content-Length"]) == len(body)
            return resp.headers.get("Content-Encoding"), body

    encoding, packed = get({"Accept-Encoding": "deflate, gzip;q=0.9"})
    assert encoding == "gzip"
    plain_encoding, plain = get({})
    assert plain_encoding is None
    text = gzip.decompress(packed).decode()
    series = [line.partition(" ")[0] for line in text.splitlines() if not line.startswith("#")]
    assert series == [line.partition(" ")[0] for line in plain.decode().splitlines() if not line.startswith("#")]
    assert len(packed) < len(plain) / 4
