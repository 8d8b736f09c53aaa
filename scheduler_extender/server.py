"""HTTP transport for the extender: POST <prefix>/filter|prioritize|bind, GET /healthz|/readyz."""

from __future__ import annotations

import gc
import json
import logging
import socket
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .extender import Extender

log = logging.getLogger(__name__)

MAX_BODY = 64 << 20  # a NodeList of 5000 full nodes is a few tens of MiB


def tune_gc() -> None:
    """Keep the collector off the hot path once the node map is loaded.

    A filter over thousands of nodes allocates a result per node; with default
    thresholds that triggers collections that rescan the whole (long-lived) GPU
    map, which is what pushed p99 up in the benchmark. Freeze what exists now and
    collect young objects less often.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 1000)


def parse_listen(addr: str, flag: str = "--listen") -> tuple[str, int]:
    """``:8888``, ``0.0.0.0:8888``, ``[::]:8888`` or ``8888`` -> (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep:
        host, port = "", addr
    host = host.strip("[]") or "0.0.0.0"
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"{flag} {addr!r}: port {port!r} is not a number") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"{flag} {addr!r}: port {number} is out of range")
    return host, number


class ExtenderServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], extender: Extender,
                 ready: Callable[[], bool] = lambda: True) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.extender = extender
        self.ready = ready
        super().__init__(address, _Handler)


class JsonHandler(BaseHTTPRequestHandler):
    """JSON replies on kept-alive HTTP/1.1 connections (kube-scheduler and the API server keep them
    open); request lines logged at debug level only. The extender's and the webhook's handlers."""

    protocol_version = "HTTP/1.1"

    def _reply(self, code: int, payload: Any) -> None:
        data = json.dumps(payload, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("%s " + format, self.address_string(), *args)


class _Handler(JsonHandler):
    server: ExtenderServer

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        verb = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        handlers: dict[str, Callable[[dict[str, Any]], Any]] = {
            "filter": self.server.extender.filter,
            "prioritize": self.server.extender.prioritize,
            "bind": self.server.extender.bind,
        }
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._reply(413, {"Error": f"request body of {length} bytes is too large"})
            return
        body = self.rfile.read(length)
        handler = handlers.get(verb)
        if handler is None:
            self._reply(404, {"Error": f"unknown verb {verb!r}; use filter, prioritize or bind"})
            return
        try:
            args = json.loads(body)
            if not isinstance(args, dict):
                raise ValueError("expected a JSON object")
        except ValueError as e:
            self._reply(400, {"Error": f"bad {verb} request: {e}"})
            return
        try:
            self._reply(200, handler(args))
        except Exception as e:  # keep serving; the scheduler retries the pod
            log.exception("%s failed", verb)
            self._reply(500, {"Error": f"{verb}: internal error: {e}"})

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._reply(200, {"status": "ok"})
        elif path == "/readyz":
            ok = self.server.ready()
            self._reply(200 if ok else 503, {"status": "ok" if ok else "syncing"})
        else:
            self._reply(404, {"Error": "not found"})
