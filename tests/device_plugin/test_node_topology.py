"""The vgpu agent publishes its GPUs and NVLink as the node annotation vcuda.io/gpu-topology
(and every agent the bare cuda-major-version / cuda-minor-version labels),
through the kubernetes client against a fake API server, retrying while that fails; the
extender's own reader accepts what it wrote."""

from __future__ import annotations

import pytest

from device_plugin.node_topology import KubeNode, encode
from kube_contract import topology
from kube_contract.names import Names
from node_state.gpus import Inventory
from py_vcuda.sim import GiB, SimConfig
from scheduler_extender.state import ClusterState

KEY = "vcuda.io/gpu-topology"


def test_encode_carries_gpus_numa_and_nvlink_counts(dp):
    gpus = tuple(dp.gpu(i, numa=i // 2) for i in range(3))
    inv = Inventory(gpus, {0: frozenset({1}), 1: frozenset({0, 2}), 2: frozenset({1})}, {(0, 1): 12})
    topo = topology.decode(encode(inv))
    assert [(g.index, g.uuid, g.model, g.memory, g.numa) for g in topo.gpus] == [
        (g.index, g.uuid, g.name, g.memory_total, g.numa_node) for g in gpus]
    assert topo.nvlink == {(0, 1): 12, (1, 2): 1}   # a pair without a count from NVML counts one link


def test_agent_publishes_after_the_api_server_recovers(agent_factory, kubelet, dp, api):
    api.fail_requests = 2   # the API server is not there yet: the agent serves kubelet anyway and retries
    agent = agent_factory("vgpu", gpus=2, patch_node=KubeNode(api.core_v1(), dp.NODE).patch)
    assert len(kubelet.latest_devices("tencent.com/vcuda-core")) == 200
    assert agent.node_publisher is not None and agent.node_publisher.published.wait(60)
    patches = [r for r in api.requests if r.method == "PATCH"]
    assert len(patches) == 3 and all(r.path == f"/api/v1/nodes/{dp.NODE}" for r in patches)
    state = ClusterState(Names())
    state.observe_node(api.get("nodes", dp.NODE))   # what the extender's node watch would see
    node = state.node(dp.NODE)
    assert node is not None and [g.uuid for g in node.gpus] == [dp.gpu(0).uuid, dp.gpu(1).uuid]


def test_pgpu_agent_publishes_nothing(agent_factory, kubelet, dp, api):
    agent = agent_factory("pgpu", gpus=2, patch_node=KubeNode(api.core_v1(), dp.NODE).patch)
    kubelet.latest_devices("nvidia.com/gpu")
    assert agent.node_publisher is None and api.requests == []


def test_real_agent_process_uses_the_api_server(kubelet, short_dir, dp, api):
    """The command line wiring: pods from the API server identify a container on a node with two
    GPUs, and the topology annotation appears on the Node."""
    sim = SimConfig(state_path=short_dir / "sim", devices=2, memory=2 * GiB, nvlink=[(0, 1)])
    uuid = dp.gpu(0).uuid
    api.put("pods", dp.pod("app", cores=30, annotations={
        "vcuda.io/gpu-assignment": dp.assignment_annotation("main", uuid, 30)}))
    proc = dp.spawn_plugin(short_dir, sim, "--mode", "vgpu", "--kubeconfig",
                           str(api.kubeconfig(short_dir / "kubeconfig")))
    try:
        kubelet.latest_devices("tencent.com/vcuda-core")
        resp = kubelet.allocate("tencent.com/vcuda-core", [f"{uuid}::{i}" for i in range(30)])
        assert dp.quota(resp.container_responses[0]).core_request == 30
        published = dp.wait_for(lambda: api.get("nodes", dp.NODE)["metadata"]["annotations"].get(KEY),
                                 what="topology annotation")
        topo = topology.decode(published)
        assert [g.uuid for g in topo.gpus] == [dp.gpu(0).uuid, dp.gpu(1).uuid] and topo.links(0, 1) == 1
    finally:
        log = dp.stop_plugin(proc, short_dir)
    assert proc.returncode == 0, log
    assert "allocated" in log and "default/app:main" in log, log


def node_selector_matches(labels: dict[str, str], requirement: dict) -> bool:  # type: ignore[type-arg]
    """One nodeSelectorRequirement, as kube-scheduler evaluates it (k8s.io/component-helpers nodeaffinity)."""
    key, op, values = requirement["key"], requirement["operator"], requirement.get("values", [])
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if key not in labels:
        return op == "NotIn"
    value = labels[key]
    if op in ("In", "NotIn"):
        return (value in values) == (op == "In")
    (bound,) = values   # Gt / Lt: one integer, and the label must parse as one
    try:
        return int(value) > int(bound) if op == "Gt" else int(value) < int(bound)
    except ValueError:
        return False


# The platform documentation's example: CUDA 12 with at least minor 4.
DOCUMENTED_AFFINITY = [{"key": "cuda-major-version", "operator": "In", "values": ["12"]},
                       {"key": "cuda-minor-version", "operator": "Gt", "values": ["3"]}]


@pytest.mark.parametrize(("driver", "matches"), [(12040, True), (12020, False), (13000, False)])
def test_documented_node_affinity_matches_the_node_labels(kubelet, short_dir, dp, api, driver, matches):
    """The agent puts the seeds' bare cuda-major-version / cuda-minor-version labels on its Node (besides
    the NFD feature file), so the nodeAffinity users copy from the documentation selects the node."""
    sim = SimConfig(state_path=short_dir / "sim", devices=1, memory=2 * GiB, driver_version=driver)
    features = short_dir / "features" / "vcuda"
    proc = dp.spawn_plugin(short_dir, sim, "--mode", "pgpu", "--features-file", str(features),
                           "--kubeconfig", str(api.kubeconfig(short_dir / "kubeconfig")))
    try:
        labels = dp.wait_for(lambda: api.get("nodes", dp.NODE)["metadata"].get("labels"), what="node labels")
        dp.wait_for(features.exists, what="NFD feature file")
    finally:
        log = dp.stop_plugin(proc, short_dir)
    assert proc.returncode == 0, log
    bare = {k: v for k, v in labels.items() if "/" not in k}   # besides GFD's nvidia.com/ labels (test_mig_labels)
    assert bare == {"cuda-major-version": str(driver // 1000), "cuda-minor-version": str(driver % 1000 // 10)}
    assert all(node_selector_matches(labels, r) for r in DOCUMENTED_AFFINITY) == matches
    assert f"vcuda.io/cuda-major-version={driver // 1000}\n" in features.read_text()   # NFD's file stays
