"""The dashboards' and alert rules' shape (no server needed): generated files current, Grafana
model fields, time presets, template variables, and `promtool check rules`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from monitoring.promql import (
    ALERTS,
    DASHBOARDS,
    GENERATOR,
    REPO,
    alert_exprs,
    dashboard_exprs,
    dashboard_files,
    substitute,
)


def test_generated_files_are_current() -> None:
    proc = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name, variables", [
    ("vcuda-node.json", ["datasource", "node", "gpu"]),
    ("vcuda-pod.json", ["datasource", "mode", "namespace", "pod"]),
])
def test_dashboard_model(name: str, variables: list[str]) -> None:
    doc = json.loads((DASHBOARDS / name).read_text())
    assert 36 <= doc["schemaVersion"] <= 41
    assert doc["timepicker"]["time_options"] == ["30m", "1h", "6h", "12h", "24h", "2d", "7d"]
    templating = {v["name"]: v for v in doc["templating"]["list"]}
    assert list(templating) == variables
    assert templating["datasource"]["type"] == "datasource" and templating["datasource"]["query"] == "prometheus"
    if "mode" in templating:
        assert templating["mode"]["query"] == "vgpu,pgpu,mps" and templating["mode"]["includeAll"]
    for var in templating.values():  # All must match every value, the empty one included (bare-metal runs)
        if var.get("includeAll"):
            assert var["allValue"] == ".*", var["name"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and doc["panels"]
    for panel in doc["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"] and panel["description"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert "vcuda_" in target["expr"]


def test_every_metric_in_a_query_is_documented() -> None:
    import re

    documented = (REPO / "node_state" / "METRICS.md").read_text()
    exprs = [e.promql for e in dashboard_exprs()] + list(alert_exprs().values())
    names = {m.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
             for e in exprs for m in re.findall(r"vcuda_[a-z_]+", e)}
    missing = {n for n in names if f"`{n}`" not in documented and f"`{n.removesuffix('_total')}" not in documented}
    assert not missing


def test_substitution_leaves_no_variable() -> None:
    values = {"node": "n", "gpu": ".*", "mode": "vgpu", "namespace": ".*", "pod": ".*",
              "__rate_interval": "1m", "__range": "1h", "__range_s": "3600"}
    for e in dashboard_exprs():
        assert "$" not in substitute(e.promql, values), e.where
    assert "[1h])) / 3600" in " ".join(substitute(e.promql, values) for e in dashboard_exprs())


def test_container_aggregations_and_joins_keep_the_tenant() -> None:
    """Containers with the same names (bare-metal runs of one command) are told apart by `tenant`: every
    per-container aggregation and join must keep it, or two containers fold into one series."""
    import re

    clauses = [(e.where, m) for e in dashboard_exprs() for m in re.findall(r"\b(?:by|on) \(([^)]*)\)", e.promql)]
    clauses += [(name, m) for name, expr in alert_exprs().items()
                for m in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr)]
    per_container = [(where, c) for where, c in clauses if "container" in c or "uuid" in c]
    assert per_container
    for where, clause in per_container:
        assert "tenant" in [label.strip() for label in clause.split(",")], (where, clause)


def test_rules_file_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing (Debian package prometheus; .ci/run installs it)")
    proc = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 4 rules found" in proc.stdout


def test_two_dashboards() -> None:
    assert [p.name for p in dashboard_files()] == ["vcuda-node.json", "vcuda-pod.json"]
