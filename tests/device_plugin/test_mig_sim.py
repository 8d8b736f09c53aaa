"""MIG end to end: the real agent process (`python -m device_plugin`) on the simulator's NVML and
CUDA (SimConfig.mig), the test kubelet and the fake API server. The strategies' resources are the
simulator's MIG devices; an allocated instance is what a simulated CUDA program sees; a layout
named by the node label changes the simulator's instances; a busy GPU keeps its layout."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from simnvml import check_instance_share_reported
from simtool import Children, lines

from device_plugin.mig_config import CONFIG_LABEL, STATE_LABEL
from kube_contract.testing import FakeApiServer
from node_state.testing import EXAMPLE_LAYOUTS, ISSUE_NODE_MIG
from py_vcuda.sim import GiB, MiB, SimConfig, SimReader


def _sim_has_mig() -> bool:
    import ctypes

    from py_vcuda import native

    try:
        return hasattr(ctypes.CDLL(str(native.lib_path(native.SIM_NVML))), "nvmlDeviceGetMigMode")
    except (OSError, native.NativeLibraryMissing):
        return False


pytestmark = pytest.mark.skipif(not _sim_has_mig(), reason="the simulator library here predates MIG: build this "
                                "checkout (cmake) and set VCUDA_LIB_DIR=$PWD/build/lib")


@pytest.fixture
def sim(short_dir: Path) -> SimConfig:
    return SimConfig(state_path=short_dir / "sim", devices=3, memory=16 * GiB, context_overhead=64 * MiB,
                     mig=list(ISSUE_NODE_MIG))


def instances(sim: SimConfig, device: int) -> list[tuple[str, str, int]]:
    """(profile, MIG uuid, memory) of a device's MIG devices, as the simulator holds them."""
    with mock.patch.dict(os.environ, sim.env()), SimReader(sim.state_path, create=True) as r:
        return sorted((i.profile, i.uuid, i.memory_total) for i in r.mig(device).instances)


def gpu_uuids(sim: SimConfig) -> list[str]:
    with mock.patch.dict(os.environ, sim.env()), SimReader(sim.state_path, create=True) as r:
        return [r.device(i).uuid for i in range(3)]


@pytest.fixture
def children(sim_tool: Path, sim: SimConfig):  # type: ignore[no-untyped-def]
    kids = Children(sim_tool, sim.env())
    yield kids
    kids.close()


def run_agent(dp, short_dir: Path, sim: SimConfig, *args: str):  # type: ignore[no-untyped-def]
    return dp.spawn_plugin(short_dir, sim, "--mode", "pgpu", *args)


def test_mixed_offers_the_simulators_instances_and_cuda_sees_the_allocated_one(kubelet, short_dir, dp, sim,
                                                                               sim_tool):
    migs = instances(sim, 0)
    gpus = gpu_uuids(sim)
    proc = run_agent(dp, short_dir, sim, "--mig-strategy", "mixed")
    try:
        small = sorted(d.ID for d in kubelet.latest_devices("nvidia.com/mig-1g.10gb"))
        (big,) = [d.ID for d in kubelet.latest_devices("nvidia.com/mig-3g.40gb")]
        assert small == sorted(u for p, u, _ in migs if p == "1g.10gb")
        assert big == next(u for p, u, _ in migs if p == "3g.40gb")
        assert sorted(d.ID for d in kubelet.latest_devices("nvidia.com/gpu")) == sorted(gpus[1:])
        envs = dict(kubelet.allocate("nvidia.com/mig-3g.40gb", [big]).container_responses[0].envs)
    finally:
        log = dp.stop_plugin(proc, short_dir)
    assert proc.returncode == 0, log
    assert envs == {"NVIDIA_VISIBLE_DEVICES": big}
    # The runtime turns NVIDIA_VISIBLE_DEVICES into the devices the container sees: that instance only.
    import subprocess

    out = subprocess.run([str(sim_tool), "init", "count", "ctx", "0", "info"], capture_output=True, text=True,
                         env={**os.environ, **sim.env(), "CUDA_VISIBLE_DEVICES": envs["NVIDIA_VISIBLE_DEVICES"]},
                         timeout=30, check=True).stdout
    from simtool import parse

    parsed = parse(out)
    assert lines(parsed, "count")[0].rest == ["1"]
    assert int(lines(parsed, "info")[0].rest[1]) == next(m for p, _, m in migs if p == "3g.40gb")


def test_none_offers_no_mig_gpu_and_single_refuses_the_issue_node(kubelet, short_dir, dp, sim):
    gpus = gpu_uuids(sim)
    proc = run_agent(dp, short_dir, sim, "--mig-strategy", "none")
    try:
        assert sorted(d.ID for d in kubelet.latest_devices("nvidia.com/gpu")) == sorted(gpus[1:])
    finally:
        log = dp.stop_plugin(proc, short_dir)
    assert proc.returncode == 0, log
    assert "are in MIG mode: not offered" in log
    proc = run_agent(dp, short_dir, sim, "--mig-strategy", "single")
    proc.wait(timeout=60)
    log = dp.stop_plugin(proc, short_dir)
    assert proc.returncode != 0
    assert "mig-strategy single needs every GPU in MIG mode" in log


def test_single_offers_every_instance_as_nvidia_gpu(kubelet, short_dir, dp):
    uniform = SimConfig(state_path=short_dir / "sim1", devices=2, memory=16 * GiB,
                        mig=["on:2g.20gb,2g.20gb", "on:2g.20gb"])
    migs = [u for d in (0, 1) for _, u, _ in instances(uniform, d)]
    proc = run_agent(dp, short_dir, uniform, "--mig-strategy", "single")
    try:
        assert sorted(d.ID for d in kubelet.latest_devices("nvidia.com/gpu")) == sorted(migs)
    finally:
        log = dp.stop_plugin(proc, short_dir)
    assert proc.returncode == 0, log


def test_vgpu_mode_shares_the_instances_and_never_the_mig_gpu(kubelet, short_dir, dp, sim):
    gpus = gpu_uuids(sim)
    proc = dp.spawn_plugin(short_dir, sim, "--mode", "vgpu", "--without-api-server")
    try:
        offered = {d.ID.split("::")[0] for d in kubelet.latest_devices("tencent.com/vcuda-core")}
    finally:
        log = dp.stop_plugin(proc, short_dir)
    assert proc.returncode == 0, log
    assert offered == {*gpus[1:], *(u for _, u, _ in instances(sim, 0))}
    assert "each of their MIG instances is shared as a GPU of its own" in log


# ---- layouts by node label ----------------------------------------------------------

@pytest.fixture
def api(dp) -> Any:
    server = FakeApiServer()
    server.add_node(dp.NODE)
    yield server
    server.close()


def label(api: FakeApiServer, dp, name: str) -> None:  # type: ignore[no-untyped-def]
    api.core_v1().patch_node(dp.NODE, {"metadata": {"labels": {CONFIG_LABEL: name, STATE_LABEL: None}}},
                             _content_type="application/merge-patch+json", _preload_content=False)


def events(api: FakeApiServer) -> list[dict[str, Any]]:
    with api.lock:
        return [dict(e) for e in api.objects["events"].values()]


def state(api: FakeApiServer, dp) -> str | None:  # type: ignore[no-untyped-def]
    return (api.get("nodes", dp.NODE)["metadata"].get("labels") or {}).get(STATE_LABEL)


def test_a_label_changes_the_simulators_layout_and_a_busy_gpu_waits(kubelet, short_dir, dp, sim, api, children):
    config = short_dir / "mig.yaml"
    config.write_text(EXAMPLE_LAYOUTS)
    before = instances(sim, 0)
    busy = children.spawn("init", "ctx", "0", "ready", env={"CUDA_VISIBLE_DEVICES": before[0][1]})
    children.ready(busy)   # a process holds a context on one of GPU 0's instances
    proc = run_agent(dp, short_dir, sim, "--mig-strategy", "mixed", "--mig-config", str(config),
                     "--resync-s", "0.3", "--kubeconfig", str(api.kubeconfig(short_dir / "kubeconfig")))
    try:
        kubelet.latest_devices("nvidia.com/mig-1g.10gb")
        label(api, dp, "mixed-1")
        dp.wait_for(lambda: state(api, dp) == "failed", what="the layout refused: GPU 0 is busy")
        assert instances(sim, 0) == before and instances(sim, 1) == []
        # The agent sets the state label before it creates the Event (two API calls): wait for the Event.
        (event,) = dp.wait_for(lambda: events(api), what="the Warning Event")
        assert "GPU 0" in event["message"] and "busy" in event["message"]
        children.release(busy)
        dp.wait_for(lambda: state(api, dp) == "success", what="the layout applied once GPU 0 is idle")
        assert [p for p, _, _ in instances(sim, 0)] == ["2g.20gb", "2g.20gb", "3g.40gb"]
        assert [p for p, _, _ in instances(sim, 1)] == ["1g.10gb", "1g.10gb", "1g.10gb", "4g.40gb"]
        twos = dp.wait_for(lambda: kubelet.latest_devices("nvidia.com/mig-2g.20gb"), what="the new resource")
        assert sorted(d.ID for d in twos) == sorted(u for p, u, _ in instances(sim, 0) if p == "2g.20gb")
        labels = dp.wait_for(lambda: api.get("nodes", dp.NODE)["metadata"]["labels"] if api.get(
            "nodes", dp.NODE)["metadata"]["labels"].get("nvidia.com/mig-4g.40gb.count") == "1" else None,
            what="the labels after the layout")
        # The one whole GPU left is the simulator's plain GPU: its product tells no compute capability, so
        # the label the H100 (GPU 1) had is gone.
        assert labels["nvidia.com/gpu.count"] == "1" and "nvidia.com/gpu.compute.major" not in labels
        # Back to no MIG at all: every GPU whole again.
        label(api, dp, "all-disabled")
        dp.wait_for(lambda: state(api, dp) == "success", what="MIG off everywhere")
        dp.wait_for(lambda: len(kubelet.latest_devices("nvidia.com/gpu")) == 3, what="three whole GPUs")
    finally:
        log = dp.stop_plugin(proc, short_dir)
    assert proc.returncode == 0, log
    with mock.patch.dict(os.environ, sim.env()), SimReader(sim.state_path) as r:
        assert [r.mig(i).enabled for i in range(3)] == [False, False, False]


# ---- vGPU shares of a MIG instance ------------------------------------------------------

def test_a_vgpu_share_of_a_mig_instance_is_limited_within_it(agent_factory, kubelet, dp, short_dir, sim,
                                                             build_c):
    """A 30-core, 1 GiB share of a 1g.10gb instance: the container sees that instance (the runtime's
    NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES here), libvcuda charges the instance's ledger entry
    (CUDA names it GPU-<hex>, the agent MIG-<hex>: one entry) and refuses past 1 GiB."""
    import subprocess

    from shimtest import parse

    from device_plugin.pods import StaticPods
    from node_state.gpus import Inventory
    from py_vcuda.ledger import Ledger
    from py_vcuda.sim import nvml_session

    cuprobe = build_c(["cuprobe.c"])
    with nvml_session(sim) as nvml:
        inv = Inventory.from_nvml(nvml)
    small = next(d for d in inv.mig_devices() if d.profile == "1g.10gb")
    pod = dp.pod("app", cores=30, annotations={
        "vcuda.io/memory": "1Gi", "vcuda.io/gpu-assignment": dp.assignment_annotation("main", small.uuid, 30)})
    agent = agent_factory("vgpu", pods=StaticPods([pod]), inv=inv)
    resp = kubelet.allocate("tencent.com/vcuda-core",
                            [f"{small.uuid}::{i}" for i in range(30)]).container_responses[0]
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == small.uuid
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
    env.update(sim.env())
    env.update(dp.host_env(resp))
    env["CUDA_VISIBLE_DEVICES"] = resp.envs["NVIDIA_VISIBLE_DEVICES"]   # what the NVIDIA runtime exposes
    proc = subprocess.run([str(cuprobe), "init", "ctx", f"alloc:{512 * MiB}", f"alloc:{640 * MiB}",
                           "spin:2000:300", "hold"],
                          env=env, input="\n", capture_output=True, text=True, timeout=120)
    allocs = [int(d["rc"]) for d in parse(proc.stdout) if d["cmd"] == "alloc"]
    assert allocs == [0, 2], proc.stdout + proc.stderr   # 512 MiB + 640 MiB > 1 GiB: out of memory
    (record,) = agent.store.records()
    with Ledger(agent.layout.ledger_path(record.key)) as ledger:
        devices = ledger.devices()
    assert [d.uuid for d in devices] == [small.uuid]             # one entry: CUDA's name found the agent's
    assert devices[0].limit == GiB and devices[0].peak >= 512 * MiB
    # The exporter's reading: the share on the instance, under its parent GPU, with its scheduler's figures.
    check_instance_share_reported(agent.layout, dp.NODE, sim, small.uuid, {d.uuid for d in inv.mig_devices()}, GiB)
