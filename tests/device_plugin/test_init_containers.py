"""Init containers, end to end: the extender counts a pod as kube-scheduler does, per resource (cores
and memory: max(sum of app containers and sidecars, each regular init container plus the sidecars
before it)), and places every container where kubelet's device manager will put it; a simulated
kubelet (TestKubelet.admit: reuse pool first, in no particular order, then GetPreferredAllocation)
then admits the pod through the device plugin, whose Allocate must serve every container on the GPU
the extender chose, with its quota."""

from __future__ import annotations

import random
from typing import Any

import pytest
from kube_requests import kube_scheduler_request

from device_plugin.node_topology import encode
from device_plugin.pods import StaticPods
from kube_contract import assignment, topology
from kube_contract.names import MEMORY_UNIT_BYTES, Names
from scheduler_extender.placement import NodeGPUs, Placement, Tags, place
from scheduler_extender.podspec import parse_pod
from scheduler_extender.state import ClusterState

CORE = "tencent.com/vcuda-core"
MEM = "tencent.com/vcuda-memory"
GiB = 1 << 30
N = Names()


def container(name: str, cores: int, units: int = 0, sidecar: bool = False) -> dict[str, Any]:
    limits = {CORE: str(cores)} | ({MEM: str(units)} if units else {})
    return {"name": name, "resources": {"limits": limits}} | ({"restartPolicy": "Always"} if sidecar else {})


def make_pod(dp, inits: list[dict[str, Any]], apps: list[dict[str, Any]],  # noqa: ANN001
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec = dp.pod("job", annotations=annotations)
    spec["spec"]["initContainers"] = inits
    spec["spec"]["containers"] = apps
    return spec


def placed_on(node: NodeGPUs, pod: dict[str, Any]) -> Placement:
    result = place(node, parse_pod(pod, N))
    assert isinstance(result, Placement), result
    pod["metadata"]["annotations"][N.assignment] = assignment.encode(result.to_assignment())
    return result


def two_gpus(dp, used0: tuple[int, int]) -> tuple[NodeGPUs, str, str]:  # noqa: ANN001
    """A node of two 16 GiB GPUs; another pod holds `used0` (cores, bytes) of GPU 0."""
    inv = dp.inventory(2)
    node = NodeGPUs.from_topology(dp.NODE, topology.decode(encode(inv)))
    node.gpus[0].add(*used0, Tags())
    return node, inv.gpus[0].uuid, inv.gpus[1].uuid


def admit(agent_factory, kubelet, dp, pod: dict[str, Any], used0: int, seed: int):  # noqa: ANN001, ANN201
    """The pod admitted by the simulated kubelet on the agent; GPU 0's first `used0` cores are taken."""
    agent = agent_factory("vgpu", gpus=2, pods=StaticPods([pod]))
    gpu0, gpu1 = dp.gpu(0).uuid, dp.gpu(1).uuid
    healthy = [f"{u}::{i}" for u in (gpu0, gpu1) for i in range(100)]
    got = kubelet.admit(CORE, pod, healthy, {f"{gpu0}::{i}" for i in range(used0)}, random.Random(seed))
    return agent, got


def quotas(agent, uuid: str) -> list[tuple[int, int]]:  # noqa: ANN001
    """(request, limit) of each tenant of the GPU's token scheduler."""
    return sorted((t["request"], t["limit"]) for t in agent.schedulers[uuid].call("list")["tenants"])


def gpus_of(devices: list[str]) -> set[str]:
    return {d.partition("::")[0] for d in devices}


def assigned(pod: dict[str, Any]) -> dict[str, list[str]]:
    decided = assignment.decode(pod["metadata"]["annotations"][N.assignment])
    return {c.name: [g.uuid for g in c.gpus] for c in decided.containers}


def check_admitted(pod: dict[str, Any], got: dict[str, Any]) -> None:
    """Every container asking for cores got devices on exactly the GPUs the extender chose."""
    want = assigned(pod)
    assert set(got) == set(want)
    for name, (devices, _) in got.items():
        assert gpus_of(devices) == set(want[name]), name


@pytest.mark.parametrize("seed", [1, 2])
def test_an_init_container_with_more_cores(agent_factory, kubelet, dp, seed: int) -> None:  # noqa: ANN001
    node, gpu0, gpu1 = two_gpus(dp, (60, 0))   # binpack would put the 30-core app on GPU 0
    pod = make_pod(dp, [container("prepare", 60)], [container("app", 30)])
    placed = placed_on(node, pod)
    assert assigned(pod) == {"prepare": [gpu1], "app": [gpu1]}
    assert placed.gpu_totals() == {1: (60, 0)} and kube_scheduler_request(pod, CORE) == 60
    agent, got = admit(agent_factory, kubelet, dp, pod, 60, seed)
    check_admitted(pod, got)
    assert dp.quota(got["prepare"][1]).core_request == 60 and dp.quota(got["app"][1]).core_request == 30
    assert quotas(agent, gpu1) == [(30, 30)]   # the app took the init container's tenant over


@pytest.mark.parametrize("seed", [1, 2])
def test_an_init_container_with_more_memory_only(agent_factory, kubelet, dp, seed: int) -> None:  # noqa: ANN001
    node, gpu0, gpu1 = two_gpus(dp, (10, 8 * GiB))
    # 10 GiB for the init container, 1 GiB for the app: GPU 0 has 8 GiB left, so only GPU 1 holds the pod
    pod = make_pod(dp, [container("prepare", 10, units=40)], [container("app", 10, units=4)])
    placed = placed_on(node, pod)
    assert assigned(pod) == {"prepare": [gpu1], "app": [gpu1]}
    assert placed.gpu_totals() == {1: (10, 10 * GiB)}
    assert kube_scheduler_request(pod, MEM) * MEMORY_UNIT_BYTES == 10 * GiB
    _, got = admit(agent_factory, kubelet, dp, pod, 10, seed)
    check_admitted(pod, got)
    assert [g.memory for g in dp.quota(got["prepare"][1]).gpus] == [10 * GiB]
    assert [g.memory for g in dp.quota(got["app"][1]).gpus] == [1 * GiB]


def test_the_memory_annotation_counts_for_every_container(agent_factory, kubelet, dp) -> None:  # noqa: ANN001
    """vcuda.io/memory replaces each container's units at Allocate, so the extender counts it too."""
    node, gpu0, gpu1 = two_gpus(dp, (10, 8 * GiB))
    pod = make_pod(dp, [container("prepare", 10)], [container("app", 10)], annotations={N.memory: "10Gi"})
    placed = placed_on(node, pod)
    assert assigned(pod) == {"prepare": [gpu1], "app": [gpu1]}
    assert placed.gpu_totals() == {1: (10, 10 * GiB)}
    _, got = admit(agent_factory, kubelet, dp, pod, 10, 1)
    check_admitted(pod, got)
    assert {n: [g.memory for g in dp.quota(r).gpus] for n, (_, r) in got.items()} == {"prepare": [10 * GiB],
                                                                                      "app": [10 * GiB]}


@pytest.mark.parametrize("seed", [1, 2])
def test_a_sidecar_counts_beside_the_app_and_the_init_containers_after_it(
        agent_factory, kubelet, dp, seed: int) -> None:  # noqa: ANN001
    node, gpu0, gpu1 = two_gpus(dp, (50, 0))
    # kube-scheduler: max(app 30 + sidecar 30, init 40 + sidecar 30 before it) = 70
    pod = make_pod(dp, [container("proxy", 30, sidecar=True), container("prepare", 40)], [container("app", 30)])
    placed = placed_on(node, pod)
    assert kube_scheduler_request(pod, CORE) == 70
    assert sum(c for c, _ in placed.gpu_totals().values()) == 70
    # the sidecar fits beside the other pod; the init container and the app that reuses its devices do not
    assert assigned(pod) == {"proxy": [gpu0], "prepare": [gpu1], "app": [gpu1]}
    agent, got = admit(agent_factory, kubelet, dp, pod, 50, seed)
    check_admitted(pod, got)
    # the sidecar keeps its own tenant (it runs beside the app); the app took the init container's over
    assert quotas(agent, gpu0) == [(30, 30)] and quotas(agent, gpu1) == [(30, 30)]


@pytest.mark.parametrize("seed", [1, 2])
def test_a_whole_gpu_init_container_larger_than_its_app(agent_factory, kubelet, dp, seed: int) -> None:  # noqa: ANN001
    node, gpu0, gpu1 = two_gpus(dp, (20, 0))
    pod = make_pod(dp, [container("prepare", 100)], [container("app", 30)])
    placed = placed_on(node, pod)
    assert assigned(pod) == {"prepare": [gpu1], "app": [gpu1]}
    assert placed.gpu_totals()[1][0] == 100
    _, got = admit(agent_factory, kubelet, dp, pod, 20, seed)
    check_admitted(pod, got)
    assert [g.scheduler for g in dp.quota(got["prepare"][1]).gpus] == [""]   # whole card: unthrottled
    assert dp.quota(got["app"][1]).core_request == 30


def test_the_extender_state_counts_a_bound_pod_as_kube_scheduler_does(dp) -> None:  # noqa: ANN001
    inv = dp.inventory(1)
    state = ClusterState(N)
    state.observe_node({"metadata": {"name": dp.NODE, "annotations": {N.topology: encode(inv)}}})
    pod = make_pod(dp, [container("proxy", 20, sidecar=True), container("prepare", 60)], [container("app", 30)])
    decided = place(state.node(dp.NODE), parse_pod(pod, N))   # type: ignore[arg-type]
    assert isinstance(decided, Placement)
    pod["metadata"]["annotations"][N.assignment] = assignment.encode(decided.to_assignment())
    state.observe_pod(pod)
    # max(app 30 + sidecar 20, init 60 + sidecar 20) = 80, not the sum 110 nor the largest 60
    assert state.node(dp.NODE).gpus[0].free_cores == 100 - kube_scheduler_request(pod, CORE) == 20   # type: ignore[union-attr]
