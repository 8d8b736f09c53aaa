"""Writes the Grafana dashboards (vcuda-node.json, vcuda-pod.json, into the Helm chart's
files/dashboards, which the chart installs as a ConfigMap) and README.md from one list of panels,
so each panel's description in the README is the query it runs.

    python3 deploy/dashboards/generate.py          # rewrite the files
    python3 deploy/dashboards/generate.py --check  # exit 1 if they are stale (tests run this)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHART_FILES = HERE.parent / "helm" / "vcuda" / "files" / "dashboards"
TIME_OPTIONS = ["30m", "1h", "6h", "12h", "24h", "2d", "7d"]
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    what: str              # one sentence for the README and the panel's description
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # timeseries | table | bargauge | stat
    instant: bool = False


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    query: str             # label_values(...) or, for custom, comma-separated values
    custom: bool = False
    multi: bool = True


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    file: str
    purpose: str
    variables: tuple[Variable, ...]
    panels: tuple[Panel, ...]


NODE_SEL = 'node="$node", gpu=~"$gpu"'
POD_SEL = 'mode=~"$mode", namespace=~"$namespace", pod=~"$pod"'
# `tenant` (the container's record key) keeps apart containers with the same names: bare-metal runs of one
# command, containers pod-resources could not name (empty namespace and pod).
BY_CONTAINER = "namespace, pod, container, tenant"
WHO = "{{pod}}/{{container}} [{{tenant}}]"

NODE = Dashboard(
    uid="vcuda-node", title="vcuda / Node", file="vcuda-node.json",
    purpose="One node (pick it in *node*): its GPUs, how busy and full they are, and how many tenants share each.",
    variables=(
        Variable("node", "Node", "label_values(vcuda_gpu_info, node)", multi=False),
        Variable("gpu", "GPU", 'label_values(vcuda_gpu_info{node="$node"}, gpu)'),
    ),
    panels=(
        Panel("GPU utilization", "Fraction of time a kernel ran on each GPU (NVML's sample period).",
              "percentunit", (Query(f"vcuda_gpu_utilization_ratio{{{NODE_SEL}}}", "GPU {{gpu}}"),)),
        Panel("Memory used vs total", "Device memory in use on each GPU (NVML, all processes) against its size.",
              "bytes", (Query(f"vcuda_gpu_memory_used_bytes{{{NODE_SEL}}}", "GPU {{gpu}} used"),
                        Query(f"vcuda_gpu_memory_total_bytes{{{NODE_SEL}}}", "GPU {{gpu}} total"))),
        Panel("Tenants per GPU", "Containers placed on each GPU, with the GPU's sharing mode.", "none",
              (Query(f"vcuda_gpu_containers{{{NODE_SEL}}}", "GPU {{gpu}} ({{mode}})"),), kind="bargauge",
              instant=True),
        Panel("Cores allocated", "Sum of the core requests of each GPU's containers (1 = the whole GPU promised).",
              "percentunit", (Query(f"vcuda_gpu_cores_allocated_ratio{{{NODE_SEL}}}", "GPU {{gpu}}"),)),
        Panel("Memory allocated", "Sum of the memory limits of each GPU's containers, as a fraction of its memory.",
              "percentunit", (Query(f"vcuda_gpu_memory_allocated_bytes{{{NODE_SEL}}} / "
                                    f"vcuda_gpu_memory_total_bytes{{{NODE_SEL}}}", "GPU {{gpu}}"),)),
        Panel("Temperature", "GPU temperature where NVML reports it.", "celsius",
              (Query(f"vcuda_gpu_temperature_celsius{{{NODE_SEL}}}", "GPU {{gpu}}"),)),
        Panel("Power", "Power draw where NVML reports it.", "watt",
              (Query(f"vcuda_gpu_power_watts{{{NODE_SEL}}}", "GPU {{gpu}}"),)),
        Panel("Token schedulers", "1 when the GPU's token scheduler answers the exporter (vGPU GPUs only).",
              "none", (Query(f"vcuda_scheduler_up{{{NODE_SEL}}}", "GPU {{gpu}}"),), kind="stat", instant=True),
        Panel("MIG layout", "The MIG instances of the GPUs in MIG mode now: profile and containers on each.",
              "none", (Query(f"vcuda_mig_instance_containers{{{NODE_SEL}}}", "containers"),),
              kind="table", instant=True),
        Panel("MIG instance memory", "Device memory in use on each MIG instance (NVML) against its size.",
              "bytes", (Query(f"vcuda_mig_instance_memory_used_bytes{{{NODE_SEL}}}",
                              "GPU {{gpu}} {{profile}} {{mig_instance}} used"),
                        Query(f"vcuda_mig_instance_memory_total_bytes{{{NODE_SEL}}}",
                              "GPU {{gpu}} {{profile}} {{mig_instance}} total"))),
        Panel("Tenants", "Every container on the node's GPUs now: measured share of GPU time and memory used.",
              "none", (Query(f"vcuda_container_gpu_time_share_ratio{{{NODE_SEL}}}", "share"),
                       Query(f"vcuda_container_memory_used_bytes{{{NODE_SEL}}}", "memory used")),
              kind="table", instant=True),
    ),
)

POD = Dashboard(
    uid="vcuda-pod", title="vcuda / Pod", file="vcuda-pod.json",
    purpose="Containers (filter by GPU type, namespace, pod): what they use against what they asked for.",
    variables=(
        Variable("mode", "GPU type", "vgpu,pgpu,mps", custom=True),
        Variable("namespace", "Namespace",
                 'label_values(vcuda_container_core_request_ratio{mode=~"$mode"}, namespace)'),
        Variable("pod", "Pod", 'label_values(vcuda_container_core_request_ratio{mode=~"$mode", '
                 'namespace=~"$namespace"}, pod)'),
    ),
    panels=(
        Panel("GPU time share vs request and limit", "Measured share of the GPU's time over the scheduler window "
              "(pGPU: the card's utilization), with the guaranteed request and the cap.", "percentunit",
              (Query(f"vcuda_container_gpu_time_share_ratio{{{POD_SEL}}}", f"{WHO} share"),
               Query(f"vcuda_container_core_request_ratio{{{POD_SEL}}}", f"{WHO} request"),
               Query(f"vcuda_container_core_limit_ratio{{{POD_SEL}}}", f"{WHO} limit"))),
        Panel("Memory used vs limit", "Device memory the container holds (its ledger) against its limit.", "bytes",
              (Query(f"vcuda_container_memory_used_bytes{{{POD_SEL}}}", f"{WHO} used"),
               Query(f"vcuda_container_memory_limit_bytes{{{POD_SEL}}}", f"{WHO} limit"))),
        Panel("Memory used / limit", "How close each container is to its memory limit (the alert fires above 95 %).",
              "percentunit", (Query(f"vcuda_container_memory_used_bytes{{{POD_SEL}}} / "
                                    f"vcuda_container_memory_limit_bytes{{{POD_SEL}}}", WHO),)),
        Panel("Token wait p50 / p99", "Time from asking for the GPU token to getting it, median and 99th percentile.",
              "s", (Query(f"histogram_quantile(0.5, sum by ({BY_CONTAINER}, le) "
                          f"(rate(vcuda_container_token_wait_seconds_bucket{{{POD_SEL}}}[$__rate_interval])))",
                          f"{WHO} p50"),
                    Query(f"histogram_quantile(0.99, sum by ({BY_CONTAINER}, le) "
                          f"(rate(vcuda_container_token_wait_seconds_bucket{{{POD_SEL}}}[$__rate_interval])))",
                          f"{WHO} p99"))),
        Panel("Time spent waiting for the token", "Seconds waited per second (summed over the container's "
              "processes); high with a share below request means starved.", "percentunit",
              (Query(f"sum by ({BY_CONTAINER}) "
                     f"(rate(vcuda_container_token_wait_seconds_sum{{{POD_SEL}}}[$__rate_interval]))",
                     WHO),)),
        Panel("Token grants, renewals and overruns", "Tokens granted per second, leases kept at their quantum's end "
              "(renewed: nobody else came first), and leases held past their quantum.", "ops",
              (Query(f"sum by ({BY_CONTAINER}) (rate(vcuda_container_token_grants_total{{{POD_SEL}}}"
                     "[$__rate_interval]))", f"{WHO} grants"),
               Query(f"sum by ({BY_CONTAINER}) (rate(vcuda_container_token_renewals_total{{{POD_SEL}}}"
                     "[$__rate_interval]))", f"{WHO} renewed"),
               Query(f"sum by ({BY_CONTAINER}) (rate(vcuda_container_token_overruns_total{{{POD_SEL}}}"
                     "[$__rate_interval]))", f"{WHO} overruns"))),
        Panel("Revocations and in-flight budget", "Leases revoked per second for a `high` tenant, those not "
              "released within the in-flight budget plus the revoke grace (reclaimed: a stuck holder), and "
              "launches per second that waited because the container's launched-but-unfinished GPU work "
              "reached its in-flight budget.", "ops",
              (Query(f"sum by ({BY_CONTAINER}) (rate(vcuda_container_token_revocations_total{{{POD_SEL}}}"
                     "[$__rate_interval]))", f"{WHO} revoked"),
               Query(f"sum by ({BY_CONTAINER}) (rate(vcuda_container_token_revoke_reclaims_total{{{POD_SEL}}}"
                     "[$__rate_interval]))", f"{WHO} reclaimed"),
               Query(f"sum by ({BY_CONTAINER}) (rate(vcuda_container_inflight_budget_hits_total{{{POD_SEL}}}"
                     "[$__rate_interval]))", f"{WHO} budget waits"))),
        Panel("OOM denials", "Allocations refused at the memory limit in each interval.", "none",
              (Query(f"sum by ({BY_CONTAINER}) (increase(vcuda_container_oom_denials_total{{{POD_SEL}}}"
                     "[$__rate_interval]))", WHO),), kind="timeseries"),
        Panel("GPU hours by namespace", "GPU time used in the selected range per namespace, in GPU-hours, for "
              "charge-back: the increase of each container's GPU-time counter (token hold time; whole cards: "
              "NVML utilization over time), so containers that lived through part of the range count only "
              "that part. MPS clients have no per-client GPU time and are not counted.", "h",
              (Query(f"sum by (namespace) (increase(vcuda_container_gpu_time_seconds_total{{{POD_SEL}}}"
                     "[$__range])) / 3600", "{{namespace}}"),), kind="bargauge", instant=True),
    ),
)

DASHBOARDS = (NODE, POD)


def _variable(v: Variable) -> dict[str, object]:
    # allValue ".*": Grafana's own "All" is the values it found OR-ed, which leaves out series whose label is
    # empty (bare-metal runs and unnamed containers have no namespace/pod) and values newer than the list.
    common = {"name": v.name, "label": v.label, "multi": v.multi, "includeAll": v.multi,
              **({"allValue": ".*"} if v.multi else {}),
              "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if v.multi else {},
              "hide": 0, "skipUrlSync": False}
    if v.custom:
        options = [{"selected": False, "text": o, "value": o} for o in v.query.split(",")]
        return {**common, "type": "custom", "query": v.query, "options": options}
    return {**common, "type": "query", "datasource": DATASOURCE, "definition": v.query,
            "query": {"query": v.query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2, "regex": "", "sort": 1, "options": []}


def _panel(p: Panel, index: int) -> dict[str, object]:
    width = 24 if p.kind == "table" else 12
    targets = [{"datasource": DATASOURCE, "expr": q.expr, "legendFormat": q.legend, "refId": chr(ord("A") + i),
                "instant": p.instant, "range": not p.instant, **({"format": "table"} if p.kind == "table" else {})}
               for i, q in enumerate(p.queries)]
    panel: dict[str, object] = {
        "id": index + 1, "type": p.kind, "title": p.title, "description": p.what, "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": width, "x": 0 if width == 24 else (index % 2) * 12, "y": (index // 2) * 8},
        "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]}}
        if p.kind == "timeseries" else {},
        "targets": targets,
    }
    if p.kind == "table":
        panel["transformations"] = [{"id": "merge", "options": {}}]
    return panel


def dashboard_json(d: Dashboard) -> dict[str, object]:
    datasource_var = {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
                      "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
                      "regex": "", "skipUrlSync": False}
    return {
        "uid": d.uid, "title": d.title, "description": d.purpose, "tags": ["vcuda", "gpu"],
        "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True, "graphTooltip": 1,
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
        "timepicker": {"time_options": TIME_OPTIONS, "refresh_intervals": ["10s", "30s", "1m", "5m", "15m"]},
        "templating": {"list": [datasource_var, *(_variable(v) for v in d.variables)]},
        "annotations": {"list": []},
        "panels": [_panel(p, i) for i, p in enumerate(d.panels)],
    }


def readme() -> str:
    lines = [
        "# vcuda Grafana dashboards",
        "",
        "Generated by `generate.py` (edit the panels there, then run it; a test checks the files are current).",
        "The JSON files are in the Helm chart (`deploy/helm/vcuda/files/dashboards/`), which installs them as",
        "a ConfigMap labelled `grafana_dashboard: \"1\"` for Grafana's dashboard sidecar; or import them",
        "(Dashboards → New → Import) and pick a Prometheus data source that scrapes the node agents'",
        "`/metrics` (metrics: `node_state/METRICS.md`; alert rules:",
        "`deploy/helm/vcuda/files/alerts/vcuda-alerts.yaml`). Time presets: " + ", ".join(TIME_OPTIONS) + ".",
        "Every query below is executed against a real Prometheus server by `tests/monitoring/test_prometheus.py`,",
        "which checks the containers or GPUs each one returns for a known set of simulated tenants.",
        "",
        "Container series are told apart by `tenant` (the container's record key), not only by",
        "namespace/pod/container: bare-metal `vcuda run`s of one command, or containers the kubelet could not",
        "name, share those. Legends show it in brackets. Multi-value variables send `.*` for *All*, so series",
        "with an empty namespace or pod are included.",
        "",
    ]
    for d in DASHBOARDS:
        lines += [f"## {d.title} (`{d.file}`)", "", d.purpose, "", "Variables: `datasource` (a Prometheus data source)"
                  + "".join(f", `{v.name}` ({v.label}: " + (f"one of {v.query.replace(',', ', ')}" if v.custom
                                                            else f"`{v.query}`") + ")" for v in d.variables) + ".",
                  ""]
        for p in d.panels:
            lines += [f"### {p.title}", "", f"{p.what} ({p.kind}, unit `{p.unit}`"
                      + (", current value" if p.instant else "") + ")", ""]
            lines += [f"- {q.legend}: `{q.expr}`" for q in p.queries]
            lines.append("")
    return "\n".join(lines)


def outputs() -> dict[Path, str]:
    files = {CHART_FILES / d.file: json.dumps(dashboard_json(d), indent=2) + "\n" for d in DASHBOARDS}
    files[HERE / "README.md"] = readme()
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    stale = [path for path, text in outputs().items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"stale: {path} (run {Path(__file__).name})", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs().items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
