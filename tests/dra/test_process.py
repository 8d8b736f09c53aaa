"""The real `python -m dra_driver` process on the simulator's NVML: it registers with the test kubelet,
publishes the simulated GPUs, takes a GPU with a critical XID out of its slice, prepares a claim,
and stops on SIGTERM; bad configuration stops it with one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dra_driver import testing as t
from node_state.testing import wait_for
from py_vcuda import native
from py_vcuda.sim import GiB, SimConfig, SimReader

REPO = Path(__file__).resolve().parents[2]
NODE = t.NODE


def spawn(short_dir: Path, sim: SimConfig, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VCUDA_", "KUBECONFIG"))}
    env.update(sim.env(), PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "dra_driver", f"--plugin-dir={short_dir / 'pl'}",
           f"--registry-dir={short_dir / 'reg'}", f"--cdi-dir={short_dir / 'cdi'}", f"--state-dir={short_dir / 'st'}",
           f"--host-lib-dir={native.lib_dir()}", f"--node-name={NODE}", "--metrics-port=0", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)


def test_driver_process_serves_and_stops(short_dir, api, kubelet):
    sim = SimConfig(state_path=short_dir / "sim", devices=2, memory=8 * GiB)
    proc = spawn(short_dir, sim, f"--kubeconfig={api.kubeconfig(short_dir / 'kc')}")
    try:
        kubelet.wait_registered(timeout=60)
        slice_ = wait_for(lambda: api.get("resourceslices", f"{NODE}-gpu.vcuda.io"), 30, "the ResourceSlice")
        devices = slice_["spec"]["devices"]
        assert [d["name"] for d in devices] == ["gpu-0", "gpu-1"]
        attributes = devices[0]["attributes"]
        assert attributes["memory"] == {"int": 8 * GiB}
        assert "driverVersion" in attributes and "cudaDriverVersion" in attributes   # from the simulator's NVML
        claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 1, 40, GiB)]))
        entry = kubelet.prepare(claim).claims[claim["metadata"]["uid"]]
        assert entry.error == "" and entry.devices[0].device_name == "gpu-1"
        assert (short_dir / "cdi" / f"gpu.vcuda.io-claim_{claim['metadata']['uid']}.json").is_file()
        with SimReader(sim.state_path) as reader:   # the XID health code's verdict reaches the slice
            reader.inject_xid(1, 79)
        wait_for(lambda: [d["name"] for d in api.get("resourceslices", f"{NODE}-gpu.vcuda.io")["spec"]["devices"]]
                 == ["gpu-0"], 30, "gpu-1 to leave the slice after XID 79")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "stopped" in out


def test_bad_configuration_is_one_clear_line(short_dir):
    sim = SimConfig(state_path=short_dir / "sim", devices=1)
    proc = spawn(short_dir, sim, "--metrics-port=http")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out.strip() == "vcuda dra-driver: --metrics-port: 'http': invalid literal for " \
                                                   "int() with base 10: 'http'"
    proc = spawn(short_dir, sim, f"--kubeconfig={short_dir / 'missing'}")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "no API server configuration" in out and "--kubeconfig" in out
