"""The node annotation ``vcuda.io/gpu-topology`` (**contract**): a node's GPUs and NVLink.

The device plugin publishes it on its Node; the extender reads it to know each
GPU's UUID, model and memory (GPUs may differ within a node) and which pairs are
NVLink-connected. No Kubernetes import, so the device plugin can encode with it.

Format, version 1 (compact JSON)::

    {
      "version": 1,
      "gpus": [
        {"index": 0, "uuid": "GPU-6f0c...", "model": "NVIDIA A100-SXM4-80GB",
         "memory": 85899345920},
        {"index": 1, "uuid": "GPU-1b2d...", "model": "NVIDIA A100-SXM4-80GB",
         "memory": 85899345920, "numa": 0}
      ],
      "nvlink": [[0, 1, 12]]
    }

- ``gpus``: one entry per GPU the plugin serves. ``index`` unique (NVML index),
  ``uuid`` unique, ``model`` the NVML name, ``memory`` total bytes, ``numa`` optional.
  Every GPU has 100 cores.
- ``nvlink``: ``[a, b, links]`` triples of GPU indices with the number of NVLink
  links between them (> 0); pairs not listed are not NVLink-connected. Optional.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

VERSION = 1


class TopologyError(ValueError):
    """The annotation is not a valid topology; the message says which field."""


@dataclass(frozen=True)
class GPUInfo:
    index: int
    uuid: str
    model: str
    memory: int
    numa: int | None = None


@dataclass(frozen=True)
class NodeTopology:
    gpus: tuple[GPUInfo, ...]
    # (a, b) with a < b -> link count
    nvlink: dict[tuple[int, int], int] = field(default_factory=dict)

    def links(self, a: int, b: int) -> int:
        return self.nvlink.get((a, b) if a < b else (b, a), 0)


def encode(topo: NodeTopology) -> str:
    doc: dict[str, Any] = {
        "version": VERSION,
        "gpus": [
            {"index": g.index, "uuid": g.uuid, "model": g.model, "memory": g.memory}
            | ({} if g.numa is None else {"numa": g.numa})
            for g in topo.gpus
        ],
    }
    if topo.nvlink:
        doc["nvlink"] = [[a, b, n] for (a, b), n in sorted(topo.nvlink.items())]
    _validate(doc)
    return json.dumps(doc, separators=(",", ":"))


def decode(text: str | bytes) -> NodeTopology:
    try:
        doc = json.loads(text)
    except (ValueError, TypeError) as e:
        raise TopologyError(f"not JSON: {e}") from None
    _validate(doc)
    gpus = tuple(
        GPUInfo(g["index"], g["uuid"], g["model"], g["memory"], g.get("numa"))
        for g in doc["gpus"]
    )
    nvlink = {(min(a, b), max(a, b)): n for a, b, n in doc.get("nvlink", [])}
    return NodeTopology(gpus=gpus, nvlink=nvlink)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _validate(doc: Any) -> None:
    if not isinstance(doc, dict):
        raise TopologyError("top level must be a JSON object")
    if doc.get("version") != VERSION:
        raise TopologyError(f"version: {doc.get('version')!r} is not supported "
                            f"(this reader knows {VERSION})")
    gpus = doc.get("gpus")
    if not isinstance(gpus, list):
        raise TopologyError("gpus: missing or not a list")
    indices: set[int] = set()
    uuids: set[str] = set()
    for i, g in enumerate(gpus):
        where = f"gpus[{i}]"
        if not isinstance(g, dict):
            raise TopologyError(f"{where}: not an object")
        idx = g.get("index")
        if not _is_int(idx) or idx < 0 or idx in indices:
            raise TopologyError(f"{where}.index: {idx!r} is not a unique integer >= 0")
        indices.add(idx)
        uuid = g.get("uuid")
        if not isinstance(uuid, str) or not uuid or uuid in uuids:
            raise TopologyError(f"{where}.uuid: {uuid!r} is not a unique non-empty string")
        uuids.add(uuid)
        if not isinstance(g.get("model"), str):
            raise TopologyError(f"{where}.model: missing or not a string")
        mem = g.get("memory")
        if not _is_int(mem) or mem <= 0:
            raise TopologyError(f"{where}.memory: {mem!r} is not a byte count > 0")
        numa = g.get("numa")
        if numa is not None and not _is_int(numa):
            raise TopologyError(f"{where}.numa: {numa!r} is not an integer")
    links = doc.get("nvlink", [])
    if not isinstance(links, list):
        raise TopologyError("nvlink: not a list")
    for i, link in enumerate(links):
        ok = (isinstance(link, list) and len(link) == 3 and all(_is_int(x) for x in link)
              and link[0] in indices and link[1] in indices and link[0] != link[1]
              and link[2] > 0)
        if not ok:
            raise TopologyError(f"nvlink[{i}]: {link!r} is not [gpuA, gpuB, links>0] "
                                "of two different known GPU indices")
