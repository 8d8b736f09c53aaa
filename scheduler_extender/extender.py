"""kube-scheduler extender semantics: filter, prioritize, bind (transport-free).

Request and response shapes follow k8s.io/kube-scheduler/extender/v1 exactly.
Those Go types carry no JSON tags, so the keys are the Go field names
(``Pod``, ``Nodes``, ``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``,
``Error``, ``Host``, ``Score``, ``PodName``, ``PodNamespace``, ``PodUID``, ``Node``);
Go decodes keys case-insensitively, so we read them that way too.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, Protocol

from kube_contract.assignment import encode
from kube_contract.names import Names

from .placement import Placement, PodRequest, Policy, Unfit, to_priority
from .podspec import PodSpecError, parse_pod, pod_ref, pod_uid
from .state import ClusterState

log = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = 10  # extenderv1.MaxExtenderPriority


class BindError(Exception):
    """The API server refused the annotation patch or the binding."""


class Binder(Protocol):
    def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    def bind(self, namespace: str, name: str, uid: str, node: str,
             annotations: dict[str, str]) -> None: ...


def field(obj: dict[str, Any], name: str) -> Any:
    """Go-style lookup: exact key first, then case-insensitive."""
    if name in obj:
        return obj[name]
    low = name.lower()
    for key, value in obj.items():
        if key.lower() == low:
            return value
    return None


class Extender:
    def __init__(self, state: ClusterState, binder: Binder, *,
                 default_policy: Policy = Policy.BINPACK, cache_size: int = 1024) -> None:
        self.state = state
        self.names: Names = state.names
        self.binder = binder
        self.default_policy = default_policy
        self._cache_size = cache_size
        # pod uid -> (pod JSON, state generation, results): filter's work reused by
        # prioritize, and the pod object bind needs (bind args carry only its name).
        self._seen: OrderedDict[str, tuple[dict[str, Any], int, dict[str, Placement | Unfit]]]
        self._seen = OrderedDict()
        self._seen_lock = threading.Lock()  # HTTP handlers run on many threads
        self._node_annotations: dict[str, str | None] = {}

    # ---- verbs ---------------------------------------------------------------

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        pod = field(args, "Pod")
        node_list = field(args, "Nodes")
        node_names = field(args, "NodeNames")
        items = (node_list or {}).get("items") or [] if isinstance(node_list, dict) else []
        names = (list(node_names) if node_names is not None
                 else [(n.get("metadata") or {}).get("name", "") for n in items])
        out: dict[str, Any] = {"Nodes": None, "NodeNames": None, "FailedNodes": {},
                               "FailedAndUnresolvableNodes": {}, "Error": ""}
        if not isinstance(pod, dict):
            out["Error"] = "ExtenderArgs.Pod is missing"
            return out
        self._learn_nodes(items)
        passed = self._filter(pod, names, out)
        if node_names is not None:
            out["NodeNames"] = passed
        else:
            keep = set(passed)
            out["Nodes"] = {"metadata": {}, "items": [
                n for n in items if (n.get("metadata") or {}).get("name") in keep]}
        return out

    def _filter(self, pod: dict[str, Any], names: list[str], out: dict[str, Any]) -> list[str]:
        """Fill FailedNodes / FailedAndUnresolvableNodes; return the nodes that fit."""
        try:
            request = parse_pod(pod, self.names, self.default_policy)
        except PodSpecError as e:
            out["FailedAndUnresolvableNodes"] = dict.fromkeys(names, f"pod {pod_ref(pod)}: {e}")
            return []
        if not request.containers:  # asks for no GPU: every node will do
            return list(names)
        results = self._evaluate(pod, request, names)
        passed = []
        for n in names:
            r = results[n]
            if isinstance(r, Placement):
                passed.append(n)
            else:
                key = "FailedAndUnresolvableNodes" if r.unresolvable else "FailedNodes"
                out[key][n] = r.reason
        if not passed and names:
            reasons = list(out["FailedNodes"].values()) + list(
                out["FailedAndUnresolvableNodes"].values())
            log.info("pod %s fits no node: %s", pod_ref(pod), "; ".join(reasons[:3]))
        return passed

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        pod = field(args, "Pod")
        node_names = field(args, "NodeNames")
        if node_names is None:
            items = (field(args, "Nodes") or {}).get("items") or []
            self._learn_nodes(items)
            node_names = [(n.get("metadata") or {}).get("name", "") for n in items]
        if not isinstance(pod, dict):
            return [{"Host": n, "Score": 0} for n in node_names]
        try:
            request = parse_pod(pod, self.names, self.default_policy)
        except PodSpecError:
            return [{"Host": n, "Score": 0} for n in node_names]
        if not request.containers:
            return [{"Host": n, "Score": 0} for n in node_names]
        results = self._evaluate(pod, request, node_names, reuse=True)
        # to_priority(score, MAX_EXTENDER_PRIORITY), memoised: many nodes share a score
        priority: dict[float, int] = {}
        out = []
        for n in node_names:
            r = results[n]
            if isinstance(r, Placement):
                score = r.score
                p = priority.get(score)
                if p is None:
                    p = priority[score] = to_priority(score, MAX_EXTENDER_PRIORITY)
                out.append({"Host": n, "Score": p})
            else:
                out.append({"Host": n, "Score": 0})
        return out

    def bind(self, args: dict[str, Any]) -> dict[str, str]:
        name = field(args, "PodName") or ""
        namespace = field(args, "PodNamespace") or "default"
        uid = field(args, "PodUID") or ""
        node = field(args, "Node") or ""
        ref = f"{namespace}/{name}"
        if not name or not node:
            return {"Error": "ExtenderBindingArgs needs PodName and Node"}
        try:
            pod = self._pod(namespace, name, uid)
            request = parse_pod(pod, self.names, self.default_policy)
        except (BindError, PodSpecError) as e:
            return {"Error": f"pod {ref}: {e}"}
        uid = uid or pod_uid(pod)
        annotations: dict[str, str] = {}
        if request.containers:
            result = self.state.reserve(uid, ref, request, node)
            if isinstance(result, Unfit):
                return {"Error": f"pod {ref}: {result.reason}"}
            annotations[self.names.assignment] = encode(result.to_assignment())
        try:
            self.binder.bind(namespace, name, uid, node, annotations)
        except Exception as e:  # any failure must release the GPUs we reserved
            self.state.release(uid)
            log.warning("bind %s -> %s failed: %s", ref, node, e)
            return {"Error": f"binding pod {ref} to node {node}: {e}"}
        with self._seen_lock:
            self._seen.pop(uid, None)
        log.info("bound %s to %s %s", ref, node, annotations.get(self.names.assignment, ""))
        return {"Error": ""}

    # ---- helpers ---------------------------------------------------------------

    def _evaluate(self, pod: dict[str, Any], request: PodRequest, names: list[str],
                  reuse: bool = False) -> dict[str, Placement | Unfit]:
        uid = pod_uid(pod)
        with self._seen_lock:
            cached = self._seen.get(uid) if uid else None
        if (reuse and cached is not None and cached[1] == self.state.generation
                and all(map(cached[2].__contains__, names))):
            return cached[2]
        with self.state.lock:  # generation and results must match
            generation = self.state.generation
            results = self.state.evaluate(request, names)
        if uid:
            with self._seen_lock:
                self._seen[uid] = (pod, generation, results)
                self._seen.move_to_end(uid)
                while len(self._seen) > self._cache_size:
                    self._seen.popitem(last=False)
        return results

    def _pod(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        with self._seen_lock:
            cached = self._seen.get(uid) if uid else None
        if cached is not None:
            return cached[0]
        pod = self.binder.get_pod(namespace, name)
        if uid and pod_uid(pod) != uid:
            raise BindError(f"pod UID is {pod_uid(pod)}, the scheduler asked for {uid}")
        return pod

    def _learn_nodes(self, items: list[dict[str, Any]]) -> None:
        """Nodes sent in full (nodeCacheCapable: false) also carry the topology annotation."""
        key = self.names.topology
        for n in items:
            meta = n.get("metadata") or {}
            name = meta.get("name")
            raw = (meta.get("annotations") or {}).get(key)
            if name and self._node_annotations.get(name, "") != raw:
                self._node_annotations[name] = raw
                self.state.observe_node(n)
