"""Pod JSON -> request: resources, policy, model filter, tags, and clear errors."""

from __future__ import annotations

import pytest

from kube_contract.names import MEMORY_UNIT_BYTES, Names
from kube_contract.testing import pod_json
from scheduler_extender.placement import ContainerRequest, Policy, Tags
from scheduler_extender.podspec import PodSpecError, parse_pod

N = Names()


def test_reads_limits_and_skips_containers_without_gpu() -> None:
    pod = pod_json("p", [(30, 4), (0, 0), (200, 0)], container_names=["a", "sidecar", "b"])
    req = parse_pod(pod, N)
    assert req.containers == (ContainerRequest("a", 30, 4 * MEMORY_UNIT_BYTES),
                              ContainerRequest("b", 200, 0))
    assert req.containers[1].whole_cards == 2
    assert req.policy is Policy.BINPACK


def test_requests_only_and_integer_values() -> None:
    pod = pod_json("p", [])
    pod["spec"]["containers"] = [{"name": "x", "resources": {
        "requests": {N.core_resource: 50, N.memory_resource: "2"}}}]
    assert parse_pod(pod, N).containers == (ContainerRequest("x", 50, 2 * MEMORY_UNIT_BYTES),)


def test_annotations_and_labels() -> None:
    pod = pod_json("p", annotations={N.policy: "Spread", N.model_include: "A100, H100",
                                     N.model_exclude: "T4", N.affinity: "g1"},
                   labels={N.anti_affinity: "db", N.exclusion: "team-a", N.affinity: "ignored"})
    req = parse_pod(pod, N)
    assert req.policy is Policy.SPREAD
    assert req.model_include == ("A100", "H100") and req.model_exclude == ("T4",)
    assert req.tags == Tags("g1", "db", "team-a")


def test_default_policy_and_custom_domain() -> None:
    names = Names("example.com", "gpu.example.com")
    pod = pod_json("p", [(10, 1)], names=names)
    req = parse_pod(pod, names, Policy.SPREAD)
    assert req.policy is Policy.SPREAD and req.containers[0].cores == 10
    assert parse_pod(pod, N).containers == ()  # other domain: not ours


@pytest.mark.parametrize(("desc", "containers", "annotations", "message"), [
    ("memory without cores", [(0, 4)], {}, "without tencent.com/vcuda-core"),
    ("150 cores", [(150, 4)], {}, "neither below 100"),
    ("bad policy", [(10, 1)], {"vcuda.io/scheduling-policy": "fast"}, "use 'binpack' or 'spread'"),
])
def test_errors(desc: str, containers: list[tuple[int, int]], annotations: dict[str, str],
                message: str) -> None:
    with pytest.raises(PodSpecError) as err:
        parse_pod(pod_json("p", containers, annotations=annotations), N)
    assert message in str(err.value), desc


def test_non_integer_quantity() -> None:
    pod = pod_json("p", [(10, 1)])
    pod["spec"]["containers"][0]["resources"]["limits"][N.core_resource] = "0.5"
    with pytest.raises(PodSpecError, match="not a whole number"):
        parse_pod(pod, N)


def test_names_validation() -> None:
    with pytest.raises(ValueError, match="resource_domain"):
        Names("a/b")
    assert Names().assignment == "vcuda.io/gpu-assignment"
    assert Names().core_resource == "tencent.com/vcuda-core"
