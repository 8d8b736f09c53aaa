"""Scenario 5, faults: the kubelet restarted (the plugin registers again, running pods keep their
quotas, new pods are placed); containerd restarted (the same); the node agent's pod deleted (the
DaemonSet brings it back, the same); `helm uninstall` then `helm install` again on the same node.

A pod "holds" a share of a GPU across each fault (the workload image, sleeping); its quota is read
through `kubectl exec ... vcuda-workload quota` (cuMemGetInfo and NVML's memory query) before and after.
"""

from __future__ import annotations

import time

import cluster as cluster_tool
import vcuda as vcuda_tool
from shimtest import parse

UNIT = vcuda_tool.MEMORY_UNIT


def _start(vcuda, namespace: str, name: str, cores: int, units: int) -> None:
    """A pod holding `cores` and `units` of a GPU, Running (placed by vcuda-scheduler)."""
    c = vcuda.cluster
    vcuda_tool.create(c, vcuda_tool.vgpu_pod(name, namespace, cores, units * UNIT, ["sleep", "3600"],
                                             restart="Always"))
    vcuda_tool.wait_for(f"pod {name} Running", lambda: vcuda_tool.get(c, "pod", name, namespace)["status"].get(
        "phase") == "Running", timeout=120, explain=lambda: c.kubectl(
        "describe", "pod", "-n", namespace, name, check=False).stdout[-3000:])


def _quota(vcuda, namespace: str, name: str) -> tuple[int, int]:
    """(cuMemGetInfo's total, NVML's total) in the pod's container."""
    def run():
        out = vcuda.cluster.kubectl("exec", "-n", namespace, name, "--", "vcuda-workload", "quota", timeout=60,
                                    check=False)
        if out.returncode != 0 and "pod does not exist" in out.stderr:
            return None   # a kubelet just restarted, its pods not synced yet: exec is refused for a moment
        assert out.returncode == 0, out.stderr
        return out
    out = vcuda_tool.wait_for(f"kubectl exec into {name}", run, timeout=60)
    steps = {d["cmd"]: d for d in parse(out.stdout) if "rc" in d}
    assert steps["info"]["rc"] == "0" and steps["nvmem"]["rc"] == "0", out.stdout + out.stderr
    return int(steps["info"]["total"]), int(steps["nvmem"]["total"])


def _restarts(vcuda, namespace: str, name: str) -> int:
    pod = vcuda_tool.get(vcuda.cluster, "pod", name, namespace)
    return sum(s.get("restartCount", 0) for s in pod["status"].get("containerStatuses", []))


def _held_and_placed(vcuda, namespace: str) -> None:
    """After a fault: "holder" kept its quota and was not restarted; a new pod is placed, gets its
    Allocate and its own quota."""
    assert _quota(vcuda, namespace, "holder") == (8 * UNIT, 8 * UNIT)
    _start(vcuda, namespace, "after", 20, 4)
    assert _quota(vcuda, namespace, "after") == (4 * UNIT, 4 * UNIT)
    assert _quota(vcuda, namespace, "holder") == (8 * UNIT, 8 * UNIT)
    assert _restarts(vcuda, namespace, "holder") == 0


def test_kubelet_restart(vcuda, namespace):
    vcuda_tool.skip_unless_ready(vcuda, "scenario 5")
    started = time.monotonic()
    _start(vcuda, namespace, "holder", 30, 8)
    assert _quota(vcuda, namespace, "holder") == (8 * UNIT, 8 * UNIT)
    agent = vcuda.wait_ready(timeout=30)["device-plugin"]["metadata"]["name"]
    took = vcuda.cluster.restart("kubelet")
    vcuda_tool.record("scenario 5: kubelet restart to node Ready", took)
    _held_and_placed(vcuda, namespace)   # the plugin registered again: the new pod got its Allocate
    assert vcuda.wait_ready(timeout=60)["device-plugin"]["metadata"]["name"] == agent   # not restarted
    vcuda_tool.record("scenario 5: kubelet restarted", time.monotonic() - started)


def test_containerd_restart(vcuda, namespace):
    """Running containers outlive containerd (their shims stay); the restarted one runs new pods."""
    vcuda_tool.skip_unless_ready(vcuda, "scenario 5")
    started = time.monotonic()
    _start(vcuda, namespace, "holder", 30, 8)
    vcuda_tool.record("scenario 5: containerd restart to node Ready", vcuda.cluster.restart("containerd"))
    _held_and_placed(vcuda, namespace)
    vcuda_tool.record("scenario 5: containerd restarted", time.monotonic() - started)


def test_node_agent_pod_deleted(vcuda, namespace):
    vcuda_tool.skip_unless_ready(vcuda, "scenario 5")
    started = time.monotonic()
    c = vcuda.cluster
    _start(vcuda, namespace, "holder", 30, 8)
    old = vcuda.wait_ready(timeout=30)["device-plugin"]["metadata"]["name"]
    c.kubectl("delete", "pod", "-n", vcuda_tool.NAMESPACE, old, "--wait=true", timeout=120)
    new = vcuda_tool.wait_for("the DaemonSet's new agent pod Ready", lambda: (
        p := vcuda.wait_ready(timeout=120)["device-plugin"])["metadata"]["name"] != old and p, timeout=150)
    assert new["spec"]["nodeName"] == cluster_tool.NODE
    _held_and_placed(vcuda, namespace)
    vcuda_tool.record("scenario 5: node agent pod deleted and back", time.monotonic() - started)


def test_helm_uninstall_then_install_again(vcuda, namespace):
    """Nothing the first release left on the node (its state directory, libvcuda on the host, the
    Lease, the webhook's Secret) keeps the second from working."""
    vcuda_tool.skip_unless_ready(vcuda, "scenario 5")
    started = time.monotonic()
    vcuda.uninstall()
    assert not [p for p in vcuda.pods() if vcuda.component(p) in vcuda.expected()]
    vcuda_tool.record("scenario 5: helm install again to every pod Ready", vcuda.install())
    # The webhook answers again (it sends the pod to vcuda-scheduler) and the pod gets its quota.
    _start(vcuda, namespace, "again", 30, 8)
    pod = vcuda_tool.get(vcuda.cluster, "pod", "again", namespace)
    assert pod["spec"]["schedulerName"] == "vcuda-scheduler"
    assert _quota(vcuda, namespace, "again") == (8 * UNIT, 8 * UNIT)
    vcuda_tool.record("scenario 5: helm uninstall and install again", time.monotonic() - started)
