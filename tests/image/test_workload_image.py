"""The e2e tier's workload image (e2e/workload), built offline as its build script says, run under
`podman run` as a GPU container the node agent set up on the simulator: the very mounts and env
`node_state.tenancy.injection` hands kubelet (the container's quota file, ledger, libvcuda and
/etc/ld.so.preload, and the simulator's driver part, node_state.gpu_driver). The workload sees its
quota (cuMemGetInfo, NVML's memory query), is refused past it, and runs kernels; outside the host's
pid namespace the simulator refuses it.

Needs podman and mmdebstrap (the same cached Debian base as vcuda's image); without them the tests
skip, except under CI (`CI` set), where a skip would hide a broken image."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from imagebuild import need_tools, podman_run_prefix
from shimtest import parse

from node_state import gpu_driver, tenancy
from node_state.containers import ContainerStore, new_key
from node_state.layout import ContainerRecord, NodeLayout
from node_state.testing import gpu
from py_vcuda import native
from py_vcuda.sim import GiB, MiB, SimReader

REPO = Path(__file__).resolve().parents[2]
TAG = "localhost/vcuda-workload:pytest"
NEEDS = ("podman", "mmdebstrap")
LIMIT = 1 * GiB
CHUNK = 256 * MiB
OUT_OF_MEMORY = 2   # CUDA_ERROR_OUT_OF_MEMORY

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def image() -> str:
    need_tools(NEEDS, "the offline workload image")
    out = subprocess.run([sys.executable, str(REPO / "e2e" / "workload" / "build"), "--builder", "podman",
                          "--tag", TAG], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"e2e/workload/build failed:\n{(out.stdout + out.stderr)[-6000:]}"
    return TAG


@pytest.fixture
def container(tmp_path: Path) -> Iterator[tuple[list[str], Path]]:
    """podman options that make a container of the workload what the agent's Allocate makes it: a share of
    GPU 0 (no token scheduler: memory only) with LIMIT of memory, on a simulated node of 2 GPUs (the
    chart's testing.simulatedNode); returns them and the simulator's state."""
    state = tmp_path / "sim" / "state"
    state.parent.mkdir()
    agent_env = {"VCUDA_REAL_LIBNVML": str(native.lib_path(native.SIM_NVML)), "VCUDA_SIM_STATE": str(state),
                 "VCUDA_SIM_DEVICES": "2", "VCUDA_SIM_MIG": ";off", "VCUDA_SIM_MIG_MODEL": "h100-80gb",
                 "VCUDA_SIM_MEMORY": str(16 * GiB)}
    layout = NodeLayout(tmp_path / "st")
    store = ContainerStore(layout)
    record = ContainerRecord(key=new_key(), mode="vgpu", resource="test", device_ids=(), gpus=(gpu(0).uuid,),
                             core_request=100, core_limit=100, memory_limit=LIMIT)
    store.create(record, ledger=True, preload=True)
    edits = tenancy.injection(layout, record, None, native.lib_path(native.SHIM), preload=True,
                              driver=gpu_driver.simulated(native.lib_dir(), agent_env))
    options = [f"--env={k}={v}" for k, v in edits.env.items()]
    options += [f"--volume={m.host}:{m.container}:{'ro' if m.read_only else 'rw'}" for m in edits.mounts]
    yield options, state


def run(image: str, options: list[str], *args: str, pid_host: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [*podman_run_prefix(), *(["--pid=host"] if pid_host else []), *options, image, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def steps(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {d["cmd"]: d for d in parse(proc.stdout)}


def test_workload_sees_its_quota_and_is_refused_past_it(image, container):
    options, state = container
    out = steps(run(image, options, "quota-fill", str(CHUNK)))
    assert out["init"]["rc"] == "0" and out["ctx"]["rc"] == "0"
    assert (out["info"]["rc"], int(out["info"]["total"])) == ("0", LIMIT)    # cuMemGetInfo: the quota
    assert int(out["info"]["free"]) < LIMIT                                  # its context is charged
    assert (out["nvmem"]["rc"], int(out["nvmem"]["total"])) == ("0", LIMIT)  # nvidia-smi's query: the quota
    fill = out["fill"]
    assert int(fill["rc"]) == OUT_OF_MEMORY
    assert 0 < int(fill["bytes"]) <= LIMIT - CHUNK // 4 and int(fill["bytes"]) == int(fill["count"]) * CHUNK
    assert int(fill["bytes"]) + CHUNK > int(out["info"]["free"])             # refused only past the quota
    with SimReader(state) as sim:                                            # the simulator was the driver
        assert sim.device(0).kernels == 0 and sim.device(0).capacity == 16 * GiB
        assert sim.device_count() == 2 and sim.mig(1).capable


def test_workload_runs_kernels_on_the_simulator(image, container):
    options, state = container
    out = steps(run(image, options, "compute", "2000", "1"))
    assert out["spin"]["rc"] == "0"
    with SimReader(state) as sim:
        assert sim.device(0).kernels > 10 and sim.device(0).busy_ns > 0.5e9


def test_workload_outside_the_hosts_pid_namespace_is_refused_with_the_reason(image, container):
    options, _ = container
    proc = run(image, options, "quota", pid_host=False)
    out = {d["cmd"]: d for d in parse(proc.stdout)}
    assert int(out["init"]["rc"]) == 801   # CUDA_ERROR_NOT_SUPPORTED
    assert "hostPID: true" in proc.stderr
