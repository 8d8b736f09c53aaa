"""Property tests: random pod sequences through ClusterState (reserve = decide + count)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube_contract.names import CORES_PER_GPU, Names
from kube_contract.testing import A100, T4, V100, topology
from scheduler_extender.placement import ContainerRequest, Placement, PodRequest, Policy, Tags, best
from scheduler_extender.state import ClusterState

GiB = 1 << 30
SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

tag = st.sampled_from([None, "a", "b"])
container = st.one_of(
    st.tuples(st.integers(1, 99), st.integers(0, 40).map(lambda g: g * GiB // 2)),
    st.tuples(st.sampled_from([100, 200, 300]), st.just(0)),
)
pods = st.builds(
    PodRequest,
    containers=st.lists(container, min_size=1, max_size=3).map(
        lambda cs: tuple(ContainerRequest(f"c{i}", c, m) for i, (c, m) in enumerate(cs))),
    policy=st.sampled_from(list(Policy)),
    model_include=st.sampled_from([(), ("A100",), ("T4", "V100")]),
    model_exclude=st.sampled_from([(), ("T4",)]),
    tags=st.builds(Tags, tag, tag, tag),
)
ops = st.lists(st.one_of(pods, st.integers(0, 1000)), min_size=1, max_size=60)


def cluster() -> ClusterState:
    state = ClusterState(Names())
    state.set_node("n0", topology("n0", [A100, A100, T4, V100], nvlink="pairs"))
    state.set_node("n1", topology("n1", [T4, T4]))
    state.set_node("n2", topology("n2", 4, nvlink="all"))
    return state


def schedule(state: ClusterState, uid: str, pod: PodRequest) -> Placement | None:
    choice = best(state.evaluate(pod, state.node_names()).values())
    if choice is None:
        return None
    result = state.reserve(uid, uid, pod, choice.node)
    assert isinstance(result, Placement) and result == choice  # same decision under the lock
    return result


def check_invariants(state: ClusterState, live: dict[str, tuple[Placement, PodRequest]]) -> None:
    expect: dict[tuple[str, int], list[int]] = {}
    per_gpu_tags: dict[tuple[str, int], list[Tags]] = {}
    for placement, pod in live.values():
        for index, (cores, memory) in placement.gpu_totals().items():
            e = expect.setdefault((placement.node, index), [0, 0, 0])
            e[0] += cores
            e[1] += memory
            e[2] += 1
            per_gpu_tags.setdefault((placement.node, index), []).append(pod.tags)
    for name in state.node_names():
        node = state.node(name)
        assert node is not None
        for g in node.gpus:
            # never overcommitted, and incremental counters equal a recount
            assert 0 <= g.used_cores <= CORES_PER_GPU
            assert 0 <= g.used_memory <= g.memory
            assert [g.used_cores, g.used_memory, g.tenants] == expect.get((name, g.index),
                                                                          [0, 0, 0])
            tags = per_gpu_tags.get((name, g.index), [])
            exclusions = {t.exclusion for t in tags if t.exclusion}
            assert len(exclusions) <= 1
            antis = [t.anti_affinity for t in tags if t.anti_affinity]
            assert len(antis) == len(set(antis))
            groups = {t.affinity for t in tags}
            if groups - {None}:  # an affinity group shares only with itself
                assert len(groups) == 1


@SETTINGS
@given(ops)
def test_random_sequences_never_overcommit(sequence: list[PodRequest | int]) -> None:
    state = cluster()
    live: dict[str, tuple[Placement, PodRequest]] = {}
    for step, op in enumerate(sequence):
        if isinstance(op, int):
            if live:
                uid = sorted(live)[op % len(live)]
                state.remove_pod(uid)
                del live[uid]
        else:
            uid = f"p{step}"
            placed = schedule(state, uid, op)
            if placed is not None:
                live[uid] = (placed, op)
                for _, shares in placed.containers:
                    for s in shares:
                        gpu = state.node(placed.node).gpus[s.index]  # type: ignore[union-attr]
                        low = gpu.model.lower()
                        assert not op.model_include or any(w.lower() in low
                                                           for w in op.model_include)
                        assert not any(w.lower() in low for w in op.model_exclude)
        check_invariants(state, live)


fraction = st.tuples(st.integers(1, 99), st.integers(0, 20).map(lambda g: g * GiB))


def fits_on_used_gpu(state: ClusterState, cores: int, memory: int) -> bool:
    for name in state.node_names():
        for g in state.node(name).gpus:  # type: ignore[union-attr]
            if g.tenants and g.free_cores >= cores and g.free_memory >= memory:
                return True
    return False


@SETTINGS
@given(st.lists(st.one_of(fraction, st.integers(0, 1000)), min_size=1, max_size=80))
def test_binpack_never_opens_a_gpu_while_a_used_one_fits(
        sequence: list[tuple[int, int] | int]) -> None:
    state = cluster()
    live: list[str] = []
    for step, op in enumerate(sequence):
        if isinstance(op, int):
            if live:
                state.remove_pod(live.pop(op % len(live)))
            continue
        cores, memory = op
        could_share = fits_on_used_gpu(state, cores, memory)
        placed = schedule(state, f"p{step}", PodRequest((ContainerRequest("c", cores, memory),)))
        if placed is not None:
            live.append(f"p{step}")
            if could_share:
                assert placed.opened == 0, (cores, memory, state.usage())


@SETTINGS
@given(st.integers(1, 50), st.integers(1, 8), st.integers(1, 40))
def test_spread_balances_equal_pods(cores: int, gpus: int, count: int) -> None:
    state = ClusterState(Names())
    state.set_node("n", topology("n", gpus))
    pod = PodRequest((ContainerRequest("c", cores, 0),), Policy.SPREAD)
    for i in range(count):
        schedule(state, f"p{i}", pod)
    tenants = [g.tenants for g in state.node("n").gpus]  # type: ignore[union-attr]
    assert max(tenants) - min(tenants) <= 1


@SETTINGS
@given(st.lists(fraction, min_size=1, max_size=40))
def test_spread_picks_least_loaded_fitting_gpu(sequence: list[tuple[int, int]]) -> None:
    state = ClusterState(Names())
    state.set_node("n", topology("n", [A100, A100, V100, T4]))
    for step, (cores, memory) in enumerate(sequence):
        node = state.node("n")
        assert node is not None
        fitting = [g for g in node.gpus if g.free_cores >= cores and g.free_memory >= memory]
        least = min((g.used_cores for g in fitting), default=None)
        placed = schedule(state, f"p{step}", PodRequest((ContainerRequest("c", cores, memory),),
                                                        Policy.SPREAD))
        assert (placed is None) == (least is None)
        if placed is not None:
            chosen = placed.containers[0][1][0].index
            assert node.gpus[chosen].used_cores - cores == least


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from([A100, T4]), st.integers(0, 90),
                          st.integers(0, 15), tag, tag, tag), min_size=1, max_size=8),
       fraction, st.sampled_from(list(Policy)), tag, tag, tag,
       st.lists(st.tuples(st.integers(0, 7), st.integers(1, 60), st.integers(0, 15), tag),
                max_size=6))
def test_fast_path_agrees_with_general_path(gpus, request, policy, affinity, anti, exclusion,
                                            changes) -> None:
    from scheduler_extender.placement import NodeGPUs, Unfit, place

    node = NodeGPUs.from_topology("n", topology("n", [model for model, *_ in gpus]))
    for g, (_, cores, mem_gib, aff, ant, exc) in zip(node.gpus, gpus, strict=True):
        if cores:
            g.add(cores, mem_gib * GiB, Tags(aff, ant, exc))
    tags = Tags(affinity, anti, exclusion)
    pod = PodRequest((ContainerRequest("c", *request),), policy, tags=tags)
    # a model filter that excludes nothing forces the general path
    slow = PodRequest(pod.containers, policy, (), ("no-such-gpu",), tags)

    def agree() -> None:
        general = place(node, slow)
        fast = place(node, pod)
        assert fast == general or (isinstance(fast, Unfit) and isinstance(general, Unfit))

    agree()
    # usage changing between requests must not leave the fast path's cached order stale
    for index, cores, mem_gib, aff in changes:
        g = node.gpus[index % len(node.gpus)]
        if g.used_cores + cores <= 100 and g.used_memory + mem_gib * GiB <= g.memory:
            g.add(cores, mem_gib * GiB, Tags(affinity=aff))
            agree()
            if cores % 2:
                g.add(cores, mem_gib * GiB, Tags(affinity=aff), -1)
                agree()
