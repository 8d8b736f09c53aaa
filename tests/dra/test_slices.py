"""The node's ResourceSlice: what it holds, that it fits the resource.k8s.io/v1 schema, and how the
publisher keeps it current in the API server (health changes, deletions, an API server that is away)."""

from __future__ import annotations

import pytest

from dra_driver import slices
from dra_driver.kube import ApiError, KubeAPI
from dra_driver.names import DRIVER
from kube_contract.apiclient import make_api_client
from kube_contract.testing import FakeApiServer
from node_state.gpus import Inventory
from node_state.testing import gpu, wait_for
from py_vcuda.sim import GiB, MiB

NODE = "node-1"
NAME = f"{NODE}-{DRIVER}"


def inv() -> Inventory:
    gpus = (gpu(0, numa=0), gpu(1, numa=0), gpu(2, numa=1, memory=16 * GiB - 3 * MiB))
    return Inventory(gpus, nvlink={0: frozenset({1}), 1: frozenset({0}), 2: frozenset()})


@pytest.mark.parametrize("text,semver", [("550.54.15", "550.54.15"), ("535.104.05", "535.104.5"),
                                         ("470.82", "470.82.0"), ("12", "12.0.0"), ("r550", None),
                                         ("1.2.3.4", None)])
def test_driver_versions_become_semver(text, semver):
    assert slices.semver(text) == semver


def test_devices_carry_attributes_and_consumable_capacity():
    devs = slices.devices(inv(), lambda uuid: True, slices.DriverVersions("535.104.05", (12, 2)))
    assert [d["name"] for d in devs] == ["gpu-0", "gpu-1", "gpu-2"]
    d0, _, d2 = devs
    assert d0["attributes"] == {
        "type": {"string": "gpu"}, "uuid": {"string": gpu(0).uuid}, "index": {"int": 0},
        "productName": {"string": "vcuda simulated GPU"},
        "memory": {"int": 16 * GiB}, "driverVersion": {"version": "535.104.5"},
        "cudaDriverVersion": {"version": "12.2.0"}, "numaNode": {"int": 0}, "nvlinkPeers": {"string": "1"}}
    assert "nvlinkPeers" not in d2["attributes"] and d2["attributes"]["numaNode"] == {"int": 1}
    assert d0["allowMultipleAllocations"] is True
    assert d0["capacity"]["cores"] == {"value": "100", "requestPolicy": {
        "default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}}
    whole = str(16 * GiB - 256 * MiB)   # the odd-sized GPU's requests stay on the 256 MiB grid
    assert d2["capacity"]["memory"] == {"value": str(16 * GiB - 3 * MiB), "requestPolicy": {
        "default": whole, "validRange": {"min": str(256 * MiB), "max": whole, "step": str(256 * MiB)}}}


def test_unknown_versions_are_left_out_and_unhealthy_gpus_too():
    devs = slices.devices(inv(), lambda uuid: uuid != gpu(1).uuid, slices.DriverVersions())
    assert [d["name"] for d in devs] == ["gpu-0", "gpu-2"]
    assert "driverVersion" not in devs[0]["attributes"]


def test_the_slice_fits_the_kubernetes_schema():
    """Through the kubernetes client's resource.k8s.io/v1 models and back: nothing dropped or renamed."""
    from kubernetes.client import ApiClient

    body = slices.resource_slice(NODE, "node-uid", 3, slices.devices(inv(), lambda u: True,
                                                                      slices.DriverVersions("550.54.15", (12, 4))))
    api = ApiClient()
    obj = api._ApiClient__deserialize(body, "V1ResourceSlice")
    assert api.sanitize_for_serialization(obj) == body


class Rig:
    def __init__(self) -> None:
        self.server = FakeApiServer()
        self.server.put("nodes", {"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE, "uid": "n-uid"}})
        self.healthy = {g.uuid: True for g in inv().gpus}

    def api(self, tmp_path) -> KubeAPI:  # type: ignore[no-untyped-def]
        return KubeAPI(make_api_client(str(self.server.kubeconfig(tmp_path / "kc"))), timeout=5)

    def publisher(self, tmp_path, build=None, **kw) -> slices.SlicePublisher:  # type: ignore[no-untyped-def]
        return slices.SlicePublisher(
            self.api(tmp_path), NODE,
            build or (lambda: slices.devices(inv(), self.healthy.__getitem__, slices.DriverVersions())), **kw)

    def stored(self) -> dict:  # type: ignore[type-arg]
        return self.server.get("resourceslices", NAME)

    def stored_as(self, name: str) -> dict:  # type: ignore[type-arg]
        return self.server.get("resourceslices", name)


@pytest.fixture
def rig():  # type: ignore[no-untyped-def]
    r = Rig()
    yield r
    r.server.close()


def test_sync_creates_then_leaves_an_unchanged_slice_alone(rig, tmp_path):
    p = rig.publisher(tmp_path)
    assert p.sync() is True
    s = rig.stored()
    assert s["spec"]["pool"]["generation"] == 1
    assert s["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "n-uid",
                                                 "controller": True}]
    assert p.sync() is False and rig.stored()["metadata"]["resourceVersion"] == s["metadata"]["resourceVersion"]


def test_a_health_change_bumps_the_generation(rig, tmp_path):
    p = rig.publisher(tmp_path)
    p.sync()
    rig.healthy[gpu(2).uuid] = False
    assert p.sync() is True
    s = rig.stored()
    assert s["spec"]["pool"]["generation"] == 2
    assert [d["name"] for d in s["spec"]["devices"]] == ["gpu-0", "gpu-1"]


def test_a_restarted_driver_continues_the_generation_and_removes_stale_slices(rig, tmp_path):
    rig.publisher(tmp_path).sync()
    stale = {**rig.stored(), "metadata": {"name": f"{NODE}-{DRIVER}-old"}}
    stale["spec"] = {**stale["spec"], "pool": {"name": NODE, "generation": 7, "resourceSliceCount": 1}}
    rig.server.put("resourceslices", stale)
    other_node = {**rig.stored(), "metadata": {"name": f"node-2-{DRIVER}"}}
    other_node["spec"] = {**other_node["spec"], "nodeName": "node-2"}
    rig.server.put("resourceslices", other_node)
    again = rig.publisher(tmp_path)
    assert again.sync() is True
    assert set(rig.server.objects["resourceslices"]) == {NAME, f"node-2-{DRIVER}"}
    assert rig.stored()["spec"]["pool"]["generation"] == 8


def test_someone_elses_change_is_overwritten(rig, tmp_path):
    p = rig.publisher(tmp_path)
    p.sync()
    changed = rig.stored()
    changed["spec"]["devices"] = []
    rig.server.put("resourceslices", changed)
    assert p.sync() is True
    assert len(rig.stored()["spec"]["devices"]) == 3


def test_the_thread_republishes_on_change_and_after_deletion(rig, tmp_path):
    p = rig.publisher(tmp_path, resync_s=0.2)
    p.start()
    try:
        wait_for(p.published.is_set, 10, "the first publish")
        rig.healthy[gpu(0).uuid] = False
        p.changed()
        wait_for(lambda: len(rig.stored()["spec"]["devices"]) == 2, 10, "gpu-0 to leave")
        rig.server.delete("resourceslices", NAME)
        wait_for(lambda: rig.stored() is not None, 10, "the slice to come back")
    finally:
        p.stop()


def test_an_api_server_that_is_away_is_retried(rig, tmp_path):
    rig.server.fail_requests = 3
    p = rig.publisher(tmp_path, retry_s=0.05)
    p.start()
    try:
        wait_for(p.published.is_set, 10, "publishing once the API server answers")
    finally:
        p.stop()
    assert rig.stored()["spec"]["pool"]["generation"] == 1


def counting_builds(p: slices.SlicePublisher) -> list[int]:
    """Each build of the pools from now on appends to the list returned."""
    builds: list[int] = []
    build = p.build

    def counted():  # type: ignore[no-untyped-def]
        builds.append(1)
        return build()
    p.build = counted
    return builds


def test_a_kubelet_call_in_flight_holds_the_publisher_back_until_it_ends(rig, tmp_path):
    p = rig.publisher(tmp_path, max_hold_s=3600)
    p.start()
    try:
        wait_for(p.published.is_set, 10, "the first publish")
        builds = counting_builds(p)
        with p.busy():
            rig.healthy[gpu(0).uuid] = False
            p.changed()
            wait_for(p.held.is_set, 10, "the publisher to hold back")
            assert builds == [] and len(rig.stored()["spec"]["devices"]) == 3
        wait_for(lambda: len(rig.stored()["spec"]["devices"]) == 2, 10, "gpu-0 to leave once the call ended")
    finally:
        p.stop()


def test_calls_that_never_end_hold_the_publisher_back_for_max_hold_s_only(rig, tmp_path):
    p = rig.publisher(tmp_path, max_hold_s=0.05)
    p.start()
    try:
        wait_for(p.published.is_set, 10, "the first publish")
        with p.busy():
            rig.healthy[gpu(0).uuid] = False
            p.changed()
            wait_for(lambda: len(rig.stored()["spec"]["devices"]) == 2, 10, "gpu-0 to leave during the call")
            assert p.held.is_set()
    finally:
        p.stop()


# ---- counter sets: laid out as the API server's version accepts them ---------------------------------

@pytest.mark.parametrize("info,version", [
    ({"major": "1", "minor": "34", "gitVersion": "v1.34.4"}, (1, 34)),
    ({"major": "1", "minor": "36", "gitVersion": "v1.36.3"}, (1, 36)),
    ({"major": "1", "minor": "35+", "gitVersion": "v1.35.2-eks-113cf36"}, (1, 35)),   # a distribution's
    ({"major": "1", "minor": "34+"}, (1, 34)),
    ({"gitVersion": "unknown"}, None),
    ({}, None),
])
def test_the_server_version_comes_from_discovery(info, version):
    assert slices.server_version(info) == version


@pytest.mark.parametrize("version,layout", [
    ((1, 33), slices.WITH_DEVICES), ((1, 34), slices.WITH_DEVICES),
    ((1, 35), slices.OWN_SLICE), ((1, 36), slices.OWN_SLICE), ((2, 0), slices.OWN_SLICE),
    (None, slices.OWN_SLICE),   # unknown: the current API's rule
])
def test_the_layout_follows_the_version(version, layout):
    assert slices.counter_layout(version) == layout


POOL = f"{NODE}-gpu-0"
GPU0 = f"{NAME}-gpu-0"
COUNTER_SET = {"name": "gpu-0-counters", "counters": {"memory-slice-0": {"value": "1"},
                                                      "memory-slice-1": {"value": "1"}}}


def consuming(name: str, *counters: str) -> dict:  # type: ignore[type-arg]
    return {"name": name, "attributes": {"type": {"string": "mig"}},
            "consumesCounters": [{"counterSet": "gpu-0-counters",
                                  "counters": {c: {"value": "1"} for c in counters}}]}


def partitioned() -> slices.Pools:
    """As dra_driver.partitions builds them: the node's pool, and a GPU's with its counter set beside its devices."""
    return {NODE: {NAME: {"devices": [{"name": "gpu-1", "attributes": {"type": {"string": "gpu"}}}]}},
            POOL: {GPU0: {"sharedCounters": [COUNTER_SET],
                          "devices": [consuming("gpu-0", "memory-slice-0", "memory-slice-1"),
                                      consuming("gpu-0-mig-1g-0", "memory-slice-0")]}}}


def test_lay_out_moves_each_counter_set_to_a_slice_of_its_own_in_the_same_pool():
    built = partitioned()
    assert slices.lay_out(built, slices.WITH_DEVICES) == built
    apart = slices.lay_out(built, slices.OWN_SLICE)
    assert apart == {NODE: built[NODE], POOL: {f"{GPU0}-counters": {"sharedCounters": [COUNTER_SET]},
                                               GPU0: {"devices": built[POOL][GPU0]["devices"]}}}
    assert list(apart[POOL]) == [f"{GPU0}-counters", GPU0]   # the counter set is written first
    assert built[POOL][GPU0]["sharedCounters"] == [COUNTER_SET]   # the built pools are left as they were


def spec_of(slice_: dict) -> dict:  # type: ignore[type-arg]
    return {k: v for k, v in slice_["spec"].items() if k not in ("driver", "nodeName")}


@pytest.mark.parametrize("version", ["1.34.4", "1.36.3"])
def test_the_slices_have_the_shape_the_api_servers_version_accepts(rig, tmp_path, version):
    """The exact slices of a partitioned GPU's pool, written through the fake API server, which refuses
    what that version refuses (kube_contract.testing.slice_problems)."""
    rig.server.version = version
    p = rig.publisher(tmp_path, build=partitioned)
    assert p.sync() is True
    built = partitioned()[POOL][GPU0]
    stored = {k: spec_of(v) for k, v in rig.server.objects["resourceslices"].items()}
    if version == "1.34.4":
        assert p.layout == slices.WITH_DEVICES
        assert stored == {NAME: {"pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                                 "devices": partitioned()[NODE][NAME]["devices"]},
                          GPU0: {"pool": {"name": POOL, "generation": 1, "resourceSliceCount": 1},
                                 "sharedCounters": [COUNTER_SET], "devices": built["devices"]}}
    else:
        assert p.layout == slices.OWN_SLICE
        assert stored == {NAME: {"pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                                 "devices": partitioned()[NODE][NAME]["devices"]},
                          f"{GPU0}-counters": {"pool": {"name": POOL, "generation": 1, "resourceSliceCount": 2},
                                               "sharedCounters": [COUNTER_SET]},
                          GPU0: {"pool": {"name": POOL, "generation": 1, "resourceSliceCount": 2},
                                 "devices": built["devices"]}}
    assert p.sync() is False   # and then left alone


def bodies(layout: str) -> list[dict]:  # type: ignore[type-arg]
    laid = slices.lay_out(partitioned(), layout)[POOL]
    return [slices.resource_slice(NODE, None, 1, part, name=name, count=len(laid), pool=POOL)
            for name, part in laid.items()]


@pytest.mark.parametrize("version,refused,message", [
    ("1.34.4", slices.OWN_SLICE, 'spec.devices[0].consumesCounters[0].counterSet: Invalid value: "gpu-0-counters": '
                                 "must reference a counterSet defined in the ResourceSlice sharedCounters"),
    ("1.36.3", slices.WITH_DEVICES, 'spec: Invalid value: "": only one of `sharedCounters` or `devices` is allowed'),
])
def test_each_version_refuses_the_other_layout(rig, tmp_path, version, refused, message):
    """What the real API servers answered (e2e/README.md), as the fake API server answers it."""
    rig.server.version = version
    api = rig.api(tmp_path)
    with pytest.raises(ApiError, match="422") as exc:
        for body in bodies(refused):
            api.create_slice(body)
    assert message in str(exc.value)
    for name in list(rig.server.objects["resourceslices"]):
        rig.server.delete("resourceslices", name)
    for body in bodies(slices.OWN_SLICE if refused == slices.WITH_DEVICES else slices.WITH_DEVICES):
        api.create_slice(body)


def test_the_fake_api_server_enforces_the_counter_limits_of_each_version():
    from kube_contract.testing import slice_problems

    many = {"sharedCounters": [{"name": "s", "counters": {f"c-{i}": {"value": "1"} for i in range(33)}}]}
    assert "the total number of shared counters must not exceed 32" in slice_problems(many, "1.34.4")[0]
    assert "must have at most 32 items" in slice_problems(many, "1.36.3")[0]
    devices = {"devices": [consuming(f"d-{i}", "memory-slice-0") for i in range(65)]}
    assert slice_problems({**devices, "sharedCounters": [COUNTER_SET]}, "1.34.4") == []
    assert slice_problems(devices, "1.36.3") == ["spec.devices: Too many: 65: must have at most 64 items"]
    unknown = {"sharedCounters": [COUNTER_SET], "devices": [consuming("d", "memory-slice-9")]}
    assert slice_problems(unknown, "1.34.4") == [
        'spec.devices[0].consumesCounters[0].counters: Invalid value: "memory-slice-9": must reference a counter '
        "defined in the ResourceSlice sharedCounters"]


def version_reads(rig: Rig) -> int:
    return sum(r.path.rstrip("/") == "/version" for r in rig.server.requests)


def test_a_control_plane_upgraded_under_the_driver_gets_the_other_layout_at_the_next_resync(rig, tmp_path):
    """The version is read at the first sync and at each resync (not when woken by a change of ours): the
    pool is rewritten in the new layout, with the next generation, and the slice that no longer belongs
    is deleted. Downgrades alike."""
    rig.server.version = "1.34.4"
    p = rig.publisher(tmp_path, build=partitioned)
    p.sync()
    assert set(rig.server.objects["resourceslices"]) == {NAME, GPU0} and version_reads(rig) == 1
    rig.server.version = "1.36.3"
    assert p.sync(local=True) is False and version_reads(rig) == 1   # our devices did not change
    assert p.sync() is True and p.layout == slices.OWN_SLICE and version_reads(rig) == 2
    stored = rig.server.objects["resourceslices"]
    assert set(stored) == {NAME, GPU0, f"{GPU0}-counters"}
    assert "sharedCounters" not in stored[GPU0]["spec"]
    assert {stored[n]["spec"]["pool"]["generation"] for n in (GPU0, f"{GPU0}-counters")} == {2}
    assert stored[NAME]["spec"]["pool"]["generation"] == 1   # the node's own pool is as it was
    rig.server.version = "1.34.4"
    assert p.sync() is True and p.layout == slices.WITH_DEVICES
    assert set(stored) == {NAME, GPU0} and stored[GPU0]["spec"]["sharedCounters"] == [COUNTER_SET]
    assert stored[GPU0]["spec"]["pool"] == {"name": POOL, "generation": 3, "resourceSliceCount": 1}


def test_a_slice_that_goes_is_deleted_only_after_its_pools_next_generation_is_written(rig, tmp_path):
    """A GPU's partitions leave (1.36: its counter set had a slice of its own): the GPU's slice is rewritten,
    one slice to the pool now, before the counter set's slice goes. Deleted first, the pool would declare
    two slices and hold one, incomplete to a scheduler (and to a test that waits for the set to go)."""
    rig.server.version = "1.36.3"
    pools = partitioned()
    p = rig.publisher(tmp_path, build=lambda: pools)
    p.sync()
    assert f"{GPU0}-counters" in rig.server.objects["resourceslices"]
    pools = {**pools, POOL: {GPU0: {"devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}]}}}
    del rig.server.requests[:]
    assert p.sync() is True
    writes = [(r.method, r.path.rsplit("/", 1)[-1]) for r in rig.server.requests if r.method in ("PUT", "DELETE")]
    assert writes == [("PUT", GPU0), ("DELETE", f"{GPU0}-counters")]
    assert rig.stored_as(GPU0)["spec"]["pool"] == {"name": POOL, "generation": 2, "resourceSliceCount": 1}
    assert set(rig.server.objects["resourceslices"]) == {NAME, GPU0}


def test_a_pool_that_loses_a_slice_is_rewritten_with_its_new_count_even_if_the_rest_is_unchanged(rig, tmp_path):
    """A pool of two slices loses one whose neighbour stays as it was: that slice still gets the next
    generation and a count of one, else the pool would declare a slice that is gone."""
    gpu0 = {"devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}]}
    other = {"devices": [{"name": "gpu-0-b", "attributes": {"type": {"string": "gpu"}}}]}
    pools = {NODE: partitioned()[NODE], POOL: {GPU0: gpu0, f"{GPU0}-b": other}}
    p = rig.publisher(tmp_path, build=lambda: pools)
    p.sync()
    assert rig.stored_as(GPU0)["spec"]["pool"] == {"name": POOL, "generation": 1, "resourceSliceCount": 2}
    pools = {NODE: partitioned()[NODE], POOL: {GPU0: gpu0}}
    assert p.sync() is True
    assert rig.stored_as(GPU0)["spec"]["pool"] == {"name": POOL, "generation": 2, "resourceSliceCount": 1}
    assert set(rig.server.objects["resourceslices"]) == {NAME, GPU0}
