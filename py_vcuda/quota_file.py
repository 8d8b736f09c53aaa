"""A container's quota file, "the node's word": what the node agent (device plugin, DRA driver)
writes for each container it sets up, and what libvcuda reads first inside it.

The container sees the file read-only at a fixed path (no environment override: a tenant could
point it elsewhere). When the directory is there the file is the only source of the quota, and
libvcuda ignores the ``VCUDA_*`` quota variables of the environment (IGNORED_ENV); a missing or
corrupt file fails closed. libvcuda parses the format itself (libvcuda/src/quota_file.c); this
module renders it (node side) and parses it strictly (``vcuda doctor``, tests).

Format, version 1 (text, UTF-8, one ``key=value`` a line; ``#`` comment lines and blank lines
ignored; an unknown key, a repeated scalar key, a bad value, a missing required key or no
``end`` line is corrupt): EXAMPLE below has every key, in the order `render` writes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

VERSION = 1
CONTAINER_QUOTA_DIR = Path("/run/vcuda-quota")
QUOTA_FILE = "quota.conf"
CONTAINER_QUOTA_FILE = CONTAINER_QUOTA_DIR / QUOTA_FILE
MAX_GPUS = 16
PRIORITIES = ("high", "normal")
ON_SCHEDULER_LOSS = ("block", "run")
DEFAULT_SCHEDULER_TIMEOUT_MS = 5000
HEADER = "# vcuda quota of this container: written by the node agent, read-only here"
EXAMPLE = f"""{HEADER}
version=1
ledger=/run/vcuda/ledger
core_request=30
core_limit=60
priority=normal
scheduler_timeout_ms=5000
on_scheduler_loss=block
gpu=GPU-5157a0c0-0000-4000-8000-000000000000 memory=1073741824 scheduler=ipc:///run/vcuda/sched/sched.sock
gpu=GPU-5157a0c0-0001-4000-8000-000000000001 memory=unlimited scheduler=
end
"""

# The environment variables libvcuda ignores when the file is there (with one warning naming those set).
IGNORED_ENV = ("VCUDA_MEMORY_LIMIT", "VCUDA_CORE_REQUEST", "VCUDA_CORE_LIMIT", "VCUDA_SCHEDULER", "VCUDA_LEDGER",
               "VCUDA_DISABLE", "VCUDA_SCHEDULER_TIMEOUT_MS", "VCUDA_ON_SCHEDULER_LOSS")
_INDEXED_ENV = re.compile(r"^(VCUDA_MEMORY_LIMIT|VCUDA_SCHEDULER)_\d+$")
_GPU_LINE = re.compile(r"^(\S+) memory=(\S+) scheduler=(\S*)$")
_SCALARS = ("version", "ledger", "core_request", "core_limit", "priority", "scheduler_timeout_ms",
            "on_scheduler_loss")
_REQUIRED = ("ledger", "core_request", "core_limit", "priority")


class QuotaFileError(ValueError):
    """A quota file that cannot be used; the message names the file, the line and the reason."""


@dataclass(frozen=True)
class GPUQuota:
    uuid: str                   # GPU-... or MIG-...
    memory: int | None          # bytes; None: unlimited
    scheduler: str = ""         # the tenant's endpoint (a container path); "": not time-limited


@dataclass(frozen=True)
class QuotaFile:
    ledger: str                 # the container path of its ledger
    core_request: int
    core_limit: int
    priority: str
    gpus: tuple[GPUQuota, ...]
    scheduler_timeout_ms: int = DEFAULT_SCHEDULER_TIMEOUT_MS
    on_scheduler_loss: str = "block"

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem:
            raise QuotaFileError(f"quota not representable: {problem}")

    def gpu(self, uuid: str) -> GPUQuota | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def render(self) -> str:
        return render(self)


def _problem(q: QuotaFile) -> str:
    """What makes `q` invalid, or ''."""
    if not q.ledger.startswith("/") or any(c.isspace() for c in q.ledger):
        return f"ledger {q.ledger!r} must be an absolute path without spaces"
    if not 1 <= q.core_request <= 100:
        return f"core_request {q.core_request} must be 1-100"
    if not q.core_request <= q.core_limit <= 100:
        return f"core_limit {q.core_limit} must be between core_request ({q.core_request}) and 100"
    if q.priority not in PRIORITIES:
        return f"priority {q.priority!r} must be one of {', '.join(PRIORITIES)}"
    if q.scheduler_timeout_ms < 0:
        return f"scheduler_timeout_ms {q.scheduler_timeout_ms} must be >= 0"
    if q.on_scheduler_loss not in ON_SCHEDULER_LOSS:
        return f"on_scheduler_loss {q.on_scheduler_loss!r} must be one of {', '.join(ON_SCHEDULER_LOSS)}"
    if not 1 <= len(q.gpus) <= MAX_GPUS:
        return f"{len(q.gpus)} GPUs; a quota names 1-{MAX_GPUS}"
    for g in q.gpus:
        if not g.uuid.startswith(("GPU-", "MIG-")) or any(c.isspace() for c in g.uuid):
            return f"{g.uuid!r} is not a GPU or MIG UUID"
        if g.memory is not None and g.memory < 0:
            return f"memory {g.memory} of {g.uuid} must be >= 0"
        if any(c.isspace() for c in g.scheduler):
            return f"scheduler {g.scheduler!r} of {g.uuid} has a space"
    if len({g.uuid for g in q.gpus}) != len(q.gpus):
        return "a GPU is named twice"
    return ""


def render(q: QuotaFile) -> str:
    lines = [HEADER, f"version={VERSION}", f"ledger={q.ledger}", f"core_request={q.core_request}",
             f"core_limit={q.core_limit}", f"priority={q.priority}",
             f"scheduler_timeout_ms={q.scheduler_timeout_ms}", f"on_scheduler_loss={q.on_scheduler_loss}"]
    lines += [f"gpu={g.uuid} memory={'unlimited' if g.memory is None else g.memory} scheduler={g.scheduler}"
              for g in q.gpus]
    lines.append("end")
    return "\n".join(lines) + "\n"


def _int(value: str, key: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{key}={value!r} is not a non-negative integer")
    return int(value)


def parse(text: str, source: str = str(CONTAINER_QUOTA_FILE)) -> QuotaFile:
    """The quota in `text`; QuotaFileError (naming `source`) when it is corrupt in any way."""
    scalars: dict[str, str] = {}
    gpus: list[GPUQuota] = []
    ended = False
    seen_key = False
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{source}: line {number}"
        if ended:
            raise QuotaFileError(f"{where}: {line!r} after 'end'")
        if line == "end":
            ended = True
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise QuotaFileError(f"{where}: {line!r} is not key=value")
        if not seen_key and key != "version":
            raise QuotaFileError(f"{where}: the first key must be version, got {key!r}")
        seen_key = True
        if key == "gpu":
            m = _GPU_LINE.match(value)
            if m is None:
                raise QuotaFileError(f"{where}: gpu={value!r} must be '<uuid> memory=<bytes|unlimited> "
                                     "scheduler=<endpoint or empty>'")
            uuid, memory, scheduler = m.groups()
            if memory != "unlimited" and not memory.isdigit():
                raise QuotaFileError(f"{where}: memory={memory!r} is neither a number of bytes nor 'unlimited'")
            gpus.append(GPUQuota(uuid, None if memory == "unlimited" else int(memory), scheduler))
            continue
        if key not in _SCALARS:
            raise QuotaFileError(f"{where}: unknown key {key!r}")
        if key in scalars:
            raise QuotaFileError(f"{where}: {key} given twice")
        if key == "version" and value != str(VERSION):
            raise QuotaFileError(f"{where}: version {value}, this vcuda reads {VERSION}")
        scalars[key] = value
    if not seen_key:
        raise QuotaFileError(f"{source}: empty (no version line)")
    if not ended:
        raise QuotaFileError(f"{source}: no 'end' line (truncated)")
    missing = [k for k in _REQUIRED if k not in scalars]
    if missing:
        raise QuotaFileError(f"{source}: missing {', '.join(missing)}")
    if not gpus:
        raise QuotaFileError(f"{source}: no gpu line")
    try:
        return QuotaFile(
            ledger=scalars["ledger"], core_request=_int(scalars["core_request"], "core_request"),
            core_limit=_int(scalars["core_limit"], "core_limit"), priority=scalars["priority"],
            gpus=tuple(gpus),
            scheduler_timeout_ms=_int(scalars.get("scheduler_timeout_ms", str(DEFAULT_SCHEDULER_TIMEOUT_MS)),
                                      "scheduler_timeout_ms"),
            on_scheduler_loss=scalars.get("on_scheduler_loss", "block"))
    except (ValueError, QuotaFileError) as exc:
        text = str(exc).removeprefix("quota not representable: ")
        raise QuotaFileError(f"{source}: {text}") from None


def read(path: Path = CONTAINER_QUOTA_FILE) -> QuotaFile:
    """The quota file at `path`; QuotaFileError when it cannot be read or is corrupt."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise QuotaFileError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    return parse(text, str(path))


def bare_metal_env(q: QuotaFile) -> dict[str, str]:
    """The environment that holds a process to `q` without the file (bare metal, as `vcuda run` sets it):
    the file's i-th GPU is the process's visible device i (``VCUDA_MEMORY_LIMIT_<i>``,
    ``VCUDA_SCHEDULER_<i>``; one unindexed variable when every GPU has the same value). The file's
    paths are as written (container paths). What the environment cannot say: other GPUs are not refused."""
    env = {"VCUDA_LEDGER": q.ledger, "VCUDA_CORE_REQUEST": str(q.core_request),
           "VCUDA_CORE_LIMIT": str(q.core_limit), "VCUDA_SCHEDULER_TIMEOUT_MS": str(q.scheduler_timeout_ms),
           "VCUDA_ON_SCHEDULER_LOSS": q.on_scheduler_loss}
    for name, values in (("VCUDA_MEMORY_LIMIT", [None if g.memory is None else str(g.memory) for g in q.gpus]),
                         ("VCUDA_SCHEDULER", [g.scheduler or None for g in q.gpus])):
        if len(set(values)) == 1:
            if values[0] is not None:
                env[name] = values[0]
            continue
        env.update((f"{name}_{i}", v) for i, v in enumerate(values) if v is not None)
    return env


def ignored_env(env: Mapping[str, str]) -> list[str]:
    """The variables set in `env` that libvcuda ignores when the quota file is there."""
    return sorted(k for k in env if k in IGNORED_ENV or _INDEXED_ENV.match(k))
