"""The API-server side against a local fake API server (the official client's real calls)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes import client

from kube_contract.assignment import decode
from kube_contract.names import Names
from kube_contract.testing import node_json, pod_json, topology
from scheduler_extender.extender import BindError, Extender
from scheduler_extender.kube import KubeBinder, Syncer
from scheduler_extender.server import ExtenderServer
from scheduler_extender.state import ClusterState

N = Names()


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def core_api(url: str) -> client.CoreV1Api:
    cfg = client.Configuration()
    cfg.host = url
    return client.CoreV1Api(client.ApiClient(cfg))


@pytest.fixture
def synced(fake_api) -> Iterator[tuple[Any, ClusterState, Syncer]]:
    fake_api.put("nodes", node_json("gpu-a", topology("gpu-a", 2)))
    fake_api.put("nodes", node_json("cpu-1", None))
    state = ClusterState(N)
    syncer = Syncer(core_api(fake_api.url), state, watch_timeout=1, retry_delay=0.05)
    syncer.start()
    assert syncer.wait_ready(5)
    yield fake_api, state, syncer
    syncer.stop()


def cores(state: ClusterState, node: str) -> list[int]:
    return [c for _, c, _, _ in state.usage().get(node, [])]


def test_list_then_watch_nodes_and_pods(synced) -> None:
    fake, state, syncer = synced
    assert syncer.ready()
    assert state.node_names() == ["gpu-a"]
    fake.put("nodes", node_json("gpu-b", topology("gpu-b", 1)))
    wait_for(lambda: "gpu-b" in state.node_names())
    a = decode('{"version":1,"node":"gpu-a","containers":[{"name":"c0","gpus":'
               '[{"uuid":"GPU-gpu-a-1","cores":40,"memory":1024}]}]}')
    fake.put("pods", pod_json("p", uid="u1", node_name="gpu-a", assignment=a, phase="Running"))
    wait_for(lambda: cores(state, "gpu-a") == [0, 40])
    fake.delete("pods", "default/p")
    wait_for(lambda: cores(state, "gpu-a") == [0, 0])
    fake.delete("nodes", "gpu-b")
    wait_for(lambda: "gpu-b" not in state.node_names())


def test_watch_410_relists(synced) -> None:
    fake, state, _ = synced
    lists_before = sum(1 for r in fake.requests if r.method == "GET" and "watch" not in r.path)
    fake.gone = 2
    wait_for(lambda: fake.gone == 0, timeout=5)  # current watches end within 1 s
    fake.put("nodes", node_json("gpu-z", topology("gpu-z", 1)))
    wait_for(lambda: "gpu-z" in state.node_names())
    lists_after = sum(1 for r in fake.requests if r.method == "GET" and "watch" not in r.path)
    assert lists_after >= lists_before + 2


def test_binder_patches_then_binds(fake_api) -> None:
    pod = fake_api.put("pods", pod_json("p", namespace="ml", uid="u1"))
    binder = KubeBinder(core_api(fake_api.url))
    assert binder.get_pod("ml", "p")["metadata"]["uid"] == "u1"
    binder.bind("ml", "p", "u1", "gpu-a", {N.assignment: "x"})
    stored = fake_api.get("pods", "ml/p")
    assert stored["metadata"]["annotations"][N.assignment] == "x"
    assert stored["spec"]["nodeName"] == "gpu-a"
    patch = next(r for r in fake_api.requests if r.method == "PATCH")
    assert (patch.content_type, patch.body) == ("application/merge-patch+json",
                                                {"metadata": {"annotations": {N.assignment: "x"}, "uid": "u1"}})
    post = next(r for r in fake_api.requests if r.method == "POST")
    assert post.path == "/api/v1/namespaces/ml/pods/p/binding"
    assert post.body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-a"}
    assert post.body["metadata"]["uid"] == "u1"
    assert pod["metadata"]["uid"] == "u1"


def test_binder_errors_are_readable(fake_api) -> None:
    binder = KubeBinder(core_api(fake_api.url))
    with pytest.raises(BindError, match='reading the pod: 404 pods "nope" not found'):
        binder.get_pod("ml", "nope")
    fake_api.put("pods", pod_json("p", namespace="ml", uid="u1"))
    with pytest.raises(BindError, match="annotating the pod: 409 Precondition failed"):
        binder.bind("ml", "p", "other-uid", "gpu-a", {N.assignment: "x"})
    fake_api.fail_bind = "etcd timeout"
    with pytest.raises(BindError, match="creating the binding: 500 etcd timeout"):
        binder.bind("ml", "p", "u1", "gpu-a", {})


@pytest.fixture
def stack(synced, post) -> Iterator[tuple[Any, ClusterState, Callable[..., Any]]]:
    fake, state, syncer = synced
    api = core_api(fake.url)
    server = ExtenderServer(("127.0.0.1", 0), Extender(state, KubeBinder(api)), syncer.ready)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield fake, state, post(f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()
    server.server_close()


def schedule(fake: Any, http: Callable[..., Any], pod: dict[str, Any],
             nodes: list[str]) -> str:
    """What kube-scheduler does: filter, prioritize, bind to the best node."""
    _, out = http("/filter", {"Pod": pod, "NodeNames": nodes})
    if not out["NodeNames"]:
        return "unschedulable: " + "; ".join(out["FailedNodes"].values())
    _, scores = http("/prioritize", {"Pod": pod, "NodeNames": out["NodeNames"]})
    node = max(scores, key=lambda h: h["Score"])["Host"]
    meta = pod["metadata"]
    _, result = http("/bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                               "PodUID": meta["uid"], "Node": node})
    return result["Error"]


def test_end_to_end_bind_is_confirmed_by_watch(stack) -> None:
    fake, state, http = stack
    pod = fake.put("pods", pod_json("train", [(30, 8)], namespace="ml"))
    assert schedule(fake, http, pod, ["gpu-a", "cpu-1"]) == ""
    stored = fake.get("pods", "ml/train")
    a = decode(stored["metadata"]["annotations"][N.assignment])
    assert a.node == stored["spec"]["nodeName"] == "gpu-a"
    assert a.containers[0].gpus[0].cores == 30 and a.containers[0].gpus[0].memory == 2 << 30
    wait_for(lambda: state.reservations() == [])  # the watch saw it bound
    assert sorted(cores(state, "gpu-a")) == [0, 30]


def test_failed_bind_releases_reservation(stack) -> None:
    fake, state, http = stack
    fake.fail_bind = "apiserver unavailable"
    pod = fake.put("pods", pod_json("p", [(100, 0)], namespace="ml"))
    err = schedule(fake, http, pod, ["gpu-a"])
    assert "binding pod ml/p to node gpu-a" in err and "apiserver unavailable" in err
    assert state.reservations() == [] and cores(state, "gpu-a") == [0, 0]


def test_concurrent_pods_never_overcommit(stack) -> None:
    fake, state, http = stack
    pods = [fake.put("pods", pod_json(f"p{i}", [(30, 4)], namespace="ml")) for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        errors = list(pool.map(lambda p: schedule(fake, http, p, ["gpu-a"]), pods))
    assert errors.count("") == 6  # 3 x 30 cores on each of the 2 GPUs
    assert all("cores free" in e for e in errors if e)
    per_gpu: dict[str, int] = {}
    for i in range(16):
        stored = fake.get("pods", f"ml/p{i}")
        ann = (stored["metadata"].get("annotations") or {}).get(N.assignment)
        if ann and stored["spec"].get("nodeName"):
            for g in decode(ann).containers[0].gpus:
                per_gpu[g.uuid] = per_gpu.get(g.uuid, 0) + g.cores
    assert per_gpu == {"GPU-gpu-a-0": 90, "GPU-gpu-a-1": 90}
    wait_for(lambda: state.reservations() == [])
    assert cores(state, "gpu-a") == [90, 90]
