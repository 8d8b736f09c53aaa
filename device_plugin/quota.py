"""A container's quota from its pod: cores from the device IDs, the elastic cap
from ``vcuda.io/core-limit``, memory from ``vcuda.io/memory`` > the extender's
assignment > the container's ``vcuda-memory`` units. Allocate and the live
update path both use this, so a pod means the same thing at start and later.

Why memory is read here and not in the vcuda-memory resource's own Allocate:
kubelet allocates each resource separately and tells neither which container
it is for, nor which GPU the other resource went to. Like GPU-Manager, the
memory resource only does the node's accounting (kubelet and the scheduler
see capacity and use); the limit is applied by the core Allocate, which knows
the GPU and the pod.
"""

from __future__ import annotations

from dataclasses import dataclass

from py_vcuda.quantity import QuantityError, parse_quantity
from scheduler_extender.names import CORES_PER_GPU, MEMORY_UNIT_BYTES, Names


class QuotaError(ValueError):
    """An annotation with a value that cannot be used; the message names it."""


@dataclass(frozen=True)
class Quota:
    core_request: int
    core_limit: int
    memory_limit: int | None   # bytes per GPU


def core_limit_annotation(names: Names) -> str:
    return f"{names.annotation_prefix}/core-limit"


def memory_annotation(names: Names) -> str:
    return f"{names.annotation_prefix}/memory"


def parse_memory(text: str) -> int:
    """Plain integers are vcuda-memory units (256 MiB), anything else a byte quantity (``4Gi``)."""
    text = text.strip()
    if text.isdigit():
        return int(text) * MEMORY_UNIT_BYTES
    try:
        return parse_quantity(text)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None


def quota(names: Names, annotations: dict[str, str], *, cores: int, share_memory: int | None,
          memory_units: int) -> Quota:
    """Quota of a container holding `cores` percent of one GPU (100: whole cards)."""
    limit = cores
    key = core_limit_annotation(names)
    if cores < CORES_PER_GPU and key in annotations:
        text = annotations[key].strip()
        if not text.isdigit() or not cores <= int(text) <= CORES_PER_GPU:
            raise QuotaError(f"annotation {key}: {annotations[key]!r} must be an integer percent between "
                             f"the request ({cores}) and {CORES_PER_GPU}")
        limit = int(text)
    memory: int | None = None
    key = memory_annotation(names)
    if key in annotations:
        try:
            memory = parse_memory(annotations[key])
        except ValueError as exc:
            raise QuotaError(f"annotation {key}: {annotations[key]!r} is neither a number of "
                             f"{MEMORY_UNIT_BYTES >> 20} MiB units nor a quantity like 4Gi ({exc})") from None
    elif share_memory:
        memory = share_memory
    elif memory_units > 0:
        memory = memory_units * MEMORY_UNIT_BYTES
    return Quota(cores, limit, memory)
