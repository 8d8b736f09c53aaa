"""pgpu (whole GPUs, topology-aware preference) and mps (percent shares, a
supervised control daemon — a fake one here) modes through the test kubelet."""

from __future__ import annotations

import os
from dataclasses import replace

import grpc
import pytest

from device_plugin.inventory import topology as numa_topology
from device_plugin.mps import PID_FILE, mps_dir
from node_state.gpus import Inventory
from py_vcuda.sim import GiB

GPU = "nvidia.com/gpu"
MPS = "nvidia.com/mps-core"


def topology(dp, numa: list[int], links: list[tuple[int, int]]) -> Inventory:  # type: ignore[no-untyped-def]
    gpus = tuple(dp.gpu(i, numa=n) for i, n in enumerate(numa))
    peers: dict[int, set[int]] = {g.index: set() for g in gpus}
    for a, b in links:
        peers[a].add(b)
        peers[b].add(a)
    return Inventory(gpus, {i: frozenset(p) for i, p in peers.items()})


def test_pgpu_devices_carry_numa(agent_factory, kubelet, dp):
    agent_factory("pgpu", inv=topology(dp, [0, 0, 1, 1], []))
    devices = kubelet.latest_devices(GPU)
    assert [d.ID for d in devices] == [dp.gpu(i).uuid for i in range(4)]
    assert [[n.ID for n in d.topology.nodes] for d in devices] == [[0], [0], [1], [1]]


@pytest.mark.parametrize("desc,numa,links,available,size,must,expect", [
    ("NVLink pair beats NUMA", [0, 0, 1, 1], [(1, 2)], [0, 1, 2, 3], 2, [], {1, 2}),
    ("same NUMA without NVLink", [0, 1, 0, 1], [], [0, 1, 2, 3], 2, [], {0, 2}),
    ("NVLink clique of four", [0, 0, 0, 0, 1, 1, 1, 1], [(4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)],
     list(range(8)), 4, [], {4, 5, 6, 7}),
    ("must include decides the NUMA node", [0, 0, 1, 1], [], [0, 1, 2, 3], 2, [3], {2, 3}),
    ("only what is available", [0, 0, 1, 1], [(0, 1)], [1, 2, 3], 2, [], {2, 3}),
])
def test_pgpu_preferred_allocation(agent_factory, kubelet, dp, desc, numa, links, available, size, must, expect):
    agent_factory("pgpu", inv=topology(dp, numa, links))
    uuid = [dp.gpu(i).uuid for i in range(len(numa))]
    chosen = kubelet.preferred(GPU, [uuid[i] for i in available], size, [uuid[i] for i in must])
    assert {uuid.index(u) for u in chosen} == expect, desc


def test_pgpu_allocate(agent_factory, kubelet, dp):
    agent = agent_factory("pgpu", gpus=2)
    a, b = dp.gpu(0).uuid, dp.gpu(1).uuid
    resp = kubelet.allocate(GPU, [b, a]).container_responses[0]
    assert dict(resp.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{b},{a}"}
    (rec,) = agent.store.records()
    assert rec.mode == "pgpu" and rec.gpus == (b, a) and rec.tenant is None
    with pytest.raises(grpc.RpcError) as e:
        kubelet.allocate(GPU, ["GPU-unknown"])
    assert "unknown device ID 'GPU-unknown'" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        kubelet.allocate(GPU, [a, a])
    assert "appear more than once" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:   # the first container of a failed request goes too
        kubelet.allocate(GPU, [a], ["GPU-unknown"])
    assert [r.gpus for r in agent.store.records()] == [(b, a)]


def test_mps_daemon_per_gpu_env_and_supervision(agent_factory, kubelet, dp, fake_mps):
    inv = dp.inventory(2, memory=8 * GiB)
    agent = agent_factory("mps", inv=inv, mps_control=str(fake_mps))
    a = dp.gpu(0).uuid
    assert len(kubelet.latest_devices(MPS)) == 200
    daemons = {c.uuid: c for c in agent.supervisor.children}
    assert all(d.alive() for d in daemons.values())
    pipe = mps_dir(agent.layout, a) / "pipe"
    assert (pipe / "calls").read_text().startswith(f"-d gpu={a} log={mps_dir(agent.layout, a) / 'log'}")

    chosen = kubelet.preferred(MPS, [d.ID for d in kubelet.latest_devices(MPS)], 25)
    assert len({c.split("::")[0] for c in chosen}) == 1
    resp = kubelet.allocate(MPS, [f"{a}::{i}" for i in range(25)]).container_responses[0]
    assert dict(resp.envs) == {"NVIDIA_VISIBLE_DEVICES": a, "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia-mps",
                               "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                               "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M"}
    assert [(m.host_path, m.container_path) for m in resp.mounts] == [(str(pipe), "/run/nvidia-mps")]

    with pytest.raises(grpc.RpcError) as e:
        kubelet.allocate(MPS, [f"{a}::{i}" for i in range(100)] + [f"{dp.gpu(1).uuid}::0"])
    assert "more than one GPU" in e.value.details()

    # the daemon dies: the supervisor starts it again
    pid = daemons[a].pid()
    os.kill(pid, 9)
    dp.wait_for(lambda: daemons[a].alive() and daemons[a].pid() != pid, what="MPS daemon restart")
    agent.stop()
    assert not (pipe / PID_FILE).exists()   # stopped with "quit"
    assert not any(d.alive() for d in daemons.values())


def test_mps_names_its_gpu_by_the_device_list_strategy(agent_factory, kubelet, dp, fake_mps):
    agent_factory("mps", gpus=1, mps_control=str(fake_mps), device_list_strategy="volume-mounts,cdi-cri")
    a = dp.gpu(0).uuid
    resp = kubelet.allocate(MPS, [f"{a}::{i}" for i in range(25)]).container_responses[0]
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert resp.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert [(m.host_path, m.container_path) for m in resp.mounts][1:] == [
        ("/dev/null", f"/var/run/nvidia-container-devices/{a}")]
    assert [d.name for d in resp.cdi_devices] == [f"nvidia.com/gpu={a}"]


def test_mps_daemon_that_cannot_start_is_retried(agent_factory, kubelet, dp, short_dir):
    broken = short_dir / "broken-mps"
    broken.write_text("#!/bin/sh\necho 'no GPU here' >&2\nexit 3\n")
    broken.chmod(0o755)
    agent = agent_factory("mps", gpus=1, mps_control=str(broken))
    (daemon,) = agent.supervisor.children
    dp.wait_for(lambda: agent.supervisor.restarts[daemon.name] >= 2, what="retries")
    assert not daemon.alive()
    assert len(kubelet.latest_devices(MPS)) == 100   # the resource is still offered
    with pytest.raises(grpc.RpcError) as e:   # but a container would find no daemon: refused, saying why
        kubelet.allocate(MPS, [f"{dp.gpu(0).uuid}::{i}" for i in range(10)])
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert f"the MPS control daemon for GPU {dp.gpu(0).uuid} is not running" in e.value.details()
    assert str(mps_dir(agent.layout, dp.gpu(0).uuid) / "log") in e.value.details()
    assert list(agent.store.records()) == []


def test_stale_pid_file_naming_another_process_is_not_adopted(agent_factory, kubelet, dp, short_dir, fake_mps):
    """The pid file survived its daemon and the pid now belongs to someone else: start a daemon,
    and leave the stranger alone."""
    import subprocess

    from node_state.layout import NodeLayout

    stranger = subprocess.Popen(["sleep", "300"])
    try:
        pipe = mps_dir(NodeLayout(short_dir / "st"), dp.gpu(0).uuid) / "pipe"
        pipe.mkdir(parents=True)
        (pipe / PID_FILE).write_text(str(stranger.pid))
        agent = agent_factory("mps", gpus=1, mps_control=str(fake_mps))
        (daemon,) = agent.supervisor.children
        assert (pipe / "calls").read_text().startswith("-d ")   # started, not adopted
        assert daemon.alive() and daemon.pid() != stranger.pid
        agent.stop()
        assert stranger.poll() is None   # never asked to quit, never signalled
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.parametrize("desc,comm,argv,expect", [
    ("the real daemon (comm keeps 15 characters)", "nvidia-cuda-mps", ["nvidia-cuda-mps-control", "-d"], True),
    ("the binary by full path", "nvidia-cuda-mps", ["/usr/bin/nvidia-cuda-mps-control", "-d"], True),
    ("a script under its interpreter", "python3", ["python3", "/opt/nvidia-cuda-mps-control", "-d"], True),
    ("a stranger with a reused pid", "sleep", ["sleep", "300"], False),
    ("a stranger naming it as a later argument", "vim", ["vim", "-R", "nvidia-cuda-mps-control"], False),
])
def test_is_program(tmp_path, desc, comm, argv, expect):
    from device_plugin.mps import is_program

    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "comm").write_text(comm + "\n")
    (tmp_path / "42" / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    assert is_program(42, "/usr/bin/nvidia-cuda-mps-control", proc=tmp_path) is expect, desc
    assert not is_program(43, "/usr/bin/nvidia-cuda-mps-control", proc=tmp_path)   # no such process



def test_gpu_without_numa_has_no_topology(dp):
    inv = Inventory((replace(dp.gpu(0), numa_node=None),))
    assert numa_topology(inv.gpus[0]) is None
