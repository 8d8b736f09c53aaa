"""Fixtures: a running extender HTTP server and a fake API server on 127.0.0.1
(kube_contract.testing.FakeApiServer)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kube_contract.testing import FakeApiServer

Post = Callable[[str, Any], tuple[int, Any]]


def post_json(base: str, path: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    yield server
    server.close()


@pytest.fixture
def post() -> Callable[[str], Post]:
    """post(base)(path, body) -> (status, json)."""
    return lambda base: (lambda path, body: post_json(base, path, body))
