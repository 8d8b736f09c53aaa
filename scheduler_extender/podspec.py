"""Pod JSON (as kube-scheduler and the API server send it) -> what the pod asks for."""

from __future__ import annotations

from typing import Any

from kube_contract.names import CORES_PER_GPU, MEMORY_UNIT_BYTES, Names

from .placement import ContainerRequest, PodRequest, Policy, Tags

_TERMINAL_PHASES = ("Succeeded", "Failed")


class PodSpecError(ValueError):
    """The pod asks for something no node can give; the message is for the pod's owner."""


def pod_uid(pod: dict[str, Any]) -> str:
    return str(pod.get("metadata", {}).get("uid") or "")


def pod_ref(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def is_terminal(pod: dict[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") in _TERMINAL_PHASES


def meta_value(pod: dict[str, Any], key: str) -> str | None:
    """Annotation, else label (Gemini users put group tags in labels)."""
    meta = pod.get("metadata", {})
    for section in ("annotations", "labels"):
        value = (meta.get(section) or {}).get(key)
        if value is not None:
            return str(value).strip() or None
    return None


def _count(value: Any, resource: str, container: str) -> int:
    # Extended resources are integers; kube accepts "30" or 30.
    try:
        n = int(str(value).strip())
    except ValueError:
        raise PodSpecError(f"container {container!r}: {resource}={value!r} "
                           "is not a whole number") from None
    if n < 0:
        raise PodSpecError(f"container {container!r}: {resource}={n} is negative")
    return n


def container_request(container: dict[str, Any], names: Names) -> ContainerRequest | None:
    """The GPU share one container asks for, or None when it asks for none."""
    name = str(container.get("name", "?"))
    res = container.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}

    def get(resource: str) -> int:
        value = limits.get(resource, requests.get(resource))
        return 0 if value is None else _count(value, resource, name)

    cores, units = get(names.core_resource), get(names.memory_resource)
    if cores == 0 and units == 0:
        return None
    if cores == 0:
        raise PodSpecError(f"container {name!r}: {names.memory_resource} without "
                           f"{names.core_resource}; ask for cores too")
    if cores > CORES_PER_GPU and cores % CORES_PER_GPU:
        raise PodSpecError(f"container {name!r}: {names.core_resource}={cores} is neither "
                           f"below {CORES_PER_GPU} (a share of one GPU) nor a multiple of "
                           f"{CORES_PER_GPU} (whole GPUs)")
    return ContainerRequest(name, cores, units * MEMORY_UNIT_BYTES)


def _words(value: str | None) -> tuple[str, ...]:
    return tuple(w.strip() for w in (value or "").split(",") if w.strip())


def parse_pod(pod: dict[str, Any], names: Names,
              default_policy: Policy = Policy.BINPACK) -> PodRequest:
    """Read the pod's GPU requests, policy, model filter and tags; raises PodSpecError."""
    spec = pod.get("spec") or {}
    containers = tuple(r for c in spec.get("containers") or []
                       if (r := container_request(c, names)) is not None)
    inits = [r for c in spec.get("initContainers") or [] if (r := container_request(c, names)) is not None]
    lead = max(inits, key=lambda r: r.cores, default=None)
    riders: tuple[ContainerRequest, ...] = ()
    lead_memory = 0
    if lead is not None and lead.cores > sum(c.cores for c in containers):
        # kube-scheduler counts the pod as its largest init container here; kubelet gives that
        # container's devices to the app containers after it, so they all run on its GPU.
        if lead.whole_cards:
            raise PodSpecError(f"init container {lead.name!r}: {names.core_resource}={lead.cores} is more "
                               "than the app containers ask for together; vcuda cannot place whole-GPU "
                               "init containers larger than their pod's app containers")
        if any(c.whole_cards for c in containers):
            raise PodSpecError(f"init container {lead.name!r} asks for more cores than app containers "
                               "that include whole GPUs")
        riders, containers, lead_memory = containers, (ContainerRequest(
            lead.name, lead.cores, max(lead.memory, sum(c.memory for c in containers))),), lead.memory
    raw_policy = meta_value(pod, names.policy)
    if raw_policy is None:
        policy = default_policy
    else:
        try:
            policy = Policy(raw_policy.lower())
        except ValueError:
            raise PodSpecError(f"annotation {names.policy}={raw_policy!r}: "
                               "use 'binpack' or 'spread'") from None
    return PodRequest(
        containers=containers,
        policy=policy,
        model_include=_words(meta_value(pod, names.model_include)),
        model_exclude=_words(meta_value(pod, names.model_exclude)),
        tags=pod_tags(pod, names),
        riders=riders,
        lead_memory=lead_memory,
    )


def pod_tags(pod: dict[str, Any], names: Names) -> Tags:
    return Tags(affinity=meta_value(pod, names.affinity),
                anti_affinity=meta_value(pod, names.anti_affinity),
                exclusion=meta_value(pod, names.exclusion))
