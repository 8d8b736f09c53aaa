"""Devices as CUDA sees them (CUDA_VISIBLE_DEVICES) and as NVML sees them."""

from __future__ import annotations

import ctypes

import pytest

from py_vcuda.sim import GiB, MiB, SimConfig

NO_DEVICE = 100


@pytest.fixture
def four(sim: SimConfig) -> SimConfig:
    sim.devices = 4
    sim.names = ["sim A", "sim B", "sim C", "sim D"]
    return sim


def uuid_hex(index: int) -> str:
    return f"5157a0c0{index:04x}40008000{index:012x}"


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, [0, 1, 2, 3]),
        ("2,0", [2, 0]),
        ("GPU-5157a0c0-0003", [3]),  # a unique UUID prefix
        ("1,foo,2", [1]),  # the list ends at the first invalid entry
        ("3,3,1", [3]),  # and at a repeated one
        ("7", []),
        ("", []),
    ],
)
def test_cuda_visible_devices(tool, four: SimConfig, visible, expected) -> None:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    cmds = ["init", "count"]
    for i in range(len(expected)):
        cmds += ["uuid", str(i), "name", str(i)]
    out = tool(*cmds, env=env)
    assert out[0].rc == (0 if expected else NO_DEVICE)
    assert out[1].rest == [str(len(expected))]
    uuids = [ln.rest[0] for ln in out if ln.cmd == "uuid"]
    names = [" ".join(ln.rest) for ln in out if ln.cmd == "name"]
    assert uuids == [uuid_hex(i) for i in expected]
    assert names == [f"sim {'ABCD'[i]}" for i in expected]


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class ProcV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class Proc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


@pytest.fixture
def nvml(four: SimConfig, monkeypatch: pytest.MonkeyPatch):
    for k, v in four.env().items():
        monkeypatch.setenv(k, v)
    lib = ctypes.CDLL(four.env()["VCUDA_REAL_LIBNVML"])
    assert lib.nvmlInit_v2() == 0
    yield lib
    assert lib.nvmlShutdown() == 0


def handle(nvml, index: int) -> ctypes.c_void_p:
    h = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(h)) == 0
    return h


def test_nvml_devices(nvml) -> None:
    n = ctypes.c_uint()
    assert nvml.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0 and n.value == 4
    buf = ctypes.create_string_buffer(96)
    h = handle(nvml, 2)
    assert nvml.nvmlDeviceGetUUID(h, buf, 96) == 0
    assert buf.value.decode() == "GPU-5157a0c0-0002-4000-8000-000000000002"
    h2 = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByUUID(buf, ctypes.byref(h2)) == 0 and h2.value == h.value
    assert nvml.nvmlDeviceGetName(h, buf, 96) == 0 and buf.value == b"sim C"
    idx = ctypes.c_uint()
    assert nvml.nvmlDeviceGetIndex(h, ctypes.byref(idx)) == 0 and idx.value == 2
    v = ctypes.c_int()
    assert nvml.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(v)) == 0 and v.value == 13000
    assert nvml.nvmlDeviceGetHandleByIndex_v2(4, ctypes.byref(h2)) == 2  # INVALID_ARGUMENT


def test_nvml_memory_and_processes(nvml, children, four: SimConfig) -> None:
    # NVML ignores CUDA_VISIBLE_DEVICES: the child's device 0 is physical 1.
    children.env = {**children.env, "CUDA_VISIBLE_DEVICES": "1"}
    a = children.spawn("init", "primary", "0", "alloc", "100M", "ready")
    b = children.spawn("init", "primary", "0", "alloc", "200M", "ready")
    children.ready(a)
    children.ready(b)
    h = handle(nvml, 1)
    m = Memory()
    assert nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) == 0
    used = 300 * MiB + 2 * 64 * MiB
    assert (m.total, m.used, m.free) == (1 * GiB, used, 1 * GiB - used)
    m2 = MemoryV2(version=ctypes.sizeof(MemoryV2) | (2 << 24))
    assert nvml.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m2)) == 0 and m2.used == used
    m2.version = 1
    assert nvml.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m2)) == 25  # version mismatch

    count = ctypes.c_uint(0)
    assert nvml.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(count), None) == 7
    assert count.value == 2
    procs = (Proc * 4)()
    count.value = 4
    assert nvml.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(count), procs) == 0
    got = {p.pid: p.usedGpuMemory for p in procs[: count.value]}
    assert got == {a.pid: 164 * MiB, b.pid: 264 * MiB}
    assert procs[0].gpuInstanceId == 0xFFFFFFFF
    count.value = 4
    assert nvml.nvmlDeviceGetComputeRunningProcesses_v2(h, ctypes.byref(count), procs) == 0
    v1 = (ProcV1 * 4)()
    count.value = 4
    assert nvml.nvmlDeviceGetComputeRunningProcesses(h, ctypes.byref(count), v1) == 0
    assert {p.pid for p in v1[: count.value]} == {a.pid, b.pid}
    count.value = 4  # device 0 has nobody
    assert nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle(nvml, 0), ctypes.byref(count),
                                                        procs) == 0
    assert count.value == 0

    a.kill()  # a dead process drops out of the view and its memory with it
    a.wait()
    assert nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) == 0 and m.used == 264 * MiB


def test_nvml_utilization(nvml, tool) -> None:
    tool("init", "primary", "0", "launch", "5", "100000", "sync")  # 0.5 s busy
    u = Util()
    assert nvml.nvmlDeviceGetUtilizationRates(handle(nvml, 0), ctypes.byref(u)) == 0
    assert 40 <= u.gpu <= 55, u.gpu
    assert nvml.nvmlDeviceGetUtilizationRates(handle(nvml, 1), ctypes.byref(u)) == 0
    assert u.gpu == 0
    t, p = ctypes.c_uint(), ctypes.c_uint()
    assert nvml.nvmlDeviceGetTemperature(handle(nvml, 0), 0, ctypes.byref(t)) == 0
    assert nvml.nvmlDeviceGetPowerUsage(handle(nvml, 0), ctypes.byref(p)) == 0
    assert t.value > 0 and p.value > 0
