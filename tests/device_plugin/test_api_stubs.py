"""The checked-in kubelet API stubs match their .proto files and the kubelet's wire names."""

from __future__ import annotations

import pytest

from kube_contract.api import deviceplugin_v1beta1_pb2 as dp
from kube_contract.api import podresources_v1_pb2 as pr


def test_stubs_are_regenerated_from_the_protos() -> None:
    pytest.importorskip("grpc_tools")
    from kube_contract.api import generate

    assert generate.main(["--check"]) == 0


def test_service_names_are_the_kubelets() -> None:
    services = {s.full_name for s in (*dp.DESCRIPTOR.services_by_name.values(),
                                      *pr.DESCRIPTOR.services_by_name.values())}
    assert services == {"v1beta1.Registration", "v1beta1.DevicePlugin", "v1.PodResourcesLister"}
    methods = set(dp.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name)
    assert methods == {"GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate",
                       "PreStartContainer"}


def test_field_numbers_match_upstream() -> None:
    """Spot checks of the wire numbers kubelet uses (a renumbered field would silently break)."""
    container = dp.ContainerAllocateResponse.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in container.items()} == {
        "envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    mount = dp.Mount.DESCRIPTOR.fields_by_name
    assert (mount["container_path"].number, mount["host_path"].number, mount["read_only"].number) == (1, 2, 3)
    pref = dp.ContainerPreferredAllocationRequest.DESCRIPTOR.fields_by_name
    assert (pref["available_deviceIDs"].number, pref["must_include_deviceIDs"].number,
            pref["allocation_size"].number) == (1, 2, 3)
    devices = pr.ContainerDevices.DESCRIPTOR.fields_by_name
    assert (devices["resource_name"].number, devices["device_ids"].number) == (1, 2)
