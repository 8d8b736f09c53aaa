"""Serve, then register; register again after a kubelet restart or when the
plugin's socket disappears; the real agent process on the simulator's NVML."""

from __future__ import annotations

import pytest

from device_plugin.kubelet import DeviceBoard
from py_vcuda.sim import GiB, SimConfig

CORE = "tencent.com/vcuda-core"
MEMORY = "tencent.com/vcuda-memory"


def test_served_before_registered_one_socket_per_resource(agent_factory, kubelet):
    agent_factory("vgpu", gpus=1)
    core = kubelet.wait_registered(CORE)
    memory = kubelet.wait_registered(MEMORY)
    # the test kubelet dials back inside Register: options arrived, so the server was up first
    assert core.options is not None and memory.options is not None
    assert core.request.version == "v1beta1"
    assert {core.request.endpoint, memory.request.endpoint} == {"vcuda-core.sock", "vcuda-memory.sock"}
    assert core.options.get_preferred_allocation_available and not memory.options.get_preferred_allocation_available


def test_reregisters_after_kubelet_restart(agent_factory, kubelet, dp):
    agent = agent_factory("vgpu", gpus=1)
    kubelet.wait_registered(CORE)
    kubelet.wait_registered(MEMORY)
    # The agent counts a registration when kubelet's reply reaches it, after kubelet saw it.
    dp.wait_for(lambda: agent.registrar.registrations >= 2, what="both registrations counted")
    before = agent.registrar.registrations
    restarted = kubelet.restart()
    again = kubelet.wait_registered(CORE, after=restarted)
    kubelet.wait_registered(MEMORY, after=restarted)
    dp.wait_for(lambda: agent.registrar.registrations >= before + 2, what="both registered again")
    dp.wait_for(lambda: again.lists, what="ListAndWatch after re-registration")
    assert len(again.lists[-1]) == 100


def test_reregisters_when_own_socket_disappears(agent_factory, kubelet):
    agent_factory("pgpu", gpus=2)
    first = kubelet.wait_registered("nvidia.com/gpu")
    (kubelet.dir / "nvidia-gpu.sock").unlink()
    again = kubelet.wait_registered("nvidia.com/gpu", after=first.at + 1e-9)
    assert again is not first and (kubelet.dir / "nvidia-gpu.sock").is_socket()


def test_registration_waits_for_kubelet(short_dir, dp):
    """No kubelet yet: the agent keeps serving and registers once kubelet.sock appears."""
    from device_plugin.agent import Agent
    from device_plugin.pods import StaticPods

    (short_dir / "dp").mkdir()
    agent = Agent(dp.plugin_config(short_dir, "pgpu"), inventory=dp.inventory(1), pods=StaticPods())
    agent.start()
    try:
        # not Ready (its readiness probe, /readyz): kubelet would refuse the pods it is there for
        assert agent._unready() == "not registered with kubelet: nvidia.com/gpu"
        kubelet = dp.TestKubelet(short_dir / "dp")
        kubelet.start()
        try:
            assert kubelet.wait_registered("nvidia.com/gpu").options is not None
            dp.wait_for(lambda: agent._unready() is None, what="Ready once registered")
        finally:
            kubelet.stop()
    finally:
        agent.stop()


def test_readyz_answers_the_agents_readiness():
    """The exporter's port serves /readyz for the DaemonSet's readiness probe: 503 with the reason until
    the agent is registered, then 200; every other path stays the metrics."""
    import urllib.error
    import urllib.request

    from node_state import metrics_text

    why: list[str | None] = ["not registered with kubelet: tencent.com/vcuda-memory"]
    server, thread = metrics_text.serve("127.0.0.1", 0, lambda: b"vcuda_up 1\n", lambda: why[0])
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url + "/readyz", timeout=5)
        assert refused.value.code == 503 and b"tencent.com/vcuda-memory" in refused.value.read()
        why[0] = None
        with urllib.request.urlopen(url + "/readyz", timeout=5) as ok:
            assert ok.status == 200 and ok.read() == b"ok\n"
        with urllib.request.urlopen(url + "/metrics", timeout=5) as metrics:
            assert metrics.read() == b"vcuda_up 1\n"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_device_board_wakes_waiters():
    board = DeviceBoard()
    seen = board.version
    board.changed()
    assert board.wait(seen, timeout=10) == seen + 1
    board.close()
    assert board.wait(seen + 1, timeout=10) is None


@pytest.mark.parametrize("mode,resource,count", [("vgpu", CORE, 200), ("pgpu", "nvidia.com/gpu", 2)])
def test_real_agent_process_on_simulated_nvml(kubelet, short_dir, dp, mode, resource, count):
    sim = SimConfig(state_path=short_dir / "sim", devices=2, memory=2 * GiB)
    features = short_dir / "features" / "vcuda"
    no_api = ("--without-api-server",) if mode == "vgpu" else ()   # the test has no API server
    proc = dp.spawn_plugin(short_dir, sim, "--mode", mode, "--features-file", str(features), *no_api)
    try:
        devices = kubelet.latest_devices(resource)
        assert len(devices) == count
        assert devices[0].ID.startswith("GPU-5157a0c0-0000-")
        if mode == "vgpu":
            assert len(kubelet.latest_devices(MEMORY)) == 2 * 2 * GiB // (256 << 20)
        restarted = kubelet.restart()
        kubelet.wait_registered(resource, after=restarted)
        dp.wait_for(features.exists, what="NFD feature file")
    finally:
        log = dp.stop_plugin(proc, short_dir)
    assert proc.returncode == 0, log
    assert "ERROR" not in log and "Traceback" not in log, log
    assert f"{mode}" in features.read_text()
