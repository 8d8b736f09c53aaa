"""The webhook's HTTPS server: ``POST /mutate-pods`` (mutate.decide), a certificate that reloads in place.

Each accepted connection is wrapped with the TLS context current at that moment (`TlsContext.load`
swaps it), so a rotated certificate is served from the next connection on, without a restart.

HTTP errors (all a JSON metav1.Status with the message): 404 another path, 405 another method,
415 a Content-Type other than application/json, 411 no Content-Length, 413 a body over `MAX_BODY`,
400 a body that is no AdmissionReview with a uid (mutate.BadReview). A client that stalls is cut
off after `IO_TIMEOUT` seconds; one bad connection never stops the server.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import sys
import tempfile
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ..server import JsonHandler
from .certs import Material
from .mutate import BadReview, Notice, Rules, decide, parse

log = logging.getLogger(__name__)

PATH = "/mutate-pods"
MAX_BODY = 8 << 20   # a Pod is at most ~1.5 MiB in etcd; a review carries it (and an old one) in JSON
IO_TIMEOUT = 15.0


class TlsContext:
    """The server's current SSLContext; `load` replaces it with one for new material."""

    def __init__(self) -> None:
        self.context: ssl.SSLContext | None = None

    def load(self, material: Material) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        with tempfile.TemporaryDirectory(prefix="vcuda-webhook-") as tmp:   # load_cert_chain reads files only
            cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
            cert.write_bytes(material.cert)
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(material.key)
            context.load_cert_chain(cert, key)
        self.context = context


class WebhookServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], tls: TlsContext, rules: Rules,
                 notify: Callable[[Notice], None] = lambda n: None) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.tls = tls
        self.rules = rules
        self.notify = notify
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        context = self.tls.context
        if context is None:
            sock.close()
            raise OSError("no TLS certificate loaded yet")
        sock.settimeout(IO_TIMEOUT)
        # The handshake happens in the handler's thread (setup), not in the accept loop.
        return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        log.info("webhook connection from %s ended: %s", client_address[0] if client_address else "?", exc)


class _Handler(JsonHandler):
    server: WebhookServer

    def setup(self) -> None:
        self.request.do_handshake()
        super().setup()

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] != PATH:
            self._status(404, "NotFound", f"no such path {self.path.split('?', 1)[0]!r}; the webhook serves {PATH}")
            return
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if content_type != "application/json":
            self._status(415, "UnsupportedMediaType", f"Content-Type {content_type or 'none'!r}: send application/json")
            return
        if self.headers.get("Content-Length") is None:
            self._status(411, "LengthRequired", "send a Content-Length")
            return
        try:
            length = int(self.headers["Content-Length"])
            if length < 0:
                raise ValueError
        except ValueError:
            self._status(400, "BadRequest", f"bad Content-Length {self.headers['Content-Length']!r}")
            return
        if length > MAX_BODY:
            self._status(413, "RequestEntityTooLarge", f"a body of {length} bytes is over the limit of {MAX_BODY}")
            return
        data = self.rfile.read(length)
        try:
            verdict = decide(parse(data), self.server.rules)
        except BadReview as exc:
            self._status(400, "BadRequest", f"not an AdmissionReview this webhook can answer: {exc}")
            return
        if verdict.notice is not None and not verdict.dry_run:
            self.server.notify(verdict.notice)
        self._reply(200, verdict.review)

    def _not_allowed(self) -> None:
        self._status(405, "MethodNotAllowed", f"{self.command} is not served; POST an AdmissionReview to {PATH}")

    do_GET = do_PUT = do_PATCH = do_DELETE = _not_allowed

    def _status(self, code: int, reason: str, message: str) -> None:
        if code != 404:
            log.warning("webhook request %s %s: %d %s", self.command, self.path, code, message)
        self._reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                           "message": message, "code": code})
        self.close_connection = True   # a body left unread must not be taken for the next request
