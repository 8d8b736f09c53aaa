"""The DRA driver end to end, in process: registered through the registration socket of a test
kubelet, claims in a fake API server, NodePrepareResources / NodeUnprepareResources over the
plugin's socket; what comes back, what lands on the node (records, tenants, CDI specs,
checkpoint), and what a restart or an unavailable API server does."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from shimtest import cdi_container, container_quota

from dra_driver import testing as t
from dra_driver.names import DRIVER, REGISTRATION_SOCKET, SUPPORTED_VERSIONS
from node_state.layout import ContainerRecord
from node_state.testing import gpu, inventory, wait_for
from py_vcuda import quota_file
from py_vcuda.sim import GiB, MiB

NODE = t.NODE
UUID0 = gpu(0).uuid


def cdi_spec(agent: Any, claim: dict[str, Any]) -> dict[str, Any]:
    return json.loads(agent.driver.specs.path(claim["metadata"]["uid"]).read_text())


def edits(spec: dict[str, Any]) -> tuple[dict[str, str], dict[str, tuple[str, list[str]]]]:
    """(env, {container path: (host path, options)}) of a spec's one device."""
    (device,) = spec["devices"]
    e = device["containerEdits"]
    env = dict(kv.split("=", 1) for kv in e["env"])
    return env, {m["containerPath"]: (m["hostPath"], m["options"]) for m in e["mounts"]}


def spec_quota(spec: dict[str, Any]) -> quota_file.QuotaFile:
    """The quota file a spec's one device mounts at /run/vcuda-quota."""
    (device,) = spec["devices"]
    return container_quota(cdi_container(device["containerEdits"])[1])


def entry(resp: Any, claim: dict[str, Any]) -> Any:
    return resp.claims[claim["metadata"]["uid"]]


def test_registers_through_the_registration_socket(agent_factory, kubelet, short_dir):
    agent = agent_factory()
    r = kubelet.wait_registered()
    assert r.socket == short_dir / "reg" / REGISTRATION_SOCKET
    assert (r.info.type, r.info.name) == ("DRAPlugin", DRIVER)
    assert r.info.endpoint == str(short_dir / "pl" / DRIVER / "dra.sock")
    assert list(r.info.supported_versions) == list(SUPPORTED_VERSIONS)
    assert r.version == "v1.DRAPlugin"                       # the kubelet takes the first it supports
    wait_for(agent.plugin.registered.is_set, 10, "NotifyRegistrationStatus")
    assert agent.plugin.registration.statuses[-1].plugin_registered


def test_removed_sockets_are_served_again_and_registered_again(agent_factory, kubelet, api, short_dir):
    agent_factory()
    first = kubelet.wait_registered()
    (short_dir / "pl" / DRIVER / "dra.sock").unlink()        # someone cleaned the plugin directory
    again = kubelet.wait_registered(after=first.at + 1e-6)
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, 4 * GiB)]))
    assert entry(kubelet.prepare(claim), claim).error == ""   # through the new socket
    (short_dir / "reg" / REGISTRATION_SOCKET).unlink()
    kubelet.wait_registered(after=again.at + 1e-6)


def test_a_kubelet_with_only_v1beta1_prepares_through_v1beta1(agent_factory, api, short_dir):
    registry = short_dir / "reg"
    registry.mkdir()
    old = t.TestKubelet(registry, versions=("v1beta1.DRAPlugin",))
    old.start()
    try:
        agent_factory()
        assert old.wait_registered().version == "v1beta1.DRAPlugin"
        claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, 4 * GiB)]))
        resp = old.prepare(claim)
        assert type(resp).__module__.endswith("dra_v1beta1_pb2")
        assert entry(resp, claim).error == "" and len(entry(resp, claim).devices) == 1
    finally:
        old.stop()


def test_a_kubelet_that_supports_no_version_is_told_so(agent_factory, short_dir):
    registry = short_dir / "reg"
    registry.mkdir()
    future = t.TestKubelet(registry, versions=("v2.DRAPlugin",))
    future.start()
    try:
        agent = agent_factory()
        status = wait_for(lambda: agent.plugin.registration.statuses, 10, "a registration status")[-1]
        assert not status.plugin_registered and "none of the versions" in status.error
        assert not agent.plugin.registered.is_set()
    finally:
        future.stop()


def test_published_slice_matches_the_gpus(agent_factory, api):
    inv = inventory(3, memory=16 * GiB)
    agent = agent_factory(inv=inv)
    wait_for(agent.publisher.published.is_set, 10, "the ResourceSlice")
    (s,) = api.objects["resourceslices"].values()
    assert s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == NODE
    assert s["spec"]["pool"]["name"] == NODE and s["spec"]["pool"]["resourceSliceCount"] == 1
    assert s["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"
    devices = {d["name"]: d for d in s["spec"]["devices"]}
    assert set(devices) == {"gpu-0", "gpu-1", "gpu-2"}
    for g in inv.gpus:
        d = devices[f"gpu-{g.index}"]
        assert d["attributes"]["uuid"] == {"string": g.uuid}
        assert d["attributes"]["index"] == {"int": g.index}
        assert d["capacity"]["memory"]["value"] == str(16 * GiB)
        assert d["capacity"]["cores"]["value"] == "100"
        assert d["allowMultipleAllocations"] is True


def test_share_claim_gets_env_mounts_and_a_cdi_spec(agent_factory, kubelet, api):
    agent = agent_factory()
    pod = {"metadata": {"name": "app", "namespace": "default", "uid": "uid-app"},
           "spec": {"nodeName": NODE, "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tmpl"}],
                    "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
                                   {"name": "sidecar"}]},
           "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "app-gpu-x1"}]}}
    api.put("pods", pod)
    claim = api.put("resourceclaims", t.claim("app-gpu-x1", NODE, [t.share(NODE, 0, 30, 8 * GiB, share_id="s-1")],
                                              config=[t.share_config(coreLimit=50, priority="high")], pod="app"))
    resp = kubelet.prepare(claim)
    e = entry(resp, claim)
    assert e.error == ""
    (device,) = e.devices
    uid = claim["metadata"]["uid"]
    assert (list(device.request_names), device.pool_name, device.device_name) == (["gpu"], NODE, "gpu-0")
    assert list(device.cdi_device_ids) == [f"gpu.vcuda.io/claim={uid}-gpu"]

    spec = cdi_spec(agent, claim)
    assert spec["kind"] == "gpu.vcuda.io/claim" and spec["devices"][0]["name"] == f"{uid}-gpu"
    env, mounts = edits(spec)
    (record,) = agent.store.records()
    assert env == {"NVIDIA_VISIBLE_DEVICES": UUID0}   # the quota is the file's word alone
    layout = agent.layout
    assert mounts == {
        "/run/vcuda-quota": (str(layout.quota_dir(record.key)), ["ro", "nosuid", "nodev", "bind"]),
        "/run/vcuda": (str(layout.shared_dir(record.key)), ["rw", "nosuid", "nodev", "bind"]),
        "/usr/local/vcuda/lib/libvcuda.so": (str(agent.config.host_lib_dir / "libvcuda.so"),
                                             ["ro", "nosuid", "nodev", "bind"]),
        "/run/vcuda/sched": (str(layout.scheduler_dir(UUID0) / "tenants" / record.tenant),
                             ["rw", "nosuid", "nodev", "bind"]),
        "/etc/ld.so.preload": (str(layout.container_dir(record.key) / "ld.so.preload"),
                               ["ro", "nosuid", "nodev", "bind"]),
    }
    for host, _ in mounts.values():
        assert Path(host).exists(), host
    # the same quota file as a vgpu container's, by container paths
    assert quota_file.read(layout.quota_dir(record.key) / "quota.conf") == quota_file.QuotaFile(
        ledger="/run/vcuda/ledger", core_request=30, core_limit=50, priority="high",
        gpus=(quota_file.GPUQuota(UUID0, 8 * GiB, "ipc:///run/vcuda/sched/sched.sock"),))
    # the record: the same layout as a vgpu container, named after the claim's pod and its container
    assert (record.mode, record.resource, record.gpus) == ("vgpu", DRIVER, (UUID0,))
    assert (record.core_request, record.core_limit, record.memory_limit) == (30, 50, 8 * GiB)
    assert (record.namespace, record.pod, record.pod_uid, record.container) == ("default", "app", "uid-app", "main")
    assert record.extra["claim_uid"] == uid and record.extra["share_id"] == "s-1"
    assert record.tenant == record.key and record.priority == "high"
    stats = agent.schedulers[UUID0].call("stats")
    assert record.tenant in json.dumps(stats)
    assert stats["tenants"][record.tenant]["priority"] == "high"
    assert agent.driver.checkpoint.get(uid).state == "prepared"


def test_whole_gpu_claim_is_unthrottled(agent_factory, kubelet, api):
    agent = agent_factory()
    claim = api.put("resourceclaims", t.claim("whole", NODE, [t.whole(NODE, 1)]))
    e = entry(kubelet.prepare(claim), claim)
    assert e.error == "" and e.devices[0].device_name == "gpu-1"
    _, mounts = edits(cdi_spec(agent, claim))
    assert "/run/vcuda/sched" not in mounts
    (record,) = agent.store.records()
    assert record.tenant is None and record.gpus == (gpu(1).uuid,)
    q = spec_quota(cdi_spec(agent, claim))
    assert (q.core_request, q.core_limit, q.gpus) == (100, 100, (quota_file.GPUQuota(gpu(1).uuid, None, ""),))
    # booked through consumable capacity with the defaults (all of it): the same
    claim2 = api.put("resourceclaims", t.claim("whole2", NODE, [t.share(NODE, 0, 100, 16 * GiB)]))
    assert entry(kubelet.prepare(claim2), claim2).error == ""
    assert spec_quota(cdi_spec(agent, claim2)).gpus == (quota_file.GPUQuota(gpu(0).uuid, None, ""),)


def test_two_whole_gpus_in_one_request_get_one_cdi_device(agent_factory, kubelet, api):
    agent = agent_factory()
    claim = api.put("resourceclaims", t.claim("two", NODE, [t.whole(NODE, 0), t.whole(NODE, 1)]))
    e = entry(kubelet.prepare(claim), claim)
    assert e.error == ""
    assert [d.device_name for d in e.devices] == ["gpu-0", "gpu-1"]
    assert [len(d.cdi_device_ids) for d in e.devices] == [1, 0]   # injected once
    env, _ = edits(cdi_spec(agent, claim))
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{gpu(0).uuid},{gpu(1).uuid}"


def test_repeated_prepare_answers_the_same_and_sets_up_once(agent_factory, kubelet, api):
    agent = agent_factory()
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, 4 * GiB)]))
    first = entry(kubelet.prepare(claim), claim)
    requests = len(api.requests)
    again = entry(kubelet.prepare(claim), claim)
    assert again == first
    assert len(list(agent.store.records())) == 1
    claim_reads = [r for r in api.requests[requests:] if "resourceclaims" in r.path]
    assert claim_reads == []          # answered from the checkpoint


def test_unprepare_removes_everything_and_is_idempotent(agent_factory, kubelet, api):
    agent = agent_factory()
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, 4 * GiB)]))
    assert entry(kubelet.prepare(claim), claim).error == ""
    (record,) = agent.store.records()
    uid = claim["metadata"]["uid"]
    api.delete("resourceclaims", "default/c")       # unprepare must not need the claim any more
    for _ in range(2):
        resp = kubelet.unprepare(claim)
        assert entry(resp, claim).error == ""
    assert list(agent.store.records()) == []
    assert not agent.driver.specs.exists(uid) and agent.driver.checkpoint.get(uid) is None
    assert record.tenant not in json.dumps(agent.schedulers[UUID0].call("stats"))


def test_unprepare_of_an_unknown_claim_succeeds(agent_factory, kubelet):
    agent_factory()
    unknown = t.claim("never", NODE, [])
    assert entry(kubelet.unprepare(unknown), unknown).error == ""


def test_claim_for_another_drivers_device_is_ignored(agent_factory, kubelet, api):
    agent = agent_factory()
    claim = api.put("resourceclaims", t.claim("nic", NODE, [t.foreign(NODE)]))
    e = entry(kubelet.prepare(claim), claim)
    assert e.error == "" and list(e.devices) == []
    assert list(agent.store.records()) == [] and not agent.driver.specs.exists(claim["metadata"]["uid"])
    # beside one of ours, only ours counts
    mixed = api.put("resourceclaims", t.claim("mixed", NODE, [t.foreign(NODE), t.share(NODE, 1, 20, 2 * GiB)]))
    e = entry(kubelet.prepare(mixed), mixed)
    assert [d.device_name for d in e.devices] == ["gpu-1"]


@pytest.mark.parametrize("config,field", [
    ({"coreLimit": 20}, "GpuShareConfig.coreLimit 20 is below the core request (30)"),
    ({"coreLimit": "lots"}, "GpuShareConfig.coreLimit: 'lots' is not a whole percentage"),
    ({"colour": "blue"}, "GpuShareConfig.colour: unknown field"),
    ({"priority": "urgent"}, "GpuShareConfig.priority: 'urgent' is not one of high, normal"),
    ({"preload": "yes"}, "GpuShareConfig.preload: 'yes' is not true or false"),
])
def test_bad_opaque_config_fails_the_claim_naming_the_field(agent_factory, kubelet, api, config, field):
    agent = agent_factory()
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, 4 * GiB)],
                                              config=[t.share_config(**config)]))
    good = api.put("resourceclaims", t.claim("good", NODE, [t.share(NODE, 1, 30, 4 * GiB)]))
    resp = kubelet.prepare(claim, good)
    assert field in entry(resp, claim).error
    assert list(entry(resp, claim).devices) == []
    assert entry(resp, good).error == ""                  # one claim's mistake fails that claim only
    assert [r.extra["claim"] for r in agent.store.records()] == ["good"]
    assert not agent.driver.specs.exists(claim["metadata"]["uid"])


def test_api_server_down_fails_each_claim_clearly_and_a_retry_succeeds(agent_factory, kubelet, api):
    agent = agent_factory()
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, 4 * GiB)]))
    api.fail_requests = 1000
    e = entry(kubelet.prepare(claim), claim)
    assert "reading ResourceClaim default/c" in e.error and "retries" in e.error, e.error
    assert list(agent.store.records()) == []
    api.fail_requests = 0
    assert entry(kubelet.prepare(claim), claim).error == ""     # the kubelet's retry


def test_api_server_gone_says_unreachable(agent_factory, kubelet, api, kube):
    agent_factory()
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, 4 * GiB)]))
    api.close()
    e = entry(kubelet.prepare(claim), claim)
    assert "API server unreachable" in e.error, e.error


def test_a_claim_created_again_under_the_same_name_is_refused(agent_factory, kubelet, api):
    agent_factory()
    old = t.claim("c", NODE, [t.share(NODE, 0, 30, 4 * GiB)])
    api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, 4 * GiB)]))   # another UID
    assert "was deleted and created again" in entry(kubelet.prepare(old), old).error


def test_an_unhealthy_gpu_is_refused_and_leaves_the_slice(agent_factory, kubelet, api):
    agent = agent_factory()
    wait_for(agent.publisher.published.is_set, 10, "the ResourceSlice")
    agent.health.set(UUID0, False, "critical XID 79")
    wait_for(lambda: [d["name"] for d in api.get("resourceslices", f"{NODE}-{DRIVER}")["spec"]["devices"]]
             == ["gpu-1"], 10, "gpu-0 to leave the slice")
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, 4 * GiB)]))
    assert "is unhealthy" in entry(kubelet.prepare(claim), claim).error
    agent.health.set(UUID0, True)
    wait_for(lambda: len(api.get("resourceslices", f"{NODE}-{DRIVER}")["spec"]["devices"]) == 2, 10, "gpu-0 back")


def test_two_shares_in_one_claim_are_refused(agent_factory, kubelet, api):
    agent_factory()
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, GiB, request="a"),
                                                          t.share(NODE, 1, 30, GiB, request="b")]))
    assert "put each share in its own claim" in entry(kubelet.prepare(claim), claim).error


def test_several_containers_of_the_pod_are_named(agent_factory, kubelet, api):
    agent = agent_factory()
    api.put("pods", {"metadata": {"name": "p", "namespace": "default", "uid": "uid-p"},
                     "spec": {"resourceClaims": [{"name": "g", "resourceClaimName": "shared"}],
                              "initContainers": [{"name": "warm", "resources": {"claims": [{"name": "g"}]}}],
                              "containers": [{"name": "a", "resources": {"claims": [{"name": "g", "request": "gpu"}]}},
                                             {"name": "b", "resources": {"claims": [{"name": "g", "request": "x"}]}}]}})
    claim = api.put("resourceclaims", t.claim("shared", NODE, [t.share(NODE, 0, 10, 512 * MiB)], pod="p"))
    assert entry(kubelet.prepare(claim), claim).error == ""
    (record,) = agent.store.records()
    assert record.container == "warm,a"


def test_restart_finishes_what_a_crash_left(agent_factory, kubelet, api, short_dir):
    agent = agent_factory()
    done = api.put("resourceclaims", t.claim("done", NODE, [t.share(NODE, 0, 30, 4 * GiB)]))
    going = api.put("resourceclaims", t.claim("going", NODE, [t.share(NODE, 1, 30, 4 * GiB)]))
    assert entry(kubelet.prepare(done, going), done).error == ""
    first = entry(kubelet.prepare(done), done)
    agent.stop()
    d = agent.driver
    done_uid, going_uid = done["metadata"]["uid"], going["metadata"]["uid"]
    d.specs.remove(done_uid)                  # crashed between checkpoint and CDI spec
    prepared = d.checkpoint.get(going_uid)    # crashed in the middle of unprepare
    d.checkpoint.put(dataclasses.replace(prepared, state="unpreparing"))
    d.specs.write("orphan-claim", [])         # a spec nobody checkpointed
    orphan = ContainerRecord(key="corphan00001", mode="vgpu", resource=DRIVER, device_ids=("node-1/gpu-0",),
                             gpus=(UUID0,), core_request=10, core_limit=10, memory_limit=None,
                             tenant="corphan00001", extra={"driver": DRIVER, "claim_uid": "never-checkpointed"})
    agent.store.create(orphan, ledger=True, preload=True)   # crashed before the checkpoint

    again = agent_factory()
    kubelet.wait_registered()
    assert again.driver.specs.exists(done_uid)
    assert entry(kubelet.prepare(done), done) == first
    assert again.driver.checkpoint.get(going_uid) is None and not again.driver.specs.exists(going_uid)
    assert not again.driver.specs.exists("orphan-claim")
    assert {r.extra["claim"] for r in again.store.records()} == {"done"}
    # the scheduler kept the surviving claim's tenant (restored, and re-added from the record), not the orphan's
    (record,) = again.store.records()
    stats = json.dumps(again.schedulers[UUID0].call("stats"))
    assert record.tenant in stats and "corphan00001" not in stats
    assert entry(kubelet.unprepare(done), done).error == ""


def test_a_missing_container_directory_is_made_again(agent_factory, kubelet, api):
    agent = agent_factory()
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, 4 * GiB)]))
    first = entry(kubelet.prepare(claim), claim)
    (record,) = agent.store.records()
    agent.store.remove(record.key)
    assert entry(kubelet.prepare(claim), claim) == first
    assert [r.key for r in agent.store.records()] == [record.key]
    assert agent.layout.ledger_path(record.key).exists()
    assert (agent.layout.quota_dir(record.key) / "quota.conf").exists()


def test_a_claim_prepared_before_quota_files_gets_one_and_its_spec_the_mount(agent_factory, kubelet, api):
    agent = agent_factory()
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, 4 * GiB)]))
    first = entry(kubelet.prepare(claim), claim)
    (record,) = agent.store.records()
    # what a driver from before quota files left: no quota directory, a spec without its mount
    shutil.rmtree(agent.layout.quota_dir(record.key))
    spec = cdi_spec(agent, claim)
    spec["devices"][0]["containerEdits"]["mounts"] = [
        m for m in spec["devices"][0]["containerEdits"]["mounts"] if m["containerPath"] != "/run/vcuda-quota"]
    agent.driver.specs.path(claim["metadata"]["uid"]).write_text(json.dumps(spec))
    assert entry(kubelet.prepare(claim), claim) == first
    assert quota_file.read(agent.layout.quota_dir(record.key) / "quota.conf").gpus[0].memory == 4 * GiB
    _, mounts = edits(cdi_spec(agent, claim))
    assert mounts["/run/vcuda-quota"] == (str(agent.layout.quota_dir(record.key)), ["ro", "nosuid", "nodev", "bind"])


def test_a_spec_from_a_driver_that_set_vcuda_variables_is_written_again(agent_factory, kubelet, api):
    """libvcuda ignores them under the quota file, with a warning in every process: the spec loses them."""
    agent = agent_factory()
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, 4 * GiB)]))
    first = entry(kubelet.prepare(claim), claim)
    spec = cdi_spec(agent, claim)
    current = json.loads(json.dumps(spec))
    spec["devices"][0]["containerEdits"]["env"] += ["VCUDA_CORE_LIMIT=30", "VCUDA_LEDGER=/run/vcuda/ledger"]
    agent.driver.specs.path(claim["metadata"]["uid"]).write_text(json.dumps(spec))
    assert entry(kubelet.prepare(claim), claim) == first
    assert cdi_spec(agent, claim) == current


def test_dra_containers_appear_in_the_node_snapshot(agent_factory, kubelet, api, short_dir):
    """The exporter and `vcuda top` read the same node state: the claim's container is there, named."""
    from node_state.metrics_snapshot import NodeReader
    from py_vcuda.sim import SimConfig, nvml_session

    agent = agent_factory()
    api.put("pods", {"metadata": {"name": "app", "namespace": "team", "uid": "uid-app"},
                     "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
                              "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}]}})
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 1, 25, 2 * GiB)], namespace="team",
                                              pod="app"))
    assert entry(kubelet.prepare(claim), claim).error == ""
    with nvml_session(SimConfig(state_path=short_dir / "sim", devices=2)) as nvml:
        reader = NodeReader(agent.layout, mode="vgpu", node=NODE, nvml=nvml, pod_resources=None)
        try:
            snap = reader.snapshot()
        finally:
            reader.close()
    (c,) = snap.containers
    assert (c.namespace, c.pod, c.container, c.uuid, c.gpu, c.mode) == ("team", "app", "main", gpu(1).uuid, 1,
                                                                         "vgpu")
    assert (c.core_request, c.memory_limit) == (0.25, 2 * GiB)
    assert c.tenant_stats is not None          # the GPU's token scheduler answered for the tenant


@pytest.mark.parametrize(("namespace", "allowed", "device", "refused"), [
    ("default", "", "share", True),            # a share of a GPU: not the claim's to opt out of
    ("default", "batch,default", "share", False),
    ("batch", "default", "share", True),
    ("default", "", "whole", False),           # whole GPUs may go without the preload as before
])
def test_preload_false_on_a_share_needs_an_allowed_namespace(agent_factory, kubelet, api, namespace, allowed,
                                                             device, refused):
    agent = agent_factory(config={"allow_opt_out_namespaces": allowed} if allowed else {})
    result = t.share(NODE, 0, 30, 4 * GiB) if device == "share" else t.whole(NODE, 0)
    claim = api.put("resourceclaims", t.claim("c", NODE, [result], namespace=namespace,
                                              config=[t.share_config(preload=False)]))
    error = entry(kubelet.prepare(claim), claim).error
    if refused:
        assert "GpuShareConfig.preload false would run a share of GPU" in error, error
        assert "--allow-opt-out-namespaces" in error and "\n" not in error
        assert list(agent.store.records()) == [] and not agent.driver.specs.exists(claim["metadata"]["uid"])
        return
    assert error == ""
    _, mounts = edits(cdi_spec(agent, claim))
    assert "/etc/ld.so.preload" not in mounts and "/run/vcuda-quota" in mounts
