"""The Kubernetes API server through the official ``kubernetes`` client, as every part uses it.

Parts read raw JSON (``_preload_content=False``) so objects keep the camelCase
shape the API server sends (and kube-scheduler forwards); these helpers read a
response and a watch stream that way, build a client, and shorten an error.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
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


log = logging.getLogger(__name__)


class ListWatch:
    """List, then watch from that resourceVersion; relist on 410 Gone or any error, in a thread.

    ``list_call(**kw)`` is a kubernetes client list method with its selectors bound (for example
    ``functools.partial(api.list_node, field_selector="metadata.name=n1")``). ``on_list(items)``
    gets every (re)list's objects, ``on_event(type, object)`` every watch event but bookmarks.
    """

    def __init__(self, list_call: Callable[..., Any], name: str, *,
                 on_event: Callable[[str, dict[str, Any]], None],
                 on_list: Callable[[list[dict[str, Any]]], None] | None = None,
                 watch_timeout: int = 240, retry_s: float = 2.0) -> None:
        self.list_call = list_call
        self.name = name
        self.on_event = on_event
        self.on_list = on_list
        self.watch_timeout = watch_timeout
        self.retry_s = retry_s
        self.events = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                doc = read_json(self.list_call(_preload_content=False, _request_timeout=60))
                if self.on_list is not None:
                    self.on_list(list(doc.get("items") or []))
                rv = str((doc.get("metadata") or {}).get("resourceVersion") or "")
                while not self._stop.is_set():
                    rv = self._watch(rv)
            except Exception as exc:  # the API server may come and go; relist when it is back
                if self._stop.is_set():
                    return
                log.warning("%s: %s; relisting in %.0f s", self.name, exc, self.retry_s)
                self._stop.wait(self.retry_s)

    def _watch(self, rv: str) -> str:
        resp = self.list_call(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                              timeout_seconds=self.watch_timeout, _preload_content=False,
                              _request_timeout=self.watch_timeout + 30)
        try:
            for line in watch_lines(resp):
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise RuntimeError(f"watch error: {obj.get('message', obj)}")
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if event.get("type") != "BOOKMARK":
                    self.events += 1
                    self.on_event(str(event.get("type")), obj)
                if self._stop.is_set():
                    break
        finally:
            getattr(resp, "response", resp).release_conn()
        return rv


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
