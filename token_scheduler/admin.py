"""Admin requests: one JSON object in, one JSON object out (PROTOCOL.md, "Admin API").

Parsing and validation live here; the daemon does the work. Every failure
becomes {"ok": false, "error": "..."}; nothing a caller sends can stop the loop.
"""

from __future__ import annotations

import json
import logging
from typing import Protocol

from .policy import NORMAL, validate_priority

log = logging.getLogger("token_scheduler")

ADMIN_VERSION = 1


class AdminTarget(Protocol):
    gpu: str

    def add_tenant(
        self, name: str, request: int, limit: int, priority: str = ...
    ) -> dict[str, object]: ...
    def update_tenant(
        self, name: str, request: int | None, limit: int | None, priority: str | None = ...
    ) -> dict[str, object]: ...
    def remove_tenant(self, name: str) -> dict[str, object]: ...
    def list_tenants(self) -> list[dict[str, object]]: ...
    def stats(self) -> dict[str, object]: ...
    def charges(self, since_ns: int) -> dict[str, object]: ...


class _BadRequest(ValueError):
    pass


def _field(req: dict[str, object], key: str, kind: type, required: bool = True) -> object:
    value = req.get(key)
    if value is None:
        if required:
            raise _BadRequest(f"missing field {key!r}")
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _BadRequest(f"field {key!r} must be {kind.__name__}")
    return value


def _dispatch(target: AdminTarget, req: dict[str, object]) -> dict[str, object]:
    op = req.get("op")
    if op == "ping":
        return {"version": ADMIN_VERSION, "gpu": target.gpu}
    if op == "add":
        name = _field(req, "tenant", str)
        request = _field(req, "request", int)
        limit = _field(req, "limit", int, required=False)
        priority = _field(req, "priority", str, required=False)
        return target.add_tenant(name, request, request if limit is None else limit,  # type: ignore[arg-type]
                                 NORMAL if priority is None else validate_priority(priority))
    if op == "update":
        priority = _field(req, "priority", str, required=False)
        return target.update_tenant(
            _field(req, "tenant", str),  # type: ignore[arg-type]
            _field(req, "request", int, required=False),  # type: ignore[arg-type]
            _field(req, "limit", int, required=False),  # type: ignore[arg-type]
            None if priority is None else validate_priority(priority),
        )
    if op == "remove":
        return target.remove_tenant(_field(req, "tenant", str))  # type: ignore[arg-type]
    if op == "list":
        return {"tenants": target.list_tenants()}
    if op == "stats":
        return target.stats()
    if op == "charges":
        since = _field(req, "since_ns", int, required=False)
        return target.charges(0 if since is None else since)  # type: ignore[arg-type]
    raise _BadRequest(f"unknown op {op!r} (ping, add, update, remove, list, stats, charges)")


def handle(target: AdminTarget, frames: list[bytes]) -> bytes:
    """Answer one admin message (all frames of it); never raises."""
    try:
        if len(frames) != 1:
            raise _BadRequest("expected a single-frame JSON request")
        try:
            req = json.loads(frames[0])
        except (ValueError, UnicodeDecodeError) as exc:
            raise _BadRequest(f"not JSON: {exc}") from exc
        if not isinstance(req, dict):
            raise _BadRequest("request must be a JSON object")
        result = {"ok": True, **_dispatch(target, req)}
    except ValueError as exc:  # bad input, refused change, invalid quota
        result = {"ok": False, "error": str(exc)}
    except Exception as exc:  # a bug or a disk error: report, keep serving
        log.exception("admin request failed")
        result = {"ok": False, "error": f"internal error: {exc}"}
    return json.dumps(result).encode()
