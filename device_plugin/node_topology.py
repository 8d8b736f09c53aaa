"""Publish on the Node object what the cluster schedules by: in vgpu mode this node's GPUs
and NVLink as the annotation ``vcuda.io/gpu-topology`` (format: kube_contract.topology),
which the scheduler extender reads to place vgpu requests on a concrete GPU (without it
the extender finds no GPUs on the node); in every mode the bare labels
``cuda-major-version`` and ``cuda-minor-version`` (device_plugin.labels.cuda_labels) that
users' nodeAffinity names.

The agent patches its Node once at start, from a background thread that keeps
retrying (with a growing pause) while the API server cannot be reached, so the
plugin serves kubelet meanwhile. The format carries no health: unhealthy GPUs
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
    """Patches `metadata` into the Node from a background thread, retrying until it succeeds."""

    def __init__(self, patch: NodePatch, metadata: dict[str, dict[str, str]], *, retry_s: float = 1.0,
                 max_retry_s: float = 60.0) -> None:
        self.patch = patch
        self.metadata = metadata
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.published = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="node-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _run(self) -> None:
        pause = self.retry_s
        failures = 0
        while not self._stop.is_set():
            try:
                self.patch(self.metadata)
            except Exception as exc:   # the API server may be down or slow; keep trying, quietly after the first
                failures += 1
                (log.warning if failures == 1 else log.debug)(
                    "node %s not published yet (%s); retrying", self._keys(), _reason(exc))
                self._stop.wait(pause)
                pause = min(pause * 2, self.max_retry_s)
                continue
            log.info("published node %s", self._keys())
            self.published.set()
            return

    def _keys(self) -> str:
        return ", ".join(f"{section[:-1]} {key}" for section, values in self.metadata.items() for key in values)


def _reason(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    return f"HTTP {status} {getattr(exc, 'reason', '')}".strip() if status else repr(exc)
