"""Command line of the node agent: parse, configure, wire, run until SIGTERM.

`vcuda device-plugin` calls add_arguments()/run(); `python -m device_plugin` calls main().
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from device_plugin import config as configlib
from node_state.daemon import StartError

if TYPE_CHECKING:  # the agent's modules load grpc and NVML: only `run` needs them, not `vcuda --help`
    from device_plugin.agent import Agent, WatchFactory
    from device_plugin.mig_config import MigNode
    from device_plugin.node_topology import NodePatch
    from device_plugin.pods import PodSource
    from kube_contract.events import EventRecorder
    from node_state.health import HealthFactory
    from py_vcuda.nvml import NVML

log = logging.getLogger("device_plugin")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    configlib.add_arguments(parser)


@dataclass
class Cluster:
    """What the agent gets from the API server, or stand-ins when there is none."""

    pods: PodSource
    watch: WatchFactory | None = None
    patch_node: NodePatch | None = None
    events: EventRecorder | None = None   # None: what would be an Event is only logged
    mig_node: MigNode | None = None


class NoAPIServer(StartError):
    """vgpu mode with no API server and no --without-api-server: memory quotas would be lost."""


def cluster(kubeconfig: str | None, node: str, *, require: bool = False) -> Cluster:
    """This node's pods, a watch on them and a way to label and annotate the Node; NoPods without an API server.

    With `require`, no API server raises NoAPIServer instead: vgpu mode finds each container's
    memory request through its pod, and a quota that cannot be applied must not become unlimited.
    """
    from device_plugin.mig_config import MigNode
    from device_plugin.node_topology import KubeNode
    from device_plugin.pods import Arrivals, KubePods, NoPods, PodWatch
    from kube_contract.events import EventRecorder

    try:
        from kubernetes import client

        from kube_contract.apiclient import make_api_client

        api = client.CoreV1Api(make_api_client(kubeconfig))
    except Exception as exc:   # the kubernetes client raises several unrelated types here
        if require:
            raise NoAPIServer(
                f"no API server ({exc}): vgpu mode needs it to apply each container's memory request; "
                "give --kubeconfig, run in-cluster, or pass --without-api-server to run with memory "
                "requests NOT enforced") from None
        log.warning("no API server (%s): pods are not identified; fine on single-GPU nodes only", exc)
        return Cluster(NoPods(str(exc)))
    arrivals = Arrivals()   # the watch's bind order, which GetPreferredAllocation and Allocate follow
    return Cluster(KubePods(api, arrivals=arrivals), lambda on_event: PodWatch(api, node, on_event, arrivals=arrivals),
                   KubeNode(api, node).patch,
                   EventRecorder(api, component="vcuda-device-plugin", host=node), MigNode(api, node))


def run(args: argparse.Namespace) -> int:
    try:
        cfg = configlib.from_args(args)
    except configlib.ConfigError as exc:
        print(f"vcuda device-plugin: {exc}", file=sys.stderr)
        return 2

    def build(nvml: NVML, health: HealthFactory | None) -> Agent:
        from device_plugin.agent import Agent
        from node_state.gpus import Inventory

        api = cluster(cfg.kubeconfig, cfg.node_name, require=cfg.mode == "vgpu" and not cfg.without_api_server)
        return Agent(cfg, inventory=Inventory.from_nvml(nvml), pods=api.pods, nvml=nvml, health_factory=health,
                     pod_watch=api.watch, patch_node=api.patch_node, events=api.events, mig_node=api.mig_node)

    from node_state.daemon import serve

    return serve("vcuda device-plugin", "device_plugin", cfg.log_level, cfg.ignored_xids, build)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m device_plugin",
                                     description="vcuda node agent: kubelet device plugin and helpers")
    add_arguments(parser)
    return run(parser.parse_args(argv))
