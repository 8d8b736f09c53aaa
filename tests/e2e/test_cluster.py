"""The cluster itself: the node reports the version we built, and a pod runs to completion."""

from __future__ import annotations

import json
import time
import uuid

import cluster as cluster_tool
import images


def test_node_reports_the_built_version(cluster):
    node = json.loads(cluster.kubectl("get", "node", cluster_tool.NODE, "-o", "json").stdout)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == f"v{cluster.version}"
    assert info["containerRuntimeVersion"].startswith("containerd://")
    server = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert server["gitVersion"] == f"v{cluster.version}"


def _run_busybox(cluster, prefix: str, command: list[str]) -> tuple[str, str, str]:
    """A busybox pod running `command` to its end: (its name, its phase, its logs or description)."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "main", "image": images.BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": command}]},
    }
    cluster.kubectl("apply", "-f", "-", input_=json.dumps(pod))
    try:
        deadline = time.monotonic() + 120
        phase = ""
        while time.monotonic() < deadline:
            phase = cluster.kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}").stdout
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(0.5)
        if phase != "Succeeded":
            return name, phase, cluster.kubectl("describe", "pod", name, check=False).stdout
        return name, phase, cluster.kubectl("logs", name).stdout
    finally:
        cluster.kubectl("delete", "pod", name, "--wait=false", check=False)


def test_a_pod_runs_to_completion(cluster):
    name, phase, logs = _run_busybox(cluster, "e2e-hello", [
        "sh", "-c", 'echo "hello from $(hostname)"; echo "nofile $(ulimit -Hn)"'])
    assert phase == "Succeeded", logs
    assert f"hello from {name}" in logs
    nofile = int(logs.split("nofile ")[1].split()[0])
    # Within this machine's hard limit (containerd's default for containers could exceed it).
    assert nofile <= cluster_tool.resource.getrlimit(cluster_tool.resource.RLIMIT_NOFILE)[1]


def test_dra_gates_are_on(cluster):
    """resource.k8s.io/v1 is served and keeps the fields of the gates we turn on (a gate that is off
    makes the API server drop its fields silently): a consumable-capacity device that several claims
    may share (DRAConsumableCapacity) and that consumes a counter set (DRAPartitionableDevices).

    The counter sets' layout differs: 1.34 wants them in the slice of the devices that consume them,
    1.35 on in a slice of their own ("only one of `sharedCounters` or `devices` is allowed")."""
    separate = tuple(int(x) for x in cluster.version.split(".")[:2]) >= (1, 35)
    pool = {"name": "probe", "generation": 1, "resourceSliceCount": 2 if separate else 1}
    driver = "probe.e2e.vcuda.io"
    counters = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": "e2e-probe-counters"},
                "spec": {"driver": driver, "nodeName": cluster_tool.NODE, "pool": pool,
                         "sharedCounters": [{"name": "gpu-0", "counters": {"cores": {"value": "100"}}}]}}
    devices = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": "e2e-probe-devices"},
               "spec": {"driver": driver, "nodeName": cluster_tool.NODE, "pool": pool, "devices": [{
                   "name": "gpu-0", "allowMultipleAllocations": True,
                   "capacity": {"cores": {"value": "100", "requestPolicy": {
                       "default": "10", "validRange": {"min": "1", "step": "1"}}}},
                   "consumesCounters": [{"counterSet": "gpu-0", "counters": {"cores": {"value": "100"}}}]}]}}
    if not separate:
        devices["spec"]["sharedCounters"] = counters["spec"]["sharedCounters"]
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": [counters, devices] if separate else [devices]})
    cluster.kubectl("apply", "-f", "-", input_=body)
    try:
        got = json.loads(cluster.kubectl("get", "resourceslice", "e2e-probe-devices", "-o", "json").stdout)
        device = got["spec"]["devices"][0]
        assert device.get("allowMultipleAllocations") is True
        assert device["capacity"]["cores"]["requestPolicy"]["default"] == "10"
        assert device["consumesCounters"][0]["counterSet"] == "gpu-0"
    finally:
        cluster.kubectl("delete", "-f", "-", "--wait=false", input_=body, check=False)


def test_pods_resolve_services_by_name(cluster):
    """The cluster's DNS (CoreDNS on the node's address): a pod finds a Service by its name, as
    vcuda-scheduler finds the extender."""
    _, phase, logs = _run_busybox(cluster, "e2e-dns", ["nslookup", "kubernetes.default.svc.cluster.local"])
    assert phase == "Succeeded", logs
    assert cluster_tool.API_SERVICE_IP in logs
