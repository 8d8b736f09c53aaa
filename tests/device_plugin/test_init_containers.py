"""An init container that asks for more than its pod's app containers together: the extender counts
the pod as kube-scheduler does, max(largest init container, sum of app containers), and places it
where the init container fits; the device plugin's Allocate then serves the init container and the
app container that reuses its devices."""

from __future__ import annotations

from device_plugin.node_topology import encode
from device_plugin.pods import StaticPods
from kube_contract import assignment, topology
from kube_contract.names import Names
from scheduler_extender.placement import NodeGPUs, Placement, Tags, place
from scheduler_extender.podspec import parse_pod
from scheduler_extender.state import ClusterState

CORE = "tencent.com/vcuda-core"


def ids(uuid: str, n: int, start: int = 0) -> list[str]:
    return [f"{uuid}::{i}" for i in range(start, start + n)]


def pod_with_init(dp, init_cores: int, app_cores: int) -> dict:  # type: ignore[no-untyped-def]  # noqa: ANN001
    spec = dp.pod("job", cores=app_cores, container="app")
    spec["spec"]["initContainers"] = [{"name": "prepare", "resources": {"limits": {CORE: str(init_cores)}}}]
    return spec


def test_a_larger_init_container_is_placed_and_allocated(agent_factory, kubelet, dp) -> None:  # noqa: ANN001
    inv = dp.inventory(2)
    gpu0, gpu1 = (g.uuid for g in inv.gpus)
    # GPU 0 has 40 cores left (another pod holds 60), GPU 1 is free: binpack prefers GPU 0 for 30 cores.
    node = NodeGPUs.from_topology(dp.NODE, topology.decode(encode(inv)))
    node.gpus[0].add(60, 0, Tags())
    pod = pod_with_init(dp, init_cores=60, app_cores=30)
    placed = place(node, parse_pod(pod, Names()))
    assert isinstance(placed, Placement), placed
    decided = placed.to_assignment()
    assert {c.name: [g.uuid for g in c.gpus] for c in decided.containers} == {"prepare": [gpu1], "app": [gpu1]}
    assert placed.gpu_totals() == {1: (60, 0)}   # max(init 60, app 30), not their sum
    pod["metadata"]["annotations"][Names().assignment] = assignment.encode(decided)

    agent_factory("vgpu", gpus=2, pods=StaticPods([pod]))
    available = ids(gpu0, 40, start=60) + ids(gpu1, 100)   # what kubelet still has
    init_ids = kubelet.preferred(CORE, available, 60)
    assert {i.partition("::")[0] for i in init_ids} == {gpu1}
    init = kubelet.allocate(CORE, init_ids).container_responses[0]
    assert init.envs["VCUDA_CORE_REQUEST"] == "60"
    # kubelet hands the init container's devices on to the app container after it
    app = kubelet.allocate(CORE, init_ids[:30]).container_responses[0]
    assert app.envs["VCUDA_CORE_REQUEST"] == "30"


def test_the_extender_state_counts_a_bound_pod_as_kube_scheduler_does(dp) -> None:  # noqa: ANN001
    inv = dp.inventory(1)
    (gpu,) = (g.uuid for g in inv.gpus)
    state = ClusterState(Names())
    state.observe_node({"metadata": {"name": dp.NODE, "annotations": {Names().topology: encode(inv)}}})
    pod = pod_with_init(dp, init_cores=60, app_cores=30)
    decided = place(state.node(dp.NODE), parse_pod(pod, Names()))   # type: ignore[arg-type]
    assert isinstance(decided, Placement)
    pod["metadata"]["annotations"][Names().assignment] = assignment.encode(decided.to_assignment())
    state.observe_pod(pod)
    assert state.node(dp.NODE).gpus[0].free_cores == 40   # type: ignore[union-attr]
    assert gpu in assignment.encode(decided.to_assignment())
