"""The simulator's MIG: modes, profiles, GPU and compute instances and MIG
devices through nvidia-ml-py (pynvml), as the node agent sees them; CUDA on a
MIG device through simulated programs (CUDA_VISIBLE_DEVICES=MIG-<uuid>)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pynvml
import pytest
from simnvml import h, nvml_error, open_nvml
from simtool import Line, lines

from py_vcuda.sim import GiB, MiB, SimConfig, SimReader

MS = 1_000_000
IN_USE = pynvml.NVML_ERROR_IN_USE
NO_ROOM = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
INVALID = pynvml.NVML_ERROR_INVALID_ARGUMENT

# (name, NVML profile index, profile id, slices, memory MiB, SMs, instances, starts, size)
H100 = [
    ("1g.10gb", pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 9984, 16, 7, range(7), 1),
    ("1g.10gb+me", pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 9984, 16, 1, range(7), 1),
    ("1g.20gb", pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 20096, 26, 4, [0, 2, 4, 6], 2),
    ("2g.20gb", pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 20096, 32, 3, [0, 2, 4], 2),
    ("3g.40gb", pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 40448, 60, 2, [0, 4], 4),
    ("4g.40gb", pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 40448, 64, 1, [0], 4),
    ("7g.80gb", pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 81152, 132, 1, [0], 8),
]
A100 = [
    ("1g.5gb", pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 4864, 14, 7, range(7), 1),
    ("1g.5gb+me", pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 4864, 14, 1, range(7), 1),
    ("1g.10gb", pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 9856, 14, 4, [0, 2, 4, 6], 2),
    ("2g.10gb", pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 9856, 28, 3, [0, 2, 4], 2),
    ("3g.20gb", pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 19968, 42, 2, [0, 4], 4),
    ("4g.20gb", pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 19968, 56, 1, [0], 4),
    ("7g.40gb", pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 40192, 98, 1, [0], 8),
]


class ProfileInfoV3(ctypes.Structure):
    """nvmlGpuInstanceProfileInfo_v3_t (nvidia-ml-py has no mirror of it)."""

    _fields_ = [("version", ctypes.c_uint), ("id", ctypes.c_uint), ("sliceCount", ctypes.c_uint),
                ("instanceCount", ctypes.c_uint), ("multiprocessorCount", ctypes.c_uint),
                ("copyEngineCount", ctypes.c_uint), ("decoderCount", ctypes.c_uint),
                ("encoderCount", ctypes.c_uint), ("jpegCount", ctypes.c_uint),
                ("ofaCount", ctypes.c_uint), ("memorySizeMB", ctypes.c_ulonglong),
                ("name", ctypes.c_char * 96), ("capabilities", ctypes.c_uint)]


@pytest.fixture
def mig(sim: SimConfig) -> SimConfig:
    """GPU 0 in MIG mode with 1g.10gb, 1g.10gb, 3g.40gb; GPU 1 MIG-capable, MIG off;
    GPU 2 without MIG."""
    sim.devices = 3
    sim.mig = ["on:1g.10gb,1g.10gb,3g.40gb", "off", ""]
    return sim


@pytest.fixture
def nvml(mig: SimConfig, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from open_nvml(mig, monkeypatch)


def mig_devices(dev) -> list[Any]:  # type: ignore[no-untyped-def]
    out = []
    for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(dev)):
        try:
            out.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(dev, k))
        except pynvml.NVMLError_NotFound:
            break
    return out


def profile_id(dev, index: int) -> int:  # type: ignore[no-untyped-def]
    return int(pynvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, index).id)


def create(dev, index: int, start: int | None = None):  # type: ignore[no-untyped-def]
    """A GPU instance of NVML profile `index` (at `start`) with its compute instance."""
    pid = profile_id(dev, index)
    if start is None:
        gi = pynvml.nvmlDeviceCreateGpuInstance(dev, pid)
    else:
        placements = placements_of(dev, pid)
        place = next(p for p in placements if p.start == start)
        gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(dev, pid, pynvml.byref(place))
    slices = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, index).sliceCount
    ci_profile = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[slices]
    pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
    return gi


def placements_of(dev, pid: int) -> list[Any]:  # type: ignore[no-untyped-def]
    count = pynvml.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(dev, pid, None, pynvml.byref(count))
    arr = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(dev, pid, arr, pynvml.byref(count))
    return list(arr)[: count.value]


def gpu_instances(dev) -> list[Any]:  # type: ignore[no-untyped-def]
    """Every GPU instance of the device, all profiles."""
    out = []
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            pid = profile_id(dev, index)
        except pynvml.NVMLError_NotSupported:
            continue
        arr = (pynvml.c_nvmlGpuInstance_t * 8)()
        count = pynvml.c_uint(0)
        pynvml.nvmlDeviceGetGpuInstances(dev, pid, arr, pynvml.byref(count))
        out.extend(arr[k] for k in range(count.value))
    return out


def destroy_all(dev) -> None:  # type: ignore[no-untyped-def]
    for gi in gpu_instances(dev):
        for ci_profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            arr = (pynvml.c_nvmlComputeInstance_t * 8)()
            count = pynvml.c_uint(0)
            pynvml.nvmlGpuInstanceGetComputeInstances(gi, ci_profile, arr, pynvml.byref(count))
            for k in range(count.value):
                pynvml.nvmlComputeInstanceDestroy(arr[k])
        pynvml.nvmlGpuInstanceDestroy(gi)


# ---- modes ----

def test_modes_and_names_follow_the_config(nvml: None) -> None:
    assert pynvml.nvmlDeviceGetMigMode(h(0)) == [1, 1]
    assert pynvml.nvmlDeviceGetMigMode(h(1)) == [0, 0]
    assert nvml_error(pynvml.nvmlDeviceGetMigMode, h(2)) == pynvml.NVML_ERROR_NOT_SUPPORTED
    for i in (0, 1):  # MIG-capable devices are the model's GPU
        assert pynvml.nvmlDeviceGetName(h(i)) == "NVIDIA H100 80GB HBM3"
        assert pynvml.nvmlDeviceGetMemoryInfo(h(i)).total == 81559 * MiB
    assert pynvml.nvmlDeviceGetMemoryInfo(h(2)).total == 1 * GiB
    assert [pynvml.nvmlDeviceGetMaxMigDeviceCount(h(i)) for i in range(3)] == [7, 0, 0]
    # as NVML: no GPU-wide utilization in MIG mode
    assert nvml_error(pynvml.nvmlDeviceGetUtilizationRates, h(0)) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert pynvml.nvmlDeviceGetUtilizationRates(h(1)).gpu == 0


def test_mode_changes_at_once_and_disabling_needs_no_instances(nvml: None) -> None:
    assert pynvml.nvmlDeviceSetMigMode(h(1), pynvml.NVML_DEVICE_MIG_ENABLE) == 0
    assert pynvml.nvmlDeviceGetMigMode(h(1)) == [1, 1]
    assert mig_devices(h(1)) == []
    assert pynvml.nvmlDeviceSetMigMode(h(1), pynvml.NVML_DEVICE_MIG_DISABLE) == 0
    assert pynvml.nvmlDeviceGetMigMode(h(1)) == [0, 0]
    # GPU 0 still has instances: disabling is refused and changes nothing
    assert nvml_error(pynvml.nvmlDeviceSetMigMode, h(0), pynvml.NVML_DEVICE_MIG_DISABLE) == IN_USE
    assert len(mig_devices(h(0))) == 3
    destroy_all(h(0))
    assert pynvml.nvmlDeviceSetMigMode(h(0), pynvml.NVML_DEVICE_MIG_DISABLE) == 0
    assert nvml_error(pynvml.nvmlDeviceSetMigMode, h(2), pynvml.NVML_DEVICE_MIG_ENABLE) == \
        pynvml.NVML_ERROR_NOT_SUPPORTED
    # profiles and instances need MIG mode, as on NVML
    assert nvml_error(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h(1), 0) == \
        pynvml.NVML_ERROR_NOT_SUPPORTED


# ---- profiles ----

@pytest.mark.parametrize("model,table,gpu_mib", [("h100-80gb", H100, 81559),
                                                 ("a100-40gb", A100, 40960)])
def test_profiles_of_both_models(sim: SimConfig, monkeypatch: pytest.MonkeyPatch, model: str,
                                 table: list[tuple[Any, ...]], gpu_mib: int) -> None:
    sim.mig, sim.mig_model = ["on"], model
    gen = open_nvml(sim, monkeypatch)
    next(gen)
    try:
        with SimReader(sim.state_path) as r:
            assert r.config().mig_model == model
        dev = h(0)
        assert pynvml.nvmlDeviceGetMemoryInfo(dev).total == gpu_mib * MiB
        seen = set()
        for name, index, pid, slices, mib, sms, count, starts, size in table:
            v1 = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, index, version=1)
            v2 = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, index)
            for info in (v1, v2):
                assert (info.id, info.sliceCount, info.memorySizeMB, info.multiprocessorCount,
                        info.instanceCount) == (pid, slices, mib, sms, count), name
            assert v2.name == f"MIG {name}"
            v3 = ProfileInfoV3(version=0x03000098)  # nvmlGpuInstanceProfileInfo_v3
            fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
            assert fn(dev, index, pynvml.byref(v3)) == 0
            assert (v3.id, v3.sliceCount, v3.memorySizeMB, v3.name, v3.capabilities) == \
                (pid, slices, mib, f"MIG {name}".encode(), 0)
            assert [(p.start, p.size) for p in placements_of(dev, pid)] == \
                [(s, size) for s in starts]
            assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, pid) == count
            seen.add(index)
        for index in set(range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)) - seen:
            assert nvml_error(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, dev, index) == \
                pynvml.NVML_ERROR_NOT_SUPPORTED
    finally:
        next(gen, None)


# ---- instances and placements ----

def test_configured_instances_and_their_mig_devices(nvml: None, mig: SimConfig) -> None:
    devs = mig_devices(h(0))
    got = [(pynvml.nvmlDeviceGetGpuInstanceId(d), pynvml.nvmlDeviceGetComputeInstanceId(d),
            pynvml.nvmlDeviceGetName(d), pynvml.nvmlDeviceGetMemoryInfo(d).total,
            pynvml.nvmlDeviceGetAttributes_v2(d).multiprocessorCount) for d in devs]
    # created in order at the highest free start: 1g at 6 and 5 (ids 13, 12), then the
    # 3g.40gb at 0 (id 1); listed by GPU instance id
    assert got == [(1, 0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40448 * MiB, 60),
                   (12, 0, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9984 * MiB, 16),
                   (13, 0, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9984 * MiB, 16)]
    uuids = [pynvml.nvmlDeviceGetUUID(d) for d in devs]
    assert all(u.startswith("MIG-") and len(u) == 40 for u in uuids) and len(set(uuids)) == 3
    for d, u in zip(devs, uuids, strict=True):
        assert pynvml.nvmlDeviceIsMigDeviceHandle(d)
        same = pynvml.nvmlDeviceGetHandleByUUID(u.encode())
        assert pynvml.nvmlDeviceGetUUID(same) == u
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(d)
        assert pynvml.nvmlDeviceGetIndex(parent) == 0
    assert not pynvml.nvmlDeviceIsMigDeviceHandle(h(0))
    assert nvml_error(pynvml.nvmlDeviceGetAttributes_v2, h(0)) == pynvml.NVML_ERROR_NOT_SUPPORTED
    with SimReader(mig.state_path) as r:
        state = r.mig(0)
        assert state.capable and state.enabled
        assert [(i.profile, i.gi_id, i.start, i.size, i.uuid) for i in state.instances] == [
            ("3g.40gb", 1, 0, 4, uuids[0]), ("1g.10gb", 12, 5, 1, uuids[1]),
            ("1g.10gb", 13, 6, 1, uuids[2])]
        assert r.mig(1) == type(state)(capable=True, enabled=False)
        assert not r.mig(2).capable
        cfg = r.config()
        assert cfg.mig == ["on:3g.40gb,1g.10gb,1g.10gb", "off", ""]
        assert (cfg.mig_model, cfg.memory) == ("h100-80gb", 1 * GiB)


def test_uuids_are_deterministic(mig: SimConfig, tmp_path: Any) -> None:
    first = mig_uuids(mig)
    mig.state_path = tmp_path / "again"
    assert mig_uuids(mig) == first


def test_placements_overlaps_and_capacity(nvml: None) -> None:
    dev = h(1)
    pynvml.nvmlDeviceSetMigMode(dev, pynvml.NVML_DEVICE_MIG_ENABLE)
    p3g = profile_id(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    p1g = profile_id(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    p2g = profile_id(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE)
    p7g = profile_id(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
    gi = create(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, start=4)
    info = pynvml.nvmlGpuInstanceGetInfo(gi)
    assert (info.id, info.profileId, info.placement.start, info.placement.size) == (2, p3g, 4, 4)

    def place(start: int, size: int) -> Any:  # NVML takes a pointer; pynvml passes it on as is
        return pynvml.byref(pynvml.c_nvmlGpuInstancePlacement_t(start, size))

    # overlapping the 3g (slices 4-7): refused; not a valid start or size: invalid
    assert nvml_error(pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, dev, p1g, place(5, 1)) == NO_ROOM
    assert nvml_error(pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, dev, p2g, place(1, 2)) == INVALID
    assert nvml_error(pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, dev, p2g, place(0, 1)) == INVALID
    assert nvml_error(pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, dev, p1g, place(7, 1)) == INVALID
    assert nvml_error(pynvml.nvmlDeviceCreateGpuInstance, dev, 12345) == INVALID
    assert nvml_error(pynvml.nvmlDeviceCreateGpuInstance, dev, p7g) == NO_ROOM
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, p7g) == 0
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, p3g) == 1
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, p2g) == 2
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, p1g) == 4
    for start in (3, 2, 1, 0):  # 1g instances fill slices 0-3 from the end: compute 3 + 4 = 7
        gi1 = create(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
        assert pynvml.nvmlGpuInstanceGetInfo(gi1).placement.start == start
    assert nvml_error(pynvml.nvmlDeviceCreateGpuInstance, dev, p1g) == NO_ROOM
    assert [pynvml.nvmlDeviceGetGpuInstanceId(d) for d in mig_devices(dev)] == [2, 7, 8, 9, 10]
    assert pynvml.nvmlDeviceGetGpuInstanceById(dev, 9)
    assert nvml_error(pynvml.nvmlDeviceGetGpuInstanceById, dev, 11) == pynvml.NVML_ERROR_NOT_FOUND
    # a GPU instance with its compute instance cannot go first
    assert nvml_error(pynvml.nvmlGpuInstanceDestroy, gi) == IN_USE
    destroy_all(dev)
    assert mig_devices(dev) == [] and gpu_instances(dev) == []
    assert nvml_error(pynvml.nvmlGpuInstanceDestroy, gi) == INVALID  # stale handle
    seven = [create(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE) for _ in range(7)]
    assert len(seven) == 7 and pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, p1g) == 0


# Every layout that fits, created largest profile first without placements.
LAYOUTS = [["3g.40gb", "2g.20gb", "2g.20gb"], ["4g.40gb", "2g.20gb", "1g.10gb"],
           ["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"], ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
           ["4g.40gb", "1g.20gb", "1g.10gb", "1g.10gb"], ["3g.40gb", "3g.40gb"], ["7g.80gb"],
           ["1g.20gb"] * 4, ["1g.10gb"] * 7]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["-".join(x) for x in LAYOUTS])
def test_layouts_created_largest_first_fit(sim: SimConfig, layout: list[str]) -> None:
    sim.mig = ["on:" + ",".join(layout)]
    with mock.patch.dict(os.environ, sim.env()), SimReader(sim.state_path, create=True) as r:
        assert sorted(i.profile for i in r.mig(0).instances) == sorted(layout)


def test_compute_instances_span_their_gpu_instance(nvml: None) -> None:
    dev = h(1)
    pynvml.nvmlDeviceSetMigMode(dev, pynvml.NVML_DEVICE_MIG_ENABLE)
    pid = profile_id(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE)
    gi = pynvml.nvmlDeviceCreateGpuInstance(dev, pid)
    assert mig_devices(dev) == []  # no compute instance yet: no MIG device
    full = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE
    info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, full, 0)
    assert (info.id, info.sliceCount, info.multiprocessorCount) == (full, 2, 32)
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, full) == 1
    ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, full)
    assert nvml_error(pynvml.nvmlGpuInstanceCreateComputeInstance, gi, full) == NO_ROOM
    cinfo = pynvml.nvmlComputeInstanceGetInfo(ci)
    assert (cinfo.id, cinfo.profileId, cinfo.placement.size) == (0, full, 2)
    (d,) = mig_devices(dev)
    assert pynvml.nvmlDeviceGetAttributes_v2(d).gpuInstanceSliceCount == 2
    pynvml.nvmlComputeInstanceDestroy(ci)
    assert mig_devices(dev) == []
    assert nvml_error(pynvml.nvmlDeviceGetUUID, d) == INVALID  # its handle went with it
    pynvml.nvmlGpuInstanceDestroy(gi)


def test_instances_made_in_one_process_are_seen_by_another(nvml: None, mig: SimConfig) -> None:
    dev = h(1)
    pynvml.nvmlDeviceSetMigMode(dev, pynvml.NVML_DEVICE_MIG_ENABLE)
    create(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE)
    mine = sorted(pynvml.nvmlDeviceGetUUID(d) for d in mig_devices(h(0)) + mig_devices(dev))
    code = textwrap.dedent("""
        import sys, pynvml
        from py_vcuda import nvml as vnvml
        vnvml._load(sys.argv[1])
        pynvml.nvmlInit()
        for i in range(pynvml.nvmlDeviceGetCount()):
            dev = pynvml.nvmlDeviceGetHandleByIndex(i)
            for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(dev)):
                try:
                    m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(dev, k)
                except pynvml.NVMLError_NotFound:
                    break
                print(pynvml.nvmlDeviceGetUUID(m))
    """)
    env = {**os.environ, **mig.env()}
    out = subprocess.run([sys.executable, "-c", code, env["VCUDA_REAL_LIBNVML"]], env=env,
                         capture_output=True, text=True, timeout=30, check=True).stdout
    assert sorted(out.split()) == mine and len(mine) == 4


@pytest.mark.parametrize("value", ["on:9g.90gb", "on:7g.80gb,1g.10gb", "maybe", "on;off;off;off"])
def test_bad_mig_config_is_refused(mig: SimConfig, value: str) -> None:
    env = {**os.environ, **mig.env(), "VCUDA_SIM_MIG": value}
    code = "import ctypes,sys; l=ctypes.CDLL(sys.argv[1]); sys.exit(l.nvmlInit_v2())"
    proc = subprocess.run([sys.executable, "-c", code, env["VCUDA_REAL_LIBNVML"]], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == pynvml.NVML_ERROR_DRIVER_NOT_LOADED, proc.stderr
    assert "VCUDA_SIM_MIG" in proc.stderr


# ---- CUDA on MIG devices ----

def mig_uuids(cfg: SimConfig, device: int = 0) -> list[str]:
    """The MIG devices' UUIDs (creating the state file from cfg if needed)."""
    with mock.patch.dict(os.environ, cfg.env()), SimReader(cfg.state_path, create=True) as r:
        return [i.uuid for i in r.mig(device).instances]


def visible(uuid: str) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": uuid}


def test_cuda_sees_only_the_named_instance(mig: SimConfig, tool: Callable[..., list[Line]]) -> None:
    big, small, _ = mig_uuids(mig)
    out = tool("init", "count", "name", "0", "uuid", "0", "attr", "16", "info", env=visible(big))
    assert lines(out, "count")[0].rest == ["1"]
    assert " ".join(lines(out, "name")[0].rest) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert lines(out, "uuid")[0].rest == [big[4:].replace("-", "")]
    assert lines(out, "attr")[0].rest == ["60"]  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    # a prefix is enough, as for GPU UUIDs
    out = tool("init", "count", "name", "0", env=visible(small[:12]))
    assert lines(out, "count")[0].rest == ["1"]
    assert lines(out, "name")[0].rest[-1] == "1g.10gb"
    with SimReader(mig.state_path) as r:
        gpu0 = r.device(0).uuid
    out = tool("init", "count", "uuid", "0", env=visible(f"MIG-{gpu0}/12/0"))  # the older form
    assert lines(out, "count")[0].rest == ["1"]
    assert lines(out, "uuid")[0].rest == [small[4:].replace("-", "")]
    out = tool("init", "count", env=visible(f"{big},{big}"))  # a repeat ends the list
    assert lines(out, "count")[0].rest == ["1"]


def test_gpu_in_mig_mode_is_never_a_whole_gpu(mig: SimConfig, tool: Callable[..., list[Line]]) -> None:
    # unset: GPU 0's three MIG devices, GPU 1 and GPU 2 (MIG off, no MIG)
    out = tool("init", "count", "name", "0", "name", "3", "name", "4")
    assert lines(out, "count")[0].rest == ["5"]
    names = [" ".join(ln.rest) for ln in lines(out, "name")]
    assert names == ["NVIDIA H100 80GB HBM3 MIG 3g.40gb", "NVIDIA H100 80GB HBM3",
                     "vcuda simulated GPU"]
    out = tool("init", "count", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert lines(out, "count")[0].rest == ["3"]


def test_memory_is_the_instances(mig: SimConfig, tool: Callable[..., list[Line]]) -> None:
    _, small, other = mig_uuids(mig)
    out = tool("init", "ctx", "0", "info", "fill", "1G", env=visible(small))
    free, total = (int(v) for v in lines(out, "info")[0].rest)
    assert total == 9984 * MiB and free == total - mig.context_overhead
    fill = lines(out, "fill")[0]
    assert fill.rest == [str(free // GiB)]  # 9 GiB fit beside the context, then
    assert fill.rc == 2  # CUDA_ERROR_OUT_OF_MEMORY, though the GPU has 80 GB


def test_nvml_reports_processes_per_instance(mig: SimConfig, children: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    big, small, _ = mig_uuids(mig)
    proc = children.spawn("init", "ctx", "0", "alloc", "1G", "ready", env=visible(small))
    children.ready(proc)
    gen = open_nvml(mig, monkeypatch)
    next(gen)
    try:
        dsmall = pynvml.nvmlDeviceGetHandleByUUID(small.encode())
        dbig = pynvml.nvmlDeviceGetHandleByUUID(big.encode())
        (p,) = pynvml.nvmlDeviceGetComputeRunningProcesses(dsmall)
        assert p.pid == proc.pid and p.usedGpuMemory == GiB + mig.context_overhead
        assert (p.gpuInstanceId, p.computeInstanceId) == (12, 0)
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(dbig) == []
        assert pynvml.nvmlDeviceGetMemoryInfo(dsmall).used == GiB + mig.context_overhead
        assert [q.pid for q in pynvml.nvmlDeviceGetComputeRunningProcesses(h(0))] == [proc.pid]
        assert pynvml.nvmlDeviceGetMemoryInfo(h(0)).used == GiB + mig.context_overhead
        # busy: no mode change, no destroying its instances
        assert nvml_error(pynvml.nvmlDeviceSetMigMode, h(0), 0) == IN_USE
        gi = pynvml.nvmlDeviceGetGpuInstanceById(h(0), 12)
        arr = (pynvml.c_nvmlComputeInstance_t * 1)()
        count = pynvml.c_uint(0)
        pynvml.nvmlGpuInstanceGetComputeInstances(gi, 0, arr, pynvml.byref(count))
        assert nvml_error(pynvml.nvmlComputeInstanceDestroy, arr[0]) == IN_USE
        children.release(proc)
        pynvml.nvmlComputeInstanceDestroy(arr[0])  # idle now
    finally:
        next(gen, None)


def test_busy_gpu_refuses_mig_mode(mig: SimConfig, children: Any,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    proc = children.spawn("init", "ctx", "0", "ready", env={"CUDA_VISIBLE_DEVICES": "1"})
    children.ready(proc)
    gen = open_nvml(mig, monkeypatch)
    next(gen)
    try:
        assert nvml_error(pynvml.nvmlDeviceSetMigMode, h(1), 1) == IN_USE
        assert pynvml.nvmlDeviceGetMigMode(h(1)) == [0, 0]
        children.release(proc)
        assert pynvml.nvmlDeviceSetMigMode(h(1), 1) == 0
    finally:
        next(gen, None)


def busy_on(r: SimReader, device: int) -> dict[int, int]:
    return {p.pid: p.busy_ns for p in r.processes(device)}


@pytest.mark.parametrize("same", [False, True])
def test_instances_do_not_time_slice_with_each_other(mig: SimConfig, children: Any,
                                                     same: bool) -> None:
    _, a, b = mig_uuids(mig)
    targets = (a, a) if same else (a, b)
    # 2 s of kernels queued each, far more than the window
    procs = [children.spawn("init", "primary", "0", "launch", "1000", "2000", "ready", "sync",
                            env=visible(u)) for u in targets]
    for p in procs:
        children.ready(p)
    with SimReader(mig.state_path) as r:
        devs = {i.uuid: i.device for i in r.mig(0).instances}
        where = [devs[u] for u in targets]
        t0 = r.now_ns()
        b0 = [busy_on(r, d)[p.pid] for d, p in zip(where, procs, strict=True)]
        time.sleep(0.5)
        b1 = [busy_on(r, d)[p.pid] for d, p in zip(where, procs, strict=True)]
        t1 = r.now_ns()
        pending = [{q.pid: q.pending_ns for q in r.processes(d)}[p.pid]
                   for d, p in zip(where, procs, strict=True)]
    assert all(x > 0 for x in pending), ("a queue ran dry inside the window", pending)
    served = sum(y - x for x, y in zip(b0, b1, strict=True)) / (t1 - t0)
    if same:  # one instance runs one kernel at a time: the two share its time
        assert served <= 1.0, served
        assert all(y > x for x, y in zip(b0, b1, strict=True))
    else:  # two instances run at once: together far more than one timeline could
        assert served >= 1.6, served

def test_a_gpu_switched_to_mig_takes_no_more_work(mig: SimConfig, children: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # attached (cuInit) to GPU 1 before the switch, no context yet: the GPU is idle
    proc = children.spawn("init", "ready", "ctx", "0", env={"CUDA_VISIBLE_DEVICES": "1"})
    children.ready(proc)
    gen = open_nvml(mig, monkeypatch)
    next(gen)
    try:
        assert pynvml.nvmlDeviceSetMigMode(h(1), 1) == 0
    finally:
        next(gen, None)
    assert lines(children.release(proc), "ctx")[0].rc == 101  # CUDA_ERROR_INVALID_DEVICE


def test_mig_handles_follow_their_gpu(nvml: None, mig: SimConfig) -> None:
    (d, *_) = mig_devices(h(0))
    # GPU-wide queries do not apply to a MIG device, as on NVML
    assert nvml_error(pynvml.nvmlDeviceGetUtilizationRates, d) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml_error(pynvml.nvmlDeviceGetMigMode, d) == pynvml.NVML_ERROR_NOT_SUPPORTED
    with SimReader(mig.state_path) as r:
        r.set_lost(0)
        assert nvml_error(pynvml.nvmlDeviceGetUUID, d) == pynvml.NVML_ERROR_GPU_IS_LOST
        r.set_lost(0, False)
    assert pynvml.nvmlDeviceGetUUID(d).startswith("MIG-")
