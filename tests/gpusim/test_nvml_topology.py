"""The simulator's NVML topology, XID events and lost GPUs, seen through nvidia-ml-py
(pynvml), the way the device plugin sees them."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pynvml
import pytest
from simnvml import h, nvml_error, open_nvml

from py_vcuda.sim import SimConfig, SimReader

XID = pynvml.nvmlEventTypeXidCriticalError


@pytest.fixture
def four(sim: SimConfig) -> SimConfig:
    sim.devices = 4
    sim.numa = [0, 0, 1, 1]
    sim.nvlink = [(0, 1), (2, 3), (0, 2)]
    return sim


@pytest.fixture
def nvml4(four: SimConfig, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from open_nvml(four, monkeypatch)


@pytest.fixture
def nvml_plain(sim: SimConfig, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    sim.devices = 2
    yield from open_nvml(sim, monkeypatch)


# ---- topology ----

def test_pci_bus_ids_match_cuda_and_find_their_device(nvml4: None) -> None:
    for i in range(4):
        pci = pynvml.nvmlDeviceGetPciInfo_v3(h(i))
        assert pci.busId == f"00000000:{0x10 + i:02X}:00.0"  # pynvml decodes strings
        assert pci.busIdLegacy == f"0000:{0x10 + i:02X}:00.0"
        assert (pci.domain, pci.bus, pci.device) == (0, 0x10 + i, 0)
        assert pci.pciDeviceId & 0xFFFF == 0x10DE  # NVIDIA's vendor id
        same = pynvml.nvmlDeviceGetHandleByPciBusId(pci.busIdLegacy.lower().encode())
        assert pynvml.nvmlDeviceGetIndex(same) == i
    assert nvml_error(pynvml.nvmlDeviceGetHandleByPciBusId, b"0000:99:00.0") == \
        pynvml.NVML_ERROR_NOT_FOUND
    assert nvml_error(pynvml.nvmlDeviceGetHandleByPciBusId, b"junk") == \
        pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_numa_nodes_and_cpu_affinity(nvml4: None) -> None:
    assert [pynvml.nvmlDeviceGetNumaNodeId(h(i)) for i in range(4)] == [0, 0, 1, 1]
    ncpu = os.cpu_count() or 1
    words = (ncpu + 63) // 64
    masks = [sum(w << (64 * k) for k, w in enumerate(pynvml.nvmlDeviceGetCpuAffinity(h(i), words)))
             for i in range(4)]
    assert masks[0] == masks[1] and masks[2] == masks[3]
    assert masks[0] and masks[2]
    if ncpu >= 2:  # two nodes split the CPUs: disjoint, together all of them
        assert masks[0] & masks[2] == 0
        assert masks[0] | masks[2] == (1 << ncpu) - 1


def test_no_numa_is_not_supported(nvml_plain: None) -> None:
    assert nvml_error(pynvml.nvmlDeviceGetNumaNodeId, h(0)) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml_error(pynvml.nvmlDeviceGetCpuAffinity, h(0), 1) == \
        pynvml.NVML_ERROR_NOT_SUPPORTED
    assert pynvml.nvmlDeviceGetTopologyCommonAncestor(h(0), h(1)) == pynvml.NVML_TOPOLOGY_NODE
    assert nvml_error(pynvml.nvmlDeviceGetNvLinkState, h(0), 0) == \
        pynvml.NVML_ERROR_NOT_SUPPORTED


def active_peers(i: int) -> list[int]:
    peers = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if not pynvml.nvmlDeviceGetNvLinkState(h(i), link):
                continue
        except pynvml.NVMLError as exc:
            assert exc.value == pynvml.NVML_ERROR_INVALID_ARGUMENT  # past the last link
            break
        remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h(i), link)
        peers.append(pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(remote.busId)))
    return peers


def test_nvlink_links_lead_to_the_configured_peers(nvml4: None) -> None:
    assert [active_peers(i) for i in range(4)] == [[1, 2], [0], [0, 3], [2]]
    # a link that is down has nothing at its other end
    assert pynvml.nvmlDeviceGetNvLinkState(h(1), 1) == 0
    assert nvml_error(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h(1), 1) == \
        pynvml.NVML_ERROR_NOT_SUPPORTED
    assert pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h(0), 0) == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU


def test_nvswitch_fabric(sim: SimConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    sim.devices, sim.nvswitch = 2, True
    gen = open_nvml(sim, monkeypatch)
    next(gen)
    try:
        for link in range(18):  # an HGX H100: 18 links, spread over 4 switches
            assert pynvml.nvmlDeviceGetNvLinkState(h(0), link) == 1
            assert pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h(0), link) == \
                pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
            remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h(0), link)
            assert remote.busId == f"00000000:{0xC0 + link % 4:02X}:00.0"
            assert nvml_error(pynvml.nvmlDeviceGetHandleByPciBusId, remote.busId.encode()) == \
                pynvml.NVML_ERROR_NOT_FOUND  # a switch, not a GPU
        assert nvml_error(pynvml.nvmlDeviceGetNvLinkState, h(1), 18) == \
            pynvml.NVML_ERROR_INVALID_ARGUMENT  # past the last link
    finally:
        next(gen, None)


@pytest.mark.parametrize(("a", "b", "level"), [
    (0, 0, pynvml.NVML_TOPOLOGY_INTERNAL),
    (0, 1, pynvml.NVML_TOPOLOGY_NODE),      # same NUMA node
    (2, 3, pynvml.NVML_TOPOLOGY_NODE),
    (0, 2, pynvml.NVML_TOPOLOGY_SYSTEM),    # across NUMA nodes (NVLink is not a PCIe path)
    (3, 1, pynvml.NVML_TOPOLOGY_SYSTEM),
])
def test_common_ancestor_follows_numa(nvml4: None, a: int, b: int, level: int) -> None:
    assert pynvml.nvmlDeviceGetTopologyCommonAncestor(h(a), h(b)) == level


def test_reader_reports_topology(four: SimConfig, tool) -> None:  # type: ignore[no-untyped-def]
    tool("init")  # creates the state file from four's env
    with SimReader(four.state_path) as r:
        cfg = r.config()
        assert cfg.numa == [0, 0, 1, 1]
        assert cfg.nvlink == [(0, 1), (0, 2), (2, 3)]
        assert r.device(0).nvlink_peers == {1, 2}


@pytest.mark.parametrize(("var", "value"), [
    ("VCUDA_SIM_NUMA", "0,0,1"),      # fewer entries than devices
    ("VCUDA_SIM_NUMA", "0,0,1,1,1"),  # more
    ("VCUDA_SIM_NUMA", "0,x,1,1"),
    ("VCUDA_SIM_NVLINK", "0-4"),      # no device 4
    ("VCUDA_SIM_NVLINK", "1-1"),
    ("VCUDA_SIM_NVLINK", "0-1,2"),
    ("VCUDA_SIM_NVLINK", "switches"),
])
def test_bad_topology_config_is_refused(four: SimConfig, var: str, value: str) -> None:
    env = {**os.environ, **four.env(), var: value}
    code = "import ctypes,sys; l=ctypes.CDLL(sys.argv[1]); sys.exit(l.nvmlInit_v2())"
    proc = subprocess.run([sys.executable, "-c", code, env["VCUDA_REAL_LIBNVML"]], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == pynvml.NVML_ERROR_DRIVER_NOT_LOADED, proc.stderr
    assert var in proc.stderr


# ---- XID events ----

def registered_set(devices: list[int]):  # type: ignore[no-untyped-def]
    es = pynvml.nvmlEventSetCreate()
    for i in devices:
        assert pynvml.nvmlDeviceGetSupportedEventTypes(h(i)) & XID
        pynvml.nvmlDeviceRegisterEvents(h(i), XID, es)
    return es


def wait_event(es, timeout_ms: int = 10_000):  # type: ignore[no-untyped-def]
    return pynvml.nvmlEventSetWait_v2(es, timeout_ms)


def test_injected_xids_are_delivered_in_order(nvml4: None, four: SimConfig) -> None:
    with SimReader(four.state_path) as r:
        r.inject_xid(1, 13)  # before registration: not delivered
        es = registered_set([1, 3])
        try:
            assert r.inject_xid(1, 48) == 2
            r.inject_xid(3, 79)
            r.inject_xid(0, 31)  # not registered
            got = []
            for _ in range(2):
                ev = wait_event(es)
                assert ev.eventType == XID
                got.append((pynvml.nvmlDeviceGetIndex(ev.device), ev.eventData))
            assert sorted(got) == [(1, 48), (3, 79)]
            assert nvml_error(pynvml.nvmlEventSetWait_v2, es, 0) == pynvml.NVML_ERROR_TIMEOUT
            assert r.device(1).xids == 2
        finally:
            pynvml.nvmlEventSetFree(es)


def test_wait_wakes_on_injection_and_sleeps_meanwhile(nvml4: None, four: SimConfig) -> None:
    es = registered_set([0])
    try:
        cpu0, wall0 = time.process_time(), time.monotonic()
        assert nvml_error(pynvml.nvmlEventSetWait_v2, es, 500) == pynvml.NVML_ERROR_TIMEOUT
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        assert wall >= 0.49  # the timeout is honoured ...
        assert cpu < wall / 2  # ... asleep, not spinning

        def inject() -> None:
            time.sleep(0.2)
            with SimReader(four.state_path) as r:
                r.inject_xid(0, 94)

        t = threading.Thread(target=inject)
        t.start()
        t0 = time.monotonic()
        ev = wait_event(es, 120_000)
        t.join()
        assert ev.eventData == 94
        assert time.monotonic() - t0 < 60  # woken by the injection, not by the timeout
    finally:
        pynvml.nvmlEventSetFree(es)


def test_a_slow_reader_skips_to_the_oldest_kept_event(nvml4: None, four: SimConfig) -> None:
    es = registered_set([2])
    try:
        with SimReader(four.state_path) as r:
            for xid in range(1, 101):
                r.inject_xid(2, xid)
        got = [wait_event(es).eventData for _ in range(64)]
        assert got == list(range(37, 101))  # the ring keeps the last 64
        assert nvml_error(pynvml.nvmlEventSetWait_v2, es, 0) == pynvml.NVML_ERROR_TIMEOUT
    finally:
        pynvml.nvmlEventSetFree(es)


class LegacyEventData(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong),
                ("eventData", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


def test_legacy_wait_fills_only_the_old_fields(nvml4: None, four: SimConfig) -> None:
    es = registered_set([3])
    try:
        with SimReader(four.state_path) as r:
            r.inject_xid(3, 92)
        data = LegacyEventData(gpuInstanceId=7, computeInstanceId=7)
        wait = pynvml.nvmlLib.nvmlEventSetWait  # the pre-11.0 entry point, no instance ids
        assert wait(es, ctypes.byref(data), ctypes.c_uint(10_000)) == pynvml.NVML_SUCCESS
        assert (data.eventType, data.eventData) == (XID, 92)
        assert (data.gpuInstanceId, data.computeInstanceId) == (7, 7)
    finally:
        pynvml.nvmlEventSetFree(es)


def test_unsupported_event_types_are_refused(nvml4: None) -> None:
    es = pynvml.nvmlEventSetCreate()
    try:
        assert nvml_error(pynvml.nvmlDeviceRegisterEvents, h(0),
                          pynvml.nvmlEventTypeSingleBitEccError, es) == \
            pynvml.NVML_ERROR_NOT_SUPPORTED
    finally:
        pynvml.nvmlEventSetFree(es)


WATCHER = textwrap.dedent("""
    import sys, pynvml
    pynvml.nvmlLib = __import__("ctypes").CDLL(sys.argv[1])
    pynvml.nvmlInit()
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(2),
                                    pynvml.nvmlEventTypeXidCriticalError, es)
    print("ready", flush=True)
    for _ in range(2):
        ev = pynvml.nvmlEventSetWait_v2(es, 600000)  # the parent gives up long before this
        print(pynvml.nvmlDeviceGetIndex(ev.device), ev.eventData, flush=True)
""")


def test_events_reach_every_registered_process(four: SimConfig, tool) -> None:  # type: ignore[no-untyped-def]
    tool("init")
    env = {**os.environ, **four.env()}
    procs = [subprocess.Popen([sys.executable, "-c", WATCHER, env["VCUDA_REAL_LIBNVML"]],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
        with SimReader(four.state_path) as r:
            r.inject_xid(2, 48)
            r.inject_xid(2, 63)
        for p in procs:
            out, err = p.communicate(timeout=60)  # woken across processes, not by the timeout
            assert p.returncode == 0, err
            assert out.split() == ["2", "48", "2", "63"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


# ---- lost GPUs ----

def test_a_lost_gpu_fails_queries_until_it_is_back(nvml4: None, four: SimConfig) -> None:
    with SimReader(four.state_path) as r:
        r.set_lost(1)
        assert r.device(1).lost
        lost = pynvml.NVML_ERROR_GPU_IS_LOST
        assert nvml_error(pynvml.nvmlDeviceGetMemoryInfo, h(1)) == lost
        assert nvml_error(pynvml.nvmlDeviceGetUUID, h(1)) == lost
        assert nvml_error(pynvml.nvmlDeviceGetPciInfo_v3, h(1)) == lost
        es = pynvml.nvmlEventSetCreate()
        assert nvml_error(pynvml.nvmlDeviceRegisterEvents, h(1), XID, es) == lost
        pynvml.nvmlEventSetFree(es)
        assert pynvml.nvmlDeviceGetMemoryInfo(h(0)).total > 0  # the others are fine
        r.set_lost(1, False)
        assert pynvml.nvmlDeviceGetMemoryInfo(h(1)).total > 0
        with pytest.raises(Exception, match="no simulated device"):
            r.set_lost(7)
        with pytest.raises(Exception, match="no simulated device"):
            r.inject_xid(7, 13)
