"""The e2e tier: tests on a real single-node Kubernetes (e2e/cluster.py), marked `e2e`.

Deselected by the default run (pyproject's addopts say `-m "not e2e"`); run them with
`python3 -m pytest -m e2e tests/e2e` as root after `python3 e2e/cluster.py build`. The cluster comes
up once per session (or is reused when it is already up) and goes down at the end unless it was up
before or VCUDA_E2E_KEEP=1. VCUDA_E2E_K8S picks the Kubernetes version (default 1.36.3).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "e2e"))

import cluster as cluster_tool  # noqa: E402


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
    c.up()
    yield c
    if not was_up and os.environ.get("VCUDA_E2E_KEEP") != "1":
        c.down()
