"""Scenario 3, pgpu with MIG: the release as pgpu with migStrategy mixed on a simulated node whose
MIG-capable GPU (GPU 1, an H100 80GB) is in MIG mode with two 1g.10gb instances, GPU 0 a plain GPU.

- The node offers nvidia.com/gpu 1 (GPU 0 whole) and nvidia.com/mig-1g.10gb 2.
- A pod asking for nvidia.com/mig-1g.10gb (the default scheduler places it; no vcuda resource) gets
  NVIDIA_VISIBLE_DEVICES=MIG-<uuid> from Allocate, and a CUDA process there sees that one device, of
  the instance's memory. The NVIDIA runtime would turn that variable into the instance's device
  nodes; the simulator has none (node_state/gpu_driver.py), so the probe is given it as
  CUDA_VISIBLE_DEVICES, which the simulated driver honours as the real one does.
- With the pod gone, `kubectl label node vcuda-e2e nvidia.com/mig.config=all-3g.40gb` (a layout of
  the chart's deploy/helm/vcuda/files/mig-parted-config.yaml) makes the agent change the idle GPU's
  layout: the label nvidia.com/mig.config.state reaches `success` and the node's allocatable follows
  (mig-3g.40gb 2, no mig-1g.10gb left). Then `all-disabled`: every GPU whole again (nvidia.com/gpu 2).

The simulated GPUs keep their state in a host directory of this scenario's own, made afresh, so the
layout a run leaves behind never reaches the next one nor the other scenarios.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import cluster as cluster_tool
import pytest
import vcuda as vcuda_tool
from shimtest import parse

GiB = 1 << 30
STATE_DIR = Path("/var/lib/vcuda-sim-e2e-mig")
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
VALUES = {
    "devicePlugin.pgpu.migStrategy": "mixed",
    "testing.simulatedNode.mig": r";on:1g.10gb\,1g.10gb",   # helm --set: an escaped comma is a comma
    "testing.simulatedNode.stateDir": str(STATE_DIR),
}


def _node(c: cluster_tool.Cluster) -> dict:
    return vcuda_tool.get(c, "node", cluster_tool.NODE)


def _allocatable(c: cluster_tool.Cluster) -> dict[str, str]:
    """The node's GPU resources with a non-zero allocatable (kubelet keeps a gone one at 0 a while)."""
    alloc = _node(c)["status"].get("allocatable", {})
    return {k: v for k, v in alloc.items() if k.startswith("nvidia.com/") and v != "0"}


def _relabel(c: cluster_tool.Cluster, layout: str | None) -> None:
    """The layout label set (state label cleared, so a stale `success` is never read), or both off."""
    value = [f"{CONFIG_LABEL}={layout}"] if layout else [f"{CONFIG_LABEL}-"]
    c.kubectl("label", "node", cluster_tool.NODE, *value, f"{STATE_LABEL}-", "--overwrite")


def _applied(vcuda, layout: str, want: dict[str, str], explain) -> float:
    """Label the node with `layout`; seconds until the state label says success and the allocatable
    GPU resources are `want`."""
    c = vcuda.cluster
    started = time.monotonic()
    _relabel(c, layout)

    # `failed` (with a Warning Event) while the agent still counts the deleted pod's container on the
    # GPU: it tries again until the GPU is idle (deploy/helm/vcuda/files/mig-parted-config.yaml).
    vcuda_tool.wait_for(f"{STATE_LABEL}=success after {CONFIG_LABEL}={layout}", lambda: _node(c)["metadata"].get(
        "labels", {}).get(STATE_LABEL) == "success", timeout=150, every=1, explain=explain)
    vcuda_tool.wait_for(f"allocatable {want} after {layout}", lambda: _allocatable(c) == want, timeout=60,
                        explain=lambda: f"allocatable {_allocatable(c)}\n{explain()}")
    return time.monotonic() - started


def test_mig_device_to_a_pod_and_a_layout_by_node_label(release, namespace):
    vcuda_tool.skip_unless_ready(release, "scenario 3")
    started = time.monotonic()
    c = release.cluster
    # A fresh simulated node: no agent may hold the state while it goes.
    if release.installed():
        release.uninstall()
    _relabel(c, None)
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    try:
        vcuda_tool.record("scenario 3: helm reinstall as pgpu, MIG mixed", release.ensure("pgpu", VALUES))
    except RuntimeError as exc:
        pytest.fail(str(exc))
    agent = release.wait_ready(timeout=60)["device-plugin"]["metadata"]["name"]

    def explain() -> str:
        logs = c.kubectl("logs", "-n", vcuda_tool.NAMESPACE, agent, "--tail=40", check=False)
        events = c.kubectl("get", "events", "-A", "--field-selector", f"involvedObject.name={cluster_tool.NODE}",
                           check=False)
        return f"--- agent {agent}:\n{logs.stdout[-4000:]}\n--- node events:\n{events.stdout[-2000:]}"

    vcuda_tool.wait_for("the node's MIG resources", lambda: _allocatable(c) == {
        "nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "2"}, timeout=60,
        explain=lambda: f"allocatable {_allocatable(c)}\n{explain()}")

    # A pod asking for a 1g.10gb instance gets its MIG device.
    vcuda_tool.create(c, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mig", "namespace": namespace},
                          "spec": {"hostPID": True, "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                                   "containers": [{
                                       "name": "main", "image": vcuda_tool.WORKLOAD_IMAGE,
                                       "imagePullPolicy": "Never", "command": ["sleep", "3600"],
                                       "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}})
    vcuda_tool.wait_for("pod mig Running", lambda: vcuda_tool.get(c, "pod", "mig", namespace)["status"].get(
        "phase") == "Running", timeout=120, explain=lambda: c.kubectl(
        "describe", "pod", "-n", namespace, "mig", check=False).stdout[-3000:] + explain())
    visible = c.kubectl("exec", "-n", namespace, "mig", "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES").stdout.strip()
    assert visible.startswith("MIG-") and "," not in visible, visible
    out = c.kubectl("exec", "-n", namespace, "mig", "--", "sh", "-c",
                    'CUDA_VISIBLE_DEVICES="$NVIDIA_VISIBLE_DEVICES" exec /usr/local/bin/cuprobe --via=proc '
                    "init devs ctx info", check=False)
    steps = {d["cmd"]: d for d in parse(out.stdout) if "rc" in d}
    assert out.returncode == 0 and steps["devs"]["rc"] == "0", out.stdout + out.stderr
    # CUDA names a MIG device's UUID with the bytes NVML prints as MIG-<hex>
    assert (steps["devs"]["count"], steps["devs"]["uuid0"][4:]) == ("1", visible[4:]), (visible, out.stdout)
    assert steps["ctx"]["rc"] == "0" and steps["info"]["rc"] == "0", out.stdout
    assert 8 * GiB < int(steps["info"]["total"]) < 11 * GiB, out.stdout   # the instance's, not a GPU's
    vcuda_tool.note("scenario 3: the 1g.10gb instance's memory seen in the pod",
                    f"{int(steps['info']['total']) / GiB:.2f} GiB")

    # The pod gone, the idle GPU takes a layout of the chart's by node label; the resources follow.
    c.kubectl("delete", "pod", "-n", namespace, "mig", "--wait=true", "--timeout=60s", timeout=90)
    took = _applied(release, "all-3g.40gb", {"nvidia.com/gpu": "1", "nvidia.com/mig-3g.40gb": "2"}, explain)
    vcuda_tool.record("scenario 3: label all-3g.40gb to success and allocatable", took)
    took = _applied(release, "all-disabled", {"nvidia.com/gpu": "2"}, explain)
    vcuda_tool.record("scenario 3: label all-disabled to success and allocatable", took)
    _relabel(c, None)
    vcuda_tool.record("scenario 3 (pgpu: a MIG device to a pod, layouts by node label)", time.monotonic() - started)
