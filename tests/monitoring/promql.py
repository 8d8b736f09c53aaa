"""The PromQL in the dashboards and alert rules, and a real Prometheus server to run it on."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
# What the Helm chart installs (files/dashboards written by deploy/dashboards/generate.py).
DASHBOARDS = REPO / "deploy" / "helm" / "vcuda" / "files" / "dashboards"
GENERATOR = REPO / "deploy" / "dashboards" / "generate.py"
ALERTS = REPO / "deploy" / "helm" / "vcuda" / "files" / "alerts" / "vcuda-alerts.yaml"


@dataclass(frozen=True)
class Expr:
    where: str      # dashboard/panel or rule name, for messages
    promql: str     # as written, with Grafana variables
    dashboard: str = ""   # file name
    panel: str = ""       # panel title, or "variable <name>"
    legend: str = ""      # the target's legendFormat ("" for variables)


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))


def dashboard_exprs() -> list[Expr]:
    out: list[Expr] = []
    for path in dashboard_files():
        doc = json.loads(path.read_text())
        for panel in doc["panels"]:
            for target in panel["targets"]:
                out.append(Expr(f"{path.name}: {panel['title']} ({target['refId']}, {target['legendFormat']})",
                                target["expr"], path.name, panel["title"], target["legendFormat"]))
        for var in doc["templating"]["list"]:
            if var["type"] == "query":
                out.append(Expr(f"{path.name}: variable {var['name']}", var["definition"], path.name,
                                f"variable {var['name']}"))
    return out


def dashboard_expr(dashboard: str, panel: str, legend: str = "") -> Expr:
    """The one expression of `panel` in `dashboard` whose legend ends with `legend` (a variable: panel
    "variable <name>")."""
    hits = [e for e in dashboard_exprs()
            if e.dashboard == dashboard and e.panel == panel and e.legend.endswith(legend)]
    assert len(hits) == 1, f"{dashboard}: {len(hits)} expressions in {panel!r} with a legend ending {legend!r}"
    return hits[0]


def alert_exprs() -> dict[str, str]:
    doc = yaml.safe_load(ALERTS.read_text())
    return {rule["alert"]: rule["expr"] for group in doc["groups"] for rule in group["rules"]}


def substitute(promql: str, values: dict[str, str]) -> str:
    """Grafana variables replaced, longest name first (`$__range_s` before `$__range`)."""
    for name in sorted(values, key=len, reverse=True):
        promql = promql.replace(f"${{{name}}}", values[name]).replace(f"${name}", values[name])
    return promql


def label_values_selector(promql: str) -> tuple[str, str] | None:
    """`label_values(sel, label)` (a Grafana variable query) -> (sel, label), else None."""
    text = promql.strip()
    if not text.startswith("label_values(") or not text.endswith(")"):
        return None
    inner = text[len("label_values("):-1]
    selector, _, label = inner.rpartition(",")
    return selector.strip(), label.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_or_install_prometheus() -> tuple[str | None, str]:
    """The prometheus binary, installing Debian's package when root; else (None, why)."""
    path = shutil.which("prometheus")
    if path:
        return path, ""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, "no prometheus binary and not root on a Debian machine (apt-get install prometheus)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            return None, f"{' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}"
    path = shutil.which("prometheus")
    return (path, "") if path else (None, "apt-get installed prometheus but it is not on PATH")


class Prometheus:
    """A private Prometheus server scraping its targets every second, with the vcuda alert rules loaded."""

    def __init__(self, binary: str, workdir: Path, targets: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [{"job_name": "vcuda", "static_configs": [{"targets": targets}]}],
        }))
        self.log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def get(self, path: str, **params: object) -> dict:
        url = f"{self.url}{path}"
        if params:
            url += "?" + urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        with urllib.request.urlopen(url, timeout=30) as resp:
            doc = json.loads(resp.read())
        if doc.get("status") != "success":
            raise AssertionError(f"{url}: {doc}")
        return doc["data"]

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}; see {self.log.name}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def query(self, promql: str) -> list[dict]:
        return self.get("/api/v1/query", query=promql)["result"]

    def query_range(self, promql: str, start: float, end: float | None = None, step: float = 1.0) -> list[dict]:
        return self.get("/api/v1/query_range", query=promql, start=start, end=end or time.time(),
                        step=step)["result"]
