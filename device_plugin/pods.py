"""Which container an Allocate is for: kubelet sends only device IDs.

With the scheduler extender, the pod carries ``vcuda.io/gpu-assignment``
(kube_contract.assignment): the container whose assigned GPUs and cores
equal what the IDs say, on a pod bound to this node and not allocated yet, is
the one; when several match and are interchangeable (same quota in every
respect), the oldest is taken provisionally and the reconciler confirms or
corrects the identity from kubelet's pod-resources List. Without it (no
extender), a not-yet-allocated container on this node asking for exactly that
many cores is taken when it is the only one. Anything
else — several matches, a malformed annotation, an assignment that names other
GPUs — fails the container with a message that says what to fix: guessing
wrong would give one pod another's quota. On a node with one GPU there is
nothing to get wrong about the GPU, so an unidentified container is served
anonymously (the exporter later learns its pod from pod-resources).

Init containers asking for the resource are candidates too, in kubelet's
order (`waiting`): a pod's init containers are allocated before its app
containers. The extender places them with the app containers, on the GPUs
where kubelet's reuse of their devices puts them (scheduler_extender.placement,
PodUse), so they are matched like app containers; an init container that an
older assignment does not name is accepted on any of its pod's GPUs.

"Oldest" is kubelet's order: the order pods were bound to the node, which is the order they reach
kubelet's watch and so its admission. The agent's own watch of the node's pods sees them in the same
order (`Arrivals`); creationTimestamp (one-second resolution: pods created together tie, and names
would then decide) orders only the pods the watch has not numbered.

Pods come from a `PodSource`; the real one asks the API server through the
``kubernetes`` client, tests pass a list.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from device_plugin.kubelet import AllocationError
from kube_contract import assignment
from kube_contract.apiclient import ListWatch
from kube_contract.names import CORES_PER_GPU, Names

log = logging.getLogger(__name__)

Pod = dict[str, Any]   # raw API JSON (camelCase), as the API server sends it


class PodSource(Protocol):
    def list_pods(self, node: str) -> list[Pod]:
        """Pods bound to `node`; raises OSError (or ApiException) when the API server cannot answer."""
        ...


ARRIVAL = "_vcudaArrival"   # set by KubePods on each pod it returns: its place in the order pods were bound


class Arrivals:
    """The order in which the node's pods were bound to it, as this agent's pod watch saw them (the
    order kubelet, watching the same pods, receives and admits them). Thread-safe."""

    def __init__(self) -> None:
        self._next = 0
        self._seq: dict[str, int] = {}
        self._lock = threading.Lock()

    def listed(self, pods: Sequence[Pod]) -> None:
        """A (re)list: pods not numbered yet are numbered oldest first (their bind order is unknown);
        pods no longer listed are forgotten (a deletion the watch missed)."""
        present = {meta(p).get("uid", "") for p in pods}
        with self._lock:
            self._seq = {uid: n for uid, n in self._seq.items() if uid in present}
        for pod in sorted(pods, key=_age):
            self.note("ADDED", pod)

    def note(self, kind: str, pod: Pod) -> None:
        uid = meta(pod).get("uid", "")
        if not uid:
            return
        with self._lock:
            if kind == "DELETED":
                self._seq.pop(uid, None)
            elif uid not in self._seq and (pod.get("spec") or {}).get("nodeName"):
                self._seq[uid] = self._next
                self._next += 1

    def of(self, pod: Pod) -> int | None:
        with self._lock:
            return self._seq.get(meta(pod).get("uid", ""))


class StaticPods:
    """A fixed list, for tests and for running without an API server (empty)."""

    def __init__(self, pods: Sequence[Pod] = ()) -> None:
        self.pods = list(pods)

    def list_pods(self, node: str) -> list[Pod]:
        return [p for p in self.pods if p.get("spec", {}).get("nodeName") == node]


class KubePods:
    """Pods on a node from the API server (field selector spec.nodeName)."""

    def __init__(self, api: Any, timeout: float = 5.0, arrivals: Arrivals | None = None) -> None:
        self.api = api            # kubernetes.client.CoreV1Api
        self.timeout = timeout
        self.arrivals = arrivals  # the pod watch's bind order: each pod returned carries its number (ARRIVAL)

    def list_pods(self, node: str) -> list[Pod]:
        resp = self.api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}",
                                                    _preload_content=False, _request_timeout=self.timeout)
        raw = getattr(resp, "response", resp)
        pods = list(json.loads(raw.data).get("items", []))
        if self.arrivals is not None:
            for pod in pods:
                n = self.arrivals.of(pod)
                if n is not None:
                    pod[ARRIVAL] = n
        return pods


@dataclass(frozen=True)
class PodMatch:
    namespace: str
    pod: str
    uid: str
    container: str
    annotations: dict[str, str]
    env: dict[str, str]                        # the container's literal env (valueFrom not resolved)
    shares: tuple[assignment.GPUShare, ...]    # from the extender; empty without it
    spec: dict[str, Any]                       # the container's spec
    provisional: bool = False                  # chosen among several waiting containers (see identify)
    init: bool = False                         # an init container (runs before the pod's app containers)
    sidecar: bool = False                      # an init container with restartPolicy Always (runs beside them)


def meta(pod: Pod) -> dict[str, Any]:
    return pod.get("metadata", {})


def pod_name(pod: Pod) -> str:
    m = meta(pod)
    return f"{m.get('namespace', '')}/{m.get('name', '')}"


def requested(container: dict[str, Any], resource: str) -> int:
    res = container.get("resources", {})
    value = res.get("limits", {}).get(resource, res.get("requests", {}).get(resource, 0))
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _match(pod: Pod, container: dict[str, Any], shares: tuple[assignment.GPUShare, ...],
           init: bool = False) -> PodMatch:
    m = meta(pod)
    env = {e["name"]: str(e.get("value", "")) for e in container.get("env", []) if "name" in e}
    return PodMatch(m.get("namespace", ""), m.get("name", ""), m.get("uid", ""), container["name"],
                    dict(m.get("annotations") or {}), env, shares, container, init=init,
                    sidecar=init and container.get("restartPolicy") == "Always")


def _quota_inputs(m: PodMatch, names: Names, resource: str, count: int,
                  opt_out_namespaces: Collection[str]) -> tuple[object, ...]:
    prefix = names.annotation_prefix + "/"
    quota_annotations = tuple(sorted((k, v) for k, v in m.annotations.items()
                                     if k.startswith(prefix) and k != names.assignment))
    # VCUDA_DISABLE=1 counts only where it takes effect (device_plugin.vgpu `_opted_out`): whole GPUs,
    # or a share in a namespace the operator lets opt out. Elsewhere it is ignored, so it tells nothing apart.
    opts_out = m.env.get("VCUDA_DISABLE") == "1" and (count >= CORES_PER_GPU or m.namespace in opt_out_namespaces)
    return (m.shares, quota_annotations, requested(m.spec, names.memory_resource), opts_out)


def finished(pod: Pod) -> bool:
    """Succeeded or Failed: every container has ended for good and its devices are free again."""
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def _live(pod: Pod) -> bool:
    return not finished(pod) and not meta(pod).get("deletionTimestamp")


def _age(pod: Pod) -> tuple[str, str, str]:
    m = meta(pod)
    return m.get("creationTimestamp", ""), m.get("namespace", ""), m.get("name", "")


def _admission(pod: Pod) -> tuple[int, int, tuple[str, str, str]]:
    """kubelet's order: bound first (ARRIVAL, where the watch numbered it), then the oldest; a pod the
    watch has not seen yet was bound after every one it has."""
    n = pod.get(ARRIVAL)
    return (0, n, _age(pod)) if isinstance(n, int) else (1, 0, _age(pod))


def containers_of(pod: Pod) -> list[tuple[dict[str, Any], bool]]:
    """(container, is init container) in the order kubelet allocates them: init containers first."""
    spec = pod.get("spec", {})
    return [(c, True) for c in spec.get("initContainers") or []] + [(c, False) for c in spec.get("containers") or []]


def container_spec(pod: Pod, name: str) -> dict[str, Any]:
    return next((c for c, _ in containers_of(pod) if c.get("name") == name), {})


@dataclass(frozen=True)
class Waiting:
    pod: Pod
    container: dict[str, Any]
    init: bool


def waiting(pods: Sequence[Pod], resource: str, allocated: Collection[tuple[str, str]]) -> list[Waiting]:
    """The container of each live pod that kubelet allocates `resource` for next, oldest pod first.

    kubelet admits a pod by allocating its containers one at a time, init
    containers first, each in spec order: so in a pod only the first container
    that asks for the resource and is not allocated yet can be the one an
    Allocate is for.
    """
    out = []
    for pod in sorted((p for p in pods if _live(p)), key=_admission):
        uid = meta(pod).get("uid", "")
        for c, init in containers_of(pod):
            if requested(c, resource) > 0 and (uid, c.get("name")) not in allocated:
                out.append(Waiting(pod, c, init))
                break
    return out


def pod_gpus(decided: assignment.Assignment) -> tuple[str, ...]:
    """Every GPU the extender gave a pod, in assignment order."""
    return tuple(dict.fromkeys(g.uuid for c in decided.containers for g in c.gpus))


def assigned_gpus(pods: Sequence[Pod], *, names: Names, resource: str, count: int,
                  allocated: Collection[tuple[str, str]]) -> list[tuple[tuple[str, ...], bool]]:
    """For each container that may get `count` devices now, oldest pod first, and that the extender
    placed: (its GPUs, exact). exact: a container gets exactly its assigned GPUs; an init container
    that an older assignment does not name runs on any of its pod's GPUs before them.
    GetPreferredAllocation steers kubelet by this; `identify` then cross-checks the same way."""
    out = []
    for w in waiting(pods, resource, allocated):
        if requested(w.container, resource) != count:
            continue
        text = (meta(w.pod).get("annotations") or {}).get(names.assignment)
        if text is None:
            continue
        try:
            decided = assignment.decode(text)
        except assignment.AssignmentError:
            continue
        entry = decided.container(w.container.get("name", ""))
        if entry is not None:
            out.append((tuple(g.uuid for g in entry.gpus), True))
        elif w.init and pod_gpus(decided):
            out.append((pod_gpus(decided), False))
    return out


def identify(pods: Sequence[Pod], *, node: str, names: Names, resource: str, cores: dict[str, int],
             count: int, allocated: Collection[tuple[str, str]], single_gpu: bool,
             opt_out_namespaces: Collection[str] = ()) -> PodMatch | None:
    """The container these device IDs belong to, or None to serve it anonymously.

    `cores` is the share per GPU UUID the IDs stand for, `count` the number of
    IDs, `allocated` the (pod uid, container) pairs already served. A match made
    while other containers of the same size were waiting too is provisional: the
    reconciler confirms or corrects it from kubelet's pod-resources List (not for
    init containers, which that List does not report).
    """
    candidates = [w for w in waiting(pods, resource, allocated) if requested(w.container, resource) == count]
    found: list[PodMatch] = []
    problems: list[str] = []
    unassigned: list[PodMatch] = []
    for w in candidates:
        pod, c = w.pod, w.container
        text = (meta(pod).get("annotations") or {}).get(names.assignment)
        if text is None:
            unassigned.append(_match(pod, c, (), w.init))
            continue
        try:
            decided = assignment.decode(text)
        except assignment.AssignmentError as exc:
            problems.append(f"pod {pod_name(pod)} has a malformed {names.assignment} annotation ({exc}); "
                            "fix or remove it and re-create the pod")
            continue
        if decided.node != node:
            problems.append(f"pod {pod_name(pod)} is assigned to node {decided.node!r} by its "
                            f"{names.assignment} annotation but runs on {node!r}; re-create the pod")
            continue
        entry = decided.container(c["name"])
        if entry is None:
            if not w.init:
                continue
            # An assignment from before the extender placed init containers: any of its pod's GPUs.
            if set(cores) <= set(pod_gpus(decided)):
                found.append(_match(pod, c, (), init=True))
            else:
                problems.append(f"pod {pod_name(pod)} init container {c['name']} got GPUs {sorted(cores)}, none of "
                                f"its pod's GPUs {list(pod_gpus(decided))}; check that kubelet uses the plugin's "
                                "preferred allocation")
            continue
        want = {g.uuid: g.cores for g in entry.gpus}
        if want == cores:
            found.append(_match(pod, c, entry.gpus, w.init))
        else:
            problems.append(f"pod {pod_name(pod)} container {c['name']} was assigned {want} by the "
                            f"extender but kubelet allocated {cores}; check that kubelet uses the "
                            "plugin's preferred allocation and that the extender manages this node")

    def chosen(m: PodMatch) -> PodMatch:
        # Others of this size were waiting too: kubelet may have meant one of them (GetPreferredAllocation
        # guessed the oldest), so the reconciler checks the identity against kubelet's own record.
        return dataclasses.replace(m, provisional=len(candidates) > 1 and not m.init)

    if len(found) == 1:
        return chosen(found[0])
    if len(found) > 1 and len({_quota_inputs(f, names, resource, count, opt_out_namespaces) for f in found}) == 1:
        # Interchangeable containers (same GPU, cores, quota annotations, memory, effective opt-out): any
        # choice enforces the same quota, so take the oldest now and let the reconciler confirm or
        # correct the identity from kubelet's pod-resources List, which knows the devices' owner.
        return dataclasses.replace(found[0], provisional=not found[0].init)
    if len(found) > 1:
        which = ", ".join(f"{f.namespace}/{f.pod}:{f.container}" for f in found)
        raise AllocationError(f"ambiguous: containers {which} are all assigned {cores}; "
                              "start them one at a time or give them different GPUs")
    if problems:
        raise AllocationError("; ".join(problems))
    if len(unassigned) == 1:
        return chosen(unassigned[0])
    if single_gpu:
        if unassigned:
            log.info("%d containers on this node ask for %d; serving this one anonymously",
                     len(unassigned), count)
        return None
    if unassigned:
        which = ", ".join(f"{u.namespace}/{u.pod}:{u.container}" for u in unassigned)
        raise AllocationError(f"cannot tell which container these devices are for ({which} all ask for "
                              f"{count}); deploy the vcuda scheduler extender for nodes with several GPUs")
    raise AllocationError(f"no pod on node {node!r} asks for {count} {resource} on {sorted(cores)}; "
                          "is the API server reachable and the node name (--node-name) right?")


class NoPods:
    """No API server: every list fails, so Allocate serves single-GPU nodes anonymously and refuses otherwise."""

    def __init__(self, why: str) -> None:
        self.why = why

    def list_pods(self, node: str) -> list[Pod]:
        raise OSError(f"no API server ({self.why})")


class PodWatch(ListWatch):
    """Watches the pods of one node and calls `on_event()` for every change, so quota
    annotation edits and deletions are acted on at once rather than at the next resync.

    List (for a resourceVersion), then watch from it; relist on 410 Gone or any error.
    """

    def __init__(self, api: Any, node: str, on_event: Callable[[], None], *, watch_timeout: int = 240,
                 retry_s: float = 2.0, arrivals: Arrivals | None = None) -> None:
        self.api = api            # kubernetes.client.CoreV1Api
        self.node = node

        def event(kind: str, obj: Pod) -> None:
            if arrivals is not None:
                arrivals.note(kind, obj)
            on_event()

        super().__init__(functools.partial(api.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}"),
                         "pod-watch", on_event=event, on_list=arrivals.listed if arrivals is not None else None,
                         watch_timeout=watch_timeout, retry_s=retry_s)
