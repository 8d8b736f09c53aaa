"""The node agent's configuration: one table of options, four sources.

Precedence (highest first): command-line flag > environment variable >
config file (``--config``, YAML or JSON, keys as in the table with ``_`` or
``-``) > default. Every option is declared once below with its env alias
``VCUDA_PLUGIN_<NAME>``; "unset" (None) is distinct from zero. Validation
happens here, so a bad value stops the agent with one line naming the option
and where the value came from. `OptionTable` does the merging; the DRA driver
(dra_driver.config) declares its own table with it.

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
``VCUDA_PLUGIN_RESYNC_S``          seconds between quota/cleanup passes (30)
``VCUDA_PLUGIN_CLEANUP_GRACE_S``   seconds before an unused container dir goes (60)
``VCUDA_PLUGIN_LOG_LEVEL``         debug, info, warning, error
=================================  ===========================================
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
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


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be a port number 0..65535 (0 disables)")
    return value


def xid_list(text: str) -> str:
    for part in filter(None, (p.strip() for p in text.split(","))):
        if not part.isdigit():
            raise ValueError(f"{part!r} is not an XID number")
    return text


def _domain(text: str) -> str:
    if not text or "/" in text or text != text.strip():
        raise ValueError("must be a DNS-style domain without '/'")
    return text


def log_level(text: str) -> str:
    if text.lower() not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
    return text.lower()


def positive_number(text: str) -> float:
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
    Option("resync_s", 30.0, positive_number,
           "seconds between pod/quota/cleanup passes besides those pod events start"),
    Option("cleanup_grace_s", 60.0, positive_number,
           "seconds a container's devices may be missing from pod-resources before its directory goes"),
    Option("log_level", "info", log_level, "debug, info, warning or error"),
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
    resync_s: float
    cleanup_grace_s: float
    log_level: str


@dataclass(frozen=True)
class OptionTable:
    """Options with their env prefix: flags, env, file and defaults merged by precedence.

    The device plugin's table is below; the DRA driver declares its own (dra_driver.config).
    """

    options: tuple[Option, ...]
    env_prefix: str
    env_aliases: Mapping[str, str] = field(default_factory=dict)   # option -> a further env var, below its own

    def env_name(self, option: Option) -> str:
        return self.env_prefix + option.name.upper()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Every option as a flag; a flag left out is None so lower sources show through."""
        parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                            help="config file (YAML or JSON); flags and env override it")
        for option in self.options:
            flag = "--" + option.name.replace("_", "-")
            default = option.default if option.default is not None else "unset"
            parser.add_argument(flag, dest=option.name, default=None,
                                help=f"{option.help} [env {self.env_name(option)}; default {default}]")

    def read_file(self, path: Path) -> dict[str, Any]:
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
        known = {o.name for o in self.options}
        out = {}
        for key, value in doc.items():
            name = str(key).replace("-", "_")
            if name not in known:
                raise ConfigError(f"--config: {path}: unknown option {key!r}")
            out[name] = value
        return out

    def merge(self, flags: Mapping[str, Any], env: Mapping[str, str], file_values: Mapping[str, Any],
              file_name: str = "config file") -> dict[str, Any]:
        """Every option's value by precedence, validated (the default where no source sets it)."""
        values: dict[str, Any] = {}
        for option in self.options:
            candidates = [
                (flags.get(option.name), "--" + option.name.replace("_", "-")),
                (env.get(self.env_name(option)), self.env_name(option)),
            ]
            if option.name in self.env_aliases:
                alias = self.env_aliases[option.name]
                candidates.append((env.get(alias), alias))
            candidates.append((file_values.get(option.name), f"{file_name}: {option.name}"))
            value, source = next(((v, s) for v, s in candidates if v is not None), (None, ""))
            if value is None:
                values[option.name] = option.default
                continue
            try:
                values[option.name] = option.parse(str(value))
            except ValueError as exc:
                raise ConfigError(f"{source}: {value!r}: {exc}") from None
        return values

    def from_args(self, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """merge() of the parsed flags, the environment and the --config file."""
        path = getattr(args, "config", None)
        file_values = self.read_file(path) if path else {}
        flags = {o.name: getattr(args, o.name, None) for o in self.options}
        return self.merge(flags, os.environ if env is None else env, file_values, str(path) if path else "config file")


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
    names = {f.name for f in fields(PluginConfig)}
    return PluginConfig(**{k: v for k, v in values.items() if k in names})


def resolve(flags: Mapping[str, Any], env: Mapping[str, str], file_values: Mapping[str, Any],
            file_name: str = "config file") -> PluginConfig:
    """Merge the sources by precedence and validate each value."""
    return _config(TABLE.merge(flags, env, file_values, file_name))


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> PluginConfig:
    return _config(TABLE.from_args(args, env))
