"""Scenario builders for tests and the benchmark: nodes, topologies and pods as JSON.

Shapes match what the API server and kube-scheduler send (camelCase pod/node JSON).
"""

from __future__ import annotations

import itertools
from typing import Any

from .assignment import Assignment
from .assignment import encode as encode_assignment
from .names import CORES_PER_GPU, Names
from .topology import GPUInfo, NodeTopology
from .topology import encode as encode_topology

GiB = 1 << 30
A100 = ("NVIDIA A100-SXM4-80GB", 80 * GiB)
T4 = ("Tesla T4", 16 * GiB)
V100 = ("Tesla V100-SXM2-32GB", 32 * GiB)

_uids = itertools.count(1)
DEFAULT_NAMES = Names()


def topology(node: str, gpus: list[tuple[str, int]] | int = 8, *,
             nvlink: str | list[tuple[int, int, int]] = "none") -> NodeTopology:
    """``gpus``: a count of A100s or a list of (model, memory). ``nvlink``: ``"none"``,
    ``"all"`` (every pair, 12 links), ``"pairs"`` (0-1, 2-3, ...) or explicit triples."""
    spec = [A100] * gpus if isinstance(gpus, int) else gpus
    infos = tuple(GPUInfo(i, f"GPU-{node}-{i}", model, mem) for i, (model, mem) in enumerate(spec))
    n = len(infos)
    if nvlink == "all":
        links = {(a, b): 12 for a in range(n) for b in range(a + 1, n)}
    elif nvlink == "pairs":
        links = {(a, a + 1): 12 for a in range(0, n - 1, 2)}
    elif nvlink == "none":
        links = {}
    else:
        links = {(min(a, b), max(a, b)): c for a, b, c in nvlink}
    return NodeTopology(gpus=infos, nvlink=links)


def node_json(name: str, topo: NodeTopology | None, names: Names = DEFAULT_NAMES,
              resource_version: str = "1") -> dict[str, Any]:
    annotations = {} if topo is None else {names.topology: encode_topology(topo)}
    n = len(topo.gpus) if topo else 0
    capacity = {names.core_resource: str(CORES_PER_GPU * n),
                names.memory_resource: str(sum(g.memory for g in topo.gpus) >> 28 if topo else 0),
                "cpu": "64", "memory": "512Gi", "pods": "110"}
    return {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": name, "uid": f"node-uid-{name}", "resourceVersion": resource_version,
                     "labels": {"kubernetes.io/hostname": name}, "annotations": annotations},
        "spec": {},
        "status": {"capacity": capacity, "allocatable": dict(capacity),
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod_json(name: str, containers: list[tuple[int, int]] | None = None, *,
             names: Names = DEFAULT_NAMES, namespace: str = "default", uid: str | None = None,
             annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
             node_name: str | None = None, assignment: Assignment | None = None,
             phase: str = "Pending", container_names: list[str] | None = None,
             ) -> dict[str, Any]:
    """``containers``: (cores, memory units) per container; (0, 0) asks for no GPU."""
    containers = containers if containers is not None else [(30, 4)]
    cnames = container_names or [f"c{i}" for i in range(len(containers))]
    ann = dict(annotations or {})
    if assignment is not None:
        ann[names.assignment] = encode_assignment(assignment)
    spec_containers = []
    for cname, (cores, units) in zip(cnames, containers, strict=True):
        limits = {"cpu": "1", "memory": "1Gi"}
        if cores:
            limits[names.core_resource] = str(cores)
        if units:
            limits[names.memory_resource] = str(units)
        spec_containers.append({"name": cname, "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                "resources": {"limits": limits, "requests": dict(limits)}})
    spec: dict[str, Any] = {"containers": spec_containers, "schedulerName": "default-scheduler",
                            "restartPolicy": "Always"}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace,
                     "uid": uid or f"pod-uid-{next(_uids)}", "resourceVersion": "1",
                     "annotations": ann, "labels": dict(labels or {})},
        "spec": spec,
        "status": {"phase": phase},
    }
