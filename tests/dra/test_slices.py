"""The node's ResourceSlice: what it holds, that it fits the resource.k8s.io/v1 schema, and how the
publisher keeps it current in the API server (health changes, deletions, an API server that is away)."""

from __future__ import annotations

import pytest

from dra_driver import slices
from dra_driver.kube import KubeAPI
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

    def publisher(self, tmp_path, **kw) -> slices.SlicePublisher:  # type: ignore[no-untyped-def]
        api = KubeAPI(make_api_client(str(self.server.kubeconfig(tmp_path / "kc"))), timeout=5)
        return slices.SlicePublisher(
            api, NODE, lambda: slices.devices(inv(), self.healthy.__getitem__, slices.DriverVersions()), **kw)

    def stored(self) -> dict:  # type: ignore[type-arg]
        return self.server.get("resourceslices", NAME)


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
