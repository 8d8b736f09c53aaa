"""A container's quota from its pod: cores from the device IDs, the elastic cap
from ``vcuda.io/core-limit``, the priority class from ``vcuda.io/priority``
(``high`` or ``normal``), memory from ``vcuda.io/memory`` > the extender's
assignment > the container's ``vcuda-memory`` units. Allocate and the live
update path both use this, so a pod means the same thing at start and later.

Why memory is read here and not in the vcuda-memory resource's own Allocate:
kubelet allocates each resource separately and tells neither which container
it is for, nor which GPU the other resource went to. Like GPU-Manager, the
memory resource only does the node's accounting (kubelet and the scheduler
see capacity and use); the limit is applied by the core Allocate, which knows
the GPU and the pod.

Memory is the container's, like its vcuda-memory units (and ``vcuda.io/memory``,
which overrides them and so means the same): a request of whole cards spreads
it evenly over them (200 cores and 64 units, 16 GiB, is 8 GiB per card), as
the extender does when it checks that a card is big enough. The extender's own
figure is already per GPU. ``vcuda.io/core-limit`` on whole cards is refused
unless it is 100: they have no token scheduler to cap them; so is
``vcuda.io/priority: high`` (nothing to revoke for them).
"""

from __future__ import annotations

from dataclasses import dataclass

from kube_contract.names import CORES_PER_GPU, MEMORY_UNIT_BYTES, Names, parse_memory
from token_scheduler.policy import HIGH, NORMAL, PRIORITIES


class QuotaError(ValueError):
    """An annotation with a value that cannot be used; the message names it."""


@dataclass(frozen=True)
class Quota:
    core_request: int
    core_limit: int
    memory_limit: int | None   # bytes per GPU
    priority: str = NORMAL


def core_limit_annotation(names: Names) -> str:
    return f"{names.annotation_prefix}/core-limit"


def priority_annotation(names: Names) -> str:
    return f"{names.annotation_prefix}/priority"


def parse_priority(names: Names, annotations: dict[str, str], cores: int) -> str:
    key = priority_annotation(names)
    if key not in annotations:
        return NORMAL
    text = annotations[key].strip()
    if text not in PRIORITIES:
        raise QuotaError(f"annotation {key}: {annotations[key]!r} is not a priority; use one of "
                         f"{', '.join(PRIORITIES)}")
    if text == HIGH and cores >= CORES_PER_GPU:
        raise QuotaError(f"annotation {key}: {text!r} cannot apply to whole GPUs, which share with nobody; "
                         f"remove it, or ask for fewer than {CORES_PER_GPU} cores to share a GPU")
    return text


def quota(names: Names, annotations: dict[str, str], *, cores: int, share_memory: int | None,
          memory_units: int, gpus: int = 1) -> Quota:
    """Quota of a container holding `cores` percent of one GPU (100: `gpus` whole cards)."""
    limit = cores
    key = core_limit_annotation(names)
    if key in annotations:
        text = annotations[key].strip()
        if cores >= CORES_PER_GPU and text != str(CORES_PER_GPU):
            # Whole cards have no token scheduler to cap them: say so rather than ignore the cap.
            raise QuotaError(f"annotation {key}: {annotations[key]!r} cannot apply to whole GPUs, which run "
                             f"unthrottled; remove it, or ask for fewer than {CORES_PER_GPU} cores to share a GPU")
        if not text.isdigit() or not cores <= int(text) <= CORES_PER_GPU:
            raise QuotaError(f"annotation {key}: {annotations[key]!r} must be an integer percent between "
                             f"the request ({cores}) and {CORES_PER_GPU}")
        limit = int(text)
    memory: int | None = None
    key = names.memory
    if key in annotations:
        try:
            memory = parse_memory(annotations[key]) // gpus
        except ValueError as exc:
            raise QuotaError(f"annotation {key}: {annotations[key]!r} is neither a number of "
                             f"{MEMORY_UNIT_BYTES >> 20} MiB units nor a quantity like 4Gi ({exc})") from None
    elif share_memory:
        memory = share_memory
    elif memory_units > 0:
        memory = memory_units * MEMORY_UNIT_BYTES // gpus
    return Quota(cores, limit, memory, parse_priority(names, annotations, cores))
