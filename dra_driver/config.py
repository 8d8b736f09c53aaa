"""The DRA driver's configuration: one table of options (node_state.options.OptionTable),
with the same precedence as the node agent's: flag > ``VCUDA_DRA_<NAME>`` > ``--config`` file > default.

Environment variables (all optional):

=================================  ===========================================
``VCUDA_DRA_PLUGIN_DIR``           kubelet plugins directory (the DRA socket goes in <dir>/gpu.vcuda.io/)
``VCUDA_DRA_REGISTRY_DIR``         kubelet plugin registry (the registration socket)
``VCUDA_DRA_CDI_DIR``              where the CDI specs of prepared claims go
``VCUDA_DRA_STATE_DIR``            node state directory (node_state.layout; the checkpoint in dra/)
``VCUDA_DRA_HOST_LIB_DIR``         host directory holding libvcuda.so
``VCUDA_DRA_NODE_NAME``            this node's name (also ``NODE_NAME``)
``VCUDA_DRA_METRICS_PORT``         Prometheus port, 0 disables
``VCUDA_DRA_KUBECONFIG``           kubeconfig (default: in-cluster)
``VCUDA_DRA_IGNORED_XIDS``         comma list of XIDs that do not fail a GPU ("" : none)
``VCUDA_DRA_RESYNC_S``             seconds between checks of the node's ResourceSlice (60)
``VCUDA_DRA_MEMORY_RECONCILE_S``   seconds between memory reconciler passes (0.5, at most 1)
``VCUDA_DRA_HOST_PROC``            the host's /proc (NVML's host pids to containers)
``VCUDA_DRA_ON_ESCAPE``            kill or report a shared-GPU process without libvcuda (kill)
``VCUDA_DRA_ON_OVER_LIMIT``        report or kill a container over its memory limit (report)
``VCUDA_DRA_LOG_LEVEL``            debug, info, warning, error
``VCUDA_DRA_ALLOW_OPT_OUT_NAMESPACES`` namespaces whose claims may opt a GPU share out of libvcuda ("")
``VCUDA_DRA_MIG``                  static (MIG instances that exist) or dynamic (also partitions made at prepare)
``VCUDA_DRA_SIMULATOR``            1: TEST ONLY, containers get the GPU simulator (node_state.gpu_driver)
=================================  ===========================================
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from dra_driver.names import DEFAULT_CDI_DIR, DEFAULT_PLUGIN_DIR, DEFAULT_REGISTRY_DIR
from node_state.options import (
    ALLOW_OPT_OUT_NAMESPACES,
    GUARD_OPTIONS,
    KILL,
    REPORT,
    SIMULATOR,
    ConfigError,
    Option,
    OptionTable,
    log_level,
    port_number,
    positive_number,
    reconcile_interval,
    xid_list,
)

ENV_PREFIX = "VCUDA_DRA_"
STATIC, DYNAMIC = "static", "dynamic"


def mig_mode(text: str) -> str:
    if text not in (STATIC, DYNAMIC):
        raise ValueError(f"must be {STATIC} or {DYNAMIC}")
    return text


OPTIONS: tuple[Option, ...] = (
    Option("plugin_dir", DEFAULT_PLUGIN_DIR, Path, "kubelet plugins directory (the DRA service socket goes "
           "in <dir>/gpu.vcuda.io/dra.sock)"),
    Option("registry_dir", DEFAULT_REGISTRY_DIR, Path, "kubelet plugin registry directory"),
    Option("cdi_dir", DEFAULT_CDI_DIR, Path, "CDI spec directory the container runtime reads"),
    Option("state_dir", Path("/var/lib/vcuda"), Path, "node state directory"),
    Option("host_lib_dir", Path("/usr/local/vcuda/lib"), Path, "host directory with libvcuda.so, mounted into "
           "containers"),
    Option("node_name", None, str, "this node's name (default: env NODE_NAME)"),
    Option("metrics_port", 9394, port_number, "Prometheus exporter port (0 disables)"),
    Option("kubeconfig", None, str, "kubeconfig for the API server (default: in-cluster)"),
    Option("ignored_xids", None, xid_list, "comma list of XIDs that do not mark a GPU unhealthy ('' : none; "
           "unset: NVIDIA's list of application XIDs)"),
    Option("resync_s", 60.0, positive_number, "seconds between checks that the node's ResourceSlice is current"),
    Option("memory_reconcile_s", 0.5, reconcile_interval,
           "seconds between memory reconciler passes (NVML per-process use vs ledgers), at most 1"),
    Option("host_proc", Path("/proc"), Path, "the host's /proc, to map NVML's host pids to containers"),
    *GUARD_OPTIONS,
    Option("log_level", "info", log_level, "debug, info, warning or error"),
    ALLOW_OPT_OUT_NAMESPACES,
    SIMULATOR,
    Option("mig", STATIC, mig_mode, "static: offer the MIG instances that exist; dynamic: also offer every idle "
           "MIG-capable GPU as partitions (partitionable devices), made at prepare and destroyed at unprepare"),
)
TABLE = OptionTable(OPTIONS, ENV_PREFIX, {"node_name": "NODE_NAME"})


@dataclass(frozen=True)
class DriverConfig:
    plugin_dir: Path
    registry_dir: Path
    cdi_dir: Path
    state_dir: Path
    host_lib_dir: Path
    node_name: str
    metrics_port: int
    kubeconfig: str | None
    ignored_xids: str | None
    resync_s: float
    memory_reconcile_s: float
    host_proc: Path
    log_level: str
    on_escape: str = KILL
    on_over_limit: str = REPORT
    allow_opt_out_namespaces: frozenset[str] = frozenset()
    mig: str = STATIC
    simulator: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    TABLE.add_arguments(parser)


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> DriverConfig:
    values = TABLE.from_args(args, env)
    if not values["node_name"]:
        values["node_name"] = os.uname().nodename
    return DriverConfig(**{f.name: values[f.name] for f in fields(DriverConfig)})


__all__ = ["ConfigError", "DriverConfig", "OPTIONS", "add_arguments", "from_args"]
