"""The HTTP layer with the bodies kube-scheduler really sends (extender/v1 field names)."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kube_contract.assignment import decode
from kube_contract.names import Names
from kube_contract.testing import T4, node_json, pod_json, topology
from scheduler_extender.extender import BindError, Extender
from scheduler_extender.placement import Policy
from scheduler_extender.server import ExtenderServer, parse_listen
from scheduler_extender.state import ClusterState

N = Names()

# A pod as kube-scheduler marshals a v1.Pod into ExtenderArgs.Pod (trimmed managedFields).
REAL_POD: dict[str, Any] = {
    "metadata": {
        "name": "trainer-7d9f8", "generateName": "trainer-", "namespace": "ml",
        "uid": "0b6a6c1e-3f7e-4d0a-9a43-5f3c2f1d9e01", "resourceVersion": "48213",
        "creationTimestamp": "2024-05-02T09:14:03Z",
        "labels": {"app": "trainer", "pod-template-hash": "7d9f8"},
        "annotations": {"vcuda.io/scheduling-policy": "binpack"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                             "name": "trainer-7d9f8", "uid": "5e1d", "controller": True,
                             "blockOwnerDeletion": True}],
        "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                           "apiVersion": "v1", "time": "2024-05-02T09:14:03Z",
                           "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}],
    },
    "spec": {
        "volumes": [{"name": "kube-api-access-x",
                     "projected": {"sources": [], "defaultMode": 420}}],
        "containers": [{
            "name": "trainer", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "command": ["python", "train.py"],
            "resources": {"limits": {"cpu": "4", "memory": "16Gi", "tencent.com/vcuda-core": "30",
                                     "tencent.com/vcuda-memory": "16"},
                          "requests": {"cpu": "4", "memory": "16Gi",
                                       "tencent.com/vcuda-core": "30",
                                       "tencent.com/vcuda-memory": "16"}},
            "volumeMounts": [{"name": "kube-api-access-x", "readOnly": True,
                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default", "serviceAccount": "default",
        "securityContext": {}, "schedulerName": "default-scheduler",
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                         "effect": "NoExecute", "tolerationSeconds": 300}],
        "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
    },
    "status": {"phase": "Pending", "qosClass": "Guaranteed"},
}


class FakeBinder:
    def __init__(self) -> None:
        self.bound: list[tuple[str, str, str, str, dict[str, str]]] = []
        self.fail: str | None = None
        self.pods: dict[str, dict[str, Any]] = {}

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        if f"{namespace}/{name}" not in self.pods:
            raise BindError(f'reading the pod: 404 pods "{name}" not found')
        return self.pods[f"{namespace}/{name}"]

    def bind(self, namespace: str, name: str, uid: str, node: str,
             annotations: dict[str, str]) -> None:
        if self.fail:
            raise BindError(self.fail)
        self.bound.append((namespace, name, uid, node, annotations))


@pytest.fixture
def env() -> Iterator[tuple[str, ClusterState, FakeBinder]]:
    state = ClusterState(N)
    state.set_node("gpu-a", topology("gpu-a", 2))
    state.set_node("gpu-b", topology("gpu-b", [T4]))
    binder = FakeBinder()
    server = ExtenderServer(("127.0.0.1", 0), Extender(state, binder), ready=lambda: False)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/scheduler", state, binder
    server.shutdown()
    server.server_close()


def test_filter_node_cache_capable(env, post) -> None:
    base, state, _ = env
    state.set_node("gpu-b", topology("gpu-b", [T4]))
    code, out = post(base)("/filter", {"Pod": REAL_POD, "NodeNames": ["gpu-a", "gpu-b", "cpu-1"]})
    assert code == 200
    assert set(out) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes",
                        "Error"}
    # 16 units of 256Mi = 4Gi: fits the A100s and the T4
    assert out["NodeNames"] == ["gpu-a", "gpu-b"] and out["Nodes"] is None
    assert out["Error"] == "" and out["FailedNodes"] == {}
    assert "cpu-1" in out["FailedAndUnresolvableNodes"]
    assert "no vcuda GPUs known" in out["FailedAndUnresolvableNodes"]["cpu-1"]


def test_filter_with_full_node_list_learns_topology(env, post) -> None:
    base, _, _ = env
    nodes = {"metadata": {"resourceVersion": "9"},
             "items": [node_json("new-1", topology("new-1", 1)), node_json("cpu-9", None)]}
    code, out = post(base)("/filter", {"pod": REAL_POD, "nodes": nodes})  # Go: any key case
    assert code == 200 and out["NodeNames"] is None
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["new-1"]
    assert out["Nodes"]["items"][0] == nodes["items"][0]  # passed through untouched
    assert list(out["FailedAndUnresolvableNodes"]) == ["cpu-9"]


def test_filter_reports_resolvable_and_unresolvable(env, post) -> None:
    base, state, _ = env
    big = json.loads(json.dumps(REAL_POD))
    big["metadata"]["uid"] = "u-big"
    big["spec"]["containers"][0]["resources"]["limits"]["tencent.com/vcuda-core"] = "90"
    big["spec"]["containers"][0]["resources"]["limits"]["tencent.com/vcuda-memory"] = "100"
    state.reserve("x", "x", __import__("scheduler_extender.podspec", fromlist=["p"]).parse_pod(
        pod_json("x", [(60, 1), (60, 1)]), N), "gpu-a")
    _, out = post(base)("/filter", {"Pod": big, "NodeNames": ["gpu-a", "gpu-b"]})
    assert out["NodeNames"] == []
    assert "gpu-a" in out["FailedNodes"]  # busy now; preemption could help
    assert "GPU0: 40 cores free" in out["FailedNodes"]["gpu-a"]
    assert "gpu-b" in out["FailedAndUnresolvableNodes"]  # 25Gi never fits a 16Gi T4
    assert "has only 16Gi in total" in out["FailedAndUnresolvableNodes"]["gpu-b"]


def test_filter_bad_pod_spec(env, post) -> None:
    base, _, _ = env
    pod = pod_json("p", [(150, 1)])
    _, out = post(base)("/filter", {"Pod": pod, "NodeNames": ["gpu-a"]})
    assert out["NodeNames"] == []
    assert "neither below 100" in out["FailedAndUnresolvableNodes"]["gpu-a"]
    _, out = post(base)("/filter", {"NodeNames": ["gpu-a"]})
    assert out["Error"] == "ExtenderArgs.Pod is missing"


def test_pod_without_gpu_passes_everywhere(env, post) -> None:
    base, _, binder = env
    pod = pod_json("web", [(0, 0)], namespace="web")
    _, out = post(base)("/filter", {"Pod": pod, "NodeNames": ["gpu-a", "cpu-1"]})
    assert out["NodeNames"] == ["gpu-a", "cpu-1"]
    binder.pods["web/web"] = pod
    _, out = post(base)("/bind", {"PodName": "web", "PodNamespace": "web",
                                  "PodUID": pod["metadata"]["uid"], "Node": "cpu-1"})
    assert out == {"Error": ""} and binder.bound[-1][4] == {}


def test_prioritize_scores(env, post) -> None:
    base, state, _ = env
    state.set_node("gpu-c", topology("gpu-c", 2))
    state.reserve("x", "x", __import__("scheduler_extender.podspec", fromlist=["p"]).parse_pod(
        pod_json("x", [(50, 1)]), N), "gpu-c")
    code, out = post(base)("/prioritize", {"Pod": REAL_POD,
                                           "NodeNames": ["gpu-a", "gpu-c", "cpu-1"]})
    assert code == 200
    scores = {h["Host"]: h["Score"] for h in out}
    assert set(out[0]) == {"Host", "Score"}
    assert all(0 <= s <= 10 for s in scores.values())
    assert scores["gpu-c"] > scores["gpu-a"] and scores["cpu-1"] == 0  # binpack


def test_prioritize_spread_and_full_nodes(env, post) -> None:
    base, state, _ = env
    pod = pod_json("s", [(10, 1)], annotations={N.policy: "spread"})
    state.set_node("gpu-c", topology("gpu-c", 2))
    state.reserve("x", "x", __import__("scheduler_extender.podspec", fromlist=["p"]).parse_pod(
        pod_json("x", [(60, 1)]), N), "gpu-c")
    nodes = {"items": [node_json("gpu-a", topology("gpu-a", 2)),
                       node_json("gpu-c", topology("gpu-c", 2))]}
    _, out = post(base)("/prioritize", {"Pod": pod, "Nodes": nodes})
    scores = {h["Host"]: h["Score"] for h in out}
    assert scores["gpu-a"] > scores["gpu-c"]


def test_bind_writes_assignment(env, post) -> None:
    base, state, binder = env
    post(base)("/filter", {"Pod": REAL_POD, "NodeNames": ["gpu-a"]})
    code, out = post(base)("/bind", {"PodName": "trainer-7d9f8", "PodNamespace": "ml",
                                     "PodUID": REAL_POD["metadata"]["uid"], "Node": "gpu-a"})
    assert code == 200 and out == {"Error": ""}
    ns, name, uid, node, annotations = binder.bound[-1]
    assert (ns, name, node) == ("ml", "trainer-7d9f8", "gpu-a")
    a = decode(annotations["vcuda.io/gpu-assignment"])
    assert a.node == "gpu-a"
    assert a.containers[0].name == "trainer"
    assert a.containers[0].gpus[0].cores == 30 and a.containers[0].gpus[0].memory == 4 << 30
    assert state.reservations() == [uid]


def test_bind_failure_releases(env, post) -> None:
    base, state, binder = env
    binder.fail = "creating the binding: 409 pod is already assigned"
    post(base)("/filter", {"Pod": REAL_POD, "NodeNames": ["gpu-a"]})
    _, out = post(base)("/bind", {"PodName": "trainer-7d9f8", "PodNamespace": "ml",
                                  "PodUID": REAL_POD["metadata"]["uid"], "Node": "gpu-a"})
    assert "already assigned" in out["Error"]
    assert state.reservations() == []
    assert all(c == 0 for _, c, _, _ in state.usage()["gpu-a"])


def test_bind_unknown_pod_and_full_node(env, post) -> None:
    base, state, binder = env
    _, out = post(base)("/bind", {"PodName": "ghost", "PodNamespace": "ml", "PodUID": "u",
                                  "Node": "gpu-a"})
    assert 'pods "ghost" not found' in out["Error"]
    binder.pods["ml/p"] = pod_json("p", [(100, 0)], namespace="ml", uid="u-p")
    _, out = post(base)("/bind", {"PodName": "p", "PodNamespace": "ml", "PodUID": "u-p",
                                  "Node": "gpu-b"})
    assert out == {"Error": ""}
    binder.pods["ml/q"] = pod_json("q", [(100, 0)], namespace="ml", uid="u-q")
    _, out = post(base)("/bind", {"PodName": "q", "PodNamespace": "ml", "PodUID": "u-q",
                                  "Node": "gpu-b"})
    assert "node gpu-b: container 'c0': needs 1 whole GPU(s)" in out["Error"]
    _, out = post(base)("/bind", {"PodName": "q", "PodNamespace": "ml", "PodUID": "other",
                                  "Node": "gpu-a"})
    assert "pod UID is u-q" in out["Error"]


def test_protocol_errors(env, post) -> None:
    base, _, _ = env
    assert post(base)("/filter", b"{nope")[0] == 400
    assert post(base)("/filter", b"[]")[0] == 400
    code, out = post(base)("/preempt", {})
    assert code == 404 and "unknown verb" in out["Error"]
    root = base.rsplit("/", 1)[0]
    with urllib.request.urlopen(root + "/healthz", timeout=5) as resp:
        assert resp.status == 200
    try:
        urllib.request.urlopen(root + "/readyz", timeout=5)
        raise AssertionError("readyz should be 503 before the first sync")
    except urllib.error.HTTPError as e:
        assert e.code == 503


@pytest.mark.parametrize(("addr", "expected"), [
    (":8888", ("0.0.0.0", 8888)), ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("[::]:9000", ("::", 9000)), ("8080", ("0.0.0.0", 8080)),
])
def test_parse_listen(addr: str, expected: tuple[str, int]) -> None:
    assert parse_listen(addr) == expected


@pytest.mark.parametrize("addr", [":http", ":70000"])
def test_parse_listen_rejects(addr: str) -> None:
    with pytest.raises(ValueError, match="--listen"):
        parse_listen(addr)


def test_default_policy_spread() -> None:
    state = ClusterState(N)
    state.set_node("n", topology("n", 2))
    ext = Extender(state, FakeBinder(), default_policy=Policy.SPREAD)
    ext.binder.pods["default/a"] = pod_json("a", [(10, 0)], uid="ua")  # type: ignore[attr-defined]
    ext.binder.pods["default/b"] = pod_json("b", [(10, 0)], uid="ub")  # type: ignore[attr-defined]
    for name, uid in (("a", "ua"), ("b", "ub")):
        assert ext.bind({"PodName": name, "PodNamespace": "default", "PodUID": uid,
                         "Node": "n"}) == {"Error": ""}
    assert [c for _, c, _, _ in state.usage()["n"]] == [10, 10]
