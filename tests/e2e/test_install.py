"""vcuda installed with its Helm chart on the real cluster: every pod Ready, vcuda-scheduler elected,
the webhook's TLS made by the extender, and the webhook mutating pods on the real API server."""

from __future__ import annotations

import base64

import cluster as cluster_tool
import images
import pytest
import vcuda as vcuda_tool

NS = vcuda_tool.NAMESPACE


def test_extender_and_scheduler_are_ready(vcuda):
    by = vcuda.wait_ready(timeout=30)
    assert vcuda.ready(by["extender"]) and vcuda.ready(by["scheduler"])
    # vcuda-scheduler runs the upstream kube-scheduler we built, and holds its own Lease (leader
    # election on, in the release namespace), never the cluster scheduler's.
    image = by["scheduler"]["spec"]["containers"][0]["image"]
    assert image == images.kube_scheduler_image(vcuda.cluster.version)
    # A Lease left by an earlier release (helm does not own it) is taken over once it expires (15 s).
    me = by["scheduler"]["metadata"]["name"] + "_"
    vcuda_tool.wait_for("vcuda-scheduler's Lease held by its pod", lambda: (vcuda_tool.get(
        vcuda.cluster, "lease", "vcuda-scheduler", NS)["spec"].get("holderIdentity") or "").startswith(me),
        timeout=60)


def test_node_agent_is_ready(vcuda):
    if not vcuda.simulator:
        pytest.skip("the node agent has no GPU on this machine without the chart's test-only value "
                    "testing.simulator (the GPU simulator wiring, branch i30-sim) — missing from this tree")
    by = vcuda.wait_ready(timeout=30)
    agent = by["device-plugin"]
    assert agent["spec"]["nodeName"] == cluster_tool.NODE
    node = vcuda_tool.get(vcuda.cluster, "node", cluster_tool.NODE)
    # The real kubelet took the plugin's registration: the node offers the vgpu resources.
    for resource in ("tencent.com/vcuda-core", "tencent.com/vcuda-memory"):
        assert int(node["status"]["allocatable"].get(resource, "0")) > 0, node["status"]["allocatable"]


def test_webhook_tls_made_by_the_extender(vcuda):
    """The extender made the CA and serving certificate in its Secret and patched the caBundle."""
    secret = vcuda_tool.get(vcuda.cluster, "secret", "vcuda-webhook-tls", NS)
    config = vcuda_tool.get(vcuda.cluster, "mutatingwebhookconfiguration", "vcuda-webhook")
    bundle = config["webhooks"][0]["clientConfig"].get("caBundle")
    assert bundle and base64.b64decode(bundle) == base64.b64decode(secret["data"]["ca.crt"])


def _gpu_pod(name: str, scheduler: str | None = None) -> dict:
    spec: dict = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [{
        "name": "c", "image": images.BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": ["true"],
        "resources": {"limits": {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "8"}}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _in(namespace: str, obj: dict) -> dict:
    obj["metadata"]["namespace"] = namespace
    return obj


def test_webhook_sends_a_vcuda_pod_to_vcuda_scheduler(vcuda, namespace):
    c = vcuda.cluster
    vcuda_tool.create(c, _in(namespace, _gpu_pod("wants-gpu")))
    pod = vcuda_tool.get(c, "pod", "wants-gpu", namespace)
    assert pod["spec"]["schedulerName"] == "vcuda-scheduler"
    # and vcuda-scheduler (not the default scheduler) is the one that acts on it: placed, or an Event
    # of its own saying why not.
    def acted():
        p = vcuda_tool.get(c, "pod", "wants-gpu", namespace)
        if p["spec"].get("nodeName"):
            return "bound"
        evs = [e for e in vcuda_tool.events(c, namespace, "wants-gpu") if e["reason"] == "FailedScheduling"]
        return evs and all((e.get("reportingComponent") or e["source"].get("component")) == "vcuda-scheduler"
                           for e in evs) and "reported"
    assert vcuda_tool.wait_for("vcuda-scheduler acting on the pod", acted, timeout=60)


def test_webhook_leaves_another_scheduler_alone_with_a_warning(vcuda, namespace):
    c = vcuda.cluster
    out = vcuda_tool.create(c, _in(namespace, _gpu_pod("own-scheduler", scheduler="my-scheduler")))
    assert "vcuda webhook" in out.stderr and "my-scheduler" in out.stderr   # the admission warning
    pod = vcuda_tool.get(c, "pod", "own-scheduler", namespace)
    assert pod["spec"]["schedulerName"] == "my-scheduler"
    event = vcuda_tool.wait_for("the NotVcudaScheduled Event", lambda: [
        e for e in vcuda_tool.events(c, namespace, "own-scheduler") if e["reason"] == "NotVcudaScheduled"], timeout=30)
    assert event[0]["type"] == "Warning" and "my-scheduler" in event[0]["message"]


def test_webhook_leaves_other_pods_alone(vcuda, namespace):
    c = vcuda.cluster
    pod = _gpu_pod("no-gpu")
    del pod["spec"]["containers"][0]["resources"]
    vcuda_tool.create(c, _in(namespace, pod))
    assert vcuda_tool.get(c, "pod", "no-gpu", namespace)["spec"]["schedulerName"] == "default-scheduler"
    assert not [e for e in vcuda_tool.events(c, namespace, "no-gpu") if e["reason"] == "NotVcudaScheduled"]
