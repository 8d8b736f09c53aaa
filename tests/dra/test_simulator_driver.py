"""The DRA driver hands out the test-only simulator driver (node_state.gpu_driver) through the same
path as vgpu Allocate: a prepared claim's CDI spec mounts the simulator's libraries and state."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from shimtest import cdi_container

from dra_driver import testing as t
from node_state.daemon import StartError
from py_vcuda import native
from py_vcuda.sim import GiB


def test_cdi_spec_carries_the_simulator(agent_factory, kubelet, api, tmp_path: Path, monkeypatch):
    state = tmp_path / "sim" / "state"
    state.parent.mkdir()
    monkeypatch.setenv("VCUDA_REAL_LIBNVML", str(native.lib_path(native.SIM_NVML)))
    monkeypatch.setenv("VCUDA_SIM_STATE", str(state))
    monkeypatch.setenv("VCUDA_SIM_DEVICES", "2")
    agent = agent_factory(config={"simulator": True})
    claim = api.put("resourceclaims", t.claim("c", t.NODE, [t.share(t.NODE, 0, 30, 4 * GiB)]))
    assert kubelet.prepare(claim).claims[claim["metadata"]["uid"]].error == ""
    spec = json.loads(agent.driver.specs.path(claim["metadata"]["uid"]).read_text())
    env, mounts = cdi_container(spec["devices"][0]["containerEdits"])
    lib = native.lib_dir()
    assert mounts[f"/usr/local/vcuda-sim/lib/{native.SIM_CUDA}"] == str(lib / native.SIM_CUDA)
    assert mounts[f"/usr/local/vcuda-sim/lib/{native.SIM_NVML}"] == str(lib / native.SIM_NVML)
    assert mounts["/run/vcuda-sim"] == str(state.parent)
    assert "/run/vcuda-quota" in mounts and "/etc/ld.so.preload" in mounts   # beside the share's own
    assert env["VCUDA_REAL_LIBCUDA"] == f"/usr/local/vcuda-sim/lib/{native.SIM_CUDA}"
    assert env["VCUDA_SIM_STATE"] == "/run/vcuda-sim/state" and env["VCUDA_SIM_DEVICES"] == "2"
    assert env["VCUDA_SIM_PID_NAMESPACE"] == os.readlink("/proc/self/ns/pid")


def test_refused_off_the_simulator(agent_factory, monkeypatch):
    monkeypatch.delenv("VCUDA_REAL_LIBNVML", raising=False)
    with pytest.raises(StartError, match="--simulator: this agent does not run on the GPU simulator"):
        agent_factory(config={"simulator": True})
