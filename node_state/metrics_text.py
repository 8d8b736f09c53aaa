"""Prometheus text format (0.0.4) for the exporter's metric families, and the HTTP server for it.

prometheus_client's generate_latest escapes and validates every label of every
sample; with 8 GPUs x 16 tenants that is ~20k labels and most of a scrape's
CPU. Our families share one label set per container, so each distinct set is
rendered once. The output is byte-for-byte what generate_latest gives for these
families (tests/monitoring checks it), served by prometheus_client's threading
WSGI server, gzip-compressed when the scraper accepts it (Prometheus does): the
text of 8 GPUs x 16 tenants is ~600 KiB and compresses to a few percent of it.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import CONTENT_TYPE_LATEST, ThreadingWSGIServer, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

_TYPES = {"counter", "gauge", "histogram"}
# Metrics text is repetitive: level 1 already shrinks it ~30x (bench/exporter_bench.py), for far less CPU than 9.
GZIP_LEVEL = 1


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render(metrics: Iterable[Metric]) -> bytes:
    """The text exposition of gauge, counter and histogram families (no timestamps, no _created)."""
    out: list[str] = []
    label_text: dict[tuple[tuple[str, str], ...], str] = {}
    for metric in metrics:
        if metric.type not in _TYPES:
            raise ValueError(f"{metric.name}: type {metric.type} is not rendered here")
        name = metric.name + "_total" if metric.type == "counter" else metric.name
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {metric.type}\n")
        for sample in metric.samples:
            key = tuple(sorted(sample.labels.items()))
            labels = label_text.get(key)
            if labels is None:
                labels = "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in key) + "}" if key else ""
                label_text[key] = labels
            out.append(f"{sample.name}{labels} {floatToGoString(sample.value)}\n")
    return "".join(out).encode()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        """Scrapes are not worth a log line each."""


def serve(addr: str, port: int, body: Callable[[], bytes],
          unready: Callable[[], str | None] | None = None) -> tuple[ThreadingWSGIServer, threading.Thread]:
    """Serve `body()` as text-format metrics on every path, in a daemon thread; with `unready`, `/readyz`
    answers 200 "ok" when it returns None and 503 with its reason otherwise (a readiness probe)."""

    def app(environ: dict, start_response: Callable) -> list[bytes]:  # type: ignore[type-arg]
        if unready is not None and environ.get("PATH_INFO") == "/readyz":
            why = unready()
            text = b"ok\n" if why is None else f"not ready: {why}\n".encode()
            start_response("200 OK" if why is None else "503 Service Unavailable",
                           [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(text)))])
            return [text]
        data = body()
        headers = [("Content-Type", CONTENT_TYPE_LATEST)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            data = gzip.compress(data, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(data))))
        start_response("200 OK", headers)
        return [data]

    server = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="vcuda-metrics", daemon=True)
    thread.start()
    return server, thread
