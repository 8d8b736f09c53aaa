"""The node daemons' options: one table per daemon, four sources.

Precedence (highest first): command-line flag > environment variable
(``<prefix><NAME>``) > config file (``--config``, YAML or JSON, keys as in the
table with ``_`` or ``-``) > default. Every option is declared once in its
daemon's table (device_plugin.config, dra_driver.config); "unset" (None) is
distinct from zero; a bad value stops the daemon with one line naming the
option and where the value came from.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(ValueError):
    """A value that cannot be used; the message names the option and its source."""


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


def log_level(text: str) -> str:
    if text.lower() not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
    return text.lower()


def switch(text: str) -> bool:
    """An on/off option: a flag without a value (present: on), or 1/true/yes, 0/false/no in env and file."""
    if text.lower() not in ("1", "true", "yes", "0", "false", "no", ""):
        raise ValueError("must be 1/true/yes or 0/false/no")
    return text.lower() in ("1", "true", "yes")


def reconcile_interval(text: str) -> float:
    """Seconds between memory reconciler passes: it runs at least once a second."""
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError("must be > 0 and at most 1 (the reconciler runs at least once a second)")
    return value


_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class NameSet(frozenset[str]):
    """A set of names that prints as the comma list it was given as (in --help, in logs)."""

    def __str__(self) -> str:
        return ",".join(sorted(self)) or "''"


def namespace_list(text: str) -> NameSet:
    """A comma list of Kubernetes namespace names ('' : none)."""
    names = NameSet(filter(None, (p.strip() for p in text.split(","))))
    for name in sorted(names):
        if not _NAMESPACE.match(name):
            raise ValueError(f"{name!r} is not a namespace name (lower-case letters, digits and '-')")
    return names


MIG_STRATEGIES = ("none", "single", "mixed")


def mig_strategy(text: str) -> str:
    """How MIG devices are offered (NVIDIA's k8s-device-plugin names): none, single or mixed."""
    if text not in MIG_STRATEGIES:
        raise ValueError(f"must be one of {', '.join(MIG_STRATEGIES)}")
    return text


def positive_number(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be > 0")
    return value


KILL, REPORT = "kill", "report"
GUARD_ACTIONS = (KILL, REPORT)   # node_state.quota_guard: what is done to an escape or a container over its limit
# Memory reconciler passes running a container may hold more than its limit before it is acted on.
OVER_LIMIT_PASSES = 3


def guard_action(text: str) -> str:
    if text not in GUARD_ACTIONS:
        raise ValueError(f"must be one of {', '.join(GUARD_ACTIONS)}")
    return text


@dataclass(frozen=True)
class Option:
    name: str
    default: Any
    parse: Callable[[str], Any]
    help: str
    flag_type: type = str


# Both daemons run the memory reconciler on shared GPUs, and so the quota guard (node_state.quota_guard).
GUARD_OPTIONS: tuple[Option, ...] = (
    Option("on_escape", KILL, guard_action,
           "a GPU process of a container holding a share of a GPU that runs without libvcuda (a quota escape): "
           "kill (SIGKILL it) or report (leave it running); both log it, record a GPUQuotaEscape Event on its "
           "pod and count it in vcuda_quota_escapes_total"),
    Option("on_over_limit", REPORT, guard_action,
           f"a container whose GPU processes hold more than its memory limit (NVML) for {OVER_LIMIT_PASSES} "
           "memory reconciler passes running: report (log, GPUQuotaOverLimit Event, "
           "vcuda_quota_over_limit_total) or kill (also SIGKILL its processes on that GPU)"),
)


# Both node daemons (device plugin, DRA driver) take it: who may run a share of a GPU without libvcuda.
ALLOW_OPT_OUT_NAMESPACES = Option(
    "allow_opt_out_namespaces", NameSet(), namespace_list,
    "comma list of namespaces whose pods may opt a share of a GPU out of libvcuda's preload (vgpu: "
    "VCUDA_DISABLE=1 in the container's env; DRA: GpuShareConfig preload: false). Elsewhere the request is "
    "ignored (vgpu, with a warning) or refused (DRA). Whole GPUs may always opt out ('' : no namespace)")


# Both node daemons take it: test only (the e2e tier, chart value testing.simulator).
SIMULATOR = Option(
    "simulator", False, switch,
    "TEST ONLY: the node's GPUs are the GPU simulator's (the agent's VCUDA_REAL_LIBNVML and VCUDA_SIM_STATE); "
    "every GPU container gets the simulator's libraries (from --host-lib-dir) and shared state as NVIDIA's "
    "container toolkit would bring the driver's (node_state.gpu_driver). Refused unless the agent runs on the "
    "simulator")


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
            help_text = f"{option.help} [env {self.env_name(option)}; default {default}]"
            if option.parse is switch:  # present is on
                parser.add_argument(flag, dest=option.name, default=None, action="store_const", const="1",
                                    help=help_text)
            else:
                parser.add_argument(flag, dest=option.name, default=None, help=help_text)

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
            if isinstance(value, list):   # a YAML/JSON list for a comma-list option
                value = ",".join(str(v) for v in value)
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
