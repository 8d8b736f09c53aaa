"""The API server side: list+watch nodes and pods into ``ClusterState``; patch and bind.

Uses the official ``kubernetes`` client, reading raw JSON (``_preload_content=False``,
kube_contract.apiclient) so pods reach ``state`` in the same camelCase shape kube-scheduler sends.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kube_contract.apiclient import api_message, read_json, watch_lines

from .extender import BindError
from .state import ClusterState

log = logging.getLogger(__name__)

PAGE_SIZE = 500


class KubeBinder:
    """Writes the decision annotation, then creates the pod's Binding."""

    def __init__(self, api: client.CoreV1Api, timeout: float = 10.0) -> None:
        self.api = api
        self.timeout = timeout

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            resp = self.api.read_namespaced_pod(name, namespace, _preload_content=False,
                                                _request_timeout=self.timeout)
        except ApiException as e:
            raise BindError(f"reading the pod: {api_message(e)}") from None
        return read_json(resp)

    def bind(self, namespace: str, name: str, uid: str, node: str,
             annotations: dict[str, str]) -> None:
        if annotations:
            # The uid makes the patch fail if the pod was deleted and re-created meanwhile.
            body = {"metadata": {"annotations": annotations} | ({"uid": uid} if uid else {})}
            try:
                self.api.patch_namespaced_pod(
                    name, namespace, body, _preload_content=False,
                    _content_type="application/merge-patch+json", _request_timeout=self.timeout)
            except ApiException as e:
                raise BindError(f"annotating the pod: {api_message(e)}") from None
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node))
        try:
            # pods/{name}/binding, as kube-scheduler itself binds. The server answers a
            # Status, which the generated V1Binding model cannot parse: keep it raw.
            self.api.create_namespaced_pod_binding(name, namespace, binding,
                                                   _preload_content=False,
                                                   _request_timeout=self.timeout)
        except ApiException as e:
            raise BindError(f"creating the binding: {api_message(e)}") from None


class Syncer:
    """Keeps ``state`` in step with the API server: list, then watch; relist on 410 Gone."""

    def __init__(self, api: client.CoreV1Api, state: ClusterState, *,
                 watch_timeout: int = 240, retry_delay: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.state = state
        self.watch_timeout = watch_timeout
        self.retry_delay = retry_delay
        self.clock = clock
        self._stop = threading.Event()
        self._synced = {"nodes": threading.Event(), "pods": threading.Event()}
        self._threads: list[threading.Thread] = []

    def ready(self) -> bool:
        return all(e.is_set() for e in self._synced.values())

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(e.wait(max(0.0, deadline - time.monotonic())) for e in self._synced.values())

    def start(self) -> None:
        for kind in self._synced:
            t = threading.Thread(target=self._run, args=(kind,), name=f"watch-{kind}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout)

    # ---- one resource kind -----------------------------------------------------

    def _list_fn(self, kind: str) -> Callable[..., Any]:
        return self.api.list_node if kind == "nodes" else self.api.list_pod_for_all_namespaces

    def _run(self, kind: str) -> None:
        while not self._stop.is_set():
            try:
                rv = self._list(kind)
                self._synced[kind].set()
                self._watch(kind, rv)  # returns when the watch must restart from a list
            except Exception as e:  # the API server may come and go; keep trying
                if self._stop.is_set():
                    return
                msg = api_message(e) if isinstance(e, ApiException) else repr(e)
                log.warning("%s list/watch failed: %s; retrying in %.0fs", kind, msg,
                            self.retry_delay)
                self._stop.wait(self.retry_delay)

    def _list(self, kind: str) -> str:
        listed_at = self.clock()
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": PAGE_SIZE, "_preload_content": False,
                                      "_request_timeout": 60}
            if token:
                kwargs["_continue"] = token
            doc = read_json(self._list_fn(kind)(**kwargs))
            items.extend(doc.get("items") or [])
            meta = doc.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        if kind == "nodes":
            self.state.replace_nodes(items)
        else:
            self.state.replace_pods(items, listed_at)
        log.info("listed %d %s", len(items), kind)
        return str(meta.get("resourceVersion") or "")

    def _watch(self, kind: str, rv: str) -> None:
        state = self.state
        while not self._stop.is_set():
            resp = self._list_fn(kind)(
                watch=True, resource_version=rv, allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout, _preload_content=False,
                _request_timeout=self.watch_timeout + 30)
            try:
                for line in watch_lines(resp):
                    event = json.loads(line)
                    kind_of, obj = event.get("type"), event.get("object") or {}
                    if kind_of == "ERROR":
                        if obj.get("code") == 410:
                            log.info("%s watch expired (410 Gone); relisting", kind)
                            return
                        raise RuntimeError(f"watch error: {obj.get('message', obj)}")
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if kind_of == "BOOKMARK":
                        continue
                    if kind == "nodes":
                        if kind_of == "DELETED":
                            state.remove_node((obj.get("metadata") or {}).get("name", ""))
                        else:
                            state.observe_node(obj)
                    elif kind_of == "DELETED":
                        state.remove_pod((obj.get("metadata") or {}).get("uid", ""))
                    else:
                        state.observe_pod(obj)
                    if self._stop.is_set():
                        return
            finally:
                raw = getattr(resp, "response", resp)
                raw.release_conn()
