"""The node daemons' Prometheus exporter: `/metrics` from a fresh NodeSnapshot on every scrape.

A custom Collector on its own CollectorRegistry (no global state), rendered by
metrics_text (generate_latest's output, faster) on prometheus_client's
threading WSGI server. Names, units and labels: node_state/METRICS.md
(contract: `vcuda_`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kube_contract.podresources import PodResourcesClient
from node_state import metrics_text
from node_state.layout import NodeLayout
from node_state.metrics_snapshot import ContainerGPU, NodeReader, NodeSnapshot, allocated, gpu_modes
from node_state.quota_guard import QuotaGuard, Subject
from py_vcuda.memory_reconciler import MemoryReconciler
from py_vcuda.nvml import NVML

GPU_LABELS = ["node", "gpu", "uuid", "mode"]
# The scheduler keeps 16 wait bounds; every exported bucket is a series per container, and text
# formatting dominates a scrape, so export the bounds dashboards need (cumulative counts stay exact).
EXPORTED_WAIT_BOUNDS_S = frozenset({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0})
# `tenant` is the container's record key (ContainerRecord.key): unique on the node, so two rows with the same
# names (bare-metal runs of one command, records pod-resources cannot name) stay two series.
CONTAINER_LABELS = [*GPU_LABELS, "namespace", "pod", "container", "tenant"]
# A MIG instance: its parent GPU's labels, then the instance's MIG-<uuid> and profile.
MIG_LABELS = [*GPU_LABELS, "mig_instance", "profile"]


def _gpu_label(index: int | None) -> str:
    return "" if index is None else str(index)


class _Families:
    """The metric families of one scrape, created on first use so empty ones are left out."""

    def __init__(self) -> None:
        self._by_name: dict[str, Metric] = {}

    def gauge(self, name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
        return self._get(name, lambda: GaugeMetricFamily(name, doc, labels=labels))  # type: ignore[return-value]

    def counter(self, name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
        return self._get(name, lambda: CounterMetricFamily(name, doc, labels=labels))  # type: ignore[return-value]

    def histogram(self, name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
        return self._get(name, lambda: HistogramMetricFamily(name, doc, labels=labels))  # type: ignore[return-value]

    def _get(self, name: str, make: Callable[[], Metric]) -> Metric:
        if name not in self._by_name:
            self._by_name[name] = make()
        return self._by_name[name]

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._by_name.values())


def snapshot_metrics(snap: NodeSnapshot, scrape_s: float | None = None) -> list[Metric]:
    """Every vcuda_ metric family of one snapshot (pure: tests feed it fixed snapshots)."""
    f = _Families()
    alloc = allocated(snap)
    modes = gpu_modes(snap)
    for g in snap.gpus:
        labels = [snap.node, str(g.index), g.uuid, modes[g.uuid]]
        f.gauge("vcuda_gpu_info", "GPU identity (value 1); name is the product name",
                [*GPU_LABELS, "name"]).add_metric([*labels, g.name], 1)
        cores, memory = alloc.get(g.uuid, (0.0, 0))
        f.gauge("vcuda_gpu_cores_allocated_ratio", "Sum of the core requests of the GPU's containers, "
                "as a ratio of the GPU", GPU_LABELS).add_metric(labels, cores)
        f.gauge("vcuda_gpu_memory_allocated_bytes", "Sum of the memory limits of the GPU's containers",
                GPU_LABELS).add_metric(labels, memory)
        f.gauge("vcuda_gpu_containers", "Containers (tenants) on the GPU", GPU_LABELS).add_metric(
            labels, sum(1 for c in snap.containers if c.uuid == g.uuid))
        if g.scheduler_up is not None:
            f.gauge("vcuda_scheduler_up", "1 when the GPU's token scheduler answered stats",
                    GPU_LABELS).add_metric(labels, 1 if g.scheduler_up else 0)
        if g.usage is None:
            continue
        f.gauge("vcuda_gpu_memory_used_bytes", "Device memory in use (NVML)", GPU_LABELS).add_metric(
            labels, g.usage.memory_used)
        f.gauge("vcuda_gpu_memory_total_bytes", "Device memory (NVML)", GPU_LABELS).add_metric(
            labels, g.usage.memory_total)
        if g.usage.utilization is not None:
            f.gauge("vcuda_gpu_utilization_ratio", "Fraction of the last NVML sample period a kernel ran",
                    GPU_LABELS).add_metric(labels, g.usage.utilization / 100.0)
        if g.usage.temperature_c is not None:
            f.gauge("vcuda_gpu_temperature_celsius", "GPU temperature (NVML)", GPU_LABELS).add_metric(
                labels, g.usage.temperature_c)
        if g.usage.power_w is not None:
            f.gauge("vcuda_gpu_power_watts", "Power draw (NVML)", GPU_LABELS).add_metric(labels, g.usage.power_w)
    for m in snap.mig:
        labels = [snap.node, str(m.gpu), m.parent_uuid, modes.get(m.parent_uuid, snap.mode), m.uuid, m.profile]
        f.gauge("vcuda_mig_instance_info", "MIG instance of a GPU in MIG mode (value 1)", MIG_LABELS).add_metric(
            labels, 1)
        f.gauge("vcuda_mig_instance_memory_total_bytes", "The instance's device memory (NVML)",
                MIG_LABELS).add_metric(labels, m.memory_total)
        if m.memory_used is not None:
            f.gauge("vcuda_mig_instance_memory_used_bytes", "Device memory in use on the instance (NVML)",
                    MIG_LABELS).add_metric(labels, m.memory_used)
        f.gauge("vcuda_mig_instance_containers", "Containers allocated on the instance", MIG_LABELS).add_metric(
            labels, sum(1 for c in snap.containers if c.uuid == m.uuid))
    for c in snap.containers:
        _container_metrics(f, snap, c)
    if scrape_s is not None:
        f.gauge("vcuda_exporter_last_scrape_duration_seconds", "How long the previous scrape took to read",
                ["node"]).add_metric([snap.node], scrape_s)
    f.gauge("vcuda_exporter_errors", "Unreadable records and unanswered schedulers in this scrape",
            ["node"]).add_metric([snap.node], len(snap.errors))
    return list(f)


def _container_metrics(f: _Families, snap: NodeSnapshot, c: ContainerGPU) -> None:
    labels = [snap.node, _gpu_label(c.gpu), c.uuid, c.mode, c.namespace, c.pod, c.container, c.key]
    f.gauge("vcuda_container_core_request_ratio", "Guaranteed share of the GPU's time",
            CONTAINER_LABELS).add_metric(labels, c.core_request)
    f.gauge("vcuda_container_core_limit_ratio", "Cap on the share of the GPU's time",
            CONTAINER_LABELS).add_metric(labels, c.core_limit)
    if c.memory_limit is not None:
        f.gauge("vcuda_container_memory_limit_bytes", "Device memory limit", CONTAINER_LABELS).add_metric(
            labels, c.memory_limit)
    if c.memory_used is not None:
        f.gauge("vcuda_container_memory_used_bytes", "Device memory in use (ledger)",
                CONTAINER_LABELS).add_metric(labels, c.memory_used)
    if c.memory_peak is not None:
        f.gauge("vcuda_container_memory_peak_bytes", "Most device memory ever in use (ledger)",
                CONTAINER_LABELS).add_metric(labels, c.memory_peak)
    if c.memory_unattributed is not None:
        f.gauge("vcuda_container_memory_unattributed_bytes", "Device memory its processes hold that no hook "
                "charged (memory reconciler; part of memory_used)", CONTAINER_LABELS).add_metric(
            labels, c.memory_unattributed)
    if c.oom_denials is not None:
        f.counter("vcuda_container_oom_denials", "Allocations refused at the memory limit",
                  CONTAINER_LABELS).add_metric(labels, c.oom_denials)
    if c.share is not None:
        f.gauge("vcuda_container_gpu_time_share_ratio", "Measured share of the GPU's time over the "
                "scheduler window", CONTAINER_LABELS).add_metric(labels, c.share)
    if c.gpu_time_s is not None:
        f.counter("vcuda_container_gpu_time_seconds", "GPU time used (token hold time; whole cards: NVML "
                  "utilization over time), since the exporter first saw the container",
                  CONTAINER_LABELS).add_metric(labels, c.gpu_time_s)
    t = c.tenant_stats
    if t is None:
        return
    f.counter("vcuda_container_token_grants", "Tokens granted", CONTAINER_LABELS).add_metric(labels, t.grants)
    f.counter("vcuda_container_token_overruns", "Tokens held past their quantum",
              CONTAINER_LABELS).add_metric(labels, t.overruns)
    f.counter("vcuda_container_token_renewals", "Leases kept at their quantum's end because nobody else came "
              "first", CONTAINER_LABELS).add_metric(labels, t.renewals)
    f.gauge("vcuda_container_token_waiting", "Processes of the container waiting for a token",
            CONTAINER_LABELS).add_metric(labels, t.waiting)
    f.counter("vcuda_container_token_revocations", "Leases revoked for a high-priority tenant",
              CONTAINER_LABELS).add_metric(labels, t.revocations)
    f.counter("vcuda_container_token_revoke_reclaims", "Revoked leases not released within the budget "
              "and grace, taken back by the scheduler", CONTAINER_LABELS).add_metric(labels, t.revoke_reclaims)
    if t.budget_s is not None:
        f.gauge("vcuda_container_inflight_budget_seconds", "GPU work a token holder may have launched and "
                "not finished", CONTAINER_LABELS).add_metric(labels, t.budget_s)
    f.counter("vcuda_container_inflight_budget_hits", "Launches that waited for earlier work to finish "
              "because the in-flight budget was reached", CONTAINER_LABELS).add_metric(labels, t.budget_hits)
    f.counter("vcuda_container_inflight_budget_wait_seconds", "Time launches waited at the in-flight budget",
              CONTAINER_LABELS).add_metric(labels, t.budget_wait_s)
    buckets = [(_le(b), n) for b, n in zip(t.wait.bounds_s, t.wait.cumulative, strict=False)
               if b in EXPORTED_WAIT_BOUNDS_S]
    buckets.append(("+Inf", t.wait.count))
    f.histogram("vcuda_container_token_wait_seconds", "Time from asking for a token to getting it",
                [*CONTAINER_LABELS, "priority"]).add_metric([*labels, t.priority], buckets, t.wait.sum_s)


def _le(bound: float) -> str:
    return repr(float(bound))


def reconciler_metrics(node: str, reconciler: MemoryReconciler) -> list[Metric]:
    """The memory reconciler's own figures: what it could not map, how long a pass takes."""
    unmapped = CounterMetricFamily("vcuda_reconciler_unmapped_pids", "GPU processes the memory reconciler "
                                   "could not map to a container, or ledger slots no GPU process mapped to",
                                   labels=["node", "container", "reason"])
    for (container, reason), n in sorted(reconciler.unmapped_counts().items()):
        unmapped.add_metric([node, container, reason], n)
    duration = GaugeMetricFamily("vcuda_reconciler_pass_duration_seconds", "How long the last memory "
                                 "reconciler pass took", labels=["node"])
    duration.add_metric([node], reconciler.last_pass_s)
    return [unmapped, duration]


def guard_metrics(snap: NodeSnapshot, guard: QuotaGuard) -> list[Metric]:
    """Quota escapes and containers over their limit (node_state.quota_guard), by container and action.

    Labelled as the container's other series: names from this scrape's snapshot where it has the
    container (pod-resources names what a record lacks), else as the guard saw the record."""
    index = {g.uuid: g.index for g in snap.gpus}
    named = {(c.key, c.uuid): c for c in snap.containers}
    labels = [*CONTAINER_LABELS, "action"]
    escapes = CounterMetricFamily("vcuda_quota_escapes", "GPU processes of shared-GPU containers found running "
                                  "without libvcuda, by what was done (killed, reported, kill-failed)", labels=labels)
    over = CounterMetricFamily("vcuda_quota_over_limit", "Times a container's processes held more device memory "
                               "than its limit (NVML) for several memory reconciler passes running", labels=labels)

    def row(subject: Subject, action: str) -> list[str]:
        c = named.get((subject.key, subject.uuid))
        names = (c.mode, c.namespace, c.pod, c.container) if c is not None else \
            (subject.mode, subject.namespace, subject.pod, subject.container)
        return [snap.node, _gpu_label(index.get(subject.uuid)), subject.uuid, *names, subject.key, action]

    for family, counts in ((escapes, guard.escape_counts()), (over, guard.over_limit_counts())):
        for (subject, action), n in sorted(counts.items(), key=lambda kv: (kv[0][0].key, kv[0][0].uuid, kv[0][1])):
            family.add_metric(row(subject, action), n)
    return [escapes, over]


class NodeCollector(Collector):
    """Reads a fresh snapshot on each scrape; scrapes are serialised (the reader keeps sockets)."""

    def __init__(self, reader: NodeReader, memory_reconciler: MemoryReconciler | None = None,
                 quota_guard: QuotaGuard | None = None) -> None:
        self.reader = reader
        self.memory_reconciler = memory_reconciler
        self.quota_guard = quota_guard
        self._lock = threading.Lock()
        self._last_scrape_s: float | None = None

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            start = time.perf_counter()
            snap = self.reader.snapshot()
            metrics = snapshot_metrics(snap, self._last_scrape_s)
            if self.memory_reconciler is not None:
                metrics += reconciler_metrics(snap.node, self.memory_reconciler)
            if self.quota_guard is not None:
                metrics += guard_metrics(snap, self.quota_guard)
            self._last_scrape_s = time.perf_counter() - start
        return metrics

    def describe(self) -> Iterable[Metric]:
        return []  # families vary with the node; do not collect at registration


def start_exporter(*, port: int, addr: str = "", layout: NodeLayout, mode: str, node: str,
                   pod_resources_socket: Path | None, nvml: NVML | None,
                   memory_reconciler: MemoryReconciler | None = None,
                   quota_guard: QuotaGuard | None = None,
                   unready: Callable[[], str | None] | None = None) -> Callable[[], None]:
    """Serve `/metrics` on addr:port (port 0: any free port) until the returned function is called;
    `/readyz` too with `unready` (None: ready; else why not), for the pod's readiness probe.

    The bound port is on the returned function as `.port`.
    """
    pod_resources = PodResourcesClient(pod_resources_socket) if pod_resources_socket else None
    reader = NodeReader(layout, mode=mode, node=node, nvml=nvml, pod_resources=pod_resources)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(reader, memory_reconciler, quota_guard))
    server, thread = metrics_text.serve(addr or "0.0.0.0", port, lambda: metrics_text.render(registry.collect()),
                                        unready)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)
        with contextlib.suppress(Exception):  # a dead scheduler's socket must not stop the shutdown
            reader.close()
        if pod_resources is not None:
            pod_resources.close()

    stop.port = server.server_address[1]  # type: ignore[attr-defined]
    return stop

