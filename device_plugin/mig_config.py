"""MIG layouts by node label, as NVIDIA's mig-manager does it: the Node's label
``nvidia.com/mig.config=<name>`` names a layout of the mig-parted file the agent was
given (``--mig-config``, mounted from a ConfigMap); the agent applies it
(node_state.mig.LayoutApplier: only when every GPU it changes is idle, all or
nothing), re-registers its resources, and reports in the label
``nvidia.com/mig.config.state``: ``pending`` while it works, then ``success`` or
``failed``, with the reason in a Warning Event on the Node.

The file is read again for every layout, so an edited ConfigMap counts from the
next label change. A layout refused because a GPU it changes is busy is tried
again every ``retry_s`` while the label still names it, and at once when a
container goes (``retry_now``: the reconciler removed one); any other failure
waits for the label to change (or the agent to restart).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from device_plugin.node_topology import KubeNode
from kube_contract.apiclient import ListWatch
from kube_contract.events import NodeRef, event_body
from node_state.mig import BusyError, GPUChange, LayoutApplier, LayoutError, Outcome, parse_layouts

log = logging.getLogger(__name__)

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
PENDING, SUCCESS, FAILED = "pending", "success", "failed"
EVENT_REASON = "MigConfigFailed"
COMPONENT = "vcuda-device-plugin"


class MigNode:
    """The Node calls the layout manager makes through the kubernetes client (RBAC: nodes
    list/watch/patch, events create)."""

    def __init__(self, api: Any, node: str, timeout: float = 10.0) -> None:
        self.api = api            # kubernetes.client.CoreV1Api
        self.node = node
        self.timeout = timeout

    def watch(self, on_labels: Callable[[dict[str, str]], None]) -> ListWatch:
        def labels(obj: dict[str, Any]) -> None:
            on_labels(dict((obj.get("metadata") or {}).get("labels") or {}))

        def listed(items: list[dict[str, Any]]) -> None:
            for item in items:
                labels(item)

        return ListWatch(functools.partial(self.api.list_node, field_selector=f"metadata.name={self.node}"),
                         "mig-config-watch", on_list=listed,
                         on_event=lambda kind, obj: labels(obj) if kind != "DELETED" else None)

    def set_state(self, state: str) -> None:
        KubeNode(self.api, self.node, self.timeout).patch({"labels": {STATE_LABEL: state}})

    def warn(self, message: str) -> None:
        """A Warning Event on the Node (kubectl describe node shows it)."""
        event = event_body(NodeRef(self.node), EVENT_REASON, message, component=COMPONENT, host=self.node)
        self.api.create_namespaced_event("default", event, _preload_content=False, _request_timeout=self.timeout)


class MigConfigManager:
    """Applies the layout the Node's label names, from its own thread."""

    def __init__(self, config_file: Path, applier: LayoutApplier, node: MigNode, *,
                 on_applied: Callable[[list[GPUChange]], None],
                 check: Callable[[Outcome], str | None] | None = None, retry_s: float = 30.0,
                 lock: AbstractContextManager[Any] | None = None, retire: Callable[[], None] | None = None
                 ) -> None:
        self.config_file = config_file
        self.applier = applier
        self.node = node
        self.on_applied = on_applied
        # Held from the idle check to `retire` (the resources whose devices changed refuse Allocate from
        # then on), so no container lands on a GPU between the check and the change.
        self.lock = lock or contextlib.nullcontext()
        self.retire = retire
        self.check = check
        self.retry_s = retry_s
        self.state: str | None = None      # the last state reported, for tests and logs
        self.reason = ""
        self._wanted: str | None = None
        self._done: str | None = None      # the name last tried, whatever came of it
        self._busy = False
        self._poked = False                # a container went: a busy layout is tried again now
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._watch: ListWatch | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mig-config", daemon=True)
        self._thread.start()
        self._watch = self.node.watch(self.labels_changed)
        self._watch.start()

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def labels_changed(self, labels: dict[str, str]) -> None:
        with self._cond:
            self._wanted = labels.get(CONFIG_LABEL) or None
            self._cond.notify_all()

    def retry_now(self) -> None:
        """A container went (its GPU may be idle now): a layout waiting for a busy GPU is tried again at
        once rather than at the next `retry_s`."""
        with self._cond:
            if self._busy:
                self._poked = True
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or self._poked or (
                    self._wanted is not None and self._wanted != self._done),
                    timeout=self.retry_s if self._busy else None)
                self._poked = False
                if self._stop:
                    return
                name = self._wanted
                if name is None or (name == self._done and not self._busy):
                    continue
                retry = self._busy and name == self._done
                self._done = name
            self._busy = False
            self.apply(name, retry=retry)

    def apply(self, name: str, *, retry: bool = False) -> None:
        """Apply the layout `name` and report it on the Node (a retry stays `failed` until it succeeds)."""
        if not retry:
            self._report(PENDING)
        try:
            layouts = parse_layouts(self._read(), str(self.config_file))
            if name not in layouts:
                raise LayoutError(f"{CONFIG_LABEL}={name}: no such layout in {self.config_file} "
                                  f"(it has: {', '.join(sorted(layouts))})")
            with self.lock:
                changes = self.applier.apply(name, layouts[name], self.check)
                if changes and self.retire is not None:
                    self.retire()
        except BusyError as exc:
            self._busy = True
            self._fail(name, str(exc))
            return
        except LayoutError as exc:
            self._fail(name, str(exc))
            return
        except Exception as exc:   # NVML or the file: the layout is not applied; say so, keep running
            log.exception("MIG layout %s failed", name)
            self._fail(name, f"{type(exc).__name__}: {exc}")
            return
        log.info("MIG layout %s applied: %d GPU(s) changed", name, len(changes))
        if changes:
            try:
                self.on_applied(changes)
            except Exception as exc:
                log.exception("re-registering resources after MIG layout %s", name)
                self._fail(name, f"applied, but re-registering the resources failed: {exc}")
                return
        self.reason = ""
        self._report(SUCCESS)

    def _read(self) -> str:
        try:
            return self.config_file.read_text()
        except OSError as exc:
            raise LayoutError(f"cannot read the MIG config {self.config_file}: {exc.strerror}") from None

    def _fail(self, name: str, reason: str) -> None:
        first = reason != self.reason
        self.reason = reason
        log.warning("MIG layout %s not applied: %s", name, reason)
        self._report(FAILED)
        if first:   # a busy GPU retried every retry_s: one Event per reason, not one per try
            try:
                self.node.warn(f"MIG layout {name!r} not applied: {reason}")
            except Exception as exc:
                log.warning("Event for MIG layout %s not created: %s", name, exc)

    def _report(self, state: str) -> None:
        self.state = state
        try:
            self.node.set_state(state)
        except Exception as exc:   # the layout itself is done or not regardless; the label catches up next time
            log.warning("label %s=%s not set: %s", STATE_LABEL, state, exc)
