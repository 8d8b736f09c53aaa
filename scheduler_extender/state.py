"""Cluster GPU usage: who holds what, including decisions not yet visible in the API.

A pod's usage comes from its assignment annotation once the API server shows it
bound to the annotated node. Between ``reserve`` (at bind) and that moment the
decision is a *reservation* that counts as used, so concurrent binds never
overcommit; a failed bind ``release``s it, and a reservation the API server never
confirms expires after ``reservation_ttl`` seconds. Every read and write happens
under ``lock``, so decide+reserve is atomic. No I/O here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kube_contract.assignment import AssignmentError, decode
from kube_contract.names import Names
from kube_contract.topology import NodeTopology, TopologyError
from kube_contract.topology import decode as decode_topology

from .placement import NodeGPUs, Placement, PodRequest, Tags, Unfit, held_per_gpu, place, placer
from .podspec import is_terminal, pod_ref, pod_tags, pod_uid

log = logging.getLogger(__name__)


@dataclass
class _Record:
    uid: str
    ref: str
    node: str
    totals: dict[str, tuple[int, int]]  # GPU uuid -> (cores, memory) for the whole pod
    tags: Tags
    reserved_at: float | None  # None once the API server shows the pod bound
    applied_to: NodeGPUs | None = None

    def same_usage(self, other: _Record) -> bool:
        return (self.node, self.totals, self.tags) == (other.node, other.totals, other.tags)


class ClusterState:
    def __init__(self, names: Names, *, clock: Callable[[], float] = time.monotonic,
                 reservation_ttl: float = 300.0) -> None:
        self.names = names
        self.lock = threading.RLock()
        self.generation = 0  # bumps on every change; lets callers reuse results
        self._clock = clock
        self._ttl = reservation_ttl
        self._nodes: dict[str, NodeGPUs] = {}
        self._topos: dict[str, NodeTopology] = {}
        self._node_errors: dict[str, str] = {}
        self._records: dict[str, _Record] = {}
        self._reserved: dict[str, float] = {}
        self._by_node: dict[str, set[str]] = {}

    # ---- nodes -------------------------------------------------------------

    def set_node(self, name: str, topo: NodeTopology | None, error: str | None = None) -> None:
        with self.lock:
            if topo is None:
                self.remove_node(name)
                if error:
                    self._node_errors[name] = error
                return
            self._node_errors.pop(name, None)
            if self._topos.get(name) == topo:
                return
            self._topos[name] = topo
            node = NodeGPUs.from_topology(name, topo)
            self._nodes[name] = node
            for uid in self._by_node.get(name, ()):
                self._apply(self._records[uid])
            self.generation += 1

    def observe_node(self, node: dict[str, Any]) -> None:
        meta = node.get("metadata", {})
        name = meta.get("name")
        if not name:
            return
        raw = (meta.get("annotations") or {}).get(self.names.topology)
        if raw is None:
            self.set_node(name, None)
            return
        try:
            self.set_node(name, decode_topology(raw))
        except TopologyError as e:
            log.warning("node %s: bad %s annotation: %s", name, self.names.topology, e)
            self.set_node(name, None, f"bad {self.names.topology} annotation: {e}")

    def remove_node(self, name: str) -> None:
        with self.lock:
            self._node_errors.pop(name, None)
            if self._nodes.pop(name, None) is not None:
                self._topos.pop(name, None)
                for uid in self._by_node.get(name, ()):
                    self._records[uid].applied_to = None
                self.generation += 1

    def replace_nodes(self, nodes: Iterable[dict[str, Any]]) -> None:
        with self.lock:
            nodes = list(nodes)
            seen = {n.get("metadata", {}).get("name") for n in nodes}
            for name in list(self._nodes) + list(self._node_errors):
                if name not in seen:
                    self.remove_node(name)
            for n in nodes:
                self.observe_node(n)

    def node(self, name: str) -> NodeGPUs | None:
        return self._nodes.get(name)

    def node_names(self) -> list[str]:
        with self.lock:
            return sorted(self._nodes)

    # ---- pods --------------------------------------------------------------

    def observe_pod(self, pod: dict[str, Any]) -> None:
        """Apply an ADDED/MODIFIED pod from the API server."""
        uid = pod_uid(pod)
        if not uid:
            return
        with self.lock:
            if is_terminal(pod):
                self._drop(uid)
                return
            node = (pod.get("spec") or {}).get("nodeName")
            raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(
                self.names.assignment)
            if node and raw is not None:
                try:
                    assignment = decode(raw)
                except AssignmentError as e:
                    log.warning("pod %s: ignoring bad %s: %s", pod_ref(pod),
                                self.names.assignment, e)
                    assignment = None
                if assignment is not None and assignment.node == node:
                    inits = {c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or []}
                    held = held_per_gpu((c.name in inits, g.uuid, g.cores, g.memory)
                                        for c in assignment.containers for g in c.gpus)
                    rec = _Record(uid, pod_ref(pod), node, held,
                                  pod_tags(pod, self.names), None)
                    old = self._records.get(uid)
                    if old is None or old.reserved_at is not None or not old.same_usage(rec):
                        self._drop(uid)
                        self._add(rec)
                    return
                if assignment is not None:
                    log.warning("pod %s: bound to %s but %s names %s; ignoring it",
                                pod_ref(pod), node, self.names.assignment, assignment.node)
            old = self._records.get(uid)
            # A reservation waits for the bind to show up; anything else has no usage.
            if old is not None and old.reserved_at is None:
                self._drop(uid)

    def remove_pod(self, uid: str) -> None:
        with self.lock:
            self._drop(uid)

    def replace_pods(self, pods: Iterable[dict[str, Any]], listed_at: float) -> None:
        """Resync from a full list; ``listed_at`` is the clock when the list was asked for."""
        with self.lock:
            pods = list(pods)
            seen = {pod_uid(p) for p in pods}
            for uid, rec in list(self._records.items()):
                if uid in seen:
                    continue
                # A reservation newer than the list may belong to a pod the list predates.
                if rec.reserved_at is None or rec.reserved_at < listed_at:
                    self._drop(uid)
            for p in pods:
                self.observe_pod(p)

    # ---- scheduling ----------------------------------------------------------

    def evaluate(self, pod: PodRequest, node_names: Iterable[str]) -> dict[str, Placement | Unfit]:
        """Where the pod would go on each named node (no change to usage)."""
        with self.lock:
            self._expire()
            out: dict[str, Placement | Unfit] = {}
            nodes = self._nodes
            run = placer(pod)
            for name in node_names:
                node = nodes.get(name)
                out[name] = run(node) if node is not None else self._unknown(name)
            return out

    def reserve(self, uid: str, ref: str, pod: PodRequest, node_name: str) -> Placement | Unfit:
        """Decide the pod's GPUs on ``node_name`` and count them as used, atomically."""
        with self.lock:
            self._expire()
            self._drop(uid)  # a retried bind replaces its earlier decision
            node = self._nodes.get(node_name)
            if node is None:
                return self._unknown(node_name)
            result = place(node, pod)
            if isinstance(result, Placement):
                totals = {node.gpus_by_index(i).uuid: t for i, t in result.gpu_totals().items()}
                self._add(_Record(uid, ref, node_name, totals, pod.tags, self._clock()))
            return result

    def release(self, uid: str) -> None:
        """Forget a reservation whose bind failed (a confirmed pod is left alone)."""
        with self.lock:
            rec = self._records.get(uid)
            if rec is not None and rec.reserved_at is not None:
                self._drop(uid)

    def usage(self) -> dict[str, list[tuple[str, int, int, int]]]:
        """node -> [(uuid, used cores, used memory, tenants)], for tests and debugging."""
        with self.lock:
            return {name: [(g.uuid, g.used_cores, g.used_memory, g.tenants) for g in n.gpus]
                    for name, n in self._nodes.items()}

    def reservations(self) -> list[str]:
        with self.lock:
            return sorted(self._reserved)

    # ---- internals -----------------------------------------------------------

    def _unknown(self, name: str) -> Unfit:
        why = self._node_errors.get(name) or (
            f"no {self.names.topology} annotation (is the vcuda device plugin running there?)")
        return Unfit(name, f"node {name}: no vcuda GPUs known: {why}", True)

    def _add(self, rec: _Record) -> None:
        self._records[rec.uid] = rec
        self._by_node.setdefault(rec.node, set()).add(rec.uid)
        if rec.reserved_at is not None:
            self._reserved[rec.uid] = rec.reserved_at
        self._apply(rec)
        self.generation += 1

    def _apply(self, rec: _Record) -> None:
        node = self._nodes.get(rec.node)
        rec.applied_to = node
        if node is None:
            return  # applied when the node shows up
        for uuid, (cores, memory) in rec.totals.items():
            gpu = node.by_uuid.get(uuid)
            if gpu is None:
                log.warning("pod %s: GPU %s is not on node %s", rec.ref, uuid, rec.node)
                continue
            gpu.add(cores, memory, rec.tags)

    def _drop(self, uid: str) -> None:
        rec = self._records.pop(uid, None)
        if rec is None:
            return
        self._reserved.pop(uid, None)
        self._by_node.get(rec.node, set()).discard(uid)
        node = rec.applied_to
        if node is not None and self._nodes.get(rec.node) is node:
            for uuid, (cores, memory) in rec.totals.items():
                gpu = node.by_uuid.get(uuid)
                if gpu is not None:
                    gpu.add(cores, memory, rec.tags, -1)
        self.generation += 1

    def _expire(self) -> None:
        if not self._reserved:
            return
        deadline = self._clock() - self._ttl
        for uid, at in list(self._reserved.items()):
            if at < deadline:
                log.warning("reservation for pod %s expired: the bind never showed up",
                            self._records[uid].ref)
                self._drop(uid)
