"""The three doors into the driver, and what the shim hands out at each."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from shimtest import OVERHEAD, Runner

from py_vcuda import native

LIMIT = 256 << 20
AVAILABLE = LIMIT - OVERHEAD
HOOKED = {"cuInit", "cuMemAlloc", "cuMemFree", "cuMemAllocManaged", "cuMemAllocAsync",
          "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuMemCreate", "cuMemRelease",
          "cuArrayCreate", "cuArray3DCreate", "cuArrayDestroy", "cuMipmappedArrayCreate",
          "cuMipmappedArrayDestroy", "cuMemGetInfo", "cuDeviceTotalMem", "cuDevicePrimaryCtxRetain",
          "cuDevicePrimaryCtxRelease", "cuCtxDestroy", "cuMemAllocPitch", "cuCtxCreate",
          "cuGetProcAddress", "cuLaunchKernel", "cuCtxSetCurrent", "cuStreamSynchronize",
          "cuCtxSynchronize", "cuModuleGetFunction", "cuMemPoolCreate", "cuMemPoolDestroy", "cuMemPoolTrimTo",
          "cuMemPoolSetAttribute", "cuDeviceSetMemPool", "cuCtxSetLimit", "cuLibraryGetKernel",
          "cuKernelGetFunction", "cuStreamBeginCapture", "cuStreamEndCapture", "cuGraphInstantiate",
          "cuGraphInstantiateWithFlags", "cuGraphLaunch", "cuGraphUpload", "cuGraphExecDestroy", "cuGraphDestroy",
          "cuGraphAddMemAllocNode", "cuDeviceGraphMemTrim"}
PASSED_THROUGH = {"cuDeviceGetDefaultMemPool", "cuModuleLoadData", "cuMemPoolGetAttribute", "cuCtxGetLimit",
                  "cuLibraryLoadData", "cuStreamCreate", "cuGraphCreate", "cuDeviceGetGraphMemAttribute",
                  "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle", "cuMemAddressReserve",
                  "cuMemMap", "cuMemSetAccess", "cuIpcGetMemHandle", "cuIpcOpenMemHandle"}
# Entry points younger than CUDA 11.3 (the simulator maps cuGraphInstantiate only
# from 12.0, to cuGraphInstantiateWithFlags).
NEWER_THAN_11030 = {"cuLibraryLoadData", "cuLibraryGetKernel", "cuKernelGetFunction", "cuGraphInstantiate",
                    "cuGraphAddMemAllocNode", "cuDeviceGraphMemTrim", "cuDeviceGetGraphMemAttribute"}


def base(name: str) -> str:
    for suffix in ("_ptsz", "_ptds", "_v2", "_v3", "_v4"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def check_quota(result) -> None:
    assert result.returncode == 0, result.stderr
    assert result.rc("init") == 0
    assert result.rc("ctx") == 0
    assert result.rc("alloc", 0) == 0       # exactly what is left after the context
    assert result.rc("alloc", 1) == 2       # one byte more: CUDA_ERROR_OUT_OF_MEMORY
    assert result.get("info", "total") == LIMIT


SCENARIO = ["init", "ctx", f"alloc:{AVAILABLE}", "alloc:1", "info"]


def test_linked_program_is_limited(run_probe: Runner, cuprobe_linked: Path) -> None:
    check_quota(run_probe(["--via=link", *SCENARIO], env={"VCUDA_MEMORY_LIMIT": str(LIMIT)},
                          exe=cuprobe_linked))


def test_dlsym_door_returns_wrappers(run_probe: Runner) -> None:
    res = run_probe(["--via=dlsym", *SCENARIO], env={"VCUDA_MEMORY_LIMIT": str(LIMIT)})
    check_quota(res)
    libs = res.resolved()
    for name, lib in libs.items():
        expected = native.SHIM if base(name) in HOOKED else native.SIM_CUDA
        assert lib == expected, f"{name} resolved into {lib}"


@pytest.mark.parametrize(
    ("version", "ptds"),
    [(11030, False), (12000, False), (12000, True), (12080, True), (13000, False), (13000, True)],
)
def test_getprocaddress_door_like_cudart(run_probe: Runner, version: int, ptds: bool) -> None:
    flags = [f"--cuda-version={version}"] + (["--ptds"] if ptds else [])
    res = run_probe(["--via=proc", *flags, *SCENARIO, "newctx:0", f"alloc:{1 << 20}"],
                    env={"VCUDA_MEMORY_LIMIT": str(LIMIT)})
    check_quota(res)
    libs = res.resolved()
    # cuGetProcAddress itself must come back wrapped, or every later lookup escapes.
    assert libs["cuGetProcAddress"] == native.SHIM
    absent = {name for name, lib in libs.items() if lib == "(null)"}  # newer than the version asked for
    assert absent <= (NEWER_THAN_11030 if version < 12000 else set()), absent
    for name, lib in libs.items():
        if name in absent:
            continue
        if name in HOOKED:
            assert lib == native.SHIM, f"{name} escaped the shim at {version}"
        elif name in PASSED_THROUGH:
            assert lib == native.SIM_CUDA, f"{name} should pass through"
    # A second context costs another overhead: the quota is already full.
    assert res.rc("newctx") == 2


def test_without_preload_nothing_is_limited(run_probe: Runner) -> None:
    res = run_probe(["--via=dlsym", *SCENARIO], env={"VCUDA_MEMORY_LIMIT": str(LIMIT)}, preload=False)
    assert res.rc("alloc", 1) == 0
    assert res.get("info", "total") > LIMIT


def test_rtld_next_interposer_after_the_shim(build_c, shim: Path, tmp_path: Path) -> None:
    """Another interposer preloaded after libvcuda that uses dlsym(RTLD_NEXT) must
    find the next definition, not itself (a naive dlsym override recurses)."""
    target = build_c(["interpose_target.c"], flags=["-shared", "-fPIC"])
    wrapper = build_c(["interpose_wrapper.c"], flags=["-shared", "-fPIC"])
    lib_target = tmp_path / "libtarget.so"
    lib_target.symlink_to(target)
    app = build_c(["interpose_app.c"], libs=[f"-L{tmp_path}", f"-Wl,-rpath,{tmp_path}", "-ltarget"])
    env = {**os.environ, "LD_PRELOAD": f"{shim} {wrapper}"}
    out = subprocess.run([str(app)], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "43"


def test_application_with_its_own_libzmq(shim: Path, sim_env: dict[str, str]) -> None:
    """pyzmq (its own libzmq) works in a process that has the shim preloaded."""
    code = (
        "import zmq\n"
        "ctx = zmq.Context()\n"
        "a = ctx.socket(zmq.PAIR); b = ctx.socket(zmq.PAIR)\n"
        "a.bind('inproc://x'); b.connect('inproc://x')\n"
        "a.send(b'ping'); print(b.recv().decode())\n"
    )
    env = {**os.environ, **sim_env, "LD_PRELOAD": str(shim)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ping"


def test_disable_is_pure_pass_through(run_probe: Runner) -> None:
    res = run_probe(["--via=proc", *SCENARIO],
                    env={"VCUDA_MEMORY_LIMIT": str(LIMIT), "VCUDA_DISABLE": "1"})
    assert res.rc("alloc", 1) == 0
    assert res.get("info", "total") > LIMIT


@pytest.mark.parametrize("via", ["link", "dlsym", "proc"])
def test_devs_lists_the_visible_devices_by_uuid(run_probe: Runner, cuprobe_linked: Path, sim_env: dict[str, str],
                                                via: str) -> None:
    """cuprobe's `devs` (the e2e tier compares its UUIDs with a pod's assignment), through each door."""
    sim_env["VCUDA_SIM_DEVICES"] = "2"
    res = run_probe([f"--via={via}", "init", "devs"], env={"CUDA_VISIBLE_DEVICES": "1,0"},
                    **({"exe": cuprobe_linked} if via == "link" else {}))
    devs = next(d for d in res.lines if d["cmd"] == "devs")
    assert devs == {"cmd": "devs", "rc": "0", "count": "2", "uuid0": "GPU-5157a0c0-0001-4000-8000-000000000001",
                    "uuid1": "GPU-5157a0c0-0000-4000-8000-000000000000"}, res.stdout
