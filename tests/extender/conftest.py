"""Fixtures: a running extender HTTP server and a fake API server on 127.0.0.1."""

from __future__ import annotations

import copy
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

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


class FakeApiServer:
    """Just enough of the Kubernetes API for list/watch nodes and pods, get/patch pod, bind.

    Watches stream newline-delimited events and end after ``timeoutSeconds`` (capped),
    like the real server. ``fail_bind`` / ``fail_patch`` inject errors; ``gone`` makes the
    next watch answer 410 Gone.
    """

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.rv = 100
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"nodes": {}, "pods": {}}
        self.events: dict[str, list[tuple[int, str, dict[str, Any]]]] = {"nodes": [], "pods": []}
        self.requests: list[tuple[str, str, Any]] = []
        self.fail_bind: str | None = None
        self.fail_patch: str | None = None
        self.gone = 0
        self.max_watch = 2.0
        self.closed = False
        handler = type("H", (_ApiHandler,), {"api": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.lock.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    @staticmethod
    def key(kind: str, obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        return meta["name"] if kind == "nodes" else f"{meta['namespace']}/{meta['name']}"

    def put(self, kind: str, obj: dict[str, Any], event: str | None = None) -> dict[str, Any]:
        with self.lock:
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            key = self.key(kind, obj)
            kind_of = event or ("MODIFIED" if key in self.objects[kind] else "ADDED")
            self.objects[kind][key] = obj
            self.events[kind].append((self.rv, kind_of, copy.deepcopy(obj)))
            self.lock.notify_all()
            return obj

    def delete(self, kind: str, key: str) -> None:
        with self.lock:
            obj = self.objects[kind].pop(key)
            self.rv += 1
            self.events[kind].append((self.rv, "DELETED", obj))
            self.lock.notify_all()

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return copy.deepcopy(self.objects["pods"].get(f"{namespace}/{name}"))


class _ApiHandler(BaseHTTPRequestHandler):
    api: FakeApiServer
    protocol_version = "HTTP/1.1"  # watches stream chunked, like the real API server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "message": message, "reason": reason, "code": code})

    def _body(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def do_GET(self) -> None:  # noqa: N802
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        api = self.api
        api.requests.append(("GET", self.path, None))
        if url.path in ("/api/v1/nodes", "/api/v1/pods"):
            kind = parts[-1]
            if query.get("watch") == "true":
                self._watch(kind, int(query.get("resourceVersion") or 0),
                            float(query.get("timeoutSeconds") or 1))
                return
            with api.lock:
                items = [copy.deepcopy(o) for o in api.objects[kind].values()]
                rv = api.rv
            self._send(200, {"kind": "NodeList" if kind == "nodes" else "PodList",
                             "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)},
                             "items": items})
            return
        if len(parts) == 6 and parts[4] == "pods":
            pod = api.pod(parts[3], parts[5])
            if pod is None:
                self._status(404, "NotFound", f'pods "{parts[5]}" not found')
            else:
                self._send(200, pod)
            return
        self._status(404, "NotFound", "no route")

    def _watch(self, kind: str, since: int, timeout: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def chunk(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            self._stream(kind, since, timeout, chunk)
        finally:
            chunk(b"")

    def _stream(self, kind: str, since: int, timeout: float,
                chunk: Callable[[bytes], None]) -> None:
        api = self.api
        if api.gone:
            api.gone -= 1
            line = {"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                                "reason": "Expired", "message": "too old"}}
            chunk(json.dumps(line).encode() + b"\n")
            return
        deadline = time.monotonic() + min(timeout, api.max_watch)
        sent = since
        while True:
            with api.lock:
                pending = [e for e in api.events[kind] if e[0] > sent]
                if not pending:
                    left = deadline - time.monotonic()
                    if left <= 0 or api.closed:
                        return
                    api.lock.wait(left)
                    continue
            for rv, kind_of, obj in pending:
                chunk(json.dumps({"type": kind_of, "object": obj}).encode() + b"\n")
                sent = rv

    def do_PATCH(self) -> None:  # noqa: N802
        parts = urlparse(self.path).path.strip("/").split("/")
        body = self._body()
        api = self.api
        api.requests.append(("PATCH", self.path, (self.headers["Content-Type"], body)))
        if self.headers["Content-Type"] != "application/merge-patch+json":
            self._status(415, "UnsupportedMediaType", self.headers["Content-Type"])
            return
        if api.fail_patch:
            self._status(409, "Conflict", api.fail_patch)
            return
        pod = api.pod(parts[3], parts[5])
        if pod is None:
            self._status(404, "NotFound", f'pods "{parts[5]}" not found')
            return
        meta = body.get("metadata", {})
        if meta.get("uid") and meta["uid"] != pod["metadata"]["uid"]:
            self._status(409, "Conflict", "Precondition failed: UID mismatch")
            return
        pod["metadata"].setdefault("annotations", {}).update(meta.get("annotations", {}))
        self._send(200, api.put("pods", pod))

    def do_POST(self) -> None:  # noqa: N802
        parts = urlparse(self.path).path.strip("/").split("/")
        body = self._body()
        api = self.api
        api.requests.append(("POST", self.path, body))
        if len(parts) == 7 and parts[6] == "binding":
            if api.fail_bind:
                self._status(500, "InternalError", api.fail_bind)
                return
            pod = api.pod(parts[3], parts[5])
            if pod is None:
                self._status(404, "NotFound", f'pods "{parts[5]}" not found')
                return
            if pod["spec"].get("nodeName"):
                self._status(409, "Conflict", f"pod {parts[5]} is already assigned")
                return
            pod["spec"]["nodeName"] = body["target"]["name"]
            api.put("pods", pod)
            self._send(201, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                             "code": 201})
            return
        self._status(404, "NotFound", "no route")


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    yield server
    server.close()


@pytest.fixture
def post() -> Callable[[str], Post]:
    """post(base)(path, body) -> (status, json)."""
    return lambda base: (lambda path, body: post_json(base, path, body))
