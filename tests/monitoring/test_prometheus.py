"""A real Prometheus server scrapes the exporter while conftest's tenants run; every PromQL
expression of the dashboards and alert rules is executed against it.

The server is Debian's `prometheus` package (installed by .ci/run, or here when running as root).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import pytest
from monitoring.conftest import NODE, GiB, MiB, Node, tenant_env, wait_for
from monitoring.promql import (
    Prometheus,
    alert_exprs,
    dashboard_exprs,
    find_or_install_prometheus,
    label_values_selector,
    substitute,
)
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.registry import Collector

from device_plugin.metrics import snapshot_metrics, start_exporter
from device_plugin.metrics_snapshot import ContainerGPU, GPUState, NodeSnapshot, TenantStats, WaitHistogram

GRAFANA = {"node": NODE, "gpu": ".*", "mode": "vgpu|pgpu|mps", "namespace": ".*", "pod": ".*",
           "__rate_interval": "15s", "__range": "5m", "__range_s": "300"}


def serve_starved_tenant() -> tuple[WSGIServer, int]:
    """The exporter's own rendering of a starved tenant: 20 % of the GPU against a 50 % request while it
    waits half of every second for the token.

    The simulator cannot produce one honestly: the token scheduler refuses over-committed requests and
    serves the largest deficit first, so a tenant that asks gets its request. This is the node agent's
    view of one that does not (a scheduler starved of CPU, a neighbour's runaway kernels).
    """
    started = time.monotonic()

    class Starved(Collector):
        def collect(self) -> list:
            waited = 0.5 * (time.monotonic() - started)
            wait = WaitHistogram((0.1, 1.0), (0, int(waited * 10), int(waited * 10)), waited)
            row = ContainerGPU(key="c-starved", mode="vgpu", gpu=0, uuid="GPU-synthetic-0000", namespace="team-x",
                               pod="starved-0", container="main", tenant="starved", core_request=0.5,
                               core_limit=0.5, memory_limit=GiB, memory_used=0, memory_peak=0, oom_denials=0,
                               share=0.2, tenant_stats=TenantStats(0.2, wait.count, 0, 1, 0.5, wait))
            gpu = GPUState(0, "GPU-synthetic-0000", "synthetic", None, True, 10.0)
            return snapshot_metrics(NodeSnapshot("node-synthetic", "vgpu", (gpu,), (row,), ()))

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Starved())
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    return server, int(server.server_address[1])


@pytest.fixture(scope="module")
def prom(node: Node) -> Iterator[Prometheus]:
    binary, why = find_or_install_prometheus()
    if binary is None:
        pytest.skip(why)
    stop = start_exporter(port=0, addr="127.0.0.1", layout=node.layout, mode="vgpu", node=NODE,
                          pod_resources_socket=node.kubelet_socket, nvml=node.nvml)
    starved_server, starved_port = serve_starved_tenant()
    workdir = Path(tempfile.mkdtemp(prefix="vcprom"))
    server = Prometheus(binary, workdir, [f"127.0.0.1:{stop.port}", f"127.0.0.1:{starved_port}"])  # type: ignore[attr-defined]
    try:
        wait_for(server.ready, 60, "prometheus ready")
        wait_for(lambda: len([r for r in server.query('up{job="vcuda"}') if r["value"][1] == "1"]) == 2, 60,
                 "both targets up")
        # a rate needs two scrapes of every tenant
        wait_for(lambda: server.query("count(count_over_time(vcuda_container_token_grants_total[1m]) >= 3)"),
                 60, "three scrapes of the tenants")
        yield server
    finally:
        server.stop()
        starved_server.shutdown()
        starved_server.server_close()
        stop()
        shutil.rmtree(workdir, ignore_errors=True)


def series_names(result: list[dict]) -> set[str]:
    return {r["metric"].get("pod", "") for r in result}


def test_the_alert_rules_are_loaded(prom: Prometheus) -> None:
    groups = prom.get("/api/v1/rules")["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(rules) == set(alert_exprs())
    assert all(r["health"] in ("ok", "unknown") for r in rules.values()), rules


def test_every_dashboard_expression_returns_series(prom: Prometheus) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 20
    start = time.time() - 60
    for e in exprs:
        promql = substitute(e.promql, GRAFANA)
        assert "$" not in promql, f"{e.where}: unsubstituted variable in {promql}"
        lv = label_values_selector(promql)
        if lv is not None:  # a variable query: the selector must yield series carrying the label
            selector, label = lv
            result = wait_for(lambda s=selector: prom.query(s), 30, f"{e.where}: {selector}")
            assert all(label in r["metric"] for r in result), f"{e.where}: no label {label}"  # type: ignore[union-attr]
            continue
        wait_for(lambda p=promql: prom.query_range(p, start), 30, f"{e.where}: {promql} to return series")


def test_pod_dashboard_filters_by_gpu_type(prom: Prometheus) -> None:
    pod_exprs = [e for e in dashboard_exprs() if "pod.json" in e.where and "share vs request" in e.where]
    assert pod_exprs
    for mode, pods in {"vgpu": {"train-0", "infer-0"}, "pgpu": {"render-0"}, "mps": {"mps-0", "mps-1"}}.items():
        promql = substitute(pod_exprs[1].promql, {**GRAFANA, "mode": mode})  # request: every container has one
        result = prom.query(promql)
        assert {r["metric"]["mode"] for r in result} == {mode}
        assert pods <= series_names(result)


def test_alerts_fire_in_the_situations_they_describe(node: Node, prom: Prometheus) -> None:
    exprs = alert_exprs()
    start = time.time()
    # OOM denials rising: another process of `full` runs into the limit again
    full = node.tenants["full"]
    directory = node.layout.container_dir("c-full")
    extra = subprocess.run([str(node.cuprobe), "init", "ctx", f"fill:{16 * MiB}"], timeout=60,
                           env=tenant_env(node.sim, directory / "ledger", full.gpu, None, full.memory_limit),
                           capture_output=True, text=True)
    assert "fill rc=2" in extra.stdout, extra.stdout  # CUDA_ERROR_OUT_OF_MEMORY
    scheduler = node.daemons[1]
    scheduler.send_signal(signal.SIGSTOP)  # a stalled scheduler: VcudaSchedulerDown
    try:
        time.sleep(3)  # the stall itself is the scenario, not a wait for a result
    finally:
        scheduler.send_signal(signal.SIGCONT)

    def fired(alert: str) -> set[str]:
        return series_names(prom.query_range(exprs[alert], start - 30))

    expected = {
        "VcudaContainerAtMemoryLimit": {"full-0"},
        "VcudaOOMDenialsRising": {"full-0"},
        "VcudaTenantStarved": {"starved-0"},
    }
    for alert, pods in expected.items():
        wait_for(lambda a=alert, p=pods: p <= fired(a), 60, f"{alert} for {pods}")
    assert not fired("VcudaContainerAtMemoryLimit") & {"train-0", "infer-0", "render-0"}
    # below their requests but not asking (full) or not waiting long (lat): not starved
    assert not fired("VcudaTenantStarved") & {"full-0", "lat-0", "hog-0", "train-0", "infer-0"}
    down = wait_for(lambda: prom.query_range(exprs["VcudaSchedulerDown"], start), 60, "VcudaSchedulerDown")
    assert {r["metric"]["gpu"] for r in down} == {"1"}  # type: ignore[union-attr]
