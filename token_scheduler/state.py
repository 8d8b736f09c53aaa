"""The tenant list on disk, so a restarted daemon enforces the same quotas.

Written atomically (temp file, fsync, rename, fsync of the directory): a
crash leaves either the old or the new list, never a torn one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from py_vcuda.files import write_atomic

from .policy import NORMAL, validate_priority

STATE_FILE = "tenants.json"
FORMAT = 1


@dataclass(frozen=True)
class TenantSpec:
    name: str
    request: int
    limit: int
    priority: str = NORMAL


class StateError(Exception):
    """The state file exists but cannot be trusted; the daemon refuses to guess."""


def save(directory: Path, gpu: str, tenants: list[TenantSpec]) -> None:
    doc = {
        "format": FORMAT,
        "gpu": gpu,
        "tenants": [{"name": t.name, "request": t.request, "limit": t.limit,
                     "priority": t.priority} for t in tenants],
    }
    write_atomic(directory / STATE_FILE, json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n", 0o600)


def load(directory: Path, gpu: str) -> list[TenantSpec]:
    """Tenants saved by a previous run for this GPU; [] when there is no file."""
    path = directory / STATE_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        doc = json.loads(raw)
        if doc.get("format") != FORMAT:
            raise StateError(f"{path}: unknown format {doc.get('format')!r}")
        if doc.get("gpu") != gpu:
            raise StateError(f"{path} belongs to GPU {doc.get('gpu')!r}, not {gpu!r}")
        # `priority` came later within format 1: a list without it is all `normal`.
        return [TenantSpec(str(t["name"]), int(t["request"]), int(t["limit"]),
                           validate_priority(t.get("priority", NORMAL)))
                for t in doc["tenants"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StateError(f"{path}: unreadable tenant list: {exc}") from exc
