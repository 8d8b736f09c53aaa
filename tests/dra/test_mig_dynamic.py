"""`--mig=dynamic`: idle MIG-capable GPUs published as partitions (counter sets and the devices that
consume them), made at prepare, destroyed at unprepare; counters that refuse overlapping placements;
crash recovery at each step; a busy GPU never repartitioned; an operator's instances never touched."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from k8s_schema import schema_problem

from dra_driver import partitions, slices
from dra_driver import testing as t
from dra_driver.agent import MIG_RECORD
from dra_driver.names import DRIVER
from node_state.mig import MigPlacement, MigRecord
from node_state.testing import H100_PROFILES, ISSUE_NODE_MIG, FakeMig, wait_for
from py_vcuda.sim import GiB

NODE = t.NODE
BASE = f"{NODE}-{DRIVER}"


# ---- a small scheduler side: counter consumption ------------------------------------------------

def over(pool: dict[str, dict[str, Any]], chosen: list[str]) -> list[str]:
    """The counters that devices `chosen` (by name) together consume beyond their counter sets. A device named
    more than once (shares of a multi-allocatable device) is charged once, as the real schedulers charge it
    (e2e scenario 4: 1.36 always, 1.34 across scheduling cycles; e2e/README.md "DRA on a real cluster")."""
    totals: dict[tuple[str, str], int] = {}
    devices: dict[str, dict[str, Any]] = {}
    for s in pool.values():
        for cs in s["spec"].get("sharedCounters") or []:
            for name, c in cs["counters"].items():
                totals[(cs["name"], name)] = int(c["value"])
        for d in s["spec"].get("devices") or []:
            devices[d["name"]] = d
    used: Counter[tuple[str, str]] = Counter()
    for name in dict.fromkeys(chosen):
        for consumption in devices[name].get("consumesCounters") or []:
            for counter, c in consumption["counters"].items():
                used[(consumption["counterSet"], counter)] += int(c["value"])
    return sorted(f"{s}/{c}" for (s, c), n in used.items() if n > totals[(s, c)])


def test_counters_refuse_exactly_the_partitions_that_cannot_be_made_together():
    """Every pair of H100 partitions: the counters fit exactly when the placements do not overlap
    and the profile's instance count allows both (what NVML allows)."""
    totals = partitions.counters(H100_PROFILES)
    parts = [(p, pl) for p in H100_PROFILES for pl in p.placements]
    pool = {"c": {"spec": {"sharedCounters": [{"name": partitions.counter_set_name(0), "counters": {
        k: {"value": str(v)} for k, v in totals.items()}}]}},
            "d": {"spec": {"devices": [
                {"name": partitions.partition_name(0, p.name, pl.start),
                 "consumesCounters": [{"counterSet": partitions.counter_set_name(0), "counters": {
                     k: {"value": str(v)} for k, v in partitions.consumption(p, pl, totals).items()}}]}
                for p, pl in parts]}}}
    refused = 0
    for (a, pa), (b, pb) in itertools.combinations(parts, 2):
        allowed = not pa.overlaps(pb) and not (a == b and a.max_instances < 2)
        names = [partitions.partition_name(0, a.name, pa.start), partitions.partition_name(0, b.name, pb.start)]
        assert (over(pool, names) == []) == allowed, (names, over(pool, names))
        refused += not allowed
    assert refused > 0
    # Seven 1g.10gb fill the GPU: an eighth partition anywhere is refused.
    seven = [partitions.partition_name(0, "1g.10gb", s) for s in range(7)]
    assert over(pool, seven) == []
    assert over(pool, [*seven, partitions.partition_name(0, "1g.20gb", 6)]) != []


# ---- the agent -----------------------------------------------------------------------------------

def stored(api: Any) -> dict[str, dict[str, Any]]:
    with api.lock:
        return {k: json.loads(json.dumps(v)) for k, v in api.objects["resourceslices"].items()}


def devices(api: Any) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in stored(api).values() for d in s["spec"].get("devices") or []}


def partitioned(api: Any, index: int) -> bool:
    """Whether GPU `index`'s pool offers partitions (holds its counter set), in either layout."""
    return any(s["spec"].get("sharedCounters") for s in stored(api).values()
               if s["spec"]["pool"]["name"] == partitions.pool_name(NODE, index))


# The API servers whose rules the fake applies (kube_contract.testing.slice_problems), and the slices
# the driver publishes for them: counter sets beside their devices (1.34), or in slices of their own.
VERSIONS = ["1.34.4", "1.36.3"]


def dynamic(agent_factory: Any, mig: FakeMig) -> Any:
    return agent_factory(inv=mig.inventory(), mig_backend=mig, config={"mig": "dynamic"})


def partition_claim(api: Any, name: str, device: str) -> dict[str, Any]:
    """A claim allocated a partition (or a whole GPU) from the pool of its GPU (`gpu-<i>-...`)."""
    index = int(device.split("-")[1])
    return api.put("resourceclaims", t.claim(name, NODE, [
        {"request": "gpu", "driver": DRIVER, "pool": partitions.pool_name(NODE, index), "device": device}]))


def spec_env(agent: Any, claim: dict[str, Any]) -> dict[str, str]:
    spec = json.loads(agent.driver.specs.path(claim["metadata"]["uid"]).read_text())
    (device,) = spec["devices"]
    return dict(kv.split("=", 1) for kv in device["containerEdits"]["env"])


def error(resp: Any, claim: dict[str, Any]) -> str:
    return resp.claims[claim["metadata"]["uid"]].error


P6 = partitions.partition_name(0, "1g.10gb", 6)


@pytest.mark.parametrize("version", VERSIONS)
def test_idle_gpus_are_published_as_partitions_in_slices_that_fit_the_schema(agent_factory, api, version):
    api.version = version   # the fake API server refuses what that version refuses
    mig = FakeMig(("off", "off", ""))
    agent = dynamic(agent_factory, mig)
    wait_for(lambda: f"{BASE}-gpu-1" in stored(api), 10, "the partitions' slices")
    pool = stored(api)
    apart = tuple(map(int, version.split(".")[:2])) >= (1, 35)
    per_gpu = 2 if apart else 1
    assert agent.publisher.layout == (slices.OWN_SLICE if apart else slices.WITH_DEVICES)
    assert set(pool) == {BASE, f"{BASE}-gpu-0", f"{BASE}-gpu-1"} | (
        {f"{BASE}-gpu-0-counters", f"{BASE}-gpu-1-counters"} if apart else set())
    for name, s in pool.items():
        assert schema_problem(s) is None, schema_problem(s)
        # The node's pool, and one per MIG-capable GPU: a partition made rewrites its GPU's pool only.
        assert (s["spec"]["pool"]["name"], s["spec"]["pool"]["resourceSliceCount"]) == (
            (NODE, 1) if name == BASE else (partitions.pool_name(NODE, int(name.split("-gpu-")[1][0])), per_gpu))
    for index in (0, 1):
        counter_slice = pool[f"{BASE}-gpu-{index}-counters" if apart else f"{BASE}-gpu-{index}"]["spec"]
        device_slice = pool[f"{BASE}-gpu-{index}"]["spec"]
        assert [cs["name"] for cs in counter_slice["sharedCounters"]] == [partitions.counter_set_name(index)]
        if apart:   # 1.35 on: never both in one slice
            assert set(counter_slice) - {"driver", "nodeName", "pool"} == {"sharedCounters"}
            assert "sharedCounters" not in device_slice
        # Every device of the GPU's pool consumes its GPU's counter set, and nothing else.
        assert {c["counterSet"] for d in device_slice["devices"] for c in d["consumesCounters"]} == {
            partitions.counter_set_name(index)}
    assert [d["name"] for d in pool[BASE]["spec"]["devices"]] == ["gpu-2"]          # not MIG-capable
    assert "sharedCounters" not in pool[BASE]["spec"]
    gpu0 = {d["name"]: d for d in pool[f"{BASE}-gpu-0"]["spec"]["devices"]}
    assert len(gpu0) == 1 + sum(len(p.placements) for p in H100_PROFILES)
    assert gpu0[P6]["attributes"]["profile"] == {"string": "1g.10gb"}
    assert gpu0[P6]["attributes"]["placementStart"] == {"int": 6}
    # The whole GPU consumes every counter: it excludes any partition, and is shared as before.
    assert over(pool, ["gpu-0", P6]) != [] and over(pool, ["gpu-0"]) == []
    assert over(pool, ["gpu-0", "gpu-0", "gpu-0"]) == [] and over(pool, ["gpu-0", "gpu-0", P6]) != []   # shares
    assert gpu0["gpu-0"]["allowMultipleAllocations"] is True and "capacity" in gpu0["gpu-0"]
    # MIG mode was turned on only to read the profiles, and off again.
    assert mig.calls[:2] == ["mode 0 True", "mode 0 False"] and not mig.modes[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_prepare_makes_the_partition_and_unprepare_destroys_it(agent_factory, kubelet, api, short_dir, version):
    api.version = version
    mig = FakeMig(("off", "off", ""))
    agent = dynamic(agent_factory, mig)
    claim = partition_claim(api, "p", P6)
    assert error(kubelet.prepare(claim), claim) == ""
    (dev,) = mig.instances[0]
    assert (dev.profile, dev.placement) == ("1g.10gb", MigPlacement(6, 1)) and mig.modes[0]
    assert spec_env(agent, claim)["NVIDIA_VISIBLE_DEVICES"] == dev.uuid
    agent.health.set(mig.gpus_[0].uuid, False, "test: XID")   # the partition is as healthy as its GPU
    assert not agent.health.healthy(dev.uuid)
    agent.health.set(mig.gpus_[0].uuid, True)
    record = MigRecord(short_dir / "st" / MIG_RECORD)
    assert record.owned(mig.gpus_[0].uuid) == {dev.uuid} and record.enabled == [mig.gpus_[0].uuid]
    # A GPU with partitions in use is not offered whole; its other partitions stay.
    wait_for(lambda: "gpu-0" not in devices(api), 10, "gpu-0 leaving the slice")
    assert partitions.partition_name(0, "3g.40gb", 0) in devices(api)
    assert error(kubelet.unprepare(claim), claim) == ""
    assert mig.instances[0] == [] and not mig.modes[0]           # the driver turned MIG on: it turns it off
    assert MigRecord(short_dir / "st" / MIG_RECORD).created == {}
    wait_for(lambda: "gpu-0" in devices(api), 10, "gpu-0 back in the slice")


@pytest.mark.parametrize("version", VERSIONS)
def test_a_busy_gpu_is_never_repartitioned(agent_factory, kubelet, api, version):
    api.version = version
    mig = FakeMig(("off", "off", ""))
    dynamic(agent_factory, mig)
    wait_for(lambda: partitioned(api, 1), 10, "the partitions' slices")
    share = api.put("resourceclaims", t.claim("share", NODE, [
        {**t.share(NODE, 1, 30, 4 * GiB), "pool": partitions.pool_name(NODE, 1)}]))
    assert error(kubelet.prepare(share), share) == ""
    wait_for(lambda: not partitioned(api, 1), 10, "gpu-1's partitions leaving")
    assert f"{BASE}-gpu-1-counters" not in stored(api)
    assert stored(api)[f"{BASE}-gpu-1"]["spec"]["pool"]["resourceSliceCount"] == 1
    assert [d["name"] for d in stored(api)[f"{BASE}-gpu-1"]["spec"]["devices"]] == ["gpu-1"]   # still shared
    assert "consumesCounters" not in devices(api)["gpu-1"]
    late = partition_claim(api, "late", partitions.partition_name(1, "3g.40gb", 4))
    assert "claim default/share runs on it" in error(kubelet.prepare(late), late)
    assert not mig.modes[1] and mig.instances[1] == []
    # A process on a GPU (not ours) keeps it unpartitioned too.
    mig.processes_on[mig.gpus_[0].uuid] = [4242]
    other = partition_claim(api, "other", P6)
    assert "process" in error(kubelet.prepare(other), other)
    assert not any(c.startswith("create") for c in mig.calls)
    # ... and a GPU running partitions takes no whole-GPU claim.
    del mig.processes_on[mig.gpus_[0].uuid]
    ok = partition_claim(api, "ok", P6)
    assert error(kubelet.prepare(ok), ok) == ""
    whole = partition_claim(api, "whole", "gpu-0")
    assert "MIG mode" in error(kubelet.prepare(whole), whole)


def test_an_operators_instances_are_offered_static_and_never_touched(agent_factory, kubelet, api):
    mig = FakeMig(ISSUE_NODE_MIG)
    before = list(mig.instances[0])
    dynamic(agent_factory, mig)
    wait_for(lambda: f"{BASE}-gpu-1" in stored(api), 10, "gpu-1's partitions")
    assert f"{BASE}-gpu-0" not in stored(api)
    assert {f"mig-0-{d.gpu_instance}" for d in before} <= set(devices(api))
    claim = partition_claim(api, "p", partitions.partition_name(0, "1g.10gb", 0))
    assert "did not make" in error(kubelet.prepare(claim), claim)
    assert mig.instances[0] == before and not any(c.startswith(("create 0", "destroy 0")) for c in mig.calls)


# ---- crash recovery ------------------------------------------------------------------------------

def record_at(short_dir: Path) -> MigRecord:
    return MigRecord(short_dir / "st" / MIG_RECORD)


def intent(claim_uid: str, start: int = 6) -> dict[str, Any]:
    p = next(p for p in H100_PROFILES if p.name == "1g.10gb")
    return {"claim": claim_uid, "device": partitions.partition_name(0, p.name, start), "profile": p.name,
            "profile_id": p.id, "start": start, "size": 1, "state": partitions.INTENT, "uuid": "",
            "gpu_instance": None}


def crashed_after_intent(short_dir: Path) -> FakeMig:
    """A node whose driver recorded the intent to make a 1g.10gb at slice 6 of GPU 0 (MIG mode it turned on)."""
    mig = FakeMig(("off", "off", ""))
    rec = record_at(short_dir)
    rec.created[mig.gpus_[0].uuid] = [intent("crashed")]
    rec.enabled.append(mig.gpus_[0].uuid)
    rec.save()
    return mig


def test_recovery_an_intent_recorded_but_nothing_made(agent_factory, short_dir):
    mig = crashed_after_intent(short_dir)
    dynamic(agent_factory, mig)
    assert record_at(short_dir).created == {} and record_at(short_dir).enabled == []
    assert not mig.modes[0] and not any(c.startswith("destroy") for c in mig.calls)


def test_recovery_an_instance_made_but_not_recorded_made(agent_factory, short_dir):
    mig = crashed_after_intent(short_dir)
    mig.modes[0] = True
    mig.create_mig_device(0, 19, MigPlacement(6, 1))   # NVML made it; the crash came before the record said so
    dynamic(agent_factory, mig)
    assert mig.instances[0] == [] and not mig.modes[0]
    assert record_at(short_dir).created == {}


def test_recovery_keeps_a_prepared_claims_partition_across_a_restart(agent_factory, kubelet, api, short_dir):
    mig = FakeMig(("off", "off", ""))
    agent = dynamic(agent_factory, mig)
    claim = partition_claim(api, "p", P6)
    first = kubelet.prepare(claim).claims[claim["metadata"]["uid"]]
    assert first.error == ""
    (dev,) = mig.instances[0]
    agent.stop()
    dynamic(agent_factory, mig)
    kubelet.wait_registered()
    assert mig.instances[0] == [dev] and not any(c.startswith("destroy") for c in mig.calls)
    assert kubelet.prepare(claim).claims[claim["metadata"]["uid"]] == first
    assert error(kubelet.unprepare(claim), claim) == "" and mig.instances[0] == []


def test_recovery_destroys_the_partition_of_a_claim_no_longer_prepared(agent_factory, kubelet, api, short_dir):
    mig = FakeMig(("off", "off", ""))
    agent = dynamic(agent_factory, mig)
    claim = partition_claim(api, "p", P6)
    assert error(kubelet.prepare(claim), claim) == ""
    agent.stop()
    agent.driver.checkpoint.remove(claim["metadata"]["uid"])   # unprepared; its instance left behind
    dynamic(agent_factory, mig)
    assert mig.instances[0] == [] and not mig.modes[0] and record_at(short_dir).created == {}


def test_a_failed_create_leaves_nothing(agent_factory, kubelet, api, short_dir):
    mig = FakeMig(("off", "off", ""))
    mig.fail_create_at = 0
    dynamic(agent_factory, mig)
    claim = partition_claim(api, "p", P6)
    assert "not made" in error(kubelet.prepare(claim), claim)
    assert mig.instances[0] == [] and not mig.modes[0] and record_at(short_dir).created == {}


# ---- on the simulator's NVML ---------------------------------------------------------------------

def test_a_partition_is_made_on_the_simulator_and_cuda_sees_exactly_it(agent_factory, kubelet, api, short_dir,
                                                                       cuprobe_exe):
    """The real NVML calls (py_vcuda.nvml) on the simulator: MIG mode on, the instance at the placement the
    scheduler chose, a CUDA program with the CDI spec's device sees that instance; unprepare undoes it all."""
    import os
    import subprocess
    from unittest import mock

    from shimtest import parse

    from node_state.gpus import Inventory
    from py_vcuda.sim import MiB, SimConfig, SimReader, nvml_session

    sim = SimConfig(state_path=short_dir / "sim", devices=2, memory=16 * GiB, context_overhead=64 * MiB,
                    mig=["off", ""])

    def state() -> Any:
        with mock.patch.dict(os.environ, sim.env()), SimReader(sim.state_path, create=True) as r:
            return r.mig(0)

    with nvml_session(sim) as nvml:
        agent = agent_factory(inv=Inventory.from_nvml(nvml), nvml=nvml, config={"mig": "dynamic"})
        device = partitions.partition_name(0, "3g.40gb", 4)
        assert device in agent.partitioner.catalog
        claim = partition_claim(api, "sim", device)
        assert error(kubelet.prepare(claim), claim) == ""
        (made,) = state().instances
        assert state().enabled and (made.profile, made.start, made.size) == ("3g.40gb", 4, 4)
        env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
        env.update(sim.env())
        env["CUDA_VISIBLE_DEVICES"] = spec_env(agent, claim)["NVIDIA_VISIBLE_DEVICES"]
        assert env["CUDA_VISIBLE_DEVICES"] == made.uuid
        proc = subprocess.run([str(cuprobe_exe), "init", "ctx", f"alloc:{GiB}"], env=env, capture_output=True,
                              text=True, timeout=120)
        assert [int(d["rc"]) for d in parse(proc.stdout) if d["cmd"] == "alloc"] == [0], proc.stdout + proc.stderr
        assert error(kubelet.unprepare(claim), claim) == ""
        assert state().instances == () and not state().enabled


def test_recovery_leaves_a_partition_in_use_recorded_and_starts(agent_factory, kubelet, api, short_dir):
    """A left-behind partition a process still runs on cannot be destroyed: the driver starts all the same,
    and keeps it recorded (so it is never taken for an operator's instance)."""
    mig = FakeMig(("off", "off", ""))
    agent = dynamic(agent_factory, mig)
    claim = partition_claim(api, "p", P6)
    assert error(kubelet.prepare(claim), claim) == ""
    agent.stop()
    agent.driver.checkpoint.remove(claim["metadata"]["uid"])
    (dev,) = mig.instances[0]
    mig.processes_on[dev.uuid] = [777]
    dynamic(agent_factory, mig)
    kubelet.wait_registered()
    assert mig.instances[0] == [dev] and record_at(short_dir).owned(mig.gpus_[0].uuid) == {dev.uuid}
    wait_for(lambda: f"mig-0-{dev.gpu_instance}" not in devices(api) and P6 in devices(api), 10, "the pool")


def test_an_instance_made_by_an_operator_after_the_start_is_not_offered(agent_factory, api):
    """The driver's devices are set at start: an operator's later instance is neither offered nor taken as
    the driver's; the GPU it is on is no longer partitioned."""
    mig = FakeMig(("off", "off", ""))
    agent = dynamic(agent_factory, mig)
    wait_for(lambda: partitioned(api, 1), 10, "gpu-1's partitions")
    mig.modes[1] = True
    dev = mig.create_mig_device(1, 19, MigPlacement(0, 1))
    agent.publisher.changed()
    wait_for(lambda: not partitioned(api, 1), 10, "gpu-1's partitions leaving")
    assert f"mig-1-{dev.gpu_instance}" not in devices(api) and mig.instances[1] == [dev]


def test_the_publisher_counts_each_kubelet_call_in_flight(agent_factory, kubelet, api):
    """The slice publisher holds back while a prepare or unprepare runs (dra_driver.slices): the driver tells it."""
    agent = dynamic(agent_factory, FakeMig(("off", "off", "")))
    seen = []
    prepare_claim, unprepare_claim = agent.driver.prepare_claim, agent.driver.unprepare_claim

    def watched(call: Any) -> Any:
        def inner(ref: Any) -> Any:
            seen.append(agent.publisher.calls_in_flight)
            return call(ref)
        return inner
    agent.driver.prepare_claim, agent.driver.unprepare_claim = watched(prepare_claim), watched(unprepare_claim)
    claim = partition_claim(api, "p", P6)
    assert error(kubelet.prepare(claim), claim) == "" and error(kubelet.unprepare(claim), claim) == ""
    assert seen == [1, 1] and agent.publisher.calls_in_flight == 0
    wait_for(lambda: "gpu-0" in devices(api), 10, "gpu-0 back in the slice")
