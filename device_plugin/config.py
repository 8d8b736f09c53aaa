"""The node agent's configuration: one table of options, four sources.

Precedence (highest first): command-line flag > environment variable >
config file (``--config``, YAML or JSON, keys as in the table with ``_`` or
``-``) > default. Every option is declared once below with its env alias
``VCUDA_PLUGIN_<NAME>``; "unset" (None) is distinct from zero. Validation
happens here, so a bad value stops the agent with one line naming the option
and where the value came from (node_state.options does the merging, as for the
DRA driver's table).

Environment variables (all optional):

=================================  ===========================================
``VCUDA_PLUGIN_MODE``              vgpu, pgpu or mps
``VCUDA_PLUGIN_DEVICE_PLUGIN_DIR`` kubelet's device-plugins directory
``VCUDA_PLUGIN_POD_RESOURCES_SOCKET``  kubelet pod-resources socket
``VCUDA_PLUGIN_STATE_DIR``         node state directory (node_state.layout)
``VCUDA_PLUGIN_METRICS_PORT``      Prometheus port, 0 disables
``VCUDA_PLUGIN_NODE_NAME``         this node's name (also ``NODE_NAME``)
``VCUDA_PLUGIN_RESOURCE_DOMAIN``   vgpu resource domain (tencent.com)
``VCUDA_PLUGIN_ANNOTATION_PREFIX`` quota annotation prefix (vcuda.io)
``VCUDA_PLUGIN_FEATURES_FILE``     NFD feature file ("" disables)
``VCUDA_PLUGIN_IGNORED_XIDS``      comma list of XIDs that do not fail a GPU ("" : none)
``VCUDA_PLUGIN_HOST_LIB_DIR``      host directory holding libvcuda.so
``VCUDA_PLUGIN_MPS_CONTROL``       nvidia-cuda-mps-control binary
``VCUDA_PLUGIN_KUBECONFIG``        kubeconfig ("" : in-cluster, else none)
``VCUDA_PLUGIN_WITHOUT_API_SERVER`` 1: vgpu mode may run with no API server (memory NOT enforced)
``VCUDA_PLUGIN_RESYNC_S``          seconds between quota/cleanup passes (30)
``VCUDA_PLUGIN_CLEANUP_GRACE_S``   seconds before an unused container dir goes (60)
``VCUDA_PLUGIN_LOG_LEVEL``         debug, info, warning, error
``VCUDA_PLUGIN_MEMORY_RECONCILE_S`` seconds between memory reconciler passes (0.5, at most 1)
``VCUDA_PLUGIN_HOST_PROC``         the host's /proc (/proc: the agent runs with hostPID)
``VCUDA_PLUGIN_ON_ESCAPE``         kill or report a shared-GPU process without libvcuda (kill)
``VCUDA_PLUGIN_ON_OVER_LIMIT``     report or kill a container over its memory limit (report)
``VCUDA_PLUGIN_DEVICE_LIST_STRATEGY`` envvar, volume-mounts, cdi-cri (a comma list; envvar)
``VCUDA_PLUGIN_ALLOW_OPT_OUT_NAMESPACES`` namespaces whose pods may opt a GPU share out of libvcuda ("")
``VCUDA_PLUGIN_MIG_STRATEGY``      none, single or mixed (pgpu mode; NVIDIA's names)
``VCUDA_PLUGIN_MIG_CONFIG``        mig-parted layouts file, applied by node label (pgpu mode)
``VCUDA_PLUGIN_SIMULATOR``         1: TEST ONLY, containers get the GPU simulator (node_state.gpu_driver)
=================================  ===========================================
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from device_plugin.device_list import DEFAULT, ENVVAR, strategy_list
from node_state.layout import MODES
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
    mig_strategy,
    port_number,
    positive_number,
    reconcile_interval,
    switch,
    xid_list,
)

ENV_PREFIX = "VCUDA_PLUGIN_"


def _mode(text: str) -> str:
    if text not in MODES:
        raise ValueError(f"must be one of {', '.join(MODES)}")
    return text


def _domain(text: str) -> str:
    if not text or "/" in text or text != text.strip():
        raise ValueError("must be a DNS-style domain without '/'")
    return text


OPTIONS: tuple[Option, ...] = (
    Option("mode", None, _mode, "vgpu (shared GPUs), pgpu (whole GPUs) or mps"),
    Option("device_plugin_dir", Path("/var/lib/kubelet/device-plugins"), Path,
           "kubelet's device-plugins directory"),
    Option("pod_resources_socket", Path("/var/lib/kubelet/pod-resources/kubelet.sock"), Path,
           "kubelet pod-resources socket"),
    Option("state_dir", Path("/var/lib/vcuda"), Path, "node state directory"),
    Option("metrics_port", 9394, port_number, "Prometheus exporter port (0 disables)"),
    Option("node_name", None, str, "this node's name (default: env NODE_NAME)"),
    Option("resource_domain", "tencent.com", _domain, "domain of the vgpu resource names"),
    Option("annotation_prefix", "vcuda.io", _domain, "prefix of the quota annotations"),
    Option("features_file", Path("/etc/kubernetes/node-feature-discovery/features.d/vcuda"), Path,
           "node-feature-discovery feature file ('' disables)"),
    Option("ignored_xids", None, xid_list, "comma list of XIDs that do not mark a GPU unhealthy ('' : none; "
           "unset: NVIDIA's list of application XIDs)"),
    Option("host_lib_dir", Path("/usr/local/vcuda/lib"), Path,
           "host directory with libvcuda.so, mounted into vgpu containers"),
    Option("mps_control", "nvidia-cuda-mps-control", str, "MPS control daemon binary (mps mode)"),
    Option("kubeconfig", None, str, "kubeconfig for the API server (default: in-cluster)"),
    Option("without_api_server", False, switch,
           "vgpu mode: start even with no API server. Memory requests (vcuda-memory units, "
           "vcuda.io/memory) are then NOT enforced, as containers cannot be told apart; "
           "without this flag vgpu mode refuses to start"),
    Option("resync_s", 30.0, positive_number,
           "seconds between pod/quota/cleanup passes besides those pod events start"),
    Option("cleanup_grace_s", 60.0, positive_number,
           "seconds a container's devices may be missing from pod-resources before its directory goes"),
    Option("log_level", "info", log_level, "debug, info, warning or error"),
    Option("memory_reconcile_s", 0.5, reconcile_interval,
           "seconds between memory reconciler passes (NVML per-process use vs ledgers), at most 1"),
    Option("host_proc", Path("/proc"), Path, "the host's /proc, to map NVML's host pids to containers"),
    *GUARD_OPTIONS,
    Option("device_list_strategy", DEFAULT, strategy_list,
           "how Allocate names the GPUs to the container runtime, as NVIDIA's device plugin: envvar "
           "(NVIDIA_VISIBLE_DEVICES), volume-mounts (/var/run/nvidia-container-devices/<uuid>), cdi-cri "
           "(CDI devices nvidia.com/gpu=<uuid>, Kubernetes >= 1.31); a comma list"),
    ALLOW_OPT_OUT_NAMESPACES,
    SIMULATOR,
    Option("mig_strategy", "none", mig_strategy,
           "pgpu mode: how MIG devices are offered: none (whole GPUs without MIG mode), single (MIG devices "
           "as nvidia.com/gpu, one profile on the node) or mixed (nvidia.com/mig-<profile> per profile)"),
    Option("mig_config", None, Path,
           "pgpu mode: mig-parted layouts file (version v1, mig-configs); the agent applies the layout the "
           "Node's label nvidia.com/mig.config names ('' or unset: no layouts)"),
)


@dataclass(frozen=True)
class PluginConfig:
    mode: str
    device_plugin_dir: Path
    pod_resources_socket: Path
    state_dir: Path
    metrics_port: int
    node_name: str
    resource_domain: str
    annotation_prefix: str
    features_file: Path | None
    ignored_xids: str | None
    host_lib_dir: Path
    mps_control: str
    kubeconfig: str | None
    without_api_server: bool
    resync_s: float
    cleanup_grace_s: float
    log_level: str
    memory_reconcile_s: float = 0.5
    host_proc: Path = Path("/proc")
    on_escape: str = KILL
    on_over_limit: str = REPORT
    device_list_strategy: tuple[str, ...] = (ENVVAR,)
    allow_opt_out_namespaces: frozenset[str] = frozenset()
    mig_strategy: str = "none"
    mig_config: Path | None = None
    simulator: bool = False


TABLE = OptionTable(OPTIONS, ENV_PREFIX, {"node_name": "NODE_NAME"})


def env_name(option: Option) -> str:
    return TABLE.env_name(option)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    TABLE.add_arguments(parser)


def _config(values: dict[str, Any]) -> PluginConfig:
    if values["mode"] is None:
        raise ConfigError("--mode: required (vgpu, pgpu or mps; or env VCUDA_PLUGIN_MODE)")
    if not values["node_name"]:
        values["node_name"] = os.uname().nodename
    if str(values["features_file"]) in ("", "."):
        values["features_file"] = None
    if str(values["mig_config"]) in ("", ".", "None"):
        values["mig_config"] = None
    if values["mode"] != "pgpu" and (values["mig_strategy"] != "none" or values["mig_config"] is not None):
        raise ConfigError(f"--mig-strategy/--mig-config: MIG devices are offered in pgpu mode only (mode "
                          f"{values['mode']}: GPUs in MIG mode are not offered until vGPU shares of MIG exist)")
    names = {f.name for f in fields(PluginConfig)}
    return PluginConfig(**{k: v for k, v in values.items() if k in names})


def resolve(flags: Mapping[str, Any], env: Mapping[str, str], file_values: Mapping[str, Any],
            file_name: str = "config file") -> PluginConfig:
    """Merge the sources by precedence and validate each value."""
    return _config(TABLE.merge(flags, env, file_values, file_name))


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> PluginConfig:
    return _config(TABLE.from_args(args, env))
