"""A real Prometheus server scrapes the exporter while conftest's tenants run; every PromQL
expression of the dashboards and alert rules is executed against it and must return the GPUs,
containers (by `tenant`) or namespaces the scenario puts behind it.

A second, synthetic target serves one starved tenant (node-synthetic, team-x), only for the
VcudaTenantStarved alert; the dashboard checks leave its series out.

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
    dashboard_expr,
    dashboard_exprs,
    find_or_install_prometheus,
    label_values_selector,
    substitute,
)
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.registry import Collector

from node_state.metrics import snapshot_metrics, start_exporter
from node_state.metrics_snapshot import ContainerGPU, GPUState, NodeSnapshot, TenantStats, WaitHistogram

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
        wait_for(lambda: server.query(f'count(count_over_time(vcuda_container_token_grants_total{{node="{NODE}"}}'
                                      '[1m]) >= 3)'), 60, "three scrapes of the tenants")
        yield server
    finally:
        server.stop()
        starved_server.shutdown()
        starved_server.server_close()
        stop()
        shutil.rmtree(workdir, ignore_errors=True)


def is_synthetic(metric: dict[str, str]) -> bool:
    """A series of the starved tenant's target (serve_starved_tenant), which only the alert test uses."""
    return metric.get("node") == "node-synthetic" or metric.get("tenant") == "c-starved" \
        or metric.get("namespace") == "team-x"


# Which containers (by `tenant`, the record key), GPUs (by `gpu`) or namespaces each dashboard expression must
# return for conftest's scenario, with every variable at All: (dashboard, panel, legend suffix) -> (label, set).
SCHED = {"c-train", "c-infer", "c-hog", "c-lat", "c-full"}         # token-scheduler tenants
SHARE = SCHED | {"c-render"}                                         # ... and the pGPU card (NVML utilization)
LEDGER = SCHED | {"run-a", "run-b"}                                  # containers with a ledger
EVERY = LEDGER | {"c-render", "c-mps-a", "c-mps-b"}
GPUS = {"0", "1", "2", "3"}
POD, NODE_D = "vcuda-pod.json", "vcuda-node.json"
EXPECTED: dict[tuple[str, str, str], tuple[str, set[str]]] = {
    (NODE_D, "GPU utilization", ""): ("gpu", GPUS),
    (NODE_D, "Memory used vs total", " used"): ("gpu", GPUS),
    (NODE_D, "Memory used vs total", " total"): ("gpu", GPUS),
    (NODE_D, "Tenants per GPU", ""): ("gpu", GPUS),
    (NODE_D, "Cores allocated", ""): ("gpu", GPUS),
    (NODE_D, "Memory allocated", ""): ("gpu", GPUS),
    (NODE_D, "Temperature", ""): ("gpu", GPUS),
    (NODE_D, "Power", ""): ("gpu", GPUS),
    (NODE_D, "Token schedulers", ""): ("gpu", {"0", "1"}),
    # The scenario's node has no GPU in MIG mode: these return nothing here (tests/monitoring/test_mig_metrics.py
    # covers the MIG series).
    (NODE_D, "MIG layout", ""): ("mig_instance", set()),
    (NODE_D, "MIG instance memory", " used"): ("mig_instance", set()),
    (NODE_D, "MIG instance memory", " total"): ("mig_instance", set()),
    (NODE_D, "Tenants", "share"): ("tenant", SHARE),
    (NODE_D, "Tenants", "memory used"): ("tenant", LEDGER | {"c-render"}),
    (NODE_D, "variable node", ""): ("node", {NODE}),
    (NODE_D, "variable gpu", ""): ("gpu", GPUS),
    (POD, "GPU time share vs request and limit", " share"): ("tenant", SHARE),
    (POD, "GPU time share vs request and limit", " request"): ("tenant", EVERY),
    (POD, "GPU time share vs request and limit", " limit"): ("tenant", EVERY),
    (POD, "Memory used vs limit", " used"): ("tenant", LEDGER | {"c-render"}),
    (POD, "Memory used vs limit", " limit"): ("tenant", EVERY),
    (POD, "Memory used / limit", ""): ("tenant", LEDGER | {"c-render"}),
    (POD, "Token wait p50 / p99", " p50"): ("tenant", SCHED),
    (POD, "Token wait p50 / p99", " p99"): ("tenant", SCHED),
    (POD, "Time spent waiting for the token", ""): ("tenant", SCHED),
    (POD, "Token grants, renewals and overruns", " grants"): ("tenant", SCHED),
    (POD, "Token grants, renewals and overruns", " renewed"): ("tenant", SCHED),
    (POD, "Token grants, renewals and overruns", " overruns"): ("tenant", SCHED),
    (POD, "Revocations and in-flight budget", " revoked"): ("tenant", SCHED),
    (POD, "Revocations and in-flight budget", " reclaimed"): ("tenant", SCHED),
    (POD, "Revocations and in-flight budget", " budget waits"): ("tenant", SCHED),
    (POD, "OOM denials", ""): ("tenant", LEDGER),
    (POD, "GPU hours by namespace", ""): ("namespace", {"team-a", "team-b", "team-s", "team-m", "team-c"}),
    (POD, "variable namespace", ""): ("namespace", {"team-a", "team-b", "team-s", "team-m", "team-c", "team-d"}),
    (POD, "variable pod", ""): ("pod", {"train-0", "infer-0", "hog-0", "lat-0", "full-0", "render-0", "mps-0",
                                        "mps-1"}),
}


def _returned(prom: Prometheus, promql: str, label: str, start: float) -> set[str]:
    lv = label_values_selector(promql)
    result = prom.query(lv[0]) if lv is not None else prom.query_range(promql, start)
    return {r["metric"].get(label, "") for r in result if not is_synthetic(r["metric"])} - ({""} if lv else set())


def test_the_expectations_cover_every_dashboard_expression() -> None:
    found = {(e.dashboard, e.panel, e.legend) for e in dashboard_exprs()}
    matched = {(e.dashboard, e.panel, e.legend) for key in EXPECTED for e in [dashboard_expr(*key)]}
    assert found == matched


@pytest.mark.parametrize("key", list(EXPECTED), ids=lambda k: f"{k[1]}{k[2]}".replace(" ", "_"))
def test_every_dashboard_expression_returns_the_scenarios_series(prom: Prometheus, key: tuple[str, str, str]) -> None:
    """Each expression, variables at All, returns exactly the GPUs / containers / namespaces the scenario
    puts behind it (the starved tenant's synthetic target left out: nothing here may depend on it)."""
    e = dashboard_expr(*key)
    label, expected = EXPECTED[key]
    promql = substitute(e.promql, GRAFANA)
    assert "$" not in promql, f"{e.where}: unsubstituted variable in {promql}"
    start = time.time() - 60
    wait_for(lambda: expected <= _returned(prom, promql, label, start), 60, f"{e.where}: {sorted(expected)}")
    assert _returned(prom, promql, label, start) == expected, e.where


def test_dashboard_values_match_the_scenario(prom: Prometheus) -> None:
    """A few values behind the panels: tenants per GPU, the cores promised, and GPU hours (only a namespace
    whose tenant ran has any)."""
    def instant(panel: str, label: str) -> dict[str, float]:
        promql = substitute(dashboard_expr(NODE_D if panel != "GPU hours by namespace" else POD, panel).promql,
                            GRAFANA)
        return {r["metric"][label]: float(r["value"][1]) for r in prom.query(promql) if not is_synthetic(r["metric"])}

    assert instant("Tenants per GPU", "gpu") == {"0": 4, "1": 3, "2": 1, "3": 2}
    assert instant("Cores allocated", "gpu") == pytest.approx({"0": 0.9, "1": 1.0, "2": 1.0, "3": 1.0})
    hours = instant("GPU hours by namespace", "namespace")
    assert hours["team-a"] > 0 and hours["team-b"] > 0 and hours["team-c"] > 0  # train, infer, render spin
    assert hours["team-m"] == 0  # full never launches a kernel
    assert max(hours.values()) < 1  # GPU-hours of a test that runs for minutes


def test_pod_dashboard_filters_by_gpu_type(prom: Prometheus) -> None:
    request = dashboard_expr(POD, "GPU time share vs request and limit", " request")  # every container has one
    by_mode = {"vgpu": LEDGER, "pgpu": {"c-render"}, "mps": {"c-mps-a", "c-mps-b"}}
    for mode, tenants in by_mode.items():
        result = [r for r in prom.query(substitute(request.promql, {**GRAFANA, "mode": mode}))
                  if not is_synthetic(r["metric"])]
        assert {r["metric"]["mode"] for r in result} == {mode}
        assert {r["metric"]["tenant"] for r in result} == tenants, mode
    one_namespace = prom.query(substitute(request.promql, {**GRAFANA, "namespace": "team-s"}))
    assert {r["metric"]["tenant"] for r in one_namespace} == {"c-hog", "c-lat"}
    # All (".*") keeps the bare-metal runs, whose namespace and pod are empty
    everything = prom.query(substitute(request.promql, GRAFANA))
    runs = [r["metric"] for r in everything if r["metric"].get("container") == "python3 train.py"]
    assert sorted(m["tenant"] for m in runs) == ["run-a", "run-b"]


def test_alerts_fire_in_the_situations_they_describe(node: Node, prom: Prometheus) -> None:
    exprs = alert_exprs()
    start = time.time()
    # OOM denials rising: another process of `full` runs into the limit again
    full = node.tenants["full"]
    env = tenant_env(node.sim, node.layout.ledger_path("c-full"), full.gpu, None, full.memory_limit)
    extra = subprocess.run([str(node.cuprobe), "init", "ctx", f"fill:{16 * MiB}"], timeout=60, env=env,
                           capture_output=True, text=True)
    assert "fill rc=2" in extra.stdout, extra.stdout  # CUDA_ERROR_OUT_OF_MEMORY
    scheduler = node.daemons[1]
    scheduler.send_signal(signal.SIGSTOP)  # a stalled scheduler: VcudaSchedulerDown
    try:
        time.sleep(3)  # the stall itself is the scenario, not a wait for a result
    finally:
        scheduler.send_signal(signal.SIGCONT)

    def fired(alert: str) -> set[str]:
        return {r["metric"]["tenant"] for r in prom.query_range(exprs[alert], start - 30)}

    expected = {
        "VcudaContainerAtMemoryLimit": {"c-full"},
        "VcudaOOMDenialsRising": {"c-full"},
        "VcudaTenantStarved": {"c-starved"},
    }
    for alert, tenants in expected.items():
        wait_for(lambda a=alert, t=tenants: t <= fired(a), 60, f"{alert} for {tenants}")
    assert fired("VcudaContainerAtMemoryLimit") == {"c-full"}  # not train, infer, render or the runs
    assert fired("VcudaOOMDenialsRising") == {"c-full"}
    # below their requests but not asking (full) or not waiting long (lat): not starved
    assert fired("VcudaTenantStarved") == {"c-starved"}
    down = wait_for(lambda: prom.query_range(exprs["VcudaSchedulerDown"], start), 60, "VcudaSchedulerDown")
    assert {r["metric"]["gpu"] for r in down} == {"1"}  # type: ignore[union-attr]
