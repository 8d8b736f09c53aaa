"""A node daemon's life (the device plugin's agent, the DRA driver): logging, NVML and its
XID health monitor, the agent its command wires, running until SIGTERM or SIGINT."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # NVML loads with `serve`, not when a command only builds its parser
    from node_state.health import HealthFactory
    from py_vcuda.nvml import NVML

log = logging.getLogger(__name__)

SIGNAL_POLL_S = 0.5   # the longest a stop signal waits to be seen


class StartError(RuntimeError):
    """The daemon cannot run with this configuration on this node; the message says why."""


class Daemon(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


def serve(prog: str, logger: str, log_level: str, ignored_xids: str | None,
          build: Callable[[NVML, HealthFactory | None], Daemon]) -> int:
    """A node daemon's life (the device plugin's agent, the DRA driver): logging, NVML and its XID
    health monitor, the agent `build` wires (StartError: a message and exit status 2), until SIGTERM."""
    from node_state.health import nvml_health
    from py_vcuda.nvml import NVML, NVMLUnavailable

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format=f"{logger}: %(levelname)s %(name)s: %(message)s")
    try:
        nvml = NVML()
    except NVMLUnavailable as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    stopping = threading.Event()

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        health = None
        try:
            health = nvml_health(nvml, ignored_xids)
        except ImportError as exc:
            log.warning("GPU health monitoring unavailable: %s", exc)
        agent = build(nvml, health)
    except (StartError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        nvml.close()
        return 2
    agent.start()
    try:
        # In slices: the kernel may hand SIGTERM to any thread, and then Python runs the handler only
        # once the main thread runs bytecode again; an unbounded wait would never see it.
        while not stopping.wait(SIGNAL_POLL_S):
            pass
    finally:
        agent.stop()
        nvml.close()
    log.info("stopped")
    return 0
