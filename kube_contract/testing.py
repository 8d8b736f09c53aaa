"""Test doubles for tests and the benchmarks, importable outside pytest.

Scenario builders: nodes, topologies and pods as JSON, in the shapes the API server and
kube-scheduler send (camelCase pod/node JSON).

`FakeApiServer`: just enough of the Kubernetes API server, on 127.0.0.1, for the extender
(scheduler_extender.kube), the device plugin agent (device_plugin.pods, node_topology) and
the DRA driver (dra_driver.kube):

- GET /api/v1/nodes and /api/v1/pods: a list, or with ``watch=true`` a chunked stream of
  newline-delimited events after ``resourceVersion`` that ends after ``timeoutSeconds``,
  capped at `max_watch_s` (a quiet watch just stays open that long); ``fieldSelector``
  (``spec.nodeName=NAME``; any dotted field, terms ANDed) filters both.
- GET and PATCH /api/v1/nodes/NAME and /api/v1/namespaces/NS/pods/NAME: PATCH takes only
  ``application/merge-patch+json`` and merges metadata annotations and labels (null
  deletes), after a ``metadata.uid`` precondition when the patch carries one.
- POST /api/v1/namespaces/NS/pods/NAME/binding sets ``spec.nodeName`` once.
- POST /api/v1/namespaces/NS/events creates an Event (kept in ``objects["events"]``, key
  ``NS/NAME``; 409 when the name is taken); GET lists them.
- Secrets: POST /api/v1/namespaces/NS/secrets (create: 409 when the name is taken), GET and PUT
  (replace: 409 unless ``metadata.resourceVersion`` is the stored one) .../secrets/NAME.
- admissionregistration.k8s.io/v1: GET, PUT (as for Secrets) and PATCH (``application/json-patch+json``:
  ``test``, ``add`` and ``replace``; 422 when a test fails) /apis/admissionregistration.k8s.io/v1/
  mutatingwebhookconfigurations/NAME.
- resource.k8s.io/v1: GET /apis/resource.k8s.io/v1/namespaces/NS/resourceclaims/NAME;
  /apis/resource.k8s.io/v1/resourceslices: GET (list, ``fieldSelector``), POST (create: 409
  when the name is taken), and per NAME GET, PUT (replace: 409 unless ``metadata.resourceVersion``
  is the stored one) and DELETE. Created objects get a ``uid``. A slice written is checked
  against the counter set rules of the server's `version` (`slice_problems`): 422 Invalid, as the
  real API server answers, when it breaks one.
- GET /version: the server's `version` (discovery's VersionInfo), 1.36.3 unless told otherwise.

Every write becomes a watch event. Injection knobs: ``fail_requests`` answers that many
next requests (any route) with 503; ``fail_bind`` (a message) fails every binding with 500;
``gone`` answers that many next watches with 410 Gone. ``requests`` records every request.
"""

from __future__ import annotations

import copy
import itertools
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlparse

from kube_contract.assignment import Assignment
from kube_contract.assignment import encode as encode_assignment
from kube_contract.names import CORES_PER_GPU, Names
from kube_contract.topology import GPUInfo, NodeTopology
from kube_contract.topology import encode as encode_topology

GiB = 1 << 30
A100 = ("NVIDIA A100-SXM4-80GB", 80 * GiB)
T4 = ("Tesla T4", 16 * GiB)
V100 = ("Tesla V100-SXM2-32GB", 32 * GiB)

_uids = itertools.count(1)
DEFAULT_NAMES = Names()
DEFAULT_VERSION = "1.36.3"   # the Kubernetes the fake API server is (FakeApiServer.version)


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


class Request(NamedTuple):
    """One request the fake API server received; ``body`` is the parsed JSON, None without one."""

    method: str
    path: str
    content_type: str | None
    body: Any


class FakeApiServer:
    """The fake API server (see the module docstring): ``objects[kind][key]`` holds the nodes
    (key: name) and pods (key: ``namespace/name``) as raw JSON; ``events[kind]`` every change
    as (resourceVersion, type, object). Hold ``lock`` to read them while it serves. `version`
    ("1.34.4"): what /version answers and whose ResourceSlice rules it applies; it may be changed
    while it serves (a control plane upgraded under a driver)."""

    def __init__(self, max_watch_s: float = 1.0, version: str = DEFAULT_VERSION) -> None:
        self.version = version
        self.lock = threading.Condition()
        self.rv = 100
        self.objects: dict[str, dict[str, dict[str, Any]]] = {k: {} for k in KINDS}
        self.events: dict[str, list[tuple[int, str, dict[str, Any]]]] = {k: [] for k in KINDS}
        self.requests: list[Request] = []
        self.fail_requests = 0
        self.fail_bind: str | None = None
        self.gone = 0
        self.max_watch_s = max_watch_s
        self.closed = False
        handler = type("Handler", (_Handler,), {"api": self})
        self.httpd = _QuietServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), name="fake-api-server", daemon=True).start()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.lock.notify_all()   # ends the open watches
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig for this server to ``path``; returns it."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "test"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        return path

    def core_v1(self) -> Any:
        """A kubernetes CoreV1Api on this server (no retries: a test sees each failure)."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.retries = False
        return client.CoreV1Api(client.ApiClient(cfg))

    def put(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store (add or replace) a copy of ``obj`` with the next resourceVersion; returns the copy."""
        with self.lock:
            self.rv += 1
            obj = copy.deepcopy(obj)
            meta = obj["metadata"]
            meta["resourceVersion"] = str(self.rv)
            key = _key(kind, meta)
            event = "MODIFIED" if key in self.objects[kind] else "ADDED"
            self.objects[kind][key] = obj
            self.events[kind].append((self.rv, event, copy.deepcopy(obj)))
            self.lock.notify_all()
            return obj

    def add_node(self, name: str) -> dict[str, Any]:
        """A bare Node (no status), enough to be patched."""
        return self.put("nodes", {"kind": "Node", "apiVersion": "v1",
                                  "metadata": {"name": name, "annotations": {}, "labels": {}}})

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        """A copy of the stored object, or None."""
        with self.lock:
            return copy.deepcopy(self.objects[kind].get(key))

    def delete(self, kind: str, key: str) -> None:
        with self.lock:
            obj = self.objects[kind].pop(key)
            self.rv += 1
            self.events[kind].append((self.rv, "DELETED", obj))
            self.lock.notify_all()


KINDS = {"nodes": "Node", "pods": "Pod", "events": "Event", "resourceclaims": "ResourceClaim",
         "resourceslices": "ResourceSlice", "secrets": "Secret",
         "mutatingwebhookconfigurations": "MutatingWebhookConfiguration"}
CLUSTER_SCOPED = ("nodes", "resourceslices", "mutatingwebhookconfigurations")
REPLACEABLE = ("resourceslices", "secrets", "mutatingwebhookconfigurations")   # PUT with a resourceVersion
RESOURCE_API = "resource.k8s.io/v1"


def version_info(version: str) -> dict[str, Any]:
    """What GET /version answers for Kubernetes `version` ("1.34.4")."""
    major, minor, _patch = version.split(".")
    return {"major": major, "minor": minor, "gitVersion": f"v{version}", "gitCommit": "0" * 40,
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.26.0",
            "compiler": "gc", "platform": "linux/amd64"}


def _minor(version: str) -> tuple[int, int]:
    major, minor, *_ = version.split(".")
    return int(major), int(minor)


# Size limits on counters, as resource.k8s.io's validation has them (pkg/apis/resource/types.go):
# 1.34.4's per slice and device, 1.36.3's per counter set, consumption and device.
LIMITS_1_34 = {"devices": 128, "shared counters": 32, "counters per device": 32, "device counters": 1024}
LIMITS_1_35 = {"devices": 128, "devices consuming counters": 64, "counter sets": 8, "counters per set": 32,
               "consumptions per device": 2, "counters per consumption": 32}


def slice_problems(spec: dict[str, Any], version: str) -> list[str]:
    """What the API server of `version` refuses in a ResourceSlice's spec, of the rules this fake knows:
    where a counter set may be, and the limits on counters (k8s.io/kubernetes pkg/apis/resource/validation,
    validateResourceSliceSpec and validateDevice, at v1.34.4 and v1.36.3).

    1.34: a device's ``consumesCounters`` names a counter set of the same slice's ``sharedCounters``, and
    only its counters. 1.35 on (KEP-4815 as changed for 1.35): a slice holds ``sharedCounters`` or
    ``devices``, never both; a device may consume counter sets of other slices of its pool."""
    devices = spec.get("devices")
    sets = spec.get("sharedCounters")
    consumptions = [(f"spec.devices[{i}].consumesCounters[{j}]", c) for i, d in enumerate(devices or [])
                    for j, c in enumerate(d.get("consumesCounters") or [])]
    out = []
    if _minor(version) < (1, 35):
        limit = LIMITS_1_34
        defined = {s.get("name"): set(s.get("counters") or {}) for s in sets or []}
        for path, c in consumptions:
            if c.get("counterSet") not in defined:
                out.append(f'{path}.counterSet: Invalid value: "{c.get("counterSet")}": must reference a '
                           "counterSet defined in the ResourceSlice sharedCounters")
                continue
            out += [f'{path}.counters: Invalid value: "{name}": must reference a counter defined in the '
                    "ResourceSlice sharedCounters" for name in c.get("counters") or {}
                    if name not in defined[c["counterSet"]]]
        for i, d in enumerate(devices or []):
            n = sum(len(c.get("counters") or {}) for c in d.get("consumesCounters") or [])
            if n > limit["counters per device"]:
                out.append(f"spec.devices[{i}]: Invalid value: {n}: the total number of counters must not "
                           f"exceed {limit['counters per device']}")
        n = sum(len(c.get("counters") or {}) for _, c in consumptions)
        if n > limit["device counters"]:
            out.append(f"spec.devices: Invalid value: {n}: the total number of counters in devices must not "
                       f"exceed {limit['device counters']}")
        n = sum(len(s.get("counters") or {}) for s in sets or [])
        if n > limit["shared counters"]:
            out.append(f"spec.sharedCounters: Invalid value: {n}: the total number of shared counters must not "
                       f"exceed {limit['shared counters']}")
        most = limit["devices"]
    else:
        limit = LIMITS_1_35
        if sets is not None and devices is not None:
            out.append('spec: Invalid value: "": only one of `sharedCounters` or `devices` is allowed')
        if len(sets or []) > limit["counter sets"]:
            out.append(f"spec.sharedCounters: Too many: {len(sets or [])}: must have at most "
                       f"{limit['counter sets']} items")
        out += [f"spec.sharedCounters[{i}].counters: Too many: {len(s.get('counters') or {})}: must have at most "
                f"{limit['counters per set']} items" for i, s in enumerate(sets or [])
                if len(s.get("counters") or {}) > limit["counters per set"]]
        for i, d in enumerate(devices or []):
            if len(d.get("consumesCounters") or []) > limit["consumptions per device"]:
                out.append(f"spec.devices[{i}].consumesCounters: Too many: {len(d['consumesCounters'])}: must "
                           f"have at most {limit['consumptions per device']} items")
        out += [f"{path}.counters: Too many: {len(c.get('counters') or {})}: must have at most "
                f"{limit['counters per consumption']} items" for path, c in consumptions
                if len(c.get("counters") or {}) > limit["counters per consumption"]]
        most = limit["devices consuming counters" if consumptions else "devices"]
    if len(devices or []) > most:
        out.append(f"spec.devices: Too many: {len(devices or [])}: must have at most {most} items")
    return out


def _key(kind: str, meta: dict[str, Any]) -> str:
    return meta["name"] if kind in CLUSTER_SCOPED else f"{meta['namespace']}/{meta['name']}"


def _route(path: str) -> tuple[str, str | None, str | None] | None:
    """(kind, key or None for the collection, subresource or None) of an API path; None: no route."""
    match path.strip("/").split("/"):
        case ["version"]:
            return "version", None, None
        case ["apis", "resource.k8s.io", "v1", "resourceslices"]:
            return "resourceslices", None, None
        case ["apis", "resource.k8s.io", "v1", "resourceslices", name]:
            return "resourceslices", name, None
        case ["apis", "resource.k8s.io", "v1", "namespaces", namespace, "resourceclaims", name]:
            return "resourceclaims", f"{namespace}/{name}", None
        case ["api", "v1", ("nodes" | "pods") as kind]:
            return kind, None, None
        case ["api", "v1", "nodes", name]:
            return "nodes", name, None
        case ["apis", "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", name]:
            return "mutatingwebhookconfigurations", name, None
        case ["api", "v1", "namespaces", _namespace, ("events" | "secrets") as kind]:
            return kind, None, None
        case ["api", "v1", "namespaces", namespace, "secrets", name]:
            return "secrets", f"{namespace}/{name}", None
        case ["api", "v1", "namespaces", namespace, "pods", name]:
            return "pods", f"{namespace}/{name}", None
        case ["api", "v1", "namespaces", namespace, "pods", name, sub]:
            return "pods", f"{namespace}/{name}", sub
    return None


def _selected(obj: dict[str, Any], field_selector: str) -> bool:
    """Whether ``obj`` matches a field selector of ``dotted.field=value`` terms, ANDed."""
    for term in filter(None, field_selector.split(",")):
        field_path, _, want = term.partition("=")
        value: Any = obj
        for part in field_path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if (value or "") != want:
            return False
    return True


def _merge(metadata: dict[str, Any], patch: dict[str, Any]) -> None:
    """A JSON merge patch of the annotations and labels in ``patch`` into ``metadata``."""
    for section in ("annotations", "labels"):
        merged = metadata.get(section) or {}
        for k, v in (patch.get(section) or {}).items():
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = v
        metadata[section] = merged


Response = tuple[int, dict[str, Any]]


def _failure(code: int, reason: str, message: str) -> Response:
    return code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                  "reason": reason, "code": code}


def _not_found(kind: str, key: str) -> Response:
    return _failure(404, "NotFound", f'{kind} "{key.rpartition("/")[2]}" not found')


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):   # a client that went away is no error here
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    """Records the request, applies `fail_requests`, then routes; the routes compute a
    `Response` under the server's lock and it is sent after (a watch streams instead)."""

    api: FakeApiServer
    protocol_version = "HTTP/1.1"  # watches stream chunked, like the real API server
    # Headers and body go out in two writes: with Nagle's algorithm the body waits for the client's
    # delayed ACK (40 ms a response). The real API server (Go) sets TCP_NODELAY too.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _handle(self) -> None:
        api = self.api
        if api.closed:
            # A keep-alive connection opened before `close` outlives the listening socket (its
            # handler thread goes on): a closed server answers nothing on it either.
            self.close_connection = True
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        content_type = self.headers.get("Content-Type")
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        selector = query.get("fieldSelector", "")
        with api.lock:
            api.requests.append(Request(self.command, self.path, content_type, body))
            failing = api.fail_requests > 0
            api.fail_requests -= failing
        match failing, self.command, _route(url.path):
            case True, _, _:
                response = _failure(503, "ServiceUnavailable", "the fake API server is unavailable on purpose")
            case _, "GET", ("version", None, None):
                response = 200, version_info(api.version)
            case _, "GET", (kind, None, None) if query.get("watch") == "true":
                self._watch(kind, selector, int(query.get("resourceVersion") or 0),
                            min(float(query.get("timeoutSeconds") or 1), api.max_watch_s))
                return
            case _, "GET", (kind, None, None):
                response = self._list(kind, selector)
            case _, "GET", (kind, str(key), None):
                obj = api.get(kind, key)
                response = _not_found(kind, key) if obj is None else (200, obj)
            case _, "PATCH", (kind, str(key), None):
                response = self._patch(kind, key, content_type, body or {})
            case _, "POST", ("pods", str(key), "binding"):
                response = self._bind(key, body or {})
            case _, "POST", ("resourceslices" as kind, None, None):
                response = self._create(kind, body or {})
            case _, "POST", (("events" | "secrets") as kind, None, None):
                body = body or {}
                body.setdefault("metadata", {})["namespace"] = url.path.strip("/").split("/")[3]
                response = self._create(kind, body)
            case _, "PUT", (kind, str(key), None) if kind in REPLACEABLE:
                response = self._replace(kind, key, body or {})
            case _, "DELETE", ("resourceslices" as kind, str(key), None):
                response = self._delete(kind, key)
            case _:
                response = _failure(404, "NotFound", "no route")
        data = json.dumps(response[1]).encode()
        self.send_response(response[0])
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _handle

    def _list(self, kind: str, selector: str) -> Response:
        with self.api.lock:
            items = [copy.deepcopy(o) for o in self.api.objects[kind].values() if _selected(o, selector)]
            rv = self.api.rv
        return 200, {"kind": f"{KINDS[kind]}List", "apiVersion": RESOURCE_API if kind.startswith("resource") else "v1",
                     "metadata": {"resourceVersion": str(rv)}, "items": items}

    def _patch(self, kind: str, key: str, content_type: str | None, body: Any) -> Response:
        if content_type == "application/json-patch+json" and kind == "mutatingwebhookconfigurations":
            return self._json_patch(kind, key, body)
        if content_type != "application/merge-patch+json":
            return _failure(415, "UnsupportedMediaType", str(content_type))
        meta = body.get("metadata") or {}
        with self.api.lock:
            obj = self.api.get(kind, key)
            if obj is None:
                return _not_found(kind, key)
            if meta.get("uid") and meta["uid"] != obj["metadata"].get("uid"):
                return _failure(409, "Conflict", "Precondition failed: UID mismatch")
            _merge(obj["metadata"], meta)
            return 200, self.api.put(kind, obj)

    def _json_patch(self, kind: str, key: str, ops: list[dict[str, Any]]) -> Response:
        """RFC 6902 test, add and replace on object members and list indexes."""
        with self.api.lock:
            obj = self.api.get(kind, key)
            if obj is None:
                return _not_found(kind, key)
            for op in ops:
                *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
                target: Any = obj
                try:
                    for part in parents:
                        target = target[int(part)] if isinstance(target, list) else target[part]
                    index: Any = int(last) if isinstance(target, list) else last
                    if op["op"] == "test" and target[index] != op["value"]:
                        return _failure(422, "Invalid", f"the server rejected our request due to an error in our "
                                        f"request: testing path {op['path']!r} failed")
                    if op["op"] in ("add", "replace"):
                        target[index] = op["value"]
                except (KeyError, IndexError, ValueError, TypeError):
                    return _failure(422, "Invalid", f"path {op['path']!r} does not exist")
            return 200, self.api.put(kind, obj)

    def _create(self, kind: str, body: dict[str, Any]) -> Response:
        with self.api.lock:
            key = _key(kind, body.get("metadata") or {})
            if self.api.get(kind, key) is not None:
                return _failure(409, "AlreadyExists", f'{kind} "{key}" already exists')
            if (invalid := self._invalid(kind, key, body)) is not None:
                return invalid
            body["metadata"]["uid"] = f"{kind}-uid-{next(_uids)}"
            return 201, self.api.put(kind, body)

    def _replace(self, kind: str, key: str, body: dict[str, Any]) -> Response:
        with self.api.lock:
            stored = self.api.get(kind, key)
            if stored is None:
                return _not_found(kind, key)
            if (body.get("metadata") or {}).get("resourceVersion") != stored["metadata"]["resourceVersion"]:
                return _failure(409, "Conflict", f'Operation cannot be fulfilled on {kind} "{key}": the object '
                                "has been modified; please apply your changes to the latest version and try again")
            if (invalid := self._invalid(kind, key, body)) is not None:
                return invalid
            body["metadata"]["uid"] = stored["metadata"].get("uid")
            return 200, self.api.put(kind, body)

    def _invalid(self, kind: str, key: str, body: dict[str, Any]) -> Response | None:
        """422 Invalid when the API server of this version refuses the object (ResourceSlices' rules)."""
        problems = slice_problems(body.get("spec") or {}, self.api.version) if kind == "resourceslices" else []
        if not problems:
            return None
        listed = problems[0] if len(problems) == 1 else f"[{', '.join(problems)}]"
        return _failure(422, "Invalid", f'{KINDS[kind]}.resource.k8s.io "{key}" is invalid: {listed}')

    def _delete(self, kind: str, key: str) -> Response:
        with self.api.lock:
            if self.api.get(kind, key) is None:
                return _not_found(kind, key)
            self.api.delete(kind, key)
        return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}

    def _bind(self, key: str, body: dict[str, Any]) -> Response:
        with self.api.lock:
            if self.api.fail_bind:
                return _failure(500, "InternalError", self.api.fail_bind)
            pod = self.api.get("pods", key)
            if pod is None:
                return _not_found("pods", key)
            if pod["spec"].get("nodeName"):
                return _failure(409, "Conflict", f"pod {key.rpartition('/')[2]} is already assigned")
            pod["spec"]["nodeName"] = body["target"]["name"]
            self.api.put("pods", pod)
        return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    def _watch(self, kind: str, selector: str, since: int, seconds: float) -> None:
        """Stream the events after ``since`` for ``seconds`` (410 Gone instead while `gone`)."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        api = self.api
        try:
            with api.lock:
                gone = api.gone > 0
                api.gone -= gone
            if gone:
                self._chunk(json.dumps({"type": "ERROR", "object": {
                    "kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}).encode() + b"\n")
                return
            deadline = time.monotonic() + seconds
            while True:
                with api.lock:
                    pending = [e for e in api.events[kind] if e[0] > since]
                    if not pending:
                        left = deadline - time.monotonic()
                        if left <= 0 or api.closed:
                            return
                        api.lock.wait(left)
                        continue
                since = pending[-1][0]
                for _, event, obj in pending:
                    if _selected(obj, selector):
                        self._chunk(json.dumps({"type": event, "object": obj}).encode() + b"\n")
        finally:
            self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
