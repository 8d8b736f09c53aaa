"""The e2e tier: tests on a real single-node Kubernetes (e2e/cluster.py), marked `e2e`.

Deselected by the default run (pyproject's addopts say `-m "not e2e"`); run them with
`python3 -m pytest -m e2e tests/e2e` as root after `python3 e2e/cluster.py build`. The cluster comes
up once per session (or is reused when it is already up) and goes down at the end unless it was up
before or VCUDA_E2E_KEEP=1. VCUDA_E2E_K8S picks the Kubernetes version (default 1.36.3).

The session fixture `release` installs vcuda on it as a user does (e2e/vcuda.py): the images built
offline (cached) and imported, `helm install` of the chart, the node labelled for vgpu, every pod
Ready; at the end `helm uninstall` (also kept with VCUDA_E2E_KEEP=1). A scenario that needs another
mode (pgpu, dra) or other chart values asks `release.ensure(mode, values)`, which reinstalls only when
they differ; the fixture `vcuda` is the release as vgpu with the chart's defaults. Each scenario's
time is printed in the summary ("vcuda e2e timings").
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "e2e"))

import cluster as cluster_tool  # noqa: E402
import vcuda as vcuda_tool  # noqa: E402

record = vcuda_tool.record


def pytest_terminal_summary(terminalreporter) -> None:
    if vcuda_tool.TIMINGS:
        terminalreporter.section("vcuda e2e timings")
        for what, value in vcuda_tool.TIMINGS.items():
            terminalreporter.write_line(f"{value}  {what}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.timeout(900))   # the first test pays for the cluster's start


@pytest.fixture(scope="session")
def cluster() -> Iterator[cluster_tool.Cluster]:
    c = cluster_tool.Cluster(os.environ.get("VCUDA_E2E_K8S", cluster_tool.DEFAULT_VERSION))
    missing = c.missing()
    if missing:
        pytest.skip("e2e cluster cannot start: " + "; ".join(missing))
    running = c.running()
    if running and running != c.version:
        pytest.skip(f"e2e cluster: Kubernetes {running} is up on this machine, not {c.version} "
                    "(python3 e2e/cluster.py down)")
    was_up = running == c.version and c.ready()
    record(f"cluster {c.version} up", c.up())
    yield c
    if not was_up and os.environ.get("VCUDA_E2E_KEEP") != "1":
        c.down()


@pytest.fixture(scope="session")
def release(cluster: cluster_tool.Cluster) -> Iterator[vcuda_tool.Install]:
    """vcuda installed with its Helm chart (a release left by an earlier run is uninstalled first)."""
    inst = vcuda_tool.Install(cluster, simulator=vcuda_tool.chart_has_simulator())
    try:
        record("images built (or cached) and imported", inst.images())
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"vcuda's images: {exc}")
    if inst.installed():
        inst.uninstall()
    try:
        record("helm install to every pod Ready", inst.install())
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield inst
    if os.environ.get("VCUDA_E2E_KEEP") != "1":
        inst.uninstall()


@pytest.fixture
def vcuda(release: vcuda_tool.Install) -> vcuda_tool.Install:
    """The release as vgpu with the chart's defaults (reinstalled so if a scenario before changed it)."""
    try:
        took = release.ensure("vgpu")
    except RuntimeError as exc:
        pytest.fail(str(exc))
    if took:
        record("helm reinstall as vgpu", took)
    return release


@pytest.fixture
def namespace(cluster: cluster_tool.Cluster) -> Iterator[str]:
    """A namespace of the test's own (the webhook serves every namespace but kube-system and vcuda's)."""
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    # The API server makes the default ServiceAccount shortly after; pods wait for it.
    deadline = time.monotonic() + 30
    while cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode != 0:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    yield name
    # Waited for: a terminating pod still holds its share of a GPU, which the next test would find taken.
    cluster.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", check=False, timeout=150)
