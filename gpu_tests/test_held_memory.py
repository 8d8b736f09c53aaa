"""What the driver holds beyond the pointers, on a real GPU (issue 12, item 8).

The CPU suite (tests/libvcuda/test_held_memory.py) checks physical use <= ledger <=
limit against the simulator; here the same scenarios run on the hardware, with the
frameworks that cause the gap, and each compares what NVML says the process uses
(nvmlDeviceGetComputeRunningProcesses, what nvidia-smi shows) with the tenant's ledger:

- CuPy ``MemoryAsyncPool`` and PyTorch ``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``:
  stream-ordered churn of mixed sizes (both set the pool's release threshold to
  UINT64_MAX, so freed blocks stay reserved and the pool fragments) until the quota
  is reached. At every checkpoint the ledger stays <= the quota, and what NVML shows
  beyond the ledger stays what it showed after framework initialisation (module code
  and context growth, the reconciler's part), give or take SLACK: the pool's
  reservation is in the ledger.
- A CuPy ``RawKernel`` with a large local array: a frame that fits is charged when the
  function is looked up (frame x SMs x threads per SM above the initial stack), at
  least what NVML shows the launch took; a frame that does not fit is refused at
  lookup with CUDA_ERROR_OUT_OF_MEMORY and takes nothing. The measured growth per KiB
  of frame is recorded: the formula is to verify on hardware.

Without a GPU every test is skipped (conftest.py).
"""

from __future__ import annotations

from typing import Any

import pytest

MiB = 1 << 20
GiB = 1 << 30
# What may appear beyond the ledger during a churn besides what was there after
# initialisation: a kernel loaded lazily on the way (the reconciler's part).
SLACK = 64 * MiB
CHECK_EVERY = 10

CHURN = """
quota, steps, seed = int(_sys.argv[1]), int(_sys.argv[2]), int(_sys.argv[3])
import random
# In 1/256ths of the quota (16 MiB of 4 GiB), so that up to 40 blocks held at once reach
# the quota whatever it is: a churn that never meets it checks nothing.
UNIT = quota // 256
SIZES = [1, 3, 7, 12, 20, 33, 48]
{setup}
say(phase="init", **info())
rng, held, ooms, allocated = random.Random(seed), [], 0, 0
for i in range(steps):
    if held and (rng.random() < 0.45 or len(held) > 40):
        held.pop(rng.randrange(len(held)))
    else:
        try:
            held.append(alloc(rng.choice(SIZES) * UNIT + rng.randrange(1, 4096)))
            allocated += 1
        except OOM:
            ooms += 1
    if i % 40 == 39:
        sync()
    if i % {every} == {every} - 1:
        sync()
        say(phase="step", step=i, live=sum(nbytes(a) for a in held), ooms=ooms, allocated=allocated, **info())
del held
sync()
done(phase="released", ooms=ooms, allocated=allocated, **info())
"""

CUPY_SETUP = """
import cupy
from cupy.cuda import runtime
cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
OOM = cupy.cuda.memory.OutOfMemoryError
x = cupy.ones(16, dtype=cupy.float32)
float((x + 1).sum())
def alloc(n):
    return cupy.empty(n, dtype=cupy.uint8)
def nbytes(a):
    return a.nbytes
def sync():
    runtime.deviceSynchronize()
def pool_attr(name):
    try:
        return int(runtime.memPoolGetAttribute(runtime.deviceGetDefaultMemPool(0), getattr(runtime, name)))
    except Exception:
        return None
def info():
    return {"reserved": pool_attr("cudaMemPoolAttrReservedMemCurrent"),
            "used": pool_attr("cudaMemPoolAttrUsedMemCurrent"),
            "threshold": pool_attr("cudaMemPoolAttrReleaseThreshold"), "framework": "cupy",
            "version": cupy.__version__, "runtime": runtime.runtimeGetVersion()}
"""

TORCH_SETUP = """
import torch
OOM = torch.cuda.OutOfMemoryError
torch.cuda.init()
x = torch.ones(16, device="cuda")
(x + 1).sum().item()
def alloc(n):
    return torch.empty(n, dtype=torch.uint8, device="cuda")
def nbytes(a):
    return a.numel()
def sync():
    torch.cuda.synchronize()
def info():
    backend = torch.cuda.get_allocator_backend() if hasattr(torch.cuda, "get_allocator_backend") else "native"
    return {"reserved": torch.cuda.memory_reserved(), "backend": backend, "framework": "torch",
            "version": torch.__version__, "runtime": torch.version.cuda}
"""

SETUPS = {"cupy": CUPY_SETUP, "torch": TORCH_SETUP}


def ledger_used(tenant: Any) -> int:
    dev = tenant.ledger_device()
    assert dev is not None, "the tenant's ledger has no record of the GPU"
    return dev.used  # the reconciler's unattributed bytes are part of it


def churn_scenario(py: Any, nvml: Any, tenant: Any, framework: str, env: dict[str, str],
                   steps: int = 300) -> dict[str, Any]:
    code = CHURN.format(setup=SETUPS[framework], every=CHECK_EVERY)
    baseline = nvml.device_used()
    child = py.spawn(code, env, argv=[str(tenant.quota), str(steps), "12"], label=f"{framework}-churn")
    init = child.read()
    _, real0, method = nvml.usage_of([child.pid], baseline)
    gap0 = real0 - ledger_used(tenant)
    checkpoints = []
    for _ in range(steps // CHECK_EVERY):
        child.go()
        msg = child.read()
        _, real, method = nvml.usage_of([child.pid], baseline)
        ledger = ledger_used(tenant)
        checkpoints.append({"step": msg["step"], "real": real, "ledger": ledger, "live": msg["live"],
                            "reserved": msg.get("reserved"), "ooms": msg["ooms"]})
    released = child.finish()
    return {"init": init, "nvml_method": method, "real_init": real0, "gap_init": gap0, "checkpoints": checkpoints,
            "released": released, "quota": tenant.quota, "stderr": child.stderr(limit=None)}


def check_churn(fig: dict[str, Any]) -> None:
    quota, gap0 = fig["quota"], fig["gap_init"]
    for cp in fig["checkpoints"]:
        assert cp["ledger"] <= quota, f"step {cp['step']}: ledger {cp['ledger']} > quota {quota}"
        assert cp["real"] - cp["ledger"] <= gap0 + SLACK, \
            f"step {cp['step']}: NVML shows {cp['real']}, the ledger {cp['ledger']} (after init the gap was {gap0})"
    assert fig["released"]["ooms"] > 0, "the churn never reached the quota"
    # The scenario exercised the gap: the pool held clearly more than the live allocations.
    assert max(cp["real"] - cp["live"] for cp in fig["checkpoints"]) > fig["real_init"] + 64 * MiB


def summary(fig: dict[str, Any]) -> dict[str, Any]:
    cps = fig["checkpoints"]
    return {"quota": fig["quota"], "init": fig["init"], "nvml_method": fig["nvml_method"],
            "gap_init": fig["gap_init"], "max_gap": max((c["real"] - c["ledger"] for c in cps), default=None),
            "max_real": max((c["real"] for c in cps), default=None),
            "max_ledger": max((c["ledger"] for c in cps), default=None),
            "max_cached": max((c["real"] - c["live"] for c in cps), default=None),
            "ooms": fig["released"].get("ooms"), "checkpoints": cps}


def test_cupy_memory_async_pool_churn(py, nvml, make_tenant, record) -> None:
    pytest.importorskip("cupy")
    tenant = make_tenant()
    fig = churn_scenario(py, nvml, tenant, "cupy", tenant.env)
    record(**summary(fig))
    check_churn(fig)


def test_torch_cuda_malloc_async_churn(py, nvml, make_tenant, record) -> None:
    pytest.importorskip("torch")
    tenant = make_tenant()
    env = tenant.with_env(PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    fig = churn_scenario(py, nvml, tenant, "torch", env)
    record(**summary(fig))
    assert fig["init"]["backend"] == "cudaMallocAsync"
    check_churn(fig)


FRAME = r"""
frame = int(_sys.argv[1])
import cupy
from cupy.cuda import runtime
x = cupy.ones(16, dtype=cupy.float32)
float((x + 1).sum())
props = runtime.getDeviceProperties(0)
say(phase="init", sms=props["multiProcessorCount"], threads_per_sm=props["maxThreadsPerMultiProcessor"])
src = '''
extern "C" __global__ void frame(float *out, int salt) {
    volatile char buf[%d];
    for (int i = threadIdx.x %% 64; i < %d; i += 64) buf[i] = (char)(i + salt);
    float s = 0;
    for (int i = 0; i < %d; i += 256) s += buf[(i + threadIdx.x * 7) %% %d];
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}
''' % (frame, frame, frame, frame)
kernel = cupy.RawKernel(src, "frame")
error, local = None, None
try:
    local = kernel.local_size_bytes  # compiles, loads the module, looks the function up
except Exception as e:
    error = f"{type(e).__name__}: {e}"[:300]
say(phase="looked_up", error=error, local=local)
if error is None:
    out = cupy.zeros(4096, dtype=cupy.float32)
    kernel((4096,), (256,), (out, 1))
    runtime.deviceSynchronize()
say(phase="launched")
done(phase="done")
"""


def frame_scenario(py: Any, nvml: Any, tenant: Any, frame: int) -> dict[str, Any]:
    baseline = nvml.device_used()
    child = py.spawn(FRAME, tenant.env, argv=[str(frame)], label=f"frame-{frame}")
    points = {}
    for phase in ("init", "looked_up", "launched"):
        msg = child.read()
        assert msg["phase"] == phase, msg
        _, real, method = nvml.usage_of([child.pid], baseline)
        points[phase] = {"msg": msg, "real": real, "ledger": ledger_used(tenant), "method": method}
        child.go()
    child.finish()
    init, looked, launched = points["init"], points["looked_up"], points["launched"]
    threads = init["msg"]["sms"] * init["msg"]["threads_per_sm"]
    return {"frame": frame, "local": looked["msg"]["local"], "error": looked["msg"]["error"], "threads": threads,
            "charged": looked["ledger"] - init["ledger"], "took": launched["real"] - init["real"],
            "took_at_lookup": looked["real"] - init["real"], "points": points, "quota": tenant.quota}


def test_raw_kernel_large_local_array(py, nvml, make_tenant, record) -> None:
    pytest.importorskip("cupy")
    tenant = make_tenant()
    fits = frame_scenario(py, nvml, tenant, 2048)
    # A frame whose local memory (frame x every thread the GPU holds) exceeds any quota the
    # suite runs with (4Gi by default): 64 KiB x 132 SMs x 2048 threads on an H100 is 16.5 GiB.
    too_big = frame_scenario(py, nvml, make_tenant(name="big"), 64 * 1024)
    per_kib = fits["took"] / max(1, (fits["local"] or 0) - 1024) * 1024 if fits["local"] else None
    record(fits={k: v for k, v in fits.items() if k != "points"}, too_big={k: v for k, v in too_big.items()
                                                                           if k != "points"},
           measured_bytes_per_kib_of_frame=per_kib, formula_bytes_per_kib=fits["threads"] * 1024)
    assert fits["error"] is None and fits["local"] >= 2048
    # Charged at lookup, before the driver grows anything...
    assert fits["charged"] >= (fits["local"] - 1024) * fits["threads"]
    # ...and at least what the launch took (module code aside: SLACK).
    assert fits["took"] <= fits["charged"] + SLACK, (fits["took"], fits["charged"])
    assert too_big["error"] and "CUDA_ERROR_OUT_OF_MEMORY" in too_big["error"], too_big["error"]
    assert too_big["charged"] == 0
    assert too_big["took"] <= SLACK  # compiling and loading the module, nothing for the frame
