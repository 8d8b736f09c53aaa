"""The three doors into the driver, and what the shim hands out at each."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BuildC
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
# Entry points younger than CUDA 11.3 (cuGraphInstantiate is cuGraphInstantiate_v2
# there, cuGraphInstantiateWithFlags from 12.0).
NEWER_THAN_11030 = {"cuLibraryLoadData", "cuLibraryGetKernel", "cuKernelGetFunction",
                    "cuGraphAddMemAllocNode", "cuDeviceGraphMemTrim", "cuDeviceGetGraphMemAttribute"}
# The legacy ABIs cuprobe resolves (its LEGACY table), by the name the driver has them under.
LEGACY = {"cuStreamBeginCapture", "cuGraphInstantiate", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset"}


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


LEGACY_DOORS = [("--via=proc", "--cuda-version=11030"), ("--via=proc", "--cuda-version=11030", "--ptds"),
                ("--via=proc", "--cuda-version=12000"), ("--via=proc", "--cuda-version=13000", "--ptds"),
                ("--via=dlsym",), ("--via=dlsym", "--ptds")]


@pytest.mark.parametrize("door", LEGACY_DOORS, ids=" ".join)
def test_legacy_abis_come_back_as_the_shims_wrappers(run_probe: Runner, door: tuple[str, ...]) -> None:
    """A runtime that asks cuGetProcAddress (4 arguments below 12000) or cuGetProcAddress_v2
    for a base name at a version below its _v2 gets the legacy ABI: cuStreamBeginCapture
    (_ptsz with the per-thread flag) below 10010, cuGraphInstantiate and
    cuDevicePrimaryCtxRelease/Reset below 11000. Each must come back as the shim's
    wrapper of exactly that ABI (the one dlsym of the legacy name gives), silently."""
    legacy = LEGACY - {"cuStreamBeginCapture"} | {"cuStreamBeginCapture_ptsz" if "--ptds" in door
                                                    else "cuStreamBeginCapture"}
    for preload, lib in ((False, native.SIM_CUDA), (True, native.SHIM)):
        res = run_probe([*door, "init"], preload=preload)
        assert res.rc("init") == 0, res.stderr
        found = {d["name"]: d for d in res.lines if d["cmd"] == "legacy"}
        assert set(found) == legacy
        for name, line in found.items():
            assert (line["lib"], line["same"]) == (lib, "1"), f"{name} resolved to {line}"
        assert "does not know" not in res.stderr, res.stderr


def odd_driver_env(build_c: BuildC, shim: Path, tmp_path: Path) -> dict[str, str]:
    """The shim over tests/c/odd_driver.c, a driver that hands out entry points the shim does not know."""
    odd = build_c(["odd_driver.c"], flags=["-shared", "-fPIC"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
    env.update(LD_PRELOAD=str(shim), VCUDA_REAL_LIBCUDA=str(odd), VCUDA_LEDGER=str(tmp_path / "ledger"))
    return env


def test_an_entry_point_the_shim_does_not_know_is_named_in_its_warning(build_c: BuildC, shim: Path,
                                                                         tmp_path: Path) -> None:
    """What cuGetProcAddress returned for a hooked base name that matches no hook passes through,
    and the warning says what it was asked (cudaVersion, flags) and what the address is: which of
    the driver's exports of that name (the bare one: the legacy ABI), or none; and the real
    addresses of the variants the shim hooks."""
    args = ["cuStreamBeginCapture", "12345", "2", "cuDevicePrimaryCtxReset", "10000", "4arg",
            "cuCtxCreate", "3000", "0"]
    out = subprocess.run([str(build_c(["sim_procaddr.c"])), *args], env=odd_driver_env(build_c, shim, tmp_path),
                         capture_output=True, text=True, timeout=30, check=True)
    # Passed through: the caller gets the driver's own entry points.
    assert [row.split()[-1] for row in out.stdout.splitlines()] == ["?", "cuDevicePrimaryCtxReset_v3",
                                                                    "cuCtxCreate"]
    warnings = [line for line in out.stderr.splitlines() if "vcuda does not know" in line]
    assert len(warnings) == 3, out.stderr
    capture, reset, create = warnings
    assert 'cuGetProcAddress("cuStreamBeginCapture", cudaVersion 12345, flags 0x2)' in capture
    assert "none of the driver's exports cuStreamBeginCapture[_v2|_v3|_v4][_ptsz|_ptds]" in capture
    assert re.search(r"vcuda hooks cuStreamBeginCapture_v2=0x[0-9a-f]+ cuStreamBeginCapture_v2_ptsz=absent "
                     r"cuStreamBeginCapture=absent cuStreamBeginCapture_ptsz=absent\)$", capture), capture
    assert 'cuGetProcAddress("cuDevicePrimaryCtxReset", cudaVersion 10000, flags 0)' in reset
    assert "the driver's export cuDevicePrimaryCtxReset_v3 (dladdr: cuDevicePrimaryCtxReset_v3+0" in reset
    assert "the driver's export cuCtxCreate (the legacy ABI)" in create


def test_legacy_entry_points_a_driver_lacks(build_c: BuildC, shim: Path, tmp_path: Path) -> None:
    """A driver without the legacy entry points the shim hooks still loads; the shim's exports of
    them, called anyway, return CUDA_ERROR_NOT_FOUND."""
    out = subprocess.run([str(build_c(["legacy_calls.c"]))], env=odd_driver_env(build_c, shim, tmp_path),
                         capture_output=True, text=True, timeout=30, check=True)
    assert sorted(out.stdout.splitlines()) == sorted(f"{name} 500" for name in LEGACY | {"cuStreamBeginCapture_ptsz"})


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
