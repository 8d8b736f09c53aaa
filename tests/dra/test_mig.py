"""MIG through the DRA driver: each MIG instance is a device of the node's ResourceSlice (a GPU in
MIG mode never offered whole), a claim for an instance prepares to a CDI spec exposing exactly that
instance, and a share of an instance is a tenant of the instance's own token scheduler, held to
its memory by libvcuda (on the simulator's MIG)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
from shimtest import cdi_container, container_env_on_host, parse
from simnvml import check_instance_share_reported

from dra_driver import slices
from dra_driver import testing as t
from node_state.testing import ISSUE_NODE_MIG, FakeMig
from py_vcuda.ledger import Ledger
from py_vcuda.sim import GiB, MiB, SimConfig

NODE = t.NODE


def spec_env(agent: Any, claim: dict[str, Any]) -> dict[str, str]:
    spec = json.loads(agent.driver.specs.path(claim["metadata"]["uid"]).read_text())
    (device,) = spec["devices"]
    return dict(kv.split("=", 1) for kv in device["containerEdits"]["env"])


def test_instances_are_devices_and_a_mig_gpu_is_never_offered_whole():
    mig = FakeMig(ISSUE_NODE_MIG)
    inv = mig.inventory()
    devs = {d["name"]: d for d in slices.devices(inv, lambda u: True, slices.DriverVersions())}
    instances = mig.instances[0]
    assert set(devs) == {"gpu-1", "gpu-2", *(slices.mig_device_name(d) for d in instances)}   # no gpu-0
    small = instances[0]
    a = devs[slices.mig_device_name(small)]["attributes"]
    assert a["type"] == {"string": "mig"} and a["uuid"] == {"string": small.uuid}
    assert a["parentUUID"] == {"string": inv.gpus[0].uuid} and a["index"] == {"int": 0}
    assert (a["profile"], a["memory"], a["multiprocessors"], a["slices"]) == (
        {"string": small.profile}, {"int": small.memory_total}, {"int": small.multiprocessors},
        {"int": small.slices})
    assert (a["placementStart"], a["placementSize"]) == ({"int": small.placement.start},
                                                        {"int": small.placement.size})
    assert devs["gpu-1"]["attributes"]["type"] == {"string": "gpu"}
    # The same consumable capacity as a whole GPU, within the instance's memory.
    assert devs[slices.mig_device_name(small)]["capacity"] == slices.capacity(small.memory_total)
    assert devs[slices.mig_device_name(small)]["allowMultipleAllocations"] is True


def test_an_instance_follows_its_gpus_health():
    mig = FakeMig(ISSUE_NODE_MIG)
    inv = mig.inventory()
    unhealthy = inv.gpus[0].uuid
    from node_state.gpus import Health

    health = Health()
    for d in inv.mig_devices():
        health.follow(d.uuid, d.parent_uuid)
    health.set(unhealthy, False)
    names = [d["name"] for d in slices.devices(inv, health.healthy, slices.DriverVersions())]
    assert names == ["gpu-1", "gpu-2"]


def test_a_claim_for_an_instance_exposes_exactly_that_instance(agent_factory, kubelet, api):
    mig = FakeMig(ISSUE_NODE_MIG)
    agent = agent_factory(inv=mig.inventory())
    big = mig.instances[0][2]
    claim = api.put("resourceclaims", t.claim("whole-mig", NODE, [
        {"request": "gpu", "driver": "gpu.vcuda.io", "pool": NODE, "device": slices.mig_device_name(big)}]))
    resp = kubelet.prepare(claim)
    assert resp.claims[claim["metadata"]["uid"]].error == ""
    assert spec_env(agent, claim)["NVIDIA_VISIBLE_DEVICES"] == big.uuid
    (record,) = agent.store.records()
    assert record.gpus == (big.uuid,) and record.tenant is None and record.memory_limit is None


def test_a_share_of_an_instance_is_a_tenant_of_its_own_scheduler(agent_factory, kubelet, api):
    mig = FakeMig(ISSUE_NODE_MIG)
    agent = agent_factory(inv=mig.inventory())
    small = mig.instances[0][0]
    device = slices.mig_device_name(small)
    claim = api.put("resourceclaims", t.claim("share-mig", NODE, [
        {**t.share(NODE, 0, 30, 2 * GiB), "device": device}]))
    resp = kubelet.prepare(claim)
    assert resp.claims[claim["metadata"]["uid"]].error == ""
    (record,) = agent.store.records()
    assert record.gpus == (small.uuid,) and record.memory_limit == 2 * GiB and record.core_request == 30
    assert spec_env(agent, claim)["NVIDIA_VISIBLE_DEVICES"] == small.uuid
    assert record.tenant is not None and agent.schedulers[small.uuid].tenant_dir(record.tenant).is_dir()
    assert [q[0] for q in agent.store.tenants(small.uuid)] == [record.tenant]
    assert mig.gpus_[0].uuid not in agent.schedulers   # the GPU in MIG mode runs nothing itself


def _sim_has_mig() -> bool:
    import ctypes

    from py_vcuda import native

    try:
        return hasattr(ctypes.CDLL(str(native.lib_path(native.SIM_NVML))), "nvmlDeviceGetMigMode")
    except (OSError, native.NativeLibraryMissing):
        return False


@pytest.mark.skipif(not _sim_has_mig(), reason="the simulator library here predates MIG: build this checkout "
                    "(cmake) and set VCUDA_LIB_DIR=$PWD/build/lib")
def test_a_share_of_a_1g_instance_is_held_to_its_memory_on_the_simulator(agent_factory, kubelet, api, short_dir,
                                                                         build_c):
    from node_state.gpus import Inventory
    from py_vcuda.sim import nvml_session

    sim = SimConfig(state_path=short_dir / "sim", devices=3, memory=16 * GiB, context_overhead=64 * MiB,
                    mig=list(ISSUE_NODE_MIG))
    cuprobe = build_c(["cuprobe.c"])
    with nvml_session(sim) as nvml:
        inv = Inventory.from_nvml(nvml)
    small = next(d for d in inv.mig_devices() if d.profile == "1g.10gb")
    agent = agent_factory(inv=inv)
    claim = api.put("resourceclaims", t.claim("sim-share", NODE, [
        {**t.share(NODE, 0, 30, GiB), "device": slices.mig_device_name(small)}]))
    resp = kubelet.prepare(claim)
    assert resp.claims[claim["metadata"]["uid"]].error == ""
    spec = json.loads(agent.driver.specs.path(claim["metadata"]["uid"]).read_text())
    (device,) = spec["devices"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
    env.update(sim.env())
    env.update(container_env_on_host(*cdi_container(device["containerEdits"])))
    env["CUDA_VISIBLE_DEVICES"] = env["NVIDIA_VISIBLE_DEVICES"]   # what the NVIDIA runtime exposes
    assert env["NVIDIA_VISIBLE_DEVICES"] == small.uuid
    proc = subprocess.run([str(cuprobe), "init", "ctx", f"alloc:{512 * MiB}", f"alloc:{640 * MiB}",
                           "spin:2000:300"], env=env, capture_output=True, text=True, timeout=120)
    allocs = [int(d["rc"]) for d in parse(proc.stdout) if d["cmd"] == "alloc"]
    assert allocs == [0, 2], proc.stdout + proc.stderr   # 64 MiB context + 512 + 640 MiB > 1 GiB: out of memory
    (record,) = agent.store.records()
    with Ledger(agent.layout.ledger_path(record.key)) as ledger:
        devices = ledger.devices()
    assert [d.uuid for d in devices] == [small.uuid] and devices[0].limit == GiB
    # The exporter's and `vcuda top`'s reading: the share on the instance, under its parent GPU, with its
    # scheduler's figures, as the device plugin's vgpu shares of an instance.
    check_instance_share_reported(agent.layout, NODE, sim, small.uuid, {d.uuid for d in inv.mig_devices()}, GiB)
