"""The device plugin's reconciler leaves alone the containers another part set up in the same state
directory (a DRA driver's claims): it would otherwise read their quota from vgpu annotations the pod
never wrote, and make a claim's memory limit unlimited, or remove a claim's container while it runs.
Its own include pgpu's MIG containers (mixed strategy, nvidia.com/mig-<profile>)."""

from __future__ import annotations

import time
from pathlib import Path

from device_plugin.pods import StaticPods
from device_plugin.reconcile import Reconciler
from kube_contract.names import Names
from kube_contract.podresources import PodRef
from node_state.containers import ContainerStore
from node_state.layout import ContainerRecord, NodeLayout
from py_vcuda.ledger import Ledger

NODE = "node-1"
GiB = 1 << 30
UUID = "GPU-00000000-0000-0000-0000-000000000000"


def _pod(name: str) -> dict:  # type: ignore[type-arg]
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": {}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "resources": {}}]},
            "status": {"phase": "Running"}}


def _claim_record(key: str, pod_uid: str) -> ContainerRecord:
    # As dra_driver.driver writes it: mode vgpu (the enforcement), resource = the DRA driver's name.
    return ContainerRecord(key=key, mode="vgpu", resource="gpu.vcuda.io", device_ids=(f"{NODE}/gpu-0",),
                           gpus=(UUID,), core_request=30, core_limit=30, memory_limit=8 * GiB, tenant=None,
                           namespace="default", pod="app" if pod_uid else "", pod_uid=pod_uid, container="main",
                           created=time.time() - 3600, extra={"driver": "gpu.vcuda.io", "claim_uid": key})


def test_reconciler_leaves_dra_containers_alone(tmp_path: Path) -> None:
    store = ContainerStore(NodeLayout(tmp_path / "state"))
    store.layout.containers.mkdir(parents=True)
    named, unnamed = _claim_record("cnamed", "uid-app"), _claim_record("cunnamed", "")
    for record in (named, unnamed):
        store.create(record, ledger=True, preload=True)
    rec = Reconciler(store, {}, StaticPods([_pod("app")]), names=Names(), node=NODE, in_use=lambda: {},
                     grace_s=0.0, interval_s=60)

    rec.run_once()

    kept = {r.key: r for r in store.records()}
    assert set(kept) == {"cnamed", "cunnamed"}          # neither removed as "not in use"
    assert kept["cnamed"].memory_limit == 8 * GiB       # not re-read from vgpu annotations (none: unlimited)
    with Ledger(store.layout.ledger_path("cnamed")) as book:
        assert [d.limit for d in book.devices()] == [8 * GiB]


def _mig_record(key: str, mig: str) -> ContainerRecord:
    # As device_plugin.pgpu's Allocate writes it for the mixed strategy: no pod known yet.
    return ContainerRecord(key=key, mode="pgpu", resource="nvidia.com/mig-1g.10gb", device_ids=(mig,), gpus=(mig,),
                           core_request=100, core_limit=100, memory_limit=None, tenant=None, namespace="", pod="",
                           pod_uid="", container="", created=time.time() - 3600, extra={})


def test_mig_containers_are_the_plugins_own(tmp_path: Path) -> None:
    """A MIG container whose devices kubelet no longer lists goes (the e2e tier's scenario 3: it kept its
    GPU busy for good, so a layout by node label never applied); one in use takes its pod's identity."""
    store = ContainerStore(NodeLayout(tmp_path / "state"))
    store.layout.containers.mkdir(parents=True)
    used, gone = _mig_record("cused", "MIG-aaaa"), _mig_record("cgone", "MIG-bbbb")
    for record in (used, gone):
        store.create(record, ledger=False, preload=False)
    in_use = {("nvidia.com/mig-1g.10gb", "MIG-aaaa"): PodRef("default", "app", "main")}
    rec = Reconciler(store, {}, StaticPods([_pod("app")]), names=Names(), node=NODE, in_use=lambda: in_use,
                     grace_s=0.0, interval_s=60)

    rec.run_once()

    kept = {r.key: r for r in store.records()}
    assert set(kept) == {"cused"}
    assert (kept["cused"].pod, kept["cused"].pod_uid) == ("app", "uid-app")
    rec.pods = StaticPods([])      # the pod deleted
    rec.run_once()
    assert list(store.records()) == []
