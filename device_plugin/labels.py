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

from device_plugin.pgpu import mig_name
from node_state.gpus import Inventory
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


# Compute capability by product, where NVML cannot tell (the simulator): the families MIG exists on
# and a few common others (CUDA programming guide's table).
_COMPUTE_BY_PRODUCT = (("H200", (9, 0)), ("H100", (9, 0)), ("GH200", (9, 0)), ("A100", (8, 0)),
                       ("A30", (8, 0)), ("A10", (8, 6)), ("L40", (8, 9)), ("L4", (8, 9)), ("T4", (7, 5)),
                       ("V100", (7, 0)), ("B200", (10, 0)))
NVIDIA = "nvidia.com"
# GFD's nvidia.com/gpu.sharing-strategy and gpu.replicas for each vcuda mode: vgpu shares a GPU in
# time (the token scheduler) as 100 core units, mps in MPS percent; pgpu does not share.
_SHARING = {"pgpu": ("none", 1), "vgpu": ("time-slicing", 100), "mps": ("mps", 100)}


def compute_capability(nvml: NVML, index: int, product: str) -> tuple[int, int] | None:
    """NVML's answer, else the product's (see _COMPUTE_BY_PRODUCT); None when neither tells."""
    cc = nvml.compute_capability(index)
    if cc is not None:
        return cc
    return next((cc for key, cc in _COMPUTE_BY_PRODUCT if key in product.split() or
                 any(w.startswith(key + "-") for w in product.split())), None)


def feature_labels(nvml: NVML, inventory: Inventory, mode: str, mig_strategy: str = "none") -> dict[str, str]:
    """GPU Feature Discovery's labels (their meanings) for what this agent offers, patched on the Node.

    ``gpu.count``/``gpu.memory``/``gpu.product`` describe what ``nvidia.com/gpu`` (or the mode's
    resource) hands out: whole GPUs without MIG mode, or under the single MIG strategy the MIG
    devices (product ``<GPU>-MIG-<profile>``, their memory). Under mixed, each profile gets
    ``nvidia.com/mig-<profile>.count``, ``.memory``, ``.multiprocessors`` and ``.slices.gi``.
    ``gpu.compute.*`` is left out when neither NVML nor the product name tells it."""
    whole = inventory.whole().gpus
    mig = inventory.mig
    first = (whole or inventory.gpus or (None,))[0]
    sharing, replicas = _SHARING[mode]
    labels = {
        "mig.capable": "true" if mig.gpus else "false",
        "mig.strategy": mig_strategy,
        "gpu.replicas": str(replicas),
        "gpu.sharing-strategy": sharing,
        "mps.capable": "true" if mode == "mps" else "false",
    }
    if first is None:
        return {f"{NVIDIA}/{k}": label_value(v) for k, v in labels.items()}
    product, count, memory = first.name, len(whole), first.memory_total if whole else 0
    devices = mig.devices()
    if mode == "pgpu" and mig_strategy == "single" and mig.enabled and devices:
        product = f"{first.name}-MIG-{devices[0].profile}"
        count, memory = len(devices), devices[0].memory_total
        labels["gpu.multiprocessors"] = str(devices[0].multiprocessors)
        labels["gpu.slices.gi"] = str(devices[0].slices)
    labels.update({"gpu.product": product, "gpu.count": str(count), "gpu.memory": str(memory // MiB)})
    cc = compute_capability(nvml, first.index, first.name)
    if cc is not None:
        labels["gpu.compute.major"], labels["gpu.compute.minor"] = str(cc[0]), str(cc[1])
    if mode == "pgpu" and mig_strategy == "mixed":
        by_profile: dict[str, list] = {}
        for d in devices:
            by_profile.setdefault(d.profile, []).append(d)
        for name, devs in by_profile.items():
            profile = mig_name(name)   # as in the resource name
            labels[f"mig-{profile}.count"] = str(len(devs))
            labels[f"mig-{profile}.memory"] = str(devs[0].memory_total // MiB)
            labels[f"mig-{profile}.multiprocessors"] = str(devs[0].multiprocessors)
            labels[f"mig-{profile}.slices.gi"] = str(devs[0].slices)
    return {f"{NVIDIA}/{k}": label_value(v) for k, v in labels.items()}


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
