"""Fixtures for the DRA driver's tests: the fake API server (holding the Node, ResourceClaims and
ResourceSlices), the test kubelet (dra_driver.testing), and in-process driver agents on fake
inventories that talk to both."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import config
from dra_driver.agent import DriverAgent
from dra_driver.kube import KubeAPI
from dra_driver.testing import NODE, TestKubelet
from kube_contract.apiclient import make_api_client
from kube_contract.testing import FakeApiServer
from node_state.gpus import Inventory
from node_state.testing import inventory
from py_vcuda import native


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.put("nodes", {"kind": "Node", "apiVersion": "v1",
                         "metadata": {"name": NODE, "uid": "node-uid-1", "annotations": {}, "labels": {}}})
    yield server
    server.close()


@pytest.fixture
def kube(api: FakeApiServer, short_dir: Path) -> KubeAPI:
    return KubeAPI(make_api_client(str(api.kubeconfig(short_dir / "kubeconfig"))), timeout=5)


@pytest.fixture
def kubelet(short_dir: Path) -> Iterator[TestKubelet]:
    registry = short_dir / "reg"
    registry.mkdir()
    k = TestKubelet(registry)
    k.start()
    yield k
    k.stop()


def driver_config(short_dir: Path, **overrides: Any) -> config.DriverConfig:
    flags = {"plugin_dir": short_dir / "pl", "registry_dir": short_dir / "reg", "cdi_dir": short_dir / "cdi",
             "state_dir": short_dir / "st", "host_lib_dir": native.lib_dir(), "node_name": NODE,
             "metrics_port": 0, "resync_s": 0.5}
    flags.update(overrides)
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    args = [f"--{k.replace('_', '-')}" if v is True else f"--{k.replace('_', '-')}={v}"   # True: a switch
            for k, v in flags.items()]
    return config.from_args(parser.parse_args(args), env={})


@pytest.fixture
def agent_factory(short_dir: Path, kube: KubeAPI) -> Iterator[Callable[..., DriverAgent]]:
    """Start an in-process DriverAgent (fake inventory, the fake API server); stopped at the end."""
    started: list[DriverAgent] = []

    def make(gpus: int = 2, inv: Inventory | None = None, api: Any = None, **kw: Any) -> DriverAgent:
        agent = DriverAgent(driver_config(short_dir, **kw.pop("config", {})), inventory=inv or inventory(gpus),
                            api=api or kube, **kw)
        agent.start()
        started.append(agent)
        return agent

    yield make
    for agent in reversed(started):
        agent.stop()

