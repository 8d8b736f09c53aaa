"""The decision annotation ``vcuda.io/gpu-assignment`` (**contract**).

The extender writes it on the pod at bind; the device plugin's Allocate reads it
to learn which GPU (and how much of it) each container gets, and cross-checks it
against the device IDs kubelet hands over. This module imports nothing from
Kubernetes so the device plugin can use it as is.

Format, version 1 (compact JSON, one line)::

    {
      "version": 1,
      "node": "gpu-node-7",
      "containers": [
        {"name": "trainer",
         "gpus": [{"uuid": "GPU-6f0c...", "cores": 30, "memory": 4294967296}]},
        {"name": "multi",
         "gpus": [{"uuid": "GPU-aa..", "cores": 100, "memory": 85899345920},
                  {"uuid": "GPU-bb..", "cores": 100, "memory": 85899345920}]}
      ]
    }

- ``version``: integer; a reader rejects versions it does not know.
- ``node``: the node the pod is bound to; Allocate on another node must refuse.
- ``containers``: only containers that got a GPU, each name once.
- ``gpus``: non-empty; each UUID once per container. ``cores`` is the share of
  that GPU's time in percent (1..100, 100 = the whole card, unthrottled);
  ``memory`` is the device-memory limit in bytes on that GPU (>= 0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

VERSION = 1
ANNOTATION = "vcuda.io/gpu-assignment"  # default name; the prefix is configurable


class AssignmentError(ValueError):
    """The annotation is not a valid assignment; the message says which field."""


@dataclass(frozen=True)
class GPUShare:
    uuid: str
    cores: int
    memory: int


@dataclass(frozen=True)
class ContainerAssignment:
    name: str
    gpus: tuple[GPUShare, ...]


@dataclass(frozen=True)
class Assignment:
    node: str
    containers: tuple[ContainerAssignment, ...]
    version: int = VERSION

    def container(self, name: str) -> ContainerAssignment | None:
        return next((c for c in self.containers if c.name == name), None)

    def gpu_totals(self) -> dict[str, tuple[int, int]]:
        """Cores and memory the whole pod holds on each GPU UUID."""
        totals: dict[str, tuple[int, int]] = {}
        for c in self.containers:
            for g in c.gpus:
                cores, memory = totals.get(g.uuid, (0, 0))
                totals[g.uuid] = (cores + g.cores, memory + g.memory)
        return totals


def encode(assignment: Assignment) -> str:
    """Serialise, validating first so a bad decision is never written."""
    doc = {
        "version": assignment.version,
        "node": assignment.node,
        "containers": [
            {"name": c.name,
             "gpus": [{"uuid": g.uuid, "cores": g.cores, "memory": g.memory} for g in c.gpus]}
            for c in assignment.containers
        ],
    }
    _validate(doc)
    return json.dumps(doc, separators=(",", ":"))


def decode(text: str | bytes) -> Assignment:
    """Parse and validate; raises AssignmentError naming the offending field."""
    try:
        doc = json.loads(text)
    except (ValueError, TypeError) as e:
        raise AssignmentError(f"not JSON: {e}") from None
    _validate(doc)
    return Assignment(
        node=doc["node"],
        version=doc["version"],
        containers=tuple(
            ContainerAssignment(
                name=c["name"],
                gpus=tuple(GPUShare(g["uuid"], g["cores"], g["memory"]) for g in c["gpus"]),
            )
            for c in doc["containers"]
        ),
    )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _validate(doc: Any) -> None:
    if not isinstance(doc, dict):
        raise AssignmentError("top level must be a JSON object")
    version = doc.get("version")
    if not _is_int(version):
        raise AssignmentError("version: missing or not an integer")
    if version != VERSION:
        raise AssignmentError(f"version: {version} is not supported (this reader knows {VERSION})")
    node = doc.get("node")
    if not isinstance(node, str) or not node:
        raise AssignmentError("node: missing or empty")
    containers = doc.get("containers")
    if not isinstance(containers, list):
        raise AssignmentError("containers: missing or not a list")
    seen: set[str] = set()
    for i, c in enumerate(containers):
        where = f"containers[{i}]"
        if not isinstance(c, dict):
            raise AssignmentError(f"{where}: not an object")
        name = c.get("name")
        if not isinstance(name, str) or not name:
            raise AssignmentError(f"{where}.name: missing or empty")
        if name in seen:
            raise AssignmentError(f"{where}.name: container {name!r} listed twice")
        seen.add(name)
        gpus = c.get("gpus")
        if not isinstance(gpus, list) or not gpus:
            raise AssignmentError(f"{where}.gpus: missing or empty")
        uuids: set[str] = set()
        for j, g in enumerate(gpus):
            gw = f"{where}.gpus[{j}]"
            if not isinstance(g, dict):
                raise AssignmentError(f"{gw}: not an object")
            uuid = g.get("uuid")
            if not isinstance(uuid, str) or not uuid:
                raise AssignmentError(f"{gw}.uuid: missing or empty")
            if uuid in uuids:
                raise AssignmentError(f"{gw}.uuid: {uuid} listed twice for {name!r}")
            uuids.add(uuid)
            cores = g.get("cores")
            if not _is_int(cores) or not 1 <= cores <= 100:
                raise AssignmentError(f"{gw}.cores: {cores!r} is not an integer in 1..100")
            memory = g.get("memory")
            if not _is_int(memory) or memory < 0:
                raise AssignmentError(f"{gw}.memory: {memory!r} is not a byte count >= 0")
