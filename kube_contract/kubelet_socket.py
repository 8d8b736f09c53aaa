"""gRPC servers on the unix sockets the kubelet dials (device plugins, DRA plugins, plugin
registration). The kubelet wipes or replaces those files (a kubelet restart clears the
device-plugins directory, an operator may clean a plugin directory), and a socket file that is
gone or replaced means nobody can reach the server any more: `intact()` tells, `serve()` again."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

log = logging.getLogger(__name__)


def socket_identity(path: Path) -> tuple[int, int, int] | None:
    """(device, inode, change time) of a socket file; a re-created socket has a new one (its inode
    number may be the freed one's, its change time is not). None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class UnixGrpcServer:
    """A gRPC server on one socket file; `add` puts the services on each new server."""

    def __init__(self, path: Path, add: Callable[[grpc.Server], None], what: str, *,
                 thread_prefix: str = "grpc") -> None:
        self.path = path
        self.add = add
        self.what = what
        self.thread_prefix = thread_prefix
        self._server: grpc.Server | None = None
        self._served: tuple[int, int, int] | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    def serve(self) -> None:
        """(Re)start serving on a fresh socket file."""
        self.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix=self.thread_prefix))
        self.add(server)
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._server = server
        self._served = socket_identity(self.path)
        log.info("serving %s on %s", self.what, self.path)

    def intact(self) -> bool:
        """Serving, and the socket file is still the one it serves on."""
        return self._server is not None and socket_identity(self.path) == self._served

    def stop(self, grace: float = 0.5) -> None:
        if self._server is not None:
            self._server.stop(grace=grace).wait()
            self._server = None
            if socket_identity(self.path) == self._served:   # not a newer server's file
                self.path.unlink(missing_ok=True)
