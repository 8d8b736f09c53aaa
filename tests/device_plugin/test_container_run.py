"""A container started from an Allocate response is limited: cuprobe (a
simulated CUDA program) runs on the host with the response's env and its quota
file said in libvcuda's bare-metal variables, container paths mapped to the
host paths the mounts name, and libvcuda preloaded the way /etc/ld.so.preload
would (shimtest.container_env_on_host). Another case runs it as a non-root user
with the mounts in place (the quota file at its fixed path), as a container
runtime sets them up."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from kubecontainer import skip_unless_namespaces, skip_unless_others_can_read
from shimtest import parse

from device_plugin.pods import StaticPods
from py_vcuda.sim import GiB, MiB, SimConfig

CORE = "tencent.com/vcuda-core"
OUT_OF_MEMORY = 2


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
    env.update(dp.host_env(resp))
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


NOBODY = 65534
# In a private mount namespace: the container directory, the tenant socket directory and the quota
# directory (read-only) at their container paths (as the runtime mounts them; the scheduler's own
# directory on the host is root's alone), then the probe as uid/gid 65534 with libvcuda preloaded.
CONTAINER_SCRIPT = """
mount -t tmpfs vcuda-test /run
mkdir -p /run/vcuda
mount --bind "$1" /run/vcuda
mkdir -p /run/vcuda/sched
mount --bind "$2" /run/vcuda/sched
mkdir -p /run/vcuda-quota
mount --bind "$3" /run/vcuda-quota
mount -o remount,bind,ro /run/vcuda-quota
shift 3
exec setpriv --reuid=65534 --regid=65534 --clear-groups -- \
    /bin/sh -c 'id -u; exec env LD_PRELOAD="$VC_PRELOAD" "$@"' probe "$@"
"""


def test_non_root_container_can_use_cuda_and_is_limited(agent_factory, kubelet, dp, short_dir, cuprobe):
    skip_unless_namespaces()
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux)")
    short_dir.chmod(0o755)   # what uid 65534 must reach: the probe and the simulator's state
    shared = short_dir / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    probe = shutil.copy(cuprobe, shared / "cuprobe")
    sim = SimConfig(state_path=shared / "sim", devices=1, memory=4 * GiB, context_overhead=64 * MiB)
    pods = StaticPods([dp.pod("app", cores=30, annotations={"vcuda.io/memory": "1Gi"})])
    agent_factory("vgpu", gpus=1, pods=pods, inv=dp.inventory(1, memory=4 * GiB))
    uuid = dp.gpu(0).uuid
    resp = kubelet.allocate(CORE, [f"{uuid}::{i}" for i in range(30)]).container_responses[0]
    mounts = {m.container_path: m.host_path for m in resp.mounts}
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
    env.update(sim.env())
    env.update(resp.envs)   # no quota in it: the quota file, mounted below, is libvcuda's only source
    env["VC_PRELOAD"] = mounts["/usr/local/vcuda/lib/libvcuda.so"]
    skip_unless_others_can_read(env["VC_PRELOAD"])   # the simulator's library lies beside it
    proc = subprocess.run(
        ["unshare", "-m", "/bin/sh", "-ec", CONTAINER_SCRIPT, "container", mounts["/run/vcuda"],
         mounts["/run/vcuda/sched"], mounts["/run/vcuda-quota"], str(probe), "init", "ctx", f"alloc:{512 * MiB}",
         f"alloc:{512 * MiB}", "spin:2000:3000"],
        env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == str(NOBODY), out
    assert "Permission denied" not in out, out
    assert "vcuda: warning: ignoring" not in out, out   # nothing in its environment for libvcuda to ignore
    lines = parse(proc.stdout.split("\n", 1)[1])
    allocs = [int(d["rc"]) for d in lines if d["cmd"] == "alloc"]
    assert allocs == [0, OUT_OF_MEMORY], out   # the ledger's 1 GiB holds for uid 65534 too
    (spin,) = [d for d in lines if d["cmd"] == "spin"]
    assert int(spin["rc"]) == 0 and int(spin["busy_us"]) / float(spin["wall_us"]) < 0.6, spin
