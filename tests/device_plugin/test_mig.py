"""MIG on the node (node_state.mig) and pgpu's MIG strategies (device_plugin.pgpu), against
node_state.testing.FakeMig: layouts parsed, planned, applied all-or-nothing; resources per strategy
through the test kubelet; health of a parent GPU on its instances; no MIG GPU offered whole."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from device_plugin import pgpu
from device_plugin.labels import feature_labels
from node_state.daemon import StartError
from node_state.gpus import Health
from node_state.mig import BusyError, LayoutApplier, LayoutError, MigRecord, MigView, outcome, parse_layouts, plan
from node_state.testing import EXAMPLE_LAYOUTS, H100_PROFILES, ISSUE_NODE_MIG, FakeMig

NODE_MIG = list(ISSUE_NODE_MIG)
LAYOUTS = EXAMPLE_LAYOUTS


def layouts() -> dict:  # type: ignore[type-arg]
    return parse_layouts(LAYOUTS)


def state(fake: FakeMig) -> dict[int, tuple[bool, list[tuple[str, int]]]]:
    """Each MIG-capable GPU's mode and (profile, placement start) of its instances."""
    return {i: (fake.modes[i], sorted((d.profile, d.placement.start) for d in fake.instances[i]))
            for i in fake.modes}


# ---- the view ------------------------------------------------------------------

def test_view_lists_instances_with_profile_parent_memory_and_placement():
    fake = FakeMig(NODE_MIG)
    view = MigView.read(fake)
    assert sorted(view.gpus) == [0, 1]                      # GPU 2 is not MIG-capable
    assert view.enabled == {fake.gpus_[0].uuid}
    devs = view.devices()
    assert [(d.profile, d.placement.start, d.placement.size) for d in devs] == [
        ("1g.10gb", 0, 1), ("1g.10gb", 1, 1), ("3g.40gb", 4, 4)]
    assert all(d.parent_uuid == fake.gpus_[0].uuid and d.uuid.startswith("MIG-") for d in devs)
    assert devs[2].memory_total == 40192 << 20 and devs[2].multiprocessors == 60 and devs[2].slices == 3
    inv = fake.inventory()
    assert [g.index for g in inv.whole().gpus] == [1, 2]   # a GPU in MIG mode is never whole


# ---- layouts: parse and plan --------------------------------------------------------

@pytest.mark.parametrize(("text", "error"), [
    ("version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}", "version 'v2'"),
    ("version: v1\n", "mig-configs"),
    ("version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}", "devices must be 'all'"),
    ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: yes-please}]}", "mig-enabled must be"),
    ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {1g.10gb: -1}}]}", ">= 0"),
    ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, device-filter: x}]}", "unsupported key"),
    ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, mig-devices: {1g.10gb: 1}}]}",
     "mig-enabled: false"),
    ("version: v1\nmig-configs: [", "not valid YAML"),
])
def test_bad_config_files_are_refused_with_the_reason(text, error):
    with pytest.raises(LayoutError, match=error):
        parse_layouts(text)


@pytest.mark.parametrize(("entries", "error"), [
    ("- {devices: [0], mig-enabled: true, mig-devices: {2g.10gb: 1}}", "no MIG profile '2g.10gb'"),
    ("- {devices: [0], mig-enabled: true, mig-devices: {3g.40gb: 3}}", "at most 2 instance"),
    ("- {devices: [0], mig-enabled: true, mig-devices: {4g.40gb: 1, 3g.40gb: 1, 1g.10gb: 1}}", "8 compute slices"),
    ("- {devices: [0], mig-enabled: true, mig-devices: {3g.40gb: 2, 1g.10gb: 1}}", "do not fit"),
    ("- {devices: [2], mig-enabled: true, mig-devices: {1g.10gb: 1}}", "not MIG-capable"),
    ("- {devices: [5], mig-enabled: false}", "index 5 does not exist"),
    ("- {devices: [0], mig-enabled: false}\n- {devices: all, mig-enabled: false}", "already configured"),
])
def test_plan_refuses_what_the_gpu_cannot_hold(entries, error):
    fake = FakeMig(NODE_MIG)
    (layout,) = parse_layouts(f"version: v1\nmig-configs:\n  x:\n{_indent(entries)}").values()
    with pytest.raises(LayoutError, match=error):
        plan(fake.view(), fake.gpus_, layout)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def test_devices_all_passes_over_a_gpu_without_mig():
    """mig-parted's `devices: all` skips a GPU that is not MIG-capable (GPU 2 here): the stock
    all-<profile> layouts apply on a node with a plain GPU beside its MIG ones (the e2e node's)."""
    fake = FakeMig(NODE_MIG)
    view = fake.view()
    view = MigView({**view.gpus, 1: replace(view.gpus[1], profiles=H100_PROFILES)})
    changes = plan(view, fake.gpus_, layouts()["all-1g.10gb"])
    assert [c.index for c in changes] == [0, 1]
    assert all(Counter(p.name for p, _ in c.create) == Counter({"1g.10gb": 7}) for c in changes)


def test_plan_changes_only_what_differs():
    fake = FakeMig(NODE_MIG)
    same = parse_layouts("version: v1\nmig-configs: {s: [{devices: [0], mig-enabled: true, "
                         "mig-devices: {3g.40gb: 1, 1g.10gb: 2}}, {devices: [1, 2], mig-enabled: false}]}")["s"]
    assert plan(fake.view(), fake.gpus_, same) == []      # already so, whoever made the instances
    enable = parse_layouts("version: v1\nmig-configs: {x: [{devices: [1], mig-enabled: true, "
                           "mig-devices: {4g.40gb: 1, 3g.40gb: 1}}]}")["x"]
    # As LayoutApplier plans it: GPU 1's profiles read in MIG mode, its mode still off.
    view = fake.view()
    gpu1 = replace(view.gpus[1], profiles=H100_PROFILES)
    (change,) = plan(MigView({**view.gpus, 1: gpu1}), fake.gpus_, enable)
    assert (change.index, change.enable, change.set_mode, change.destroy) == (1, True, True, ())
    assert sorted((p.name, pl.start) for p, pl in change.create) == [("3g.40gb", 4), ("4g.40gb", 0)]


# ---- layouts: apply -------------------------------------------------------------

def test_apply_enables_creates_and_records_what_it_made(tmp_path: Path):
    fake = FakeMig(NODE_MIG)
    record = MigRecord(tmp_path / "mig.json")
    changes = LayoutApplier(fake, record).apply("mixed-1", layouts()["mixed-1"])
    assert [c.index for c in changes] == [0, 1]
    assert state(fake) == {0: (True, [("2g.20gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)]),
                           1: (True, [("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6), ("4g.40gb", 0)])}
    again = MigRecord(tmp_path / "mig.json")   # persisted
    assert again.config == "mixed-1"
    assert again.owned(fake.gpus_[1].uuid) == {d.uuid for d in fake.instances[1]}
    # Applied again: nothing to do, nothing destroyed.
    fake.calls.clear()
    assert LayoutApplier(fake, again).apply("mixed-1", layouts()["mixed-1"]) == []
    assert fake.calls == []


def test_apply_disables_mig_after_destroying_the_instances(tmp_path: Path):
    fake = FakeMig(NODE_MIG)
    LayoutApplier(fake, MigRecord(None)).apply("all-disabled", layouts()["all-disabled"])
    assert state(fake) == {0: (False, []), 1: (False, [])}
    assert fake.calls[-1] == "mode 0 False"


@pytest.mark.parametrize("where", ["parent", "instance", "container"])
def test_a_busy_gpu_is_never_changed(tmp_path: Path, where: str):
    fake = FakeMig(NODE_MIG)
    before = state(fake)
    target = fake.instances[0][2].uuid if where != "parent" else fake.gpus_[0].uuid
    busy = None
    if where == "container":
        busy = lambda uuid: "container default/p/main" if uuid == target else None  # noqa: E731
    else:
        fake.processes_on[target] = [4242]
    with pytest.raises(BusyError, match="GPU 0 .* busy"):
        LayoutApplier(fake, MigRecord(None), busy).apply("mixed-1", layouts()["mixed-1"])
    assert state(fake) == before and not [c for c in fake.calls if not c.startswith("processes")]


@pytest.mark.parametrize("fail_at", [0, 2, 4])
def test_a_step_failing_midway_rolls_everything_back(fail_at: int):
    fake = FakeMig(NODE_MIG)
    before = state(fake)
    fake.fail_create_at = fail_at
    with pytest.raises(LayoutError, match="every change was rolled back"):
        LayoutApplier(fake, MigRecord(None)).apply("mixed-1", layouts()["mixed-1"])
    assert state(fake) == before


def test_single_strategy_check_refuses_a_mixed_outcome():
    fake = FakeMig(["on:1g.10gb", "off"])
    before = state(fake)
    with pytest.raises(LayoutError, match="one MIG profile"):
        LayoutApplier(fake, MigRecord(None)).apply("mixed-1", layouts()["mixed-1"], pgpu.check_single)
    # GPU 1 went into MIG mode only to read its profiles (NVML lists them in MIG mode only), and back.
    assert state(fake) == before and fake.calls == ["mode 1 True", "mode 1 False"]
    # GPU 2 cannot do MIG: single needs every GPU in MIG mode, so that is refused too.
    issue_node = FakeMig(NODE_MIG)
    with pytest.raises(LayoutError, match="every GPU in MIG mode"):
        LayoutApplier(issue_node, MigRecord(None)).apply("first-two-1g", layouts()["first-two-1g"],
                                                         pgpu.check_single)
    assert issue_node.calls == ["mode 1 True", "mode 1 False"]
    uniform = FakeMig(["on:1g.10gb,3g.40gb", "off"])
    LayoutApplier(uniform, MigRecord(None)).apply("all-1g.10gb", layouts()["all-1g.10gb"], pgpu.check_single)
    assert outcome(uniform.view(), uniform.gpus_) == {0: Counter({"1g.10gb": 7}), 1: Counter({"1g.10gb": 7})}


# ---- strategies -------------------------------------------------------------------

def resources(strategy: str, fake: FakeMig) -> dict[str, list[str]]:
    from node_state.containers import ContainerStore
    from node_state.layout import NodeLayout

    store = ContainerStore(NodeLayout(Path("/nonexistent")))
    return {p.resource: [d.ID for d in p.devices()] for p in pgpu.plugins(strategy, fake.inventory(), Health(), store)}


def test_none_offers_only_gpus_without_mig_mode():
    fake = FakeMig(NODE_MIG)
    assert resources("none", fake) == {"nvidia.com/gpu": [fake.gpus_[1].uuid, fake.gpus_[2].uuid]}


def test_mixed_offers_one_resource_per_profile_beside_whole_gpus():
    fake = FakeMig(NODE_MIG)
    migs = fake.instances[0]
    assert resources("mixed", fake) == {
        "nvidia.com/gpu": [fake.gpus_[1].uuid, fake.gpus_[2].uuid],
        "nvidia.com/mig-1g.10gb": [migs[0].uuid, migs[1].uuid],
        "nvidia.com/mig-3g.40gb": [migs[2].uuid],
    }


def test_single_refuses_mixed_profiles_and_mixed_modes_and_serves_a_uniform_node():
    with pytest.raises(StartError, match="every GPU in MIG mode"):
        resources("single", FakeMig(NODE_MIG))
    with pytest.raises(StartError, match="one MIG profile .* 1g.10gb, 3g.40gb"):
        resources("single", FakeMig(["on:1g.10gb,1g.10gb,3g.40gb", "on:1g.10gb"]))
    with pytest.raises(StartError, match="GPU.s. 1 are in MIG mode with no MIG devices"):
        resources("single", FakeMig(["on:2g.20gb", "on"]))
    fake = FakeMig(["on:2g.20gb,2g.20gb", "on:2g.20gb"])
    assert resources("single", fake) == {"nvidia.com/gpu": [d.uuid for i in (0, 1) for d in fake.instances[i]]}
    plain = FakeMig(["off", ""])   # no GPU in MIG mode: whole GPUs, as NVIDIA's plugin falls back to none
    assert resources("single", plain) == {"nvidia.com/gpu": [g.uuid for g in plain.gpus_]}


def test_mig_profile_with_media_extensions_gets_a_valid_resource_name():
    assert pgpu.mig_resource("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"


# ---- through kubelet --------------------------------------------------------------

def test_mixed_agent_registers_profiles_and_allocates_mig_devices(agent_factory, kubelet):
    fake = FakeMig(NODE_MIG)
    agent = agent_factory("pgpu", inv=fake.inventory(), nvml=fake, mig_strategy="mixed")
    migs = fake.instances[0]
    assert [d.ID for d in kubelet.latest_devices("nvidia.com/mig-1g.10gb")] == [migs[0].uuid, migs[1].uuid]
    assert [d.ID for d in kubelet.latest_devices("nvidia.com/gpu")] == [fake.gpus_[1].uuid, fake.gpus_[2].uuid]
    resp = kubelet.allocate("nvidia.com/mig-3g.40gb", [migs[2].uuid])
    assert dict(resp.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": migs[2].uuid}
    (rec,) = agent.store.records()
    assert rec.gpus == (migs[2].uuid,) and rec.resource == "nvidia.com/mig-3g.40gb"
    with pytest.raises(grpc.RpcError, match="not MIG devices of nvidia.com/mig-1g.10gb"):
        kubelet.allocate("nvidia.com/mig-1g.10gb", [migs[2].uuid])
    # Preferred: stay on few GPUs.
    assert kubelet.preferred("nvidia.com/mig-1g.10gb", [migs[1].uuid, migs[0].uuid], 1) in (
        [migs[0].uuid], [migs[1].uuid])


def test_an_xid_on_the_parent_marks_its_instances_and_they_recover(agent_factory, kubelet, dp):
    fake = FakeMig(NODE_MIG)
    agent = agent_factory("pgpu", inv=fake.inventory(), nvml=fake, mig_strategy="mixed")
    parent = fake.gpus_[0].uuid
    kubelet.latest_devices("nvidia.com/mig-1g.10gb")
    agent.health.set(parent, False, "critical XID 79")   # what the health monitor reports

    def health() -> set[str]:
        return {d.health for r in ("nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb")
                for d in kubelet.latest_devices(r)}

    dp.wait_for(lambda: health() == {"Unhealthy"}, what="instances of the failed GPU unhealthy")
    assert {d.health for d in kubelet.latest_devices("nvidia.com/gpu")} == {"Healthy"}   # other GPUs
    agent.health.set(parent, True, "probe passes")
    dp.wait_for(lambda: health() == {"Healthy"}, what="instances healthy again")


def test_mps_runs_a_control_daemon_per_mig_instance(agent_factory, kubelet, fake_mps, caplog):
    from device_plugin.mps import mps_dir

    fake = FakeMig(NODE_MIG)
    migs = fake.instances[0]
    agent = agent_factory("mps", inv=fake.inventory(), mps_control=str(fake_mps))
    gpus = {d.ID.split("::")[0] for d in kubelet.latest_devices("nvidia.com/mps-core")}
    assert gpus == {fake.gpus_[1].uuid, fake.gpus_[2].uuid, *(m.uuid for m in migs)}
    assert fake.gpus_[0].uuid not in {c.uuid for c in agent.supervisor.children}   # never the MIG GPU whole
    big = migs[2]
    pipe = mps_dir(agent.layout, big.uuid) / "pipe"
    assert (pipe / "calls").read_text().startswith(f"-d gpu={big.uuid} ")   # CUDA_VISIBLE_DEVICES=MIG-<uuid>
    resp = kubelet.allocate("nvidia.com/mps-core", [f"{big.uuid}::{i}" for i in range(25)]).container_responses[0]
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == big.uuid
    assert resp.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={(big.memory_total // 4) >> 20}M"   # of the instance
    assert "never offered whole" in caplog.text


def test_vgpu_shares_each_mig_instance_as_a_gpu_and_never_the_mig_gpu(agent_factory, kubelet, dp):
    from device_plugin.pods import StaticPods
    from kube_contract.names import MEMORY_UNIT_BYTES

    fake = FakeMig(NODE_MIG)
    migs = fake.instances[0]
    big = migs[2]
    p = dp.pod("p", cores=30, annotations={"vcuda.io/gpu-assignment": dp.assignment_annotation("main", big.uuid, 30)})
    agent = agent_factory("vgpu", inv=fake.inventory(), pods=StaticPods([p]))
    cores = kubelet.latest_devices("tencent.com/vcuda-core")
    per_gpu: dict[str, int] = {}
    for d in cores:
        per_gpu[d.ID.split("::")[0]] = per_gpu.get(d.ID.split("::")[0], 0) + 1
    assert per_gpu == {fake.gpus_[1].uuid: 100, fake.gpus_[2].uuid: 100, **{m.uuid: 100 for m in migs}}
    units: dict[str, int] = {}
    for d in kubelet.latest_devices("tencent.com/vcuda-memory"):
        units[d.ID.split("::")[0]] = units.get(d.ID.split("::")[0], 0) + 1
    assert units[big.uuid] == big.memory_total // MEMORY_UNIT_BYTES and units[migs[0].uuid] < units[big.uuid]
    assert set(agent.schedulers) == set(per_gpu)   # a token scheduler of its own per instance
    resp = kubelet.allocate("tencent.com/vcuda-core", [f"{big.uuid}::{i}" for i in range(30)])
    assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == big.uuid
    (rec,) = agent.store.records()
    assert rec.gpus == (big.uuid,) and rec.tenant
    # The parent's XID marks its instances, not the other GPUs.
    agent.health.set(fake.gpus_[0].uuid, False, "critical XID 79")
    dp.wait_for(lambda: {d.health for d in kubelet.latest_devices("tencent.com/vcuda-core")
                         if d.ID.startswith("MIG-")} == {"Unhealthy"}, what="instances unhealthy")
    assert {d.health for d in kubelet.latest_devices("tencent.com/vcuda-core")
            if d.ID.startswith("GPU-")} == {"Healthy"}


# ---- labels -----------------------------------------------------------------------

def test_feature_labels_follow_gfd_for_each_strategy():
    fake = FakeMig(NODE_MIG)
    mixed = feature_labels(fake, fake.inventory(), "pgpu", "mixed")
    assert mixed["nvidia.com/mig.capable"] == "true" and mixed["nvidia.com/mig.strategy"] == "mixed"
    assert (mixed["nvidia.com/gpu.count"], mixed["nvidia.com/gpu.memory"]) == ("2", str(80 * 1024))
    assert mixed["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert (mixed["nvidia.com/gpu.compute.major"], mixed["nvidia.com/gpu.compute.minor"]) == ("9", "0")
    assert mixed["nvidia.com/mig-1g.10gb.count"] == "2" and mixed["nvidia.com/mig-3g.40gb.memory"] == "40192"
    assert (mixed["nvidia.com/gpu.sharing-strategy"], mixed["nvidia.com/gpu.replicas"]) == ("none", "1")
    assert mixed["nvidia.com/mps.capable"] == "false"
    uniform = FakeMig(["on:3g.40gb,3g.40gb", "on:3g.40gb"])
    single = feature_labels(uniform, uniform.inventory(), "pgpu", "single")
    assert single["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"
    assert (single["nvidia.com/gpu.count"], single["nvidia.com/gpu.memory"]) == ("3", "40192")
    plain = FakeMig(["", ""])
    vgpu = feature_labels(plain, plain.inventory(), "vgpu")
    assert vgpu["nvidia.com/mig.capable"] == "false" and vgpu["nvidia.com/gpu.sharing-strategy"] == "time-slicing"


def test_a_resource_a_layout_replaced_refuses_allocate(tmp_path: Path):
    from device_plugin.kubelet import AllocationError
    from node_state.containers import ContainerStore
    from node_state.layout import NodeLayout

    fake = FakeMig(NODE_MIG)
    store = ContainerStore(NodeLayout(tmp_path))
    mixed = {p.resource: p for p in pgpu.plugins("mixed", fake.inventory(), Health(), store)}
    small = mixed["nvidia.com/mig-1g.10gb"]
    uuid = fake.instances[0][0].uuid
    assert small.allocate([uuid]).envs["NVIDIA_VISIBLE_DEVICES"] == uuid
    small.retired = True   # what the agent does, under the store's lock, once a layout changed the devices
    with pytest.raises(AllocationError, match="MIG layout changed"):
        small.allocate([uuid])
    assert len(list(store.records())) == 1


def test_an_nvml_that_cannot_tell_never_offers_a_mig_gpu_whole():
    class Flaky(FakeMig):
        def mig_mode(self, index):  # type: ignore[no-untyped-def]
            if index == 1:
                raise RuntimeError("NVML: unknown error")
            return super().mig_mode(index)

        def mig_devices(self, index):  # type: ignore[no-untyped-def]
            raise RuntimeError("NVML: unknown error")

    fake = Flaky(NODE_MIG)
    view = MigView.read(fake)
    assert sorted(view.gpus) == [0] and view.gpus[0].enabled and view.gpus[0].devices == ()
    assert [g.index for g in fake.inventory().whole().gpus] == [1, 2]   # GPU 0 is in MIG mode all the same


def test_the_extender_sees_each_instance_as_a_gpu_and_not_the_mig_gpu():
    from device_plugin.node_topology import encode
    from kube_contract import topology

    fake = FakeMig(NODE_MIG)
    topo = topology.decode(encode(fake.inventory().shareable()))
    migs = fake.instances[0]
    assert [(g.uuid, g.memory) for g in topo.gpus] == [
        (fake.gpus_[1].uuid, fake.gpus_[1].memory_total), (fake.gpus_[2].uuid, fake.gpus_[2].memory_total),
        *((m.uuid, m.memory_total) for m in migs)]
    assert len({g.index for g in topo.gpus}) == 5 and topo.nvlink == {}
    assert topo.gpus[4].model == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"


def test_the_ledger_knows_a_mig_device_by_either_name(tmp_path: Path):
    """libvcuda names a device from CUDA's UUID bytes, GPU-<hex>; for a MIG device the agent writes the
    same device as MIG-<hex> (NVML's name). One device, one ledger entry."""
    from py_vcuda.ledger import Ledger

    hexpart = "55a7cf81-e2c8-561e-8f0f-26b707f5c67b"
    with Ledger(tmp_path / "ledger", create=True) as book:
        book.set_limit(f"MIG-{hexpart}", 1 << 30)
        book.set_limit(f"GPU-{hexpart}", 2 << 30)      # what libvcuda's name reaches: the same entry
        book.set_limit("GPU-5157a0c0-0000-4000-8000-000000000000", 3 << 30)
        devices = book.devices()
    assert [(d.uuid, d.limit) for d in devices] == [(f"MIG-{hexpart}", 2 << 30),
                                                    ("GPU-5157a0c0-0000-4000-8000-000000000000", 3 << 30)]
