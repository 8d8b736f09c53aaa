"""Fixtures for the device plugin's tests: the test kubelet (device_plugin.testing),
in-process agents on fake inventories and pod lists, the real agent process on
the simulator, and builders for pods and assignment annotations."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from shimtest import container_env_on_host, container_quota

from device_plugin.config import resolve
from device_plugin.testing import TestKubelet
from kube_contract.api import deviceplugin_v1beta1_pb2 as pb
from kube_contract.testing import FakeApiServer
from node_state.gpus import Inventory
from node_state.testing import gpu, inventory, wait_for
from py_vcuda import native
from py_vcuda.quota_file import QuotaFile
from py_vcuda.sim import SimConfig

REPO = Path(__file__).resolve().parents[2]
NODE = "node-1"


@pytest.fixture
def kubelet(short_dir: Path) -> Iterator[TestKubelet]:
    plugins = short_dir / "dp"
    plugins.mkdir()
    k = TestKubelet(plugins)
    k.start()
    yield k
    k.stop()


def plugin_config(short_dir: Path, mode: str = "vgpu", **overrides: Any):  # type: ignore[no-untyped-def]
    flags = {"mode": mode, "device_plugin_dir": str(short_dir / "dp"), "state_dir": str(short_dir / "st"),
             "metrics_port": "0", "node_name": NODE, "features_file": "", "host_lib_dir": str(native.lib_dir()),
             "pod_resources_socket": str(short_dir / "pr.sock"), "resync_s": "0.2", "cleanup_grace_s": "1"}
    flags.update({k: str(v) for k, v in overrides.items()})
    return resolve(flags, {}, {})


def pod(name: str, *, cores: int = 0, memory_units: int = 0, container: str = "main",
        annotations: dict[str, str] | None = None, env: dict[str, str] | None = None, node: str = NODE,
        created: str = "2026-01-01T00:00:00Z", phase: str = "Pending", resource_domain: str = "tencent.com",
        ) -> dict[str, Any]:
    limits = {}
    if cores:
        limits[f"{resource_domain}/vcuda-core"] = str(cores)
    if memory_units:
        limits[f"{resource_domain}/vcuda-memory"] = str(memory_units)
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "creationTimestamp": created,
                     "annotations": dict(annotations or {})},
        "spec": {"nodeName": node, "containers": [{
            "name": container, "resources": {"limits": limits},
            "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}]},
        "status": {"phase": phase},
    }


def assignment_annotation(container: str, uuid: str, cores: int, memory: int = 0, node: str = NODE) -> str:
    return json.dumps({"version": 1, "node": node,
                       "containers": [{"name": container, "gpus": [{"uuid": uuid, "cores": cores,
                                                                    "memory": memory}]}]})


def spawn_plugin(short_dir: Path, sim: SimConfig, *args: str) -> subprocess.Popen[bytes]:
    """The real agent (`python -m device_plugin`) on the simulator's NVML."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VCUDA_", "KUBECONFIG"))}
    env.update(sim.env())
    env["PYTHONPATH"] = str(REPO)
    env["KUBECONFIG"] = str(short_dir / "no-kubeconfig")
    cmd = [sys.executable, "-m", "device_plugin", "--device-plugin-dir", str(short_dir / "dp"),
           "--state-dir", str(short_dir / "st"), "--metrics-port", "0", "--node-name", NODE,
           "--features-file", "", "--host-lib-dir", str(native.lib_dir()),
           "--pod-resources-socket", str(short_dir / "pr.sock"), *args]
    log = open(short_dir / "plugin.log", "wb")   # noqa: SIM115  (closed with the process by the caller)
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO))


def stop_plugin(proc: subprocess.Popen[bytes], short_dir: Path) -> str:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return (short_dir / "plugin.log").read_text(errors="replace")


def response_mounts(resp: pb.ContainerAllocateResponse) -> dict[str, str]:
    """{container path: host path} of the response's mounts."""
    return {m.container_path: m.host_path for m in resp.mounts}


def host_env(resp: pb.ContainerAllocateResponse) -> dict[str, str]:
    """What a process of the container run on the host needs (shimtest.container_env_on_host): the response's
    env and its quota file in libvcuda's bare-metal variables, host paths."""
    return container_env_on_host(resp.envs, response_mounts(resp))


def quota(resp: pb.ContainerAllocateResponse) -> QuotaFile:
    """The quota file the response mounts at /run/vcuda-quota."""
    return container_quota(response_mounts(resp))


class Helpers:
    """The helpers above for test modules (conftest is not importable by name)."""

    TestKubelet = TestKubelet
    NODE = NODE
    wait_for = staticmethod(wait_for)
    gpu = staticmethod(gpu)
    inventory = staticmethod(inventory)
    plugin_config = staticmethod(plugin_config)
    pod = staticmethod(pod)
    assignment_annotation = staticmethod(assignment_annotation)
    spawn_plugin = staticmethod(spawn_plugin)
    stop_plugin = staticmethod(stop_plugin)
    host_env = staticmethod(host_env)
    quota = staticmethod(quota)


@pytest.fixture
def dp() -> type[Helpers]:
    return Helpers


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    """The fake API server with this node on it."""
    server = FakeApiServer()
    server.add_node(NODE)
    yield server
    server.close()


@pytest.fixture
def agent_factory(short_dir: Path, kubelet: TestKubelet) -> Iterator[Callable[..., Any]]:
    """Start an in-process Agent (fake inventory and pods); stopped at the end of the test."""
    from device_plugin.agent import Agent
    from device_plugin.pods import StaticPods

    started: list[Agent] = []

    def make(mode: str = "vgpu", gpus: int = 1, pods: Any = None, inv: Inventory | None = None,
             health_factory: Any = None, pod_watch: Any = None, patch_node: Any = None,
             nvml: Any = None, events: Any = None, mig_node: Any = None, **overrides: Any) -> Agent:
        cfg = plugin_config(short_dir, mode, **overrides)
        agent = Agent(cfg, inventory=inv or inventory(gpus), pods=pods if pods is not None else StaticPods(),
                      nvml=nvml, health_factory=health_factory, pod_watch=pod_watch, patch_node=patch_node,
                      events=events, mig_node=mig_node)
        agent.start()
        started.append(agent)
        return agent

    yield make
    for agent in reversed(started):
        agent.stop()


FAKE_MPS = textwrap.dedent("""\
    #!/usr/bin/env python3
    # Fake nvidia-cuda-mps-control: "-d" daemonises and writes the pid file; stdin "quit" stops it.
    import os, sys, time
    pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    pidfile = os.path.join(pipe, "nvidia-cuda-mps-control.pid")
    with open(os.path.join(pipe, "calls"), "a") as f:
        f.write(" ".join(sys.argv[1:]) + " gpu=" + os.environ["CUDA_VISIBLE_DEVICES"]
                + " log=" + os.environ["CUDA_MPS_LOG_DIRECTORY"] + "\\n")
    if sys.argv[1:] == ["-d"]:
        if os.fork():
            sys.exit(0)
        os.setsid()
        if os.fork():
            os._exit(0)
        with open(pidfile, "w") as f:
            f.write(str(os.getpid()))
        while os.path.exists(pidfile):
            time.sleep(0.05)
        os._exit(0)
    if sys.stdin.read().strip() == "quit":
        os.unlink(pidfile)
""")


@pytest.fixture
def fake_mps(short_dir: Path) -> Path:
    path = short_dir / "fake-mps-control"
    path.write_text(FAKE_MPS)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path
