"""Keep helper processes alive: one token scheduler (vgpu) or MPS control daemon
(mps) per GPU. A child that dies is started again, with a growing pause so a
child that cannot start does not spin; `after_start` re-applies state (tenants)
each time. Everything stops on shutdown.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Protocol

log = logging.getLogger(__name__)


class Child(Protocol):
    name: str

    def start(self) -> None:
        """Start and wait until usable; raise (OSError, TimeoutError, ...) when it cannot."""
        ...

    def alive(self) -> bool: ...
    def stop(self) -> None: ...
    def after_start(self) -> None: ...


class Supervisor:
    def __init__(self, children: Sequence[Child], *, poll_s: float = 0.5, max_backoff_s: float = 30.0) -> None:
        self.children = list(children)
        self.poll_s = poll_s
        self.max_backoff_s = max_backoff_s
        self.restarts: dict[str, int] = {c.name: 0 for c in self.children}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()   # a child is never started twice at once

    def start(self) -> None:
        """Start every child (failures are retried by the watch thread), then watch."""
        for child in self.children:
            self._start(child)
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)
        self._thread.start()

    def _start(self, child: Child) -> bool:
        with self._lock:
            try:
                child.start()
                child.after_start()
                return True
            except Exception as exc:   # whatever one child raises, the others and later retries go on
                expected = isinstance(exc, (OSError, TimeoutError))   # anything else is a bug: keep its trace
                log.error("%s did not start: %s", child.name, exc, exc_info=not expected)
                return False

    def _loop(self) -> None:
        backoff = {c.name: self.poll_s for c in self.children}
        due = {c.name: 0.0 for c in self.children}
        while not self._stop.wait(self.poll_s):
            for child in self.children:
                try:
                    if self._stop.is_set() or child.alive() or time.monotonic() < due[child.name]:
                        continue
                except Exception:   # one child's check failing must not end the watch over all
                    log.exception("checking %s", child.name)
                    continue
                log.warning("%s is not running: restarting", child.name)
                self.restarts[child.name] += 1
                if self._start(child):
                    backoff[child.name] = self.poll_s
                else:
                    backoff[child.name] = min(backoff[child.name] * 2, self.max_backoff_s)
                    due[child.name] = time.monotonic() + backoff[child.name]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for child in self.children:
            try:
                child.stop()
            except Exception as exc:   # stop the others all the same
                log.warning("stopping %s: %s", child.name, exc)
