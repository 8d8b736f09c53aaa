"""GPU health from NVML: critical XID events and a probe that notices a GPU fallen off the bus.

A GPU turns unhealthy on a critical XID that is not an application error
(`DEFAULT_IGNORED_XIDS`, the list NVIDIA's k8s-device-plugin skips) or when
its probe fails (NVML says the GPU is lost). It turns healthy again once its
probe passes and no critical XID has arrived for ``recover_after_s``: most
critical XIDs are cleared by a GPU reset or a driver reload, which nobody
announces, so time without new errors is the evidence that the GPU is back.

One thread waits on the XID event set for ``poll_ms`` at a time, then probes
each GPU; ``stop()`` returns within about one ``poll_ms``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from node_state.gpus import Inventory
from py_vcuda.nvml import NVML, GPUInfo, XidWatch

log = logging.getLogger(__name__)

# NVIDIA/k8s-device-plugin (internal/rm/health.go): application errors, the GPU is still fine.
DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({
    13,   # Graphics Engine Exception
    31,   # GPU memory page fault
    43,   # GPU stopped processing
    45,   # Preemptive cleanup, due to previous errors
    68,   # Video processor exception
    109,  # Context Switch Timeout Error
})

OnChange = Callable[[str, bool, str], None]
HealthFactory = Callable[[Inventory, OnChange], Any]   # -> an object with start()/stop(), e.g. a HealthMonitor


def parse_xid_list(text: str) -> frozenset[int]:
    """'13,31, 43' -> {13, 31, 43}; empty text -> {}. ValueError names the bad entry."""
    xids: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.isdigit():
            raise ValueError(f"XID list {text!r}: {item!r} is not a non-negative integer "
                             "(write XIDs as numbers separated by commas, like 13,31,43)")
        xids.add(int(item))
    return frozenset(xids)


@dataclass
class _GPUState:
    info: GPUInfo
    healthy: bool = True
    reason: str = ""
    last_xid_at: float | None = None  # monotonic time of the last critical XID


class HealthMonitor:
    """Watches GPUs' health and calls ``on_change(uuid, healthy, reason)`` on every
    transition, from its own thread."""

    def __init__(self, nvml: NVML, gpus: Sequence[GPUInfo], on_change: OnChange, *,
                 ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS,
                 recover_after_s: float = 30.0, poll_ms: int = 1000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if poll_ms <= 0:
            raise ValueError(f"poll_ms must be positive, not {poll_ms}")
        self._nvml = nvml
        self._on_change = on_change
        self._ignored = ignored_xids
        self._recover_after = recover_after_s
        self._poll_ms = poll_ms
        self._clock = clock
        self._gpus = {g.uuid: _GPUState(g) for g in gpus}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def ignored_xids(self) -> frozenset[int]:
        return self._ignored

    def healthy(self, uuid: str) -> bool:
        with self._lock:
            state = self._gpus.get(uuid)
            return state is not None and state.healthy

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("HealthMonitor already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="vcuda-gpu-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # ---- the monitor thread ----

    def _run(self) -> None:
        watch = self._open_watch()
        try:
            while not self._stop.is_set():
                back = self._check_probes()
                if back and (watch is None or back & watch.unwatched.keys()):
                    # A GPU lost when the watch opened could not be registered: now it can.
                    if watch is not None:
                        watch.close()
                    watch = self._open_watch()
                self._wait_events(watch)
        except Exception:  # never die silently: the plugin would keep reporting stale health
            log.exception("GPU health monitor failed; GPUs keep their last health")
        finally:
            if watch is not None:
                watch.close()

    def _open_watch(self) -> XidWatch | None:
        try:
            watch = self._nvml.watch_xids(list(self._gpus))
        except Exception as exc:  # noqa: BLE001 - any NVML failure: fall back to probes
            log.warning("no XID events from NVML (%s); GPU health from probes only", exc)
            return None
        for uuid, why in watch.unwatched.items():
            log.warning("no XID events for GPU %s (%s); its health comes from probes only", uuid, why)
        return watch

    def _wait_events(self, watch: XidWatch | None) -> None:
        if watch is None:
            self._stop.wait(self._poll_ms / 1000)
            return
        try:
            events = watch.wait(self._poll_ms)
        except Exception as exc:  # noqa: BLE001 - e.g. GPU_IS_LOST from the wait itself
            log.warning("waiting for XID events failed: %s", exc)
            self._stop.wait(self._poll_ms / 1000)  # do not spin on a failing wait
            return
        for uuid, xid in events:
            self._on_xid(uuid, xid)

    def _on_xid(self, uuid: str, xid: int) -> None:
        if xid in self._ignored:
            log.info("XID %d on GPU %s: an application error, GPU stays healthy", xid, uuid or "?")
            return
        # NVML did not say which GPU: like NVIDIA's plugin, suspect them all.
        targets = [uuid] if uuid in self._gpus else list(self._gpus)
        now = self._clock()
        for target in targets:
            state = self._gpus[target]
            state.last_xid_at = now
            self._set(state, False, f"critical XID {xid}")

    def _check_probes(self) -> set[str]:
        """Probes every GPU; returns those that turned healthy."""
        now = self._clock()
        back: set[str] = set()
        for state in self._gpus.values():
            if not self._nvml.probe(state.info.index):
                self._set(state, False, "GPU is lost: NVML does not reach it")
                continue
            if state.healthy:
                continue
            quiet = state.last_xid_at is None or now - state.last_xid_at >= self._recover_after
            if quiet:
                why = ("probe passes" if state.last_xid_at is None else
                       f"probe passes, no critical XID for {self._recover_after:g} s")
                self._set(state, True, why)
                back.add(state.info.uuid)
        return back

    def _set(self, state: _GPUState, healthy: bool, reason: str) -> None:
        with self._lock:
            changed = state.healthy != healthy
            state.healthy, state.reason = healthy, reason
        if not changed:
            return
        level = logging.INFO if healthy else logging.WARNING
        log.log(level, "GPU %s is %s: %s", state.info.uuid, "healthy" if healthy else "unhealthy",
                reason)
        try:
            self._on_change(state.info.uuid, healthy, reason)
        except Exception:
            log.exception("health change listener failed for GPU %s", state.info.uuid)


def nvml_health(nvml: NVML, ignored_xids: str | None) -> HealthFactory:
    """The XID health monitor bound to this NVML session (the node daemons' health_factory)."""
    # None (unset) keeps NVIDIA's list; "" is a list too: ignore no XID.
    ignored = parse_xid_list(ignored_xids) if ignored_xids is not None else DEFAULT_IGNORED_XIDS

    def make(inventory: Inventory, on_change: OnChange) -> HealthMonitor:
        return HealthMonitor(nvml, inventory.gpus, on_change, ignored_xids=ignored)

    return make
