"""Node labels through node-feature-discovery's local feature source.

nfd-worker reads every file in ``/etc/kubernetes/node-feature-discovery/features.d/``
(files whose name starts with a dot are skipped) and turns each ``name=value``
line into a node label. Unprefixed names would become
``feature.node.kubernetes.io/<name>``; ours carry their own namespace, written
as full names (``vcuda.io/cuda-major-version=12``), which NFD v0.13 and later
accept as they are (older nfd-master needs ``-extra-label-ns=vcuda.io``).

The file is replaced atomically (a dot-named temporary file, then rename), so
nfd-worker never reads half of it.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import Counter
from pathlib import Path

from py_vcuda.nvml import NVML

DEFAULT_FEATURES_FILE = Path("/etc/kubernetes/node-feature-discovery/features.d/vcuda")
DEFAULT_PREFIX = "vcuda.io"
MODES = ("vgpu", "pgpu", "mps")
MAX_LABEL_VALUE = 63
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9._-]+")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
MiB = 1 << 20


def label_value(text: str) -> str:
    """A valid Kubernetes label value for text: at most 63 of [A-Za-z0-9._-],
    alphanumeric at both ends; runs of anything else become one '-'.
    "NVIDIA H100 80GB HBM3" -> "NVIDIA-H100-80GB-HBM3"."""
    value = _EDGE.sub("", _NOT_ALLOWED.sub("-", text))
    value = _EDGE.sub("", value[:MAX_LABEL_VALUE])
    return value or "unknown"


def cuda_labels(nvml: NVML) -> dict[str, str]:
    """The bare ``cuda-major-version`` / ``cuda-minor-version`` labels (no namespace) that the
    platform documentation users follow puts on GPU nodes, so their nodeAffinity
    (``cuda-major-version In ["12"]``, ``cuda-minor-version Gt "3"``) matches. NFD can write
    only namespaced names, so the agent patches these onto the Node itself."""
    major, minor = nvml.cuda_driver_version()
    return {"cuda-major-version": str(major), "cuda-minor-version": str(minor)}


def node_labels(nvml: NVML, mode: str, prefix: str = DEFAULT_PREFIX) -> dict[str, str]:
    """The labels this node gets, full names to values.

    gpu-product: the GPUs' model, ``mixed`` when they differ; gpu-memory: MiB of
    the smallest GPU (what any one GPU is guaranteed to have)."""
    if mode not in MODES:
        raise ValueError(f"sharing mode {mode!r}: expected one of {', '.join(MODES)}")
    gpus = nvml.gpus()
    products = Counter(g.name for g in gpus)
    product = next(iter(products)) if len(products) == 1 else "mixed"
    values = {
        **cuda_labels(nvml),
        "driver-version": nvml.driver_version(),
        "gpu-product": product if gpus else "none",
        "gpu-memory": str(min((g.memory_total for g in gpus), default=0) // MiB),
        "gpu-count": str(len(gpus)),
        "sharing-mode": mode,
    }
    return {f"{prefix}/{name}": label_value(value) for name, value in values.items()}


def write_feature_file(path: Path, nvml: NVML, mode: str, *, prefix: str = DEFAULT_PREFIX
                       ) -> dict[str, str]:
    """Writes this node's labels as an NFD feature file at path, atomically; returns them."""
    labels = node_labels(nvml, mode, prefix)
    text = "# vcuda node labels, written by the vcuda device plugin; replaced on each start\n"
    text += "".join(f"{name}={value}\n" for name, value in sorted(labels.items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # dot: NFD skips it
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return labels
