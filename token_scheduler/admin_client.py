"""Client of a token scheduler's admin socket (JSON over ZeroMQ REQ), used by
`vcuda run` to register tenants and by tests."""

from __future__ import annotations

import json
import time
from pathlib import Path

import zmq


class AdminClient:
    """REQ client of the admin socket; each call has a timeout and never hangs."""

    def __init__(self, path: Path | str, context: zmq.Context | None = None) -> None:
        self.endpoint = f"ipc://{path}"
        self.context = context or zmq.Context.instance()
        self.sock = self._open()

    def _open(self) -> zmq.Socket:
        sock = self.context.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        return sock

    def close(self) -> None:
        self.sock.close(0)

    def call(self, op: str, timeout_s: float = 5.0, **fields: object) -> dict[str, object]:
        self.sock.send(json.dumps({"op": op, **fields}).encode())
        if not self.sock.poll(int(timeout_s * 1000)):
            self.sock.close(0)  # a REQ that missed its reply is stuck: start over
            self.sock = self._open()
            raise TimeoutError(f"admin {op}: no reply within {timeout_s} s")
        return json.loads(self.sock.recv())

    def wait_ready(self, timeout_s: float = 10.0) -> dict[str, object]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.call("ping", timeout_s=0.2)
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
