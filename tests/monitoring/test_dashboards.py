"""The dashboards' and alert rules' shape (no server needed): generated files current, Grafana
model fields, time presets, template variables, and `promtool check rules`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from monitoring.promql import ALERTS, DASHBOARDS, alert_exprs, dashboard_exprs, dashboard_files, substitute


def test_generated_files_are_current() -> None:
    proc = subprocess.run([sys.executable, str(DASHBOARDS / "generate.py"), "--check"], capture_output=True,
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

    documented = (DASHBOARDS.parents[1] / "device_plugin" / "METRICS.md").read_text()
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
    assert "3600 / 3600" in " ".join(substitute(e.promql, values) for e in dashboard_exprs())


def test_rules_file_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing (Debian package prometheus; .ci/run installs it)")
    proc = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 4 rules found" in proc.stdout


def test_two_dashboards() -> None:
    assert [p.name for p in dashboard_files()] == ["vcuda-node.json", "vcuda-pod.json"]
