"""Memory shared between processes is one allocation, charged to its creator
(vcudasim.h "Sharing"), and NVML names processes by their host pid
(vcudasim.h "Host pids")."""

from __future__ import annotations

import pynvml
from simtool import lines, mem

from py_vcuda.sim import MiB, SimConfig, SimReader, nvml_session

INVALID_VALUE = 1


def test_ipc_handle_opened_by_another_process_is_charged_once(children, sim: SimConfig) -> None:
    creator = children.spawn("init", "primary", "0", "alloc", "100M", "ipcget", "ready")
    handle = lines(children.ready(creator), "ipcget")[0]
    assert handle.rc == 0
    user = children.spawn("init", "primary", "0", "ipcopen", handle.rest[0], "mem", "ready",
                          "ipcclose", "mem")
    seen = children.ready(user)
    assert lines(seen, "ipcopen")[0].rc == 0
    assert mem(lines(seen, "mem")[0]).alloc == 0  # the importer holds nothing of it
    with SimReader(sim.state_path) as r:
        assert r.device(0).used == 2 * 64 * MiB + 100 * MiB
        assert r.device(0).memory.alloc == 100 * MiB
    rest = children.release(user)
    assert lines(rest, "ipcclose")[0].rc == 0
    children.release(creator)
    late = children.spawn("init", "primary", "0", "ipcopen", handle.rest[0], "ready")
    assert lines(children.ready(late), "ipcopen")[0].rc == INVALID_VALUE  # its creator is gone


def test_exported_vmm_handle_imported_elsewhere_is_charged_once(children, sim: SimConfig) -> None:
    creator = children.spawn("init", "primary", "0", "export", "64M", "vmap", "ready")
    seen = children.ready(creator)
    export = lines(seen, "export")[0]
    assert export.rc == 0 and lines(seen, "vmap")[0].rc == 0
    user = children.spawn("init", "primary", "0", "import", str(creator.pid), export.rest[0],
                          "64M", "vmap", "mem", "ready", "vrelease", "mem")
    seen = children.ready(user)
    assert [ln.rc for ln in lines(seen, "import") + lines(seen, "vmap")] == [0, 0]
    assert mem(lines(seen, "mem")[0]).alloc == 0
    with SimReader(sim.state_path) as r:
        assert r.device(0).memory.alloc == 64 * MiB
        assert r.process(creator.pid).memory.alloc == 64 * MiB  # type: ignore[union-attr]
    rest = children.release(user)
    assert lines(rest, "vrelease")[0].rc == 0 and mem(lines(rest, "mem")[0]).alloc == 0
    with SimReader(sim.state_path) as r:  # releasing the import frees nothing of the creator's
        assert r.device(0).memory.alloc == 64 * MiB


def test_nvml_reports_host_pids_and_all_physical_use(children, sim: SimConfig) -> None:
    offset = 400_000
    inside = children.spawn("init", "primary", "0", "stream", "alloc", "10M",
                            "aalloc", "1M",  # a 32 MiB pool chunk
                            "module", "vcudasim-module;kernel k local=2Ki code=3Mi",
                            "fn", "k", "run", "0",  # 1 KiB x 132 x 2048 local, 3 MiB code
                            "mem", "ready", env={"VCUDA_SIM_HOST_PID_OFFSET": str(offset)})
    own = mem(lines(children.ready(inside), "mem")[0])
    assert (own.alloc, own.pool, own.local, own.module) == (10 * MiB, 32 * MiB, 264 * MiB, 3 * MiB)
    host = children.spawn("init", "primary", "0", "ready")
    children.ready(host)
    with SimReader(sim.state_path) as r:
        procs = {p.pid: p for p in r.processes(0)}
        assert procs[inside.pid].host_pid == inside.pid + offset
        assert procs[host.pid].host_pid == host.pid
    with nvml_session(sim):
        infos = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
        used = {p.pid: p.usedGpuMemory for p in infos}
    assert used == {inside.pid + offset: own.total, host.pid: 64 * MiB}


def test_bad_host_pid_offset_fails_init(tool) -> None:
    out = tool("init", env={"VCUDA_SIM_HOST_PID_OFFSET": "-5"})
    assert lines(out, "init")[0].rc == INVALID_VALUE
