"""ClusterState: reservations, confirmation by the API server, release, expiry, resync."""

from __future__ import annotations

from kube_contract.assignment import Assignment, ContainerAssignment, GPUShare
from kube_contract.names import Names
from kube_contract.testing import node_json, pod_json, topology
from scheduler_extender.placement import ContainerRequest, Placement, PodRequest, Unfit
from scheduler_extender.state import ClusterState

N = Names()
GiB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def state_with(nodes: dict[str, int], clock: Clock | None = None) -> ClusterState:
    s = ClusterState(N, clock=clock or Clock(), reservation_ttl=60)
    s.replace_nodes([node_json(name, topology(name, n)) for name, n in nodes.items()])
    return s


def req(cores: int, memory: int = 0) -> PodRequest:
    return PodRequest((ContainerRequest("c0", cores, memory),))


def used(s: ClusterState, node: str) -> list[int]:
    return [cores for _, cores, _, _ in s.usage()[node]]


def bound_pod(uid: str, node: str, shares: list[tuple[int, int, int]]) -> dict:
    a = Assignment(node, (ContainerAssignment("c0", tuple(
        GPUShare(f"GPU-{node}-{i}", c, m) for i, c, m in shares)),))
    return pod_json("p-" + uid, uid=uid, node_name=node, assignment=a, phase="Running")


def test_reservation_counts_until_released() -> None:
    s = state_with({"n": 1})
    r = s.reserve("u1", "default/a", req(60), "n")
    assert isinstance(r, Placement)
    assert used(s, "n") == [60]
    second = s.reserve("u2", "default/b", req(60), "n")
    assert isinstance(second, Unfit) and "40 cores free" in second.reason
    s.release("u1")
    assert used(s, "n") == [0]
    assert isinstance(s.reserve("u2", "default/b", req(60), "n"), Placement)


def test_retried_reserve_replaces_its_own_decision() -> None:
    s = state_with({"n": 1})
    s.reserve("u1", "a", req(60), "n")
    assert isinstance(s.reserve("u1", "a", req(60), "n"), Placement)
    assert used(s, "n") == [60]


def test_pod_seen_bound_replaces_reservation_and_survives_release() -> None:
    s = state_with({"n": 2})
    s.reserve("u1", "a", req(30, GiB), "n")
    pod = bound_pod("u1", "n", [(0, 30, GiB)])
    s.observe_pod(pod)
    assert s.reservations() == []
    assert used(s, "n") == [30, 0]
    s.release("u1")  # a late failure report must not free a running pod
    assert used(s, "n") == [30, 0]
    s.observe_pod(pod)  # status-only updates change nothing
    assert used(s, "n") == [30, 0]
    pod["status"]["phase"] = "Succeeded"
    s.observe_pod(pod)
    assert used(s, "n") == [0, 0]


def test_pending_pod_keeps_its_reservation() -> None:
    s = state_with({"n": 1})
    s.reserve("u1", "a", req(50), "n")
    s.observe_pod(pod_json("a", uid="u1"))  # annotation patch not visible yet
    assert used(s, "n") == [50]
    s.remove_pod("u1")  # deleted before it ran
    assert used(s, "n") == [0]


def test_annotation_for_other_node_or_garbage_is_ignored() -> None:
    s = state_with({"n": 1, "m": 1})
    pod = bound_pod("u1", "n", [(0, 30, 0)])
    pod["spec"]["nodeName"] = "m"
    s.observe_pod(pod)
    pod2 = pod_json("x", uid="u2", node_name="n",
                    annotations={N.assignment: "{broken"})
    s.observe_pod(pod2)
    assert used(s, "n") == [0] and used(s, "m") == [0]


def test_reservation_expires() -> None:
    clock = Clock()
    s = state_with({"n": 1}, clock)
    s.reserve("u1", "a", req(70), "n")
    clock.now += 61
    assert isinstance(s.evaluate(req(70), ["n"])["n"], Placement)
    assert s.reservations() == []


def test_pods_before_their_node_and_topology_changes() -> None:
    s = ClusterState(N)
    s.observe_pod(bound_pod("u1", "n", [(1, 40, 0)]))
    s.set_node("n", topology("n", 2))
    assert used(s, "n") == [0, 40]
    s.set_node("n", topology("n", 3))  # a GPU added: usage re-applied to the new map
    assert used(s, "n") == [0, 40, 0]
    s.remove_node("n")
    assert s.usage() == {}
    s.set_node("n", topology("n", 2))
    assert used(s, "n") == [0, 40]
    s.remove_pod("u1")
    assert used(s, "n") == [0, 0]


def test_replace_pods_resync() -> None:
    clock = Clock()
    s = state_with({"n": 2}, clock)
    s.observe_pod(bound_pod("gone", "n", [(0, 20, 0)]))
    s.reserve("old", "a", req(10), "n")
    clock.now += 1
    listed_at = clock.now
    clock.now += 1
    s.reserve("new", "b", req(10), "n")
    s.replace_pods([bound_pod("stay", "n", [(1, 50, 0)])], listed_at)
    # 'gone' and the reservation older than the list vanish; the newer one stays.
    assert s.reservations() == ["new"]
    assert sum(used(s, "n")) == 60


def test_unknown_and_bad_nodes_are_explained() -> None:
    s = ClusterState(N)
    bad = node_json("bad", None)
    bad["metadata"]["annotations"][N.topology] = '{"version": 7}'
    s.replace_nodes([bad, node_json("plain", None)])
    out = s.evaluate(req(10), ["bad", "plain", "ghost"])
    assert all(isinstance(r, Unfit) and r.unresolvable for r in out.values())
    assert "bad vcuda.io/gpu-topology annotation" in out["bad"].reason  # type: ignore[union-attr]
    assert "is the vcuda device plugin running" in out["plain"].reason  # type: ignore[union-attr]
    s.replace_nodes([])
    assert "bad vcuda.io" not in s.evaluate(req(10), ["bad"])["bad"].reason  # type: ignore[union-attr]
