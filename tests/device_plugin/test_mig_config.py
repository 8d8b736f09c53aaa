"""MIG layouts by node label (device_plugin.mig_config) through the agent, the test kubelet and the
fake API server, on node_state.testing.FakeMig: the label names a layout of the mounted mig-parted
file; the agent applies it, registers the new resources, relabels the node and reports
nvidia.com/mig.config.state; a layout it cannot apply fails with a Warning Event and changes nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from device_plugin.mig_config import CONFIG_LABEL, EVENT_REASON, STATE_LABEL, MigNode
from device_plugin.node_topology import KubeNode
from kube_contract.testing import FakeApiServer
from node_state.testing import EXAMPLE_LAYOUTS, ISSUE_NODE_MIG, FakeMig

NODE_MIG = list(ISSUE_NODE_MIG)
LAYOUTS = EXAMPLE_LAYOUTS


def start(agent_factory, api, dp, tmp_path: Path, fake: FakeMig, strategy: str = "mixed",  # type: ignore[no-untyped-def]
          **overrides):
    config = tmp_path / "config.yaml"
    config.write_text(LAYOUTS)
    core = api.core_v1()
    return agent_factory("pgpu", inv=fake.inventory(), nvml=fake, mig_strategy=strategy, mig_config=config,
                         patch_node=KubeNode(core, dp.NODE).patch, mig_node=MigNode(core, dp.NODE),
                         **overrides), config


def label(api: FakeApiServer, dp, name: str | None) -> None:  # type: ignore[no-untyped-def]
    """`kubectl label node --overwrite nvidia.com/mig.config=<name>` (a merge patch); the state label is
    cleared too, so the test waits on the state this change brings."""
    api.core_v1().patch_node(dp.NODE, {"metadata": {"labels": {CONFIG_LABEL: name, STATE_LABEL: None}}},
                             _content_type="application/merge-patch+json", _preload_content=False)


def node_labels(api: FakeApiServer, dp) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return api.get("nodes", dp.NODE)["metadata"].get("labels") or {}


def wait_state(api, dp, state: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return dp.wait_for(lambda: node_labels(api, dp) if node_labels(api, dp).get(STATE_LABEL) == state else None,
                       what=f"{STATE_LABEL}={state}")


def events(api: FakeApiServer) -> list[dict]:  # type: ignore[type-arg]
    with api.lock:
        return [dict(e) for e in api.objects["events"].values()]


def layout(fake: FakeMig) -> dict[int, tuple[bool, list[str]]]:
    return {i: (fake.modes[i], sorted(d.profile for d in fake.instances[i])) for i in fake.modes}


def test_label_applies_the_layout_and_reregisters_the_resources(agent_factory, kubelet, api, dp, tmp_path):
    fake = FakeMig(NODE_MIG)
    agent, _ = start(agent_factory, api, dp, tmp_path, fake)
    kubelet.latest_devices("nvidia.com/mig-1g.10gb")
    before = time.monotonic()
    label(api, dp, "mixed-1")
    labels = wait_state(api, dp, "success")
    assert layout(fake) == {0: (True, ["2g.20gb", "2g.20gb", "3g.40gb"]),
                            1: (True, ["1g.10gb", "1g.10gb", "1g.10gb", "4g.40gb"])}
    reg = kubelet.wait_registered("nvidia.com/mig-2g.20gb", after=before)
    assert reg is not None and len(kubelet.latest_devices("nvidia.com/mig-2g.20gb")) == 2
    assert len(kubelet.latest_devices("nvidia.com/mig-4g.40gb")) == 1
    kubelet.wait_registered("nvidia.com/gpu", after=before)
    dp.wait_for(lambda: [d.ID for d in kubelet.latest_devices("nvidia.com/gpu")] == [fake.gpus_[2].uuid],
                what="GPU 1 no longer whole")
    mig_uuid = next(d.uuid for d in fake.instances[1] if d.profile == "4g.40gb")
    resp = kubelet.allocate("nvidia.com/mig-4g.40gb", [mig_uuid])
    assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == mig_uuid
    # The node's labels follow: the new profiles counted, GPU 1 no longer a whole GPU.
    labels = dp.wait_for(lambda: node_labels(api, dp) if node_labels(api, dp).get(
        "nvidia.com/mig-2g.20gb.count") == "2" else None, what="labels after the layout")
    assert labels["nvidia.com/mig-1g.10gb.count"] == "3" and labels["nvidia.com/gpu.count"] == "1"
    assert labels["nvidia.com/mig.capable"] == "true" and labels["nvidia.com/mig.strategy"] == "mixed"
    assert agent.mig_manager is not None and agent.mig_manager.applier.record.config == "mixed-1"
    assert events(api) == []


def test_disabling_mig_removes_the_profile_labels(agent_factory, kubelet, api, dp, tmp_path):
    fake = FakeMig(NODE_MIG)
    start(agent_factory, api, dp, tmp_path, fake)
    dp.wait_for(lambda: "nvidia.com/mig-1g.10gb.count" in node_labels(api, dp), what="first labels")
    label(api, dp, "all-disabled")
    wait_state(api, dp, "success")
    assert layout(fake) == {0: (False, []), 1: (False, [])}
    labels = dp.wait_for(lambda: node_labels(api, dp) if node_labels(api, dp).get("nvidia.com/gpu.count") == "3"
                         else None, what="three whole GPUs")
    assert not [k for k in labels if k.startswith("nvidia.com/mig-")]
    dp.wait_for(lambda: len(kubelet.latest_devices("nvidia.com/gpu")) == 3, what="three whole GPUs offered")


@pytest.mark.parametrize(("name", "config", "reason"), [
    ("nope", LAYOUTS, "no such layout"),
    ("too-big", LAYOUTS, "at most 2 instance"),
    ("mixed-1", "version: v1\nmig-configs: [", "not valid YAML"),
    ("mixed-1", "version: v9\nmig-configs: {}", "version 'v9'"),
])
def test_a_layout_it_cannot_apply_fails_with_an_event_and_changes_nothing(agent_factory, kubelet, api, dp,
                                                                         tmp_path, name, config, reason):
    fake = FakeMig(NODE_MIG)
    before = layout(fake)
    _, path = start(agent_factory, api, dp, tmp_path, fake)
    path.write_text(config)   # an edited ConfigMap counts from the next label change
    label(api, dp, name)
    wait_state(api, dp, "failed")
    assert layout(fake) == before and not [c for c in fake.calls if not c.startswith("processes")]
    (event,) = dp.wait_for(lambda: events(api), what="the Warning Event")
    assert event["reason"] == EVENT_REASON and event["type"] == "Warning" and reason in event["message"]
    assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == dp.NODE


def test_a_busy_gpu_fails_the_layout_until_it_is_idle(agent_factory, kubelet, api, dp, tmp_path):
    fake = FakeMig(NODE_MIG)
    before = layout(fake)
    agent, _ = start(agent_factory, api, dp, tmp_path, fake)
    victim = fake.instances[0][2].uuid
    kubelet.allocate("nvidia.com/mig-3g.40gb", [victim])     # a container holds an instance of GPU 0
    fake.processes_on[fake.gpus_[1].uuid] = [777]              # and a process runs on GPU 1
    label(api, dp, "mixed-1")
    wait_state(api, dp, "failed")
    (event,) = dp.wait_for(lambda: events(api), what="the Warning Event")
    assert "busy" in event["message"] and "GPU 0" in event["message"]
    assert layout(fake) == before
    (rec,) = agent.store.records()
    agent.store.remove(rec.key)                                # the container went; GPU 1 still busy
    dp.wait_for(lambda: "GPU 1" in (agent.mig_manager.reason if agent.mig_manager else ""),
                what="the retry to find GPU 1 busy")
    assert layout(fake) == before
    fake.processes_on.clear()
    wait_state(api, dp, "success")                             # retried while the label names it
    assert layout(fake)[0] == (True, ["2g.20gb", "2g.20gb", "3g.40gb"])
    assert len(events(api)) == 2                               # one per reason, not one per retry


def test_a_container_gone_retries_a_busy_layout_at_once(agent_factory, kubelet, api, dp, tmp_path):
    """The reconciler removing the container that kept the GPU busy tries the layout again then, not at
    the next retry (every resync_s, 60 s here): on the e2e cluster the pod's deletion is what frees it."""
    fake = FakeMig(NODE_MIG)
    agent, _ = start(agent_factory, api, dp, tmp_path, fake, resync_s=60)
    kubelet.allocate("nvidia.com/mig-3g.40gb", [fake.instances[0][2].uuid])
    label(api, dp, "mixed-1")
    wait_state(api, dp, "failed")
    (rec,) = agent.store.records()
    with agent.store.lock:
        agent.reconciler.remove(rec, "its pod is gone")
    wait_state(api, dp, "success")
    assert layout(fake)[0] == (True, ["2g.20gb", "2g.20gb", "3g.40gb"])


def test_single_strategy_refuses_a_layout_of_several_profiles(agent_factory, kubelet, api, dp, tmp_path):
    fake = FakeMig(["on:1g.10gb", "on:1g.10gb"])
    start(agent_factory, api, dp, tmp_path, fake, strategy="single")
    assert len(kubelet.latest_devices("nvidia.com/gpu")) == 2
    label(api, dp, "mixed-1")
    wait_state(api, dp, "failed")
    (event,) = dp.wait_for(lambda: events(api), what="the Warning Event")
    assert "one MIG profile" in event["message"]
    assert layout(fake) == {0: (True, ["1g.10gb"]), 1: (True, ["1g.10gb"])}


