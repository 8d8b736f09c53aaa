"""Publish on the Node object what the cluster schedules by: in vgpu mode this node's GPUs
and NVLink as the annotation ``vcuda.io/gpu-topology`` (format: kube_contract.topology),
which the scheduler extender reads to place vgpu requests on a concrete GPU (without it
the extender finds no GPUs on the node); in every mode the bare labels
``cuda-major-version`` and ``cuda-minor-version`` (device_plugin.labels.cuda_labels) that
users' nodeAffinity names.

The agent patches its Node at start, from a background thread that keeps
retrying (with a growing pause) while the API server cannot be reached, so the
plugin serves kubelet meanwhile, and again when what it publishes changes (the
GPU feature labels after a MIG layout, device_plugin.labels). The format carries no health: unhealthy GPUs
reach the scheduler as unhealthy devices through kubelet, so there is nothing
to re-publish when health changes. A restarted agent publishes again, which is
what a changed set of GPUs needs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kube_contract import topology
from node_state.gpus import Inventory

log = logging.getLogger(__name__)

# Merge these metadata maps ("labels", "annotations": key -> value) into our Node; raises on failure.
NodePatch = Callable[[dict[str, dict[str, str]]], None]


def encode(inventory: Inventory) -> str:
    gpus = tuple(topology.GPUInfo(index=g.index, uuid=g.uuid, model=g.name, memory=g.memory_total,
                                  numa=g.numa_node) for g in inventory.gpus)
    indexes = [g.index for g in inventory.gpus]
    nvlink = {(a, b): n for a in indexes for b in indexes if a < b and (n := inventory.link_count(a, b)) > 0}
    return topology.encode(topology.NodeTopology(gpus=gpus, nvlink=nvlink))


class KubeNode:
    """Labels and annotates one Node through the kubernetes client (RBAC: nodes patch)."""

    def __init__(self, api: Any, node: str, timeout: float = 10.0) -> None:
        self.api = api            # kubernetes.client.CoreV1Api
        self.node = node
        self.timeout = timeout

    def patch(self, metadata: dict[str, dict[str, str]]) -> None:
        # A merge patch touches only these keys: other labels and other agents' annotations stay.
        self.api.patch_node(self.node, {"metadata": metadata},
                            _content_type="application/merge-patch+json", _preload_content=False,
                            _request_timeout=self.timeout)


class NodePublisher:
    """Patches `metadata` into the Node from a background thread, retrying until it succeeds;
    `update()` publishes new values later (keys it no longer has are removed from the Node)."""

    def __init__(self, patch: NodePatch, metadata: dict[str, dict[str, str]], *, retry_s: float = 1.0,
                 max_retry_s: float = 60.0) -> None:
        self.patch = patch
        self.metadata = metadata
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.published = threading.Event()
        self._lock = threading.Lock()
        self._pending: dict[str, dict[str, str | None]] | None = {k: dict(v) for k, v in metadata.items()}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="node-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def update(self, metadata: dict[str, dict[str, str]]) -> None:
        """Publish these values instead; a key published before and absent now is deleted (null in the patch)."""
        with self._lock:
            patch: dict[str, dict[str, str | None]] = {}
            for section in {*self.metadata, *metadata}:
                new = metadata.get(section, {})
                old = self.metadata.get(section, {})
                changed: dict[str, str | None] = {k: v for k, v in new.items() if old.get(k) != v}
                changed.update({k: None for k in old if k not in new})
                if changed:
                    patch[section] = changed
            self.metadata = metadata
            if not patch:
                return
            if self._pending is not None:   # not sent yet: send the union (a new dict: one may be in flight)
                merged = {section: dict(values) for section, values in self._pending.items()}
                for section, values in patch.items():
                    merged.setdefault(section, {}).update(values)
                patch = merged
            self._pending = patch
            self.published.clear()
        self._wake.set()

    def _run(self) -> None:
        pause = self.retry_s
        failures = 0
        while not self._stop.is_set():
            with self._lock:
                pending = self._pending
            if pending is None:
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                self.patch(pending)  # type: ignore[arg-type]  (None deletes a key in a merge patch)
            except Exception as exc:   # the API server may be down or slow; keep trying, quietly after the first
                failures += 1
                (log.warning if failures == 1 else log.debug)(
                    "node %s not published yet (%s); retrying", _keys(pending), _reason(exc))
                self._stop.wait(pause)
                pause = min(pause * 2, self.max_retry_s)
                continue
            log.info("published node %s", _keys(pending))
            pause, failures = self.retry_s, 0
            with self._lock:
                if self._pending is pending:
                    self._pending = None
                    self.published.set()


def _keys(metadata: dict[str, dict[str, str | None]]) -> str:
    return ", ".join(f"{section[:-1]} {key}" for section, values in metadata.items() for key in values)


def _reason(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    return f"HTTP {status} {getattr(exc, 'reason', '')}".strip() if status else repr(exc)
