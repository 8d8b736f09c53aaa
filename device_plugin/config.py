"""The node agent's configuration: one table of options, four sources.

Precedence (highest first): command-line flag > environment variable >
config file (``--config``, YAML or JSON, keys as in the table with ``_`` or
``-``) > default. Every option is declared once below with its env alias
``VCUDA_PLUGIN_<NAME>``; "unset" (None) is distinct from zero. Validation
happens here, so a bad value stops the agent with one line naming the option
and where the value came from.

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
=================================  ===========================================
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from node_state.layout import MODES

ENV_PREFIX = "VCUDA_PLUGIN_"
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(ValueError):
    """A value that cannot be used; the message names the option and its source."""


def _mode(text: str) -> str:
    if text not in MODES:
        raise ValueError(f"must be one of {', '.join(MODES)}")
    return text


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise ValueError("must be a port number 0..65535 (0 disables)")
    return port


def _xids(text: str) -> str:
    for part in filter(None, (p.strip() for p in text.split(","))):
        if not part.isdigit():
            raise ValueError(f"{part!r} is not an XID number")
    return text


def _domain(text: str) -> str:
    if not text or "/" in text or text != text.strip():
        raise ValueError("must be a DNS-style domain without '/'")
    return text


def _level(text: str) -> str:
    if text.lower() not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
    return text.lower()


def _reconcile_interval(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError("must be > 0 and at most 1 (the reconciler runs at least once a second)")
    return value


def _flag(text: str) -> bool:
    if text.lower() not in ("1", "true", "yes", "0", "false", "no", ""):
        raise ValueError("must be 1/true/yes or 0/false/no")
    return text.lower() in ("1", "true", "yes")


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be > 0")
    return value


@dataclass(frozen=True)
class Option:
    name: str
    default: Any
    parse: Callable[[str], Any]
    help: str
    flag_type: type = str


OPTIONS: tuple[Option, ...] = (
    Option("mode", None, _mode, "vgpu (shared GPUs), pgpu (whole GPUs) or mps"),
    Option("device_plugin_dir", Path("/var/lib/kubelet/device-plugins"), Path,
           "kubelet's device-plugins directory"),
    Option("pod_resources_socket", Path("/var/lib/kubelet/pod-resources/kubelet.sock"), Path,
           "kubelet pod-resources socket"),
    Option("state_dir", Path("/var/lib/vcuda"), Path, "node state directory"),
    Option("metrics_port", 9394, _port, "Prometheus exporter port (0 disables)"),
    Option("node_name", None, str, "this node's name (default: env NODE_NAME)"),
    Option("resource_domain", "tencent.com", _domain, "domain of the vgpu resource names"),
    Option("annotation_prefix", "vcuda.io", _domain, "prefix of the quota annotations"),
    Option("features_file", Path("/etc/kubernetes/node-feature-discovery/features.d/vcuda"), Path,
           "node-feature-discovery feature file ('' disables)"),
    Option("ignored_xids", None, _xids, "comma list of XIDs that do not mark a GPU unhealthy ('' : none; "
           "unset: NVIDIA's list of application XIDs)"),
    Option("host_lib_dir", Path("/usr/local/vcuda/lib"), Path,
           "host directory with libvcuda.so, mounted into vgpu containers"),
    Option("mps_control", "nvidia-cuda-mps-control", str, "MPS control daemon binary (mps mode)"),
    Option("kubeconfig", None, str, "kubeconfig for the API server (default: in-cluster)"),
    Option("without_api_server", False, _flag,
           "vgpu mode: start even with no API server. Memory requests (vcuda-memory units, "
           "vcuda.io/memory) are then NOT enforced, as containers cannot be told apart; "
           "without this flag vgpu mode refuses to start"),
    Option("resync_s", 30.0, _positive, "seconds between pod/quota/cleanup passes besides those pod events start"),
    Option("cleanup_grace_s", 60.0, _positive,
           "seconds a container's devices may be missing from pod-resources before its directory goes"),
    Option("log_level", "info", _level, "debug, info, warning or error"),
    Option("memory_reconcile_s", 0.5, _reconcile_interval,
           "seconds between memory reconciler passes (NVML per-process use vs ledgers), at most 1"),
    Option("host_proc", Path("/proc"), Path, "the host's /proc, to map NVML's host pids to containers"),
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


def env_name(option: Option) -> str:
    return ENV_PREFIX + option.name.upper()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option as a flag; a flag left out is None so lower sources show through."""
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="config file (YAML or JSON); flags and env override it")
    for option in OPTIONS:
        flag = "--" + option.name.replace("_", "-")
        default = option.default if option.default is not None else "unset"
        help_text = f"{option.help} [env {env_name(option)}; default {default}]"
        if option.parse is _flag:  # a switch: present is true
            parser.add_argument(flag, dest=option.name, default=None, action="store_const", const="1",
                                help=help_text)
        else:
            parser.add_argument(flag, dest=option.name, default=None, help=help_text)


def read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None
    try:
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"--config: {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                          f"{str(exc).splitlines()[0]}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"--config: {path} must hold a mapping of option names to values")
    known = {o.name for o in OPTIONS}
    out = {}
    for key, value in doc.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise ConfigError(f"--config: {path}: unknown option {key!r}")
        out[name] = value
    return out


def resolve(flags: Mapping[str, Any], env: Mapping[str, str], file_values: Mapping[str, Any],
            file_name: str = "config file") -> PluginConfig:
    """Merge the sources by precedence and validate each value."""
    values: dict[str, Any] = {}
    for option in OPTIONS:
        candidates = [
            (flags.get(option.name), "--" + option.name.replace("_", "-")),
            (env.get(env_name(option)), env_name(option)),
        ]
        if option.name == "node_name":
            candidates.append((env.get("NODE_NAME"), "NODE_NAME"))
        candidates.append((file_values.get(option.name), f"{file_name}: {option.name}"))
        value, source = next(((v, s) for v, s in candidates if v is not None), (None, ""))
        if value is None:
            values[option.name] = option.default
            continue
        try:
            values[option.name] = option.parse(str(value))
        except ValueError as exc:
            raise ConfigError(f"{source}: {value!r}: {exc}") from None
    if values["mode"] is None:
        raise ConfigError("--mode: required (vgpu, pgpu or mps; or env VCUDA_PLUGIN_MODE)")
    if not values["node_name"]:
        values["node_name"] = os.uname().nodename
    if str(values["features_file"]) in ("", "."):
        values["features_file"] = None
    names = {f.name for f in fields(PluginConfig)}
    return PluginConfig(**{k: v for k, v in values.items() if k in names})


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> PluginConfig:
    file_values = read_file(args.config) if getattr(args, "config", None) else {}
    flags = {o.name: getattr(args, o.name, None) for o in OPTIONS}
    return resolve(flags, os.environ if env is None else env, file_values,
                   str(args.config) if getattr(args, "config", None) else "config file")
