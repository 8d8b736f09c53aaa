"""Checks a Kubernetes object against the API schema, as the kubernetes client's models carry it."""

from __future__ import annotations

from typing import Any


def schema_problem(doc: dict[str, Any]) -> str | None:
    """None if `doc` fits its kind's schema, else what differs.

    Through the kubernetes client's models and back: a misspelt or misplaced field is dropped on
    the way in (so the round trip differs), a missing required one raises."""
    from kubernetes.client import ApiClient

    api = ApiClient()
    try:
        obj = api._ApiClient__deserialize(doc, f"V1{doc['kind']}")  # the client's own loader
    except (ValueError, AttributeError) as exc:
        return f"{doc['kind']}: {exc}"
    back = api.sanitize_for_serialization(obj)
    return None if back == doc else f"{doc['kind']} {doc['metadata'].get('name')}: round trip differs"
