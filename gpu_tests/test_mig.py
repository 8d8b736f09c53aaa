"""MIG on a real GPU, read-only: runs only where MIG is already enabled with instances, and
NEVER changes MIG settings (no mode change, no instance created or destroyed).

Without a GPU in MIG mode that holds MIG devices, every test skips with that reason. Where
there is one:

- the node's MIG view (node_state.mig.MigView, what the device plugin and the DRA driver see)
  lists every MIG device with the profile, UUID and parent that ``nvidia-smi -L`` shows, and
  the memory NVML reports for that MIG device;
- pgpu's mixed strategy offers one resource per profile with exactly those devices, and none
  of the GPUs in MIG mode whole;
- a CUDA process pinned to one instance (``CUDA_VISIBLE_DEVICES=MIG-<uuid>``) sees one device
  with that instance's memory (CuPy or PyTorch, whichever is importable; else skipped).

NVML is read in child processes: nvidia-ml-py keeps one library per process, and the suite's
own NVML reader (conftest) may hold it already.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest

MiB = 1 << 20

VIEW = """
import json
from py_vcuda.nvml import NVML
from node_state.gpus import Inventory
from node_state.mig import MigView
from node_state.containers import ContainerStore
from node_state.gpus import Health
from node_state.layout import NodeLayout
from device_plugin import pgpu
import pathlib, tempfile
with NVML() as nvml:
    inv = Inventory.from_nvml(nvml)
    store = ContainerStore(NodeLayout(pathlib.Path(tempfile.mkdtemp())))
    offered = {p.resource: [d.ID for d in p.devices()] for p in pgpu.plugins("mixed", inv, Health(), store)}
    done(gpus=[{"index": g.index, "uuid": g.uuid, "enabled": g.enabled,
                "devices": [{"uuid": d.uuid, "profile": d.profile, "parent": d.parent_uuid,
                             "memory": d.memory_total, "sms": d.multiprocessors, "slices": d.slices,
                             "placement": [d.placement.start, d.placement.size]} for d in g.devices]}
               for g in inv.mig.gpus.values()],
         offered=offered)
"""

RAW_MEMORY = """
import json, sys, pynvml
pynvml.nvmlInit()
out = {}
for uuid in sys.argv[1:]:
    h = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
    out[uuid] = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
done(memory=out)
"""

CUDA_SEES = """
import sys
which = sys.argv[1]
if which == "cupy":
    import cupy
    n = cupy.cuda.runtime.getDeviceCount()
    free, total = cupy.cuda.runtime.memGetInfo()
    a = cupy.ones((64 * 1024 * 1024,), dtype=cupy.uint8); cupy.cuda.runtime.deviceSynchronize()
    sms = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
else:
    import torch
    n = torch.cuda.device_count()
    free, total = torch.cuda.mem_get_info(0)
    a = torch.ones(64 * 1024 * 1024, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
done(count=n, total=int(total), sms=int(sms))
"""


MIG_MODES = """
import pynvml
pynvml.nvmlInit()
modes = []
for i in range(pynvml.nvmlDeviceGetCount()):
    try:
        modes.append(int(pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(i))[0]))
    except pynvml.NVMLError:  # a GPU without MIG support
        modes.append(0)
done(modes=modes)
"""

NO_MIG = ("no GPU here is in MIG mode with MIG devices; these tests never change MIG settings "
          "(enable MIG and create instances yourself to run them)")


@pytest.fixture(scope="module")
def node(py_module: Any, no_shim_env: dict[str, str]) -> dict[str, Any]:
    """The node's MIG view and pgpu's mixed offer, read by vcuda's own code in a child process
    (run from the checkout, so it imports this vcuda). Skipped, before vcuda's device plugin is
    imported, where NVML shows no GPU in MIG mode."""
    if importlib.util.find_spec("pynvml") is None:
        pytest.skip("nvidia-ml-py (pynvml) is not importable: cannot tell whether a GPU is in MIG mode")
    modes = py_module.run(MIG_MODES, no_shim_env, timeout=60)
    if modes.rc != 0 or "modes" not in modes.data:
        pytest.fail(f"reading the GPUs' MIG mode failed (rc={modes.rc}):\n{modes.stderr[-4000:]}")
    if not any(modes.data["modes"]):
        pytest.skip(NO_MIG)
    res = py_module.run(VIEW, no_shim_env, timeout=120)
    if res.rc != 0 or "gpus" not in res.data:
        pytest.fail(f"reading the node's MIG view failed (rc={res.rc}):\n{res.stderr[-4000:]}")
    usable = [g for g in res.data["gpus"] if g["enabled"] and g["devices"]]
    if not usable:
        pytest.skip(NO_MIG)
    return res.data


def instances(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for g in node["gpus"] for d in g["devices"]]


def smi_listing(env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """MIG UUID -> (profile, parent GPU UUID) from ``nvidia-smi -L``."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi not on PATH: nothing independent to compare the view with")
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=True,
                         env=env).stdout
    listing: dict[str, tuple[str, str]] = {}
    parent = ""
    for line in out.splitlines():
        gpu = re.search(r"^GPU \d+: .*\(UUID: (GPU-[0-9a-f-]+)\)", line.strip())
        if gpu:
            parent = gpu.group(1)
        mig = re.search(r"MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[0-9a-f-]+)\)", line)
        if mig:
            listing[mig.group(2)] = (mig.group(1), parent)
    return listing


def test_view_lists_the_instances_nvidia_smi_shows(node: dict[str, Any], no_shim_env: dict[str, str]) -> None:
    listing = smi_listing(no_shim_env)
    seen = {d["uuid"]: (d["profile"], d["parent"]) for d in instances(node)}
    assert seen == listing


def test_view_memory_is_nvmls_for_each_mig_device(node: dict[str, Any], py: Any,
                                                  no_shim_env: dict[str, str]) -> None:
    pytest.importorskip("pynvml")
    devs = instances(node)
    res = py.run(RAW_MEMORY, no_shim_env, argv=[d["uuid"] for d in devs], timeout=60)
    assert res.rc == 0, res.stderr
    assert {d["uuid"]: d["memory"] for d in devs} == res.data["memory"]
    for d in devs:
        assert d["sms"] > 0 and d["slices"] >= 1 and d["placement"][1] >= 1, d


def test_mixed_strategy_offers_each_profile_and_no_mig_gpu_whole(node: dict[str, Any]) -> None:
    by_profile: dict[str, list[str]] = {}
    for d in instances(node):
        by_profile.setdefault("nvidia.com/mig-" + d["profile"].replace("+", "."), []).append(d["uuid"])
    offered = node["offered"]
    assert {k: sorted(v) for k, v in offered.items() if k != "nvidia.com/gpu"} == {
        k: sorted(v) for k, v in by_profile.items()}
    in_mig = {g["uuid"] for g in node["gpus"] if g["enabled"]}
    assert not in_mig & set(offered.get("nvidia.com/gpu", []))


@pytest.mark.parametrize("framework", ["cupy", "torch"])
def test_a_process_pinned_to_an_instance_sees_that_instance(node: dict[str, Any], py: Any, framework: str,
                                                           no_shim_env: dict[str, str], record: Any) -> None:
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not importable in {sys.executable}")
    dev = min(instances(node), key=lambda d: d["memory"])   # the smallest: a mix-up shows most
    env = {**no_shim_env, "CUDA_VISIBLE_DEVICES": dev["uuid"]}
    res = py.run(CUDA_SEES, env, argv=[framework], timeout=300)
    assert res.rc == 0, res.stderr[-4000:]
    seen = res.data
    record(profile=dev["profile"], nvml_memory_mib=dev["memory"] // MiB, cuda_total_mib=seen["total"] // MiB,
           sms=seen["sms"])
    assert seen["count"] == 1
    # CUDA's total for a MIG device is the instance's memory (never the parent GPU's): within 5 %.
    assert abs(seen["total"] - dev["memory"]) <= dev["memory"] * 0.05, json.dumps(seen)
    assert seen["sms"] == dev["sms"]
