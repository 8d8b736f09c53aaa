"""The test-only simulator driver (node_state.gpu_driver, agent option --simulator, chart value
testing.simulator): every GPU container the agent sets up, in every mode and through the DRA
driver alike, gets the simulator's libraries and state as NVIDIA's toolkit would bring the
driver's; an agent not on the simulator refuses the option; the simulator refuses a process in a
pid namespace whose pids it cannot book."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from shimtest import parse

from node_state import gpu_driver
from node_state.daemon import StartError
from py_vcuda import native

GPU = "nvidia.com/gpu"
CORE = "tencent.com/vcuda-core"
MPS = "nvidia.com/mps-core"
SIM_LIBS = {f"/usr/local/vcuda-sim/lib/{native.SIM_CUDA}": native.SIM_CUDA,
            f"/usr/local/vcuda-sim/lib/{native.SIM_NVML}": native.SIM_NVML}


@pytest.fixture
def sim_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The agent's environment on the simulator (as the chart's testing.simulator sets it); returns the state."""
    state = tmp_path / "sim" / "state"
    state.parent.mkdir()
    monkeypatch.setenv("VCUDA_REAL_LIBNVML", str(native.lib_path(native.SIM_NVML)))
    monkeypatch.setenv("VCUDA_SIM_STATE", str(state))
    monkeypatch.setenv("VCUDA_SIM_DEVICES", "2")
    monkeypatch.setenv("VCUDA_SIM_MIG", "on;")
    monkeypatch.setenv("VCUDA_SIM_MIG_MODEL", "a100-40gb")
    monkeypatch.setenv("VCUDA_SIM_HOST_PID_OFFSET", "1000")   # the agent's own: never handed on
    return state


def assert_simulated(env: dict[str, str], mounts: dict[str, str], state: Path) -> None:
    """env and {container path: host path} carry the simulator, container paths, as gpu_driver says."""
    lib = native.lib_dir()
    for inside, name in SIM_LIBS.items():
        assert mounts[inside] == str(lib / name)
    assert mounts["/run/vcuda-sim"] == str(state.parent)
    assert env["VCUDA_REAL_LIBCUDA"] == f"/usr/local/vcuda-sim/lib/{native.SIM_CUDA}"
    assert env["VCUDA_REAL_LIBNVML"] == f"/usr/local/vcuda-sim/lib/{native.SIM_NVML}"
    assert env["VCUDA_SIM_STATE"] == "/run/vcuda-sim/state"
    assert (env["VCUDA_SIM_DEVICES"], env["VCUDA_SIM_MIG"], env["VCUDA_SIM_MIG_MODEL"]) == ("2", "on;", "a100-40gb")
    assert env["VCUDA_SIM_PID_NAMESPACE"] == os.readlink("/proc/self/ns/pid")
    assert "VCUDA_SIM_HOST_PID_OFFSET" not in env


def response(resp) -> tuple[dict[str, str], dict[str, str]]:  # type: ignore[no-untyped-def]
    return dict(resp.envs), {m.container_path: m.host_path for m in resp.mounts}


def test_pgpu_container_gets_the_simulator(agent_factory, kubelet, dp, sim_env):
    agent_factory("pgpu", gpus=2, simulator="1")
    a = dp.gpu(1).uuid
    env, mounts = response(kubelet.allocate(GPU, [a]).container_responses[0])
    assert env["NVIDIA_VISIBLE_DEVICES"] == a
    assert_simulated(env, mounts, sim_env)
    assert set(mounts) == {*SIM_LIBS, "/run/vcuda-sim"}   # nothing else of ours in a whole-GPU container


def test_vgpu_container_gets_the_simulator_beside_its_quota(agent_factory, kubelet, dp, sim_env):
    agent_factory("vgpu", gpus=1, simulator="1")
    uuid = dp.gpu(0).uuid
    env, mounts = response(kubelet.allocate(CORE, [f"{uuid}::{i}" for i in range(30)]).container_responses[0])
    assert_simulated(env, mounts, sim_env)
    assert {"/run/vcuda-quota", "/run/vcuda", "/usr/local/vcuda/lib/libvcuda.so", "/etc/ld.so.preload"} <= set(mounts)
    assert not {k for k in env if k.startswith("VCUDA_") and not k.startswith(("VCUDA_SIM_", "VCUDA_REAL_"))}


def test_mps_container_gets_the_simulator(agent_factory, kubelet, dp, sim_env, fake_mps):
    agent_factory("mps", gpus=1, simulator="1", mps_control=str(fake_mps))
    uuid = dp.gpu(0).uuid
    dp.wait_for(lambda: kubelet.latest_devices(MPS), 30, "mps devices")
    resp = dp.wait_for(lambda: _try_allocate(kubelet, MPS, [f"{uuid}::{i}" for i in range(20)]), 30, "mps allocate")
    env, mounts = response(resp)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    assert_simulated(env, mounts, sim_env)


def _try_allocate(kubelet, resource, ids):  # type: ignore[no-untyped-def]
    import grpc
    try:
        return kubelet.allocate(resource, ids).container_responses[0]
    except grpc.RpcError:
        return None   # the fake MPS daemon is not up yet


def test_off_by_default_nothing_of_the_simulator(agent_factory, kubelet, dp, sim_env):
    agent_factory("pgpu", gpus=1)
    env, mounts = response(kubelet.allocate(GPU, [dp.gpu(0).uuid]).container_responses[0])
    assert env == {"NVIDIA_VISIBLE_DEVICES": dp.gpu(0).uuid} and mounts == {}


@pytest.mark.parametrize("desc,env,message", [
    ("real NVML", {"VCUDA_SIM_STATE": "/tmp/x/state"}, "does not run on the GPU simulator"),
    ("another library", {"VCUDA_REAL_LIBNVML": "/usr/lib/libnvidia-ml.so.1"}, "does not run on the GPU simulator"),
    ("no state", {"VCUDA_REAL_LIBNVML": f"/x/{native.SIM_NVML}"}, "VCUDA_SIM_STATE must be an absolute path"),
    ("relative state", {"VCUDA_REAL_LIBNVML": f"/x/{native.SIM_NVML}", "VCUDA_SIM_STATE": "state"},
     "VCUDA_SIM_STATE must be an absolute path"),
])
def test_refused_unless_the_agent_runs_on_the_simulator(desc, env, message):
    with pytest.raises(StartError, match=message):
        gpu_driver.for_agent(True, native.lib_dir(), env)
    assert gpu_driver.for_agent(False, native.lib_dir(), env) == gpu_driver.NO_DRIVER, desc


def test_refused_without_the_simulators_libraries(tmp_path):
    env = {"VCUDA_REAL_LIBNVML": f"/x/{native.SIM_NVML}", "VCUDA_SIM_STATE": str(tmp_path / "state")}
    with pytest.raises(StartError, match=f"{tmp_path}/{native.SIM_CUDA}.*missing"):
        gpu_driver.for_agent(True, tmp_path, env)


def test_agent_refuses_the_option_off_the_simulator(dp, short_dir, monkeypatch):
    from device_plugin.agent import Agent
    from device_plugin.pods import StaticPods
    monkeypatch.delenv("VCUDA_REAL_LIBNVML", raising=False)
    with pytest.raises(StartError, match="--simulator: this agent does not run on the GPU simulator"):
        Agent(dp.plugin_config(short_dir, "pgpu", simulator="1"), inventory=dp.inventory(1), pods=StaticPods())


@pytest.mark.parametrize("desc,namespace,rc", [
    ("the agent's pid namespace", None, 0),
    ("another pid namespace", "pid:[1]", 801),   # CUDA_ERROR_NOT_SUPPORTED
])
def test_simulator_refuses_a_process_outside_its_pid_namespace(cuprobe_exe, tmp_path, desc, namespace, rc):
    env = {**os.environ, "VCUDA_REAL_LIBCUDA": str(native.lib_path(native.SIM_CUDA)),
           "VCUDA_REAL_LIBNVML": str(native.lib_path(native.SIM_NVML)), "VCUDA_SIM_STATE": str(tmp_path / "state"),
           "VCUDA_SIM_PID_NAMESPACE": namespace or os.readlink("/proc/self/ns/pid")}
    proc = subprocess.run([str(cuprobe_exe), "init", "nvmem"], env=env, capture_output=True, text=True, timeout=30,
                          check=False)
    lines = {d["cmd"]: d for d in parse(proc.stdout)}
    assert int(lines["init"]["rc"]) == rc, desc
    if rc:
        assert "run the container in the host's pid namespace (hostPID: true" in proc.stderr
        assert int(lines["nvmem"]["rc"]) != 0    # NVML too: its queries would reap live processes
    else:
        assert int(lines["nvmem"]["rc"]) == 0 and int(lines["nvmem"]["total"]) > 0
