"""The checked-in plugin-registration and DRA stubs carry the kubelet's wire names (their regeneration
check is tests/device_plugin/test_api_stubs.py's: one generator for every kubelet proto)."""

from __future__ import annotations

import pytest

from kube_contract.api import dra_v1_pb2, dra_v1beta1_pb2
from kube_contract.api import pluginregistration_v1_pb2 as reg


def test_service_names_are_the_kubelets() -> None:
    """The gRPC method paths the kubelet calls: upstream's proto packages, unchanged."""
    assert [s.full_name for s in reg.DESCRIPTOR.services_by_name.values()] == ["pluginregistration.Registration"]
    assert set(reg.DESCRIPTOR.services_by_name["Registration"].methods_by_name) == {
        "GetInfo", "NotifyRegistrationStatus"}
    for module, version in ((dra_v1_pb2, "v1"), (dra_v1beta1_pb2, "v1beta1")):
        (service,) = module.DESCRIPTOR.services_by_name.values()
        assert service.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
        assert set(service.methods_by_name) == {"NodePrepareResources", "NodeUnprepareResources"}


@pytest.mark.parametrize("pb", [dra_v1_pb2, dra_v1beta1_pb2], ids=["v1", "v1beta1"])
def test_field_numbers_match_upstream(pb) -> None:  # type: ignore[no-untyped-def]
    """Spot checks of the wire numbers (a renumbered field would silently break)."""
    def numbers(message) -> dict[str, int]:  # type: ignore[no-untyped-def]
        return {n: f.number for n, f in message.DESCRIPTOR.fields_by_name.items()}

    assert numbers(pb.Claim) == {"namespace": 1, "uid": 2, "name": 3}
    assert numbers(pb.Device) == {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}
    assert numbers(pb.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
    assert numbers(pb.NodeUnprepareResourceResponse) == {"error": 1}
    assert numbers(pb.NodePrepareResourcesRequest) == {"claims": 1}
    assert numbers(pb.NodePrepareResourcesResponse) == {"claims": 1}


def test_registration_field_numbers_match_upstream() -> None:
    info = {n: f.number for n, f in reg.PluginInfo.DESCRIPTOR.fields_by_name.items()}
    assert info == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    status = {n: f.number for n, f in reg.RegistrationStatus.DESCRIPTOR.fields_by_name.items()}
    assert status == {"plugin_registered": 1, "error": 2}


def test_stubs_load_beside_the_device_plugins() -> None:
    """One process may hold both (the test suite does): no clashing symbols in the descriptor pool."""
    from kube_contract.api import deviceplugin_v1beta1_pb2, podresources_v1_pb2  # noqa: F401

    assert dra_v1beta1_pb2.Device.DESCRIPTOR.full_name == "k8s.io.kubelet.pkg.apis.dra.v1beta1.Device"
