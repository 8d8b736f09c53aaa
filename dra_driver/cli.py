"""Command line of the DRA driver: parse, configure, wire, run until SIGTERM.

`vcuda dra-driver` calls add_arguments()/run(); `python -m dra_driver` calls main().
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from dra_driver import config as configlib

if TYPE_CHECKING:
    from dra_driver.agent import DriverAgent
    from node_state.health import HealthFactory
    from py_vcuda.nvml import NVML

log = logging.getLogger("dra_driver")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    configlib.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from node_state.daemon import serve

    try:
        cfg = configlib.from_args(args)
    except configlib.ConfigError as exc:
        print(f"vcuda dra-driver: {exc}", file=sys.stderr)
        return 2

    def build(nvml: NVML, health: HealthFactory | None) -> DriverAgent:
        # grpc and the kubernetes client load here, not for `vcuda --help`.
        from kubernetes import client

        from dra_driver.agent import DriverAgent
        from dra_driver.kube import KubeAPI
        from dra_driver.slices import DriverVersions
        from kube_contract.apiclient import make_api_client
        from kube_contract.events import EventRecorder
        from node_state.daemon import StartError
        from node_state.gpus import Inventory

        try:
            api_client = make_api_client(cfg.kubeconfig)
            api = KubeAPI(api_client)
            events = EventRecorder(client.CoreV1Api(api_client), component="vcuda-dra-driver", host=cfg.node_name)
        except Exception as exc:   # the kubernetes client raises several unrelated types here
            raise StartError(f"no API server configuration ({exc}); a DRA driver reads every claim from the API "
                             "server: run it in-cluster or pass --kubeconfig") from None
        versions = DriverVersions(driver=_optional(nvml.driver_version), cuda=_optional(nvml.cuda_driver_version))
        return DriverAgent(cfg, inventory=Inventory.from_nvml(nvml), api=api, nvml=nvml, health_factory=health,
                           versions=versions, events=events)

    return serve("vcuda dra-driver", "dra_driver", cfg.log_level, cfg.ignored_xids, build)


def _optional(read):  # type: ignore[no-untyped-def]
    """NVML's answer, or None where this driver does not give it (a label, not a reason to stop)."""
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - NVML raises its own error types
        log.warning("NVML: %s", exc)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra_driver",
                                     description="vcuda's Kubernetes DRA driver (gpu.vcuda.io): kubelet plugin, "
                                                 "ResourceSlices, token schedulers and metrics")
    add_arguments(parser)
    return run(parser.parse_args(argv))
