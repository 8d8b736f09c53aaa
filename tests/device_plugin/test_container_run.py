"""A container started from an Allocate response is limited: cuprobe (a
simulated CUDA program) runs with the response's env, its container paths
mapped to the host paths the mounts name, and libvcuda preloaded the way
/etc/ld.so.preload would (LD_PRELOAD: ld.so.preload needs root)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from shimtest import parse

from device_plugin.api import deviceplugin_v1beta1_pb2 as pb
from device_plugin.pods import StaticPods
from py_vcuda.sim import GiB, MiB, SimConfig

CORE = "tencent.com/vcuda-core"
OUT_OF_MEMORY = 2


def host_env(resp: pb.ContainerAllocateResponse) -> dict[str, str]:
    """The response's env as a process on the host sees it: container paths -> host paths."""
    mounts = sorted(resp.mounts, key=lambda m: len(m.container_path), reverse=True)
    env = {}
    for key, value in resp.envs.items():
        for m in mounts:
            if m.container_path in value:
                value = value.replace(m.container_path, m.host_path)
                break
        env[key] = value
    preload = next(m for m in resp.mounts if m.container_path == "/etc/ld.so.preload")
    lib = next(m.host_path for m in resp.mounts if m.container_path == Path(preload.host_path).read_text().strip())
    env["LD_PRELOAD"] = lib
    return env


@pytest.fixture(scope="module")
def cuprobe(build_c) -> Path:  # type: ignore[no-untyped-def]
    return build_c(["cuprobe.c"])


def test_allocated_container_is_limited(agent_factory, kubelet, dp, short_dir, cuprobe):
    sim = SimConfig(state_path=short_dir / "sim", devices=1, memory=4 * GiB, context_overhead=64 * MiB)
    pods = StaticPods([dp.pod("app", cores=30, annotations={"vcuda.io/memory": "1Gi"})])
    agent = agent_factory("vgpu", gpus=1, pods=pods, inv=dp.inventory(1, memory=4 * GiB))
    uuid = dp.gpu(0).uuid
    resp = kubelet.allocate(CORE, [f"{uuid}::{i}" for i in range(30)]).container_responses[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
    env.update(sim.env())
    env.update(host_env(resp))
    assert env["VCUDA_SCHEDULER"].startswith(f"ipc://{agent.layout.scheduler_dir(uuid)}")

    proc = subprocess.run([str(cuprobe), "init", "ctx", f"alloc:{512 * MiB}", f"alloc:{512 * MiB}",
                           "spin:2000:3000"], env=env, capture_output=True, text=True, timeout=120)
    lines = parse(proc.stdout)
    allocs = [int(d["rc"]) for d in lines if d["cmd"] == "alloc"]
    assert allocs == [0, OUT_OF_MEMORY], proc.stdout + proc.stderr   # 64 MiB context + 2 x 512 MiB > 1 GiB
    (spin,) = [d for d in lines if d["cmd"] == "spin"]
    share = int(spin["busy_us"]) / float(spin["wall_us"])
    assert int(spin["rc"]) == 0 and share < 0.6, spin    # a core-limit of 30 %, unthrottled would be ~1.0
    stats = agent.schedulers[uuid].call("stats")
    (record,) = agent.store.records()
    assert record.tenant in str(stats)
