"""vgpu mode through the test kubelet: devices, preferred allocation, Allocate
(env, mounts, preload, scheduler tenant), pod identity, bad requests, live
quota changes and cleanup."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest

from device_plugin.pods import StaticPods
from kube_contract.names import MEMORY_UNIT_BYTES
from node_state.layout import ContainerRecord
from py_vcuda import quota_file
from py_vcuda.ledger import Ledger

CORE = "tencent.com/vcuda-core"
MEMORY = "tencent.com/vcuda-memory"
MiB = 1 << 20


def ids(uuid: str, n: int, start: int = 0) -> list[str]:
    return [f"{uuid}::{i}" for i in range(start, start + n)]


def records(agent) -> list[ContainerRecord]:  # type: ignore[no-untyped-def]
    return list(agent.store.records())


def tenants(agent, uuid: str) -> dict[str, tuple[int, int]]:  # type: ignore[no-untyped-def]
    reply = agent.schedulers[uuid].call("list")
    return {t["tenant"]: (t["request"], t["limit"]) for t in reply["tenants"]}


def priorities(agent, uuid: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {t["tenant"]: t["priority"] for t in agent.schedulers[uuid].call("list")["tenants"]}


def refused(excinfo: pytest.ExceptionInfo[grpc.RpcError]) -> str:
    assert excinfo.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE)
    return excinfo.value.details()


def test_devices_per_gpu(agent_factory, kubelet, dp):
    agent_factory("vgpu", gpus=2, inv=dp.inventory(2, memory=4 << 30))
    cores = kubelet.latest_devices(CORE)
    assert len(cores) == 200 and {d.health for d in cores} == {"Healthy"}
    assert f"{dp.gpu(0).uuid}::0" == cores[0].ID and f"{dp.gpu(1).uuid}::99" == cores[199].ID
    memory = kubelet.latest_devices(MEMORY)
    assert len(memory) == 2 * (4 << 30) // MEMORY_UNIT_BYTES
    assert kubelet.registered(CORE).options.get_preferred_allocation_available


def test_fractional_allocate_on_single_gpu_without_extender(agent_factory, kubelet, dp, short_dir):
    pods = StaticPods([dp.pod("p1", cores=30, memory_units=4,
                              annotations={"vcuda.io/core-limit": "50"})])
    agent = agent_factory("vgpu", gpus=1, pods=pods)
    uuid = dp.gpu(0).uuid
    resp = kubelet.allocate(CORE, ids(uuid, 30)).container_responses[0]
    (rec,) = records(agent)
    assert (rec.namespace, rec.pod, rec.container, rec.pod_uid) == ("default", "p1", "main", "uid-p1")
    assert (rec.core_request, rec.core_limit, rec.memory_limit) == (30, 50, 4 * MEMORY_UNIT_BYTES)
    assert rec.tenant == rec.key and rec.gpus == (uuid,)
    assert dict(resp.envs) == {"NVIDIA_VISIBLE_DEVICES": uuid}   # the quota is the file's word alone
    directory = agent.layout.container_dir(rec.key)
    sched = agent.layout.scheduler_dir(uuid) / "tenants" / rec.tenant
    mounts = {m.container_path: (m.host_path, m.read_only) for m in resp.mounts}
    assert mounts == {
        "/run/vcuda-quota": (str(directory / "quota"), True),
        "/run/vcuda": (str(directory / "shared"), False),
        "/run/vcuda/sched": (str(sched), False),
        "/usr/local/vcuda/lib/libvcuda.so": (str(agent.config.host_lib_dir / "libvcuda.so"), True),
        "/etc/ld.so.preload": (str(directory / "ld.so.preload"), True),
    }
    assert (directory / "ld.so.preload").read_text() == "/usr/local/vcuda/lib/libvcuda.so\n"
    # the node's word, read-only in the container: the same quota as the record, by container paths
    assert quota_file.read(directory / "quota" / "quota.conf") == quota_file.QuotaFile(
        ledger="/run/vcuda/ledger", core_request=30, core_limit=50, priority="normal",
        gpus=(quota_file.GPUQuota(uuid, 4 * MEMORY_UNIT_BYTES, "ipc:///run/vcuda/sched/sched.sock"),))
    assert ((directory / "quota").stat().st_mode & 0o777, (directory / "quota" / "quota.conf").stat().st_mode
            & 0o777) == (0o755, 0o644)
    # what the container may write holds its ledger and nothing the agent trusts (its record, the preload)
    assert sorted(p.name for p in (directory / "shared").iterdir()) == ["ledger"]
    assert (sched / "sched.sock").exists()
    assert tenants(agent, uuid) == {rec.tenant: (30, 50)}
    with Ledger(agent.layout.ledger_path(rec.key)) as book:
        assert [(d.uuid, d.limit) for d in book.devices()] == [(uuid, 4 * MEMORY_UNIT_BYTES)]
    # the memory resource only accounts: nothing harmful in its answer
    assert kubelet.allocate(MEMORY, ids(uuid, 4)).container_responses[0] == type(resp)()


@pytest.mark.parametrize(("cores", "allowed", "preloaded"), [
    (20, "", True),                  # a share of a GPU: the pod's VCUDA_DISABLE is ignored
    (20, "other,team-b", True),      # ... unless its namespace is listed
    (20, "default", False),
    (100, "", False),                # whole GPUs may opt out as before
])
def test_vcuda_disable_opts_out_only_where_the_operator_allows(agent_factory, kubelet, dp, caplog, cores, allowed,
                                                                preloaded):
    agent_factory("vgpu", pods=StaticPods([dp.pod("p1", cores=cores, env={"VCUDA_DISABLE": "1"})]),
                  allow_opt_out_namespaces=allowed)
    resp = kubelet.allocate(CORE, ids(dp.gpu(0).uuid, cores)).container_responses[0]
    paths = {m.container_path for m in resp.mounts}
    assert ("/etc/ld.so.preload" in paths) == preloaded
    assert {"/run/vcuda", "/run/vcuda-quota"} <= paths   # the quota file is there either way
    ignored = [r for r in caplog.records if "sets VCUDA_DISABLE=1 on a share of a GPU: ignored" in r.getMessage()]
    assert len(ignored) == (1 if cores < 100 and preloaded else 0)


def test_whole_cards_are_unthrottled(agent_factory, kubelet, dp):
    agent = agent_factory("vgpu", gpus=2, pods=StaticPods([dp.pod("big", cores=200)]))
    a, b = dp.gpu(0).uuid, dp.gpu(1).uuid
    available = [d.ID for d in kubelet.latest_devices(CORE)]
    chosen = kubelet.preferred(CORE, available, 200)
    assert sorted(chosen) == sorted(ids(a, 100) + ids(b, 100))
    resp = kubelet.allocate(CORE, chosen).container_responses[0]
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == f"{a},{b}"
    (rec,) = records(agent)
    assert rec.tenant is None and rec.pod == "big"
    assert tenants(agent, a) == {} and tenants(agent, b) == {}
    # injected whole cards get a quota file too: their GPUs named (others refused), no scheduler, no limit
    q = dp.quota(resp)
    assert q.gpus == (quota_file.GPUQuota(a, None, ""), quota_file.GPUQuota(b, None, ""))
    assert q.core_limit == 100


def test_preferred_keeps_a_share_on_one_gpu_best_fit(agent_factory, kubelet, dp):
    agent_factory("vgpu", gpus=3, inv=dp.inventory(3))
    a, b, c = (dp.gpu(i).uuid for i in range(3))
    # a: 100 free, b: 40 free, c: 25 free -> 30 cores fit best on b
    available = ids(a, 100) + ids(b, 40, start=60) + ids(c, 25, start=75)
    chosen = kubelet.preferred(CORE, available, 30)
    assert len(chosen) == 30 and {x.split("::")[0] for x in chosen} == {b}
    with pytest.raises(grpc.RpcError) as e:
        kubelet.preferred(CORE, ids(b, 40) + ids(c, 40), 50)
    assert "no single GPU has 50 free cores" in refused(e)


def test_extender_assignment_identifies_the_pod_and_guides_preference(agent_factory, kubelet, dp):
    a, b = dp.gpu(0).uuid, dp.gpu(1).uuid
    pods = StaticPods([
        dp.pod("early", cores=30, annotations={"vcuda.io/gpu-assignment": dp.assignment_annotation("main", a, 30)}),
        dp.pod("late", cores=30, memory_units=2, created="2026-01-02T00:00:00Z", annotations={
            "vcuda.io/gpu-assignment": dp.assignment_annotation("main", b, 30, memory=1 << 30)}),
    ])
    agent = agent_factory("vgpu", gpus=2, pods=pods)
    resp = kubelet.allocate(CORE, ids(b, 30)).container_responses[0]
    (rec,) = records(agent)
    assert rec.pod == "late" and rec.gpus == (b,)
    assert {g.memory for g in dp.quota(resp).gpus} == {1 << 30}   # the extender's figure wins over units
    # only "early" waits now: its GPU is the preferred one although b fits better
    available = ids(a, 100) + ids(b, 70, start=30)
    assert {x.split("::")[0] for x in kubelet.preferred(CORE, available, 30)} == {a}
    kubelet.allocate(CORE, ids(a, 30))
    assert {r.pod for r in records(agent)} == {"early", "late"}


@pytest.mark.parametrize("case", [
    "fractional-across-gpus", "unknown-id", "not-multiple", "malformed-annotation", "mismatch", "ambiguous",
    "no-pod-multi-gpu", "bad-core-limit", "core-limit-on-whole-card", "duplicate-ids", "bad-priority",
    "high-priority-on-whole-card"])
def test_bad_requests_are_refused_with_a_reason(agent_factory, kubelet, dp, case):
    a, b = dp.gpu(0).uuid, dp.gpu(1).uuid
    ann = "vcuda.io/gpu-assignment"
    pods, request, expect = {
        "fractional-across-gpus": ([dp.pod("p", cores=30)], ids(a, 15) + ids(b, 15), "must stay on one GPU"),
        "unknown-id": ([dp.pod("p", cores=2)], [f"{a}::7", "GPU-nope::1"], "unknown device ID 'GPU-nope::1'"),
        "not-multiple": ([dp.pod("p", cores=150)], ids(a, 100) + ids(b, 50), "not a multiple of 100"),
        "malformed-annotation": ([dp.pod("p", cores=30, annotations={ann: "{not json"})], ids(a, 30),
                                 "pod default/p has a malformed vcuda.io/gpu-assignment annotation"),
        "mismatch": ([dp.pod("p", cores=30, annotations={ann: dp.assignment_annotation("main", b, 30)})],
                     ids(a, 30), "was assigned"),
        "ambiguous": ([dp.pod("p", cores=30, annotations={ann: dp.assignment_annotation("main", a, 30)}),
                       dp.pod("q", cores=30, annotations={ann: dp.assignment_annotation("main", a, 30),
                                                          "vcuda.io/core-limit": "60"})],
                      ids(a, 30), "ambiguous"),
        "no-pod-multi-gpu": ([dp.pod("p", cores=30), dp.pod("q", cores=30)], ids(a, 30),
                             "deploy the vcuda scheduler extender"),
        "bad-core-limit": ([dp.pod("p", cores=30, annotations={"vcuda.io/core-limit": "20"})], ids(a, 30),
                           "annotation vcuda.io/core-limit: '20' must be an integer percent"),
        "core-limit-on-whole-card": ([dp.pod("p", cores=100, annotations={"vcuda.io/core-limit": "5O"})],
                                     ids(a, 100), "annotation vcuda.io/core-limit: '5O' cannot apply to whole GPUs"),
        "duplicate-ids": ([dp.pod("p", cores=3)], ids(a, 2) + ids(a, 1), "appear more than once"),
        "bad-priority": ([dp.pod("p", cores=30, annotations={"vcuda.io/priority": "urgent"})], ids(a, 30),
                         "annotation vcuda.io/priority: 'urgent' is not a priority; use one of high, normal"),
        "high-priority-on-whole-card": ([dp.pod("p", cores=100, annotations={"vcuda.io/priority": "high"})],
                                        ids(a, 100), "annotation vcuda.io/priority: 'high' cannot apply to whole"),
    }[case]
    agent = agent_factory("vgpu", gpus=2, pods=StaticPods(pods))
    with pytest.raises(grpc.RpcError) as e:
        kubelet.allocate(CORE, request)
    assert expect in refused(e)
    assert records(agent) == [] and tenants(agent, a) == {}


def test_anonymous_on_single_gpu_when_ambiguous(agent_factory, kubelet, dp):
    agent = agent_factory("vgpu", gpus=1, pods=StaticPods([dp.pod("p", cores=30), dp.pod("q", cores=30)]))
    kubelet.allocate(CORE, ids(dp.gpu(0).uuid, 30))
    (rec,) = records(agent)
    assert rec.pod == "" and rec.device_ids == tuple(ids(dp.gpu(0).uuid, 30)) and rec.tenant


def test_live_quota_change_and_cleanup(agent_factory, kubelet, dp):
    p = dp.pod("p", cores=30, memory_units=4)
    pods = StaticPods([p])
    agent = agent_factory("vgpu", gpus=1, pods=pods)
    uuid = dp.gpu(0).uuid
    kubelet.allocate(CORE, ids(uuid, 30))
    (rec,) = records(agent)
    p["metadata"]["annotations"].update({"vcuda.io/core-limit": "80", "vcuda.io/memory": "2Gi"})
    dp.wait_for(lambda: tenants(agent, uuid) == {rec.tenant: (30, 80)}, what="live core-limit update")
    dp.wait_for(lambda: agent.layout.read_record(rec.key).memory_limit == 2 << 30, what="record update")
    with Ledger(agent.layout.ledger_path(rec.key)) as book:
        assert book.devices()[0].limit == 2 << 30
    # the quota file follows (the record is written after it)
    live = quota_file.read(agent.layout.quota_dir(rec.key) / "quota.conf")
    assert (live.core_request, live.core_limit, live.gpus[0].memory) == (30, 80, 2 << 30)
    pods.pods.clear()   # the pod is deleted
    dp.wait_for(lambda: not agent.layout.container_dir(rec.key).exists(), what="cleanup")
    assert tenants(agent, uuid) == {}


def test_a_finished_pods_tenant_is_released_before_its_pod_is_deleted(agent_factory, kubelet, dp):
    """Seen on a real cluster: a Succeeded pod kept its tenant until the pod object went, so the next
    pod the extender placed on that GPU (its share free for the schedulers) was refused at Allocate."""
    p = dp.pod("p", cores=30, phase="Running")
    agent = agent_factory("vgpu", gpus=1, pods=StaticPods([p]))
    uuid = dp.gpu(0).uuid
    kubelet.allocate(CORE, ids(uuid, 30))
    (rec,) = records(agent)
    assert tenants(agent, uuid) == {rec.tenant: (30, 30)}
    p["status"]["phase"] = "Succeeded"   # the pod object stays
    dp.wait_for(lambda: not agent.layout.container_dir(rec.key).exists(), what="cleanup of the finished pod")
    assert tenants(agent, uuid) == {}


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_allocate_releases_a_finished_pods_tenant_before_the_next_one(agent_factory, kubelet, dp, phase):
    """Allocate does not wait for the reconciler: the new tenant's guarantee fits once the finished one goes."""
    done = dp.pod("done", cores=60, phase="Running")
    pods = StaticPods([done])
    agent = agent_factory("vgpu", gpus=1, pods=pods)
    uuid = dp.gpu(0).uuid
    kubelet.allocate(CORE, ids(uuid, 60))
    agent.reconciler.stop()             # only Allocate may clean up now
    done["status"]["phase"] = phase
    pods.pods.append(dp.pod("next", cores=60, phase="Pending", created="2026-01-02T00:00:00Z"))
    kubelet.allocate(CORE, ids(uuid, 60, start=40))   # 60 + 60 > 100 while the finished tenant stays
    (rec,) = records(agent)
    assert rec.pod == "next" and tenants(agent, uuid) == {rec.tenant: (60, 60)}


def test_priority_annotation_at_allocate_and_live(agent_factory, kubelet, dp):
    p = dp.pod("p", cores=30, annotations={"vcuda.io/priority": "high"})
    agent = agent_factory("vgpu", gpus=1, pods=StaticPods([p]))
    uuid = dp.gpu(0).uuid
    kubelet.allocate(CORE, ids(uuid, 30))
    (rec,) = records(agent)
    assert rec.priority == "high" and priorities(agent, uuid) == {rec.tenant: "high"}
    p["metadata"]["annotations"]["vcuda.io/priority"] = "normal"
    dp.wait_for(lambda: priorities(agent, uuid) == {rec.tenant: "normal"}, what="live priority update")
    dp.wait_for(lambda: agent.layout.read_record(rec.key).priority == "normal", what="record update")
    assert quota_file.read(agent.layout.quota_dir(rec.key) / "quota.conf").priority == "normal"
    p["metadata"]["annotations"]["vcuda.io/priority"] = "asap"   # refused: the current one is kept
    time.sleep(0.5)
    assert priorities(agent, uuid) == {rec.tenant: "normal"}


def test_crashed_scheduler_is_restarted_with_its_tenants(agent_factory, kubelet, dp):
    agent = agent_factory("vgpu", gpus=1, pods=StaticPods([dp.pod("p", cores=40,
                                                                 annotations={"vcuda.io/priority": "high"})]))
    uuid = dp.gpu(0).uuid
    kubelet.allocate(CORE, ids(uuid, 40))
    (rec,) = records(agent)
    sched = agent.schedulers[uuid]
    first = sched.pid
    (agent.layout.scheduler_dir(uuid) / "tenants.json").unlink()   # restore must come from the records
    sched._proc.kill()
    dp.wait_for(lambda: sched.pid != first and sched.alive(), what="scheduler restart")
    dp.wait_for(lambda: tenants(agent, uuid) == {rec.tenant: (40, 40)}, what="tenant re-registered")
    assert priorities(agent, uuid) == {rec.tenant: "high"}
    assert json.loads((agent.layout.scheduler_dir(uuid) / "tenants.json").read_text())
    assert agent.supervisor.restarts[sched.name] >= 1


def test_bad_host_lib_dir_is_a_start_error(short_dir: Path, dp):
    from device_plugin.agent import Agent
    from node_state.daemon import StartError

    cfg = dp.plugin_config(short_dir, "vgpu", host_lib_dir=str(short_dir / "nowhere"))
    with pytest.raises(StartError, match="--host-lib-dir: .*libvcuda.so does not exist"):
        Agent(cfg, inventory=dp.inventory(1), pods=StaticPods())


def test_interchangeable_pods_get_a_provisional_identity_that_pod_resources_corrects(
        agent_factory, kubelet, dp, short_dir):
    from device_plugin.testing import TestPodResources

    a = dp.gpu(0).uuid
    ann = {"vcuda.io/gpu-assignment": dp.assignment_annotation("main", a, 30)}
    pods = StaticPods([dp.pod("old", cores=30, annotations=ann),
                       dp.pod("new", cores=30, annotations=ann, created="2026-01-02T00:00:00Z")])
    podres = TestPodResources(short_dir / "pr.sock")
    podres.start()
    try:
        agent = agent_factory("vgpu", gpus=2, pods=pods)
        first, second = ids(a, 30), ids(a, 30, start=30)
        kubelet.allocate(CORE, first)
        (rec,) = records(agent)
        assert rec.pod == "old" and rec.extra["identity"] == "provisional"
        kubelet.allocate(CORE, second)   # the other one, by elimination
        assert {r.pod for r in records(agent)} == {"old", "new"}
        # kubelet actually gave the first devices to "new": the record follows kubelet
        podres.owners = {("default", "new", "main"): {CORE: first}, ("default", "old", "main"): {CORE: second}}
        dp.wait_for(lambda: all("identity" not in r.extra for r in records(agent)), what="identity correction")
        owners = {r.device_ids[0]: (r.pod, r.pod_uid) for r in records(agent)}
        assert owners == {first[0]: ("new", "uid-new"), second[0]: ("old", "uid-old")}
    finally:
        podres.stop()


def test_anonymous_container_cleaned_up_when_kubelet_no_longer_lists_its_devices(
        agent_factory, kubelet, dp, short_dir):
    from device_plugin.pods import NoPods
    from device_plugin.testing import TestPodResources

    podres = TestPodResources(short_dir / "pr.sock")
    podres.start()
    try:
        agent = agent_factory("vgpu", gpus=1, pods=NoPods("test"), cleanup_grace_s=1)
        uuid = dp.gpu(0).uuid
        kubelet.allocate(CORE, ids(uuid, 10))
        (rec,) = records(agent)
        assert rec.pod == "" and tenants(agent, uuid) == {rec.tenant: (10, 10)}
        podres.owners = {("ns", "web", "app"): {CORE: ids(uuid, 10)}}
        # listed: the identity is learnt, and the directory stays
        dp.wait_for(lambda: agent.layout.read_record(rec.key).pod == "web", what="identity from pod-resources")
        podres.owners = {}
        dp.wait_for(lambda: not agent.layout.container_dir(rec.key).exists(), what="cleanup after grace")
        assert tenants(agent, uuid) == {}
    finally:
        podres.stop()


def test_whole_cards_follow_the_extenders_assignment(agent_factory, kubelet, dp):
    gpus = [dp.gpu(i).uuid for i in range(4)]
    ann = {"vcuda.io/gpu-assignment": json.dumps({"version": 1, "node": dp.NODE, "containers": [
        {"name": "main", "gpus": [{"uuid": gpus[2], "cores": 100, "memory": 0},
                                  {"uuid": gpus[3], "cores": 100, "memory": 0}]}]})}
    agent = agent_factory("vgpu", gpus=4, pods=StaticPods([dp.pod("big", cores=200, annotations=ann)]))
    chosen = kubelet.preferred(CORE, [d.ID for d in kubelet.latest_devices(CORE)], 200)
    assert {c.split("::")[0] for c in chosen} == {gpus[2], gpus[3]}   # not the first two free ones
    resp = kubelet.allocate(CORE, chosen).container_responses[0]
    assert set(resp.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == {gpus[2], gpus[3]}
    (rec,) = records(agent)
    assert rec.pod == "big" and rec.tenant is None


def test_whole_cards_without_extender_take_the_nvlink_pair(agent_factory, kubelet, dp):
    from node_state.gpus import Inventory

    gpus = tuple(dp.gpu(i, numa=0) for i in range(4))
    inv = Inventory(gpus, {0: frozenset(), 1: frozenset({2}), 2: frozenset({1}), 3: frozenset()})
    agent_factory("vgpu", inv=inv, pods=StaticPods([dp.pod("big", cores=200)]))
    chosen = kubelet.preferred(CORE, [d.ID for d in kubelet.latest_devices(CORE)], 200)
    assert {c.split("::")[0] for c in chosen} == {gpus[1].uuid, gpus[2].uuid}
    with pytest.raises(grpc.RpcError) as e:   # a must-include GPU that is not wholly free
        kubelet.preferred(CORE, ids(gpus[0].uuid, 50) + ids(gpus[1].uuid, 100) + ids(gpus[2].uuid, 100), 200,
                          must_include=ids(gpus[0].uuid, 1))
    assert "not wholly free" in refused(e)


def test_memory_units_are_split_over_whole_cards(agent_factory, kubelet, dp):
    agent = agent_factory("vgpu", gpus=2, pods=StaticPods([dp.pod("big", cores=200, memory_units=64)]))
    a, b = dp.gpu(0).uuid, dp.gpu(1).uuid
    resp = kubelet.allocate(CORE, ids(a, 100) + ids(b, 100)).container_responses[0]
    assert {g.memory for g in dp.quota(resp).gpus} == {8 << 30}   # 64 units = 16 GiB for the container: 8 per card
    (rec,) = records(agent)
    with Ledger(agent.layout.ledger_path(rec.key)) as book:
        assert sorted((d.uuid, d.limit) for d in book.devices()) == [(a, 8 << 30), (b, 8 << 30)]


def test_equal_shares_on_different_gpus_cannot_swap_quotas(agent_factory, kubelet, dp, short_dir):
    """Two waiting pods of the same size, placed on different GPUs: GetPreferredAllocation follows the
    oldest, the match is provisional, and when kubelet says the devices are the other pod's, the record
    and the quota in the scheduler follow kubelet."""
    from device_plugin.testing import TestPodResources

    a, b = dp.gpu(0).uuid, dp.gpu(1).uuid
    ann = "vcuda.io/gpu-assignment"
    pods = StaticPods([
        dp.pod("old", cores=30, annotations={ann: dp.assignment_annotation("main", a, 30),
                                             "vcuda.io/core-limit": "40"}),
        dp.pod("new", cores=30, created="2026-01-02T00:00:00Z",
               annotations={ann: dp.assignment_annotation("main", b, 30), "vcuda.io/core-limit": "70"}),
    ])
    podres = TestPodResources(short_dir / "pr.sock")
    podres.start()
    try:
        agent = agent_factory("vgpu", gpus=2, pods=pods)
        # b is fuller (best fit would take it), but the oldest waiting pod was placed on a
        available = ids(a, 100) + ids(b, 60, start=40)
        chosen = kubelet.preferred(CORE, available, 30)
        assert {c.split("::")[0] for c in chosen} == {a}
        kubelet.allocate(CORE, chosen)
        (rec,) = records(agent)
        assert (rec.pod, rec.extra.get("identity")) == ("old", "provisional")
        assert tenants(agent, a) == {rec.tenant: (30, 40)}
        # kubelet was in fact admitting "new" (it need not follow the preference): the record and
        # the scheduler's quota follow kubelet's own account of who holds the devices
        podres.owners = {("default", "new", "main"): {CORE: chosen}}
        dp.wait_for(lambda: agent.layout.read_record(rec.key).pod == "new", what="identity correction")
        dp.wait_for(lambda: tenants(agent, a) == {rec.tenant: (30, 70)}, what="the right pod's quota")
        # The reconciler writes the record after the scheduler took the new limit: wait for it too.
        fixed = dp.wait_for(lambda: r if (r := agent.layout.read_record(rec.key)).core_limit == 70 else None,
                            what="the record's quota")
        assert (fixed.pod_uid, fixed.core_limit) == ("uid-new", 70) and "identity" not in fixed.extra
    finally:
        podres.stop()


def test_a_failed_container_rolls_back_the_earlier_ones_of_the_request(agent_factory, kubelet, dp):
    a = dp.gpu(0).uuid
    agent = agent_factory("vgpu", gpus=1, pods=StaticPods([dp.pod("p", cores=30)]))
    with pytest.raises(grpc.RpcError) as e:
        kubelet.allocate(CORE, ids(a, 30), [f"{a}::99", "GPU-nope::1"])
    assert "unknown device ID 'GPU-nope::1'" in refused(e)
    assert records(agent) == [] and tenants(agent, a) == {}
    assert list(agent.layout.containers.iterdir()) == []


def init_pod(dp, init_cores: int, main_cores: int):  # type: ignore[no-untyped-def]
    p = dp.pod("p", cores=main_cores)
    p["spec"]["initContainers"] = [{"name": "warmup", "resources": {"limits": {CORE: str(init_cores)}}}]
    return p


def test_init_container_is_allocated_first_and_hands_its_tenant_on(agent_factory, kubelet, dp):
    """kubelet allocates init containers before app containers and hands their devices on; the
    app container takes over the init container's tenant, so their requests are not summed."""
    agent = agent_factory("vgpu", gpus=1, pods=StaticPods([init_pod(dp, 20, 30)]))
    uuid = dp.gpu(0).uuid
    first = kubelet.allocate(CORE, ids(uuid, 20)).container_responses[0]
    (init,) = records(agent)
    assert (init.container, init.extra.get("init"), init.core_request) == ("warmup", "1", 20)
    assert tenants(agent, uuid) == {init.tenant: (20, 20)}
    second = kubelet.allocate(CORE, ids(uuid, 30)).container_responses[0]   # reuses the 20, plus 10
    main = next(r for r in records(agent) if r.container == "main")
    assert main.tenant == init.tenant and agent.layout.read_record(init.key).tenant is None
    assert tenants(agent, uuid) == {init.tenant: (30, 30)}
    sched = {m.container_path: m.host_path for m in first.mounts}["/run/vcuda/sched"]
    assert {m.container_path: m.host_path for m in second.mounts}["/run/vcuda/sched"] == sched


def test_init_container_runs_on_its_pods_assigned_gpu(agent_factory, kubelet, dp):
    a, b = dp.gpu(0).uuid, dp.gpu(1).uuid
    p = init_pod(dp, 50, 30)
    p["metadata"]["annotations"]["vcuda.io/gpu-assignment"] = dp.assignment_annotation("main", b, 30)
    agent = agent_factory("vgpu", gpus=2, pods=StaticPods([p]))
    available = ids(a, 60) + ids(b, 100)   # best fit alone would take a
    chosen = kubelet.preferred(CORE, available, 50)
    assert {c.split("::")[0] for c in chosen} == {b}
    kubelet.allocate(CORE, chosen)
    (rec,) = records(agent)
    assert (rec.container, rec.gpus) == ("warmup", (b,))
    with pytest.raises(grpc.RpcError) as e:   # the app container next, but kubelet put it elsewhere
        kubelet.allocate(CORE, ids(a, 30))
    assert "was assigned" in refused(e)
