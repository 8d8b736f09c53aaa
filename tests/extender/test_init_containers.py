"""Pods with init containers and sidecars: the extender's count per GPU adds up to kube-scheduler's
count of the pod, and kubelet's device manager, which hands a finished init container's devices on
in no particular order, gives every container devices on exactly the GPUs the extender chose."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kube_requests import kube_scheduler_request

from kube_contract.names import CORES_PER_GPU, MEMORY_UNIT_BYTES, Names
from kube_contract.testing import topology
from scheduler_extender.placement import NodeGPUs, Placement, Tags, place
from scheduler_extender.podspec import parse_pod

CORE, MEM = "tencent.com/vcuda-core", "tencent.com/vcuda-memory"
GiB = 1 << 30

size = st.one_of(st.integers(1, 99), st.sampled_from([100, 200]))
containers = st.lists(st.tuples(size, st.integers(0, 24), st.booleans()), min_size=0, max_size=3)


def pod_of(inits: list[tuple[int, int, bool]], apps: list[tuple[int, int, bool]]) -> dict[str, Any]:
    def c(prefix: str, i: int, cores: int, units: int, sidecar: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"name": f"{prefix}{i}", "resources": {"limits": {CORE: str(cores), MEM: str(units)}}}
        return out | ({"restartPolicy": "Always"} if sidecar else {})
    return {"metadata": {"name": "p", "annotations": {}},
            "spec": {"initContainers": [c("i", n, *x) for n, x in enumerate(inits)],
                     "containers": [c("a", n, cores, units, False) for n, (cores, units, _) in enumerate(apps)]}}


def kubelet_admits(node: NodeGPUs, pod: dict[str, Any], placed: Placement, rng: random.Random) -> None:
    """kubelet's device manager on the placement: from the reuse pool first, at random, then new
    devices where the device plugin's preferred allocation puts them (the assigned GPUs)."""
    shares = dict(placed.containers)
    taken = {g.index: set(range(g.used_cores)) for g in node.gpus}    # other pods' devices
    pool: set[tuple[int, int]] = set()
    spec = pod["spec"]
    for c, init in [(c, True) for c in spec["initContainers"]] + [(c, False) for c in spec["containers"]]:
        need = int(c["resources"]["limits"][CORE])
        gpus = {s.index for s in shares[c["name"]]}
        got = rng.sample(sorted(pool), min(need, len(pool)))
        assert {g for g, _ in got} <= gpus, f"{c['name']}: kubelet reuses devices of other GPUs than {gpus}"
        per_gpu = {g: sum(1 for d in got if d[0] == g) for g in gpus}
        for g in sorted(gpus):
            want = (need if len(gpus) == 1 else CORES_PER_GPU) - per_gpu[g]
            free = [i for i in range(CORES_PER_GPU) if i not in taken[g]]
            assert len(free) >= want, f"{c['name']}: GPU{g} has {len(free)} free devices, needs {want}"
            got += [(g, i) for i in free[:want]]
            taken[g].update(free[:want])
        if init and c.get("restartPolicy") != "Always":
            pool.update(got)
        else:
            pool.difference_update(got)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inits=containers, apps=containers, used=st.lists(st.integers(0, 100), min_size=3, max_size=3),
       seed=st.integers(0, 1000))
def test_counted_as_kube_scheduler_does_and_admitted_as_placed(inits, apps, used, seed) -> None:  # noqa: ANN001
    pod = pod_of(inits, apps)
    node = NodeGPUs.from_topology("n", topology("n", 3))
    for g, u in zip(node.gpus, used, strict=True):
        if u:
            g.add(u, 0, Tags())
    result = place(node, parse_pod(pod, Names()))
    if not isinstance(result, Placement):
        return
    held = result.gpu_totals()
    assert sum(c for c, _ in held.values()) == kube_scheduler_request(pod, CORE)
    if len(held) == 1:   # all on one GPU: the memory count is kube-scheduler's too
        (memory,) = (m for _, m in held.values())
        whole = any(int(c["resources"]["limits"][CORE]) >= CORES_PER_GPU
                    for c in pod["spec"]["initContainers"] + pod["spec"]["containers"])
        if not whole:
            assert memory == kube_scheduler_request(pod, MEM) * MEMORY_UNIT_BYTES
    for g in node.gpus:
        cores, memory = held.get(g.index, (0, 0))
        assert g.used_cores + cores <= CORES_PER_GPU and g.used_memory + memory <= g.memory
    kubelet_admits(node, pod, result, random.Random(seed))


def test_an_init_container_goes_where_the_app_reusing_its_devices_fits_too() -> None:
    """A 20-core init container would fit the fullest GPU, but the 50-core app after it takes its
    devices and 30 more there: both go where 50 fit."""
    node = NodeGPUs.from_topology("n", topology("n", 2))
    node.gpus[0].add(75, 0, Tags())
    result = place(node, parse_pod(pod_of([(20, 0, False)], [(50, 0, False)]), Names()))
    assert isinstance(result, Placement)
    assert {name: [s.index for s in shares] for name, shares in result.containers} == {"i0": [1], "a0": [1]}
    assert result.gpu_totals() == {1: (50, 0)}


def test_init_containers_on_two_whole_gpus_cannot_hand_a_share_on() -> None:
    """kubelet would give the app 30 of the 200 devices in no particular order: on two GPUs."""
    node = NodeGPUs.from_topology("n", topology("n", 2))
    result = place(node, parse_pod(pod_of([(200, 0, False)], [(30, 0, False)]), Names()))
    assert not isinstance(result, Placement)
    assert result.unresolvable and "no particular order" in result.reason
