"""The Kubernetes API server through the official ``kubernetes`` client, as every part uses it.

Parts read raw JSON (``_preload_content=False``) so objects keep the camelCase
shape the API server sends (and kube-scheduler forwards); these helpers read a
response and a watch stream that way, build a client, and shorten an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException


def api_message(e: ApiException) -> str:
    """The API server's own message ("pods \\"x\\" not found"), not the whole HTTP dump."""
    try:
        return f"{e.status} {json.loads(e.body)['message']}"
    except (TypeError, ValueError, KeyError):
        return f"{e.status} {e.reason}"


def read_json(resp: Any) -> Any:
    """The JSON body of a response requested with ``_preload_content=False``."""
    raw = getattr(resp, "response", resp)  # RESTResponse wraps urllib3's response
    return json.loads(raw.data)


def watch_lines(resp: Any) -> Iterator[bytes]:
    """The non-empty lines (one event each) of a watch response, as they arrive."""
    raw = getattr(resp, "response", resp)
    if not getattr(raw, "chunked", False):  # the API server streams chunked; be safe anyway
        yield from (line for line in iter(raw.readline, b"") if line.strip())
        return
    buf = b""
    for chunk in raw.stream(None, decode_content=True):  # one chunk per event, as it comes
        buf += chunk
        *lines, buf = buf.split(b"\n")
        yield from (line for line in lines if line.strip())
    if buf.strip():
        yield buf


def make_api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """In-cluster service account, else the kubeconfig (explicit or default)."""
    from kubernetes import config

    if kubeconfig is None:
        try:
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(cfg)
        except config.ConfigException:
            pass
    return config.new_client_from_config(config_file=kubeconfig, context=context)
