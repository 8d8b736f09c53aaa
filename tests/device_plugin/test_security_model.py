"""Issue 24's table through the real Allocate: a vgpu container built as kubelet and the runtime
build it (tests/kubecontainer.py: the answer's mounts, /etc/ld.so.preload and the read-only quota
directory included, in a private mount namespace; the answer's env, then the pod's own), on a node
with two simulated GPUs. Whatever the pod's spec adds, and for a process started with a clean
environment, the container is held to its quota (1 GiB, 13 % of the GPU) and to its GPU."""

from __future__ import annotations

import pytest
from kubecontainer import NODE_MEMORY, ROW_IDS, ROWS, MountSpec, Row, check_held, node_sim

from device_plugin.pods import StaticPods

CORE = "tencent.com/vcuda-core"
CORES = 13
UNITS = 4   # 1 GiB


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_a_pods_spec_cannot_loosen_its_quota(agent_factory, kubelet, dp, short_dir, cuprobe_exe, row: Row):
    sim = node_sim(short_dir)
    pods = StaticPods([dp.pod("app", cores=CORES, memory_units=UNITS, env=row.pod_env)])
    agent = agent_factory("vgpu", gpus=2, pods=pods, inv=dp.inventory(2, memory=NODE_MEMORY))
    own, other = dp.gpu(1).uuid, dp.gpu(0).uuid   # its GPU is not device 0 of the node
    resp = kubelet.allocate(CORE, [f"{own}::{i}" for i in range(CORES)]).container_responses[0]
    mounts = [MountSpec(m.host_path, m.container_path, m.read_only) for m in resp.mounts]
    check_held(row, mounts, dict(resp.envs), sim, cuprobe_exe, own, other)
    (record,) = agent.store.records()
    assert record.extra["preload"] == "1"   # VCUDA_DISABLE did not take the preload away
