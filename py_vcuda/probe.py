"""A tiny CUDA driver client in pure ctypes, used by `vcuda doctor` and `vcuda demo`.

It loads the driver the way applications do (``dlopen`` + ``dlsym``), so under
``LD_PRELOAD=libvcuda.so`` every call it makes goes through the shim. Run as
``python -m py_vcuda.probe COMMAND`` in a child process; it prints one JSON
object.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from typing import Any

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2


class CudaError(RuntimeError):
    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} failed with CUresult {code}")
        self.call = call
        self.code = code


class Driver:
    """The handful of driver calls the probe needs."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or os.environ.get("VCUDA_REAL_LIBCUDA") or "libcuda.so.1"
        self.lib = ctypes.CDLL(self.path)
        self.ctx = ctypes.c_void_p()

    def call(self, name: str, *args: Any) -> int:
        return int(getattr(self.lib, name)(*args))

    def check(self, name: str, *args: Any) -> None:
        self.check_rc(name, self.call(name, *args))

    @staticmethod
    def check_rc(name: str, rc: int) -> None:
        if rc != CUDA_SUCCESS:
            raise CudaError(name, rc)

    def driver_version(self) -> int:
        v = ctypes.c_int()
        self.check("cuDriverGetVersion", ctypes.byref(v))
        return v.value

    def open(self, device: int = 0) -> None:
        self.check("cuInit", 0)
        self.check("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), device)
        self.check("cuCtxSetCurrent", self.ctx)

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def alloc(self, size: int) -> tuple[int, int]:
        ptr = ctypes.c_uint64()
        rc = self.call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(size))
        return rc, ptr.value

    def free(self, ptr: int) -> None:
        self.check("cuMemFree_v2", ctypes.c_uint64(ptr))


# A kernel that spins for `cycles` GPU clock cycles (real GPUs); the simulator
# runs any kernel for the microseconds in its first parameter instead.
SPIN_PTX = b"""
.version 7.0
.target sm_50
.address_size 64
.visible .entry spin(.param .u64 cycles)
{
    .reg .pred %p;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [cycles];
    mov.u64 %rd2, %clock64;
LOOP:
    mov.u64 %rd3, %clock64;
    sub.s64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p, %rd4, %rd1;
    @%p bra LOOP;
    ret;
}
"""
CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13  # kHz


def spin(kernel_us: int, seconds: float, sync_every: int = 10) -> dict[str, Any]:
    """Launch `kernel_us`-long kernels for `seconds`; report the GPU time used."""
    drv = Driver()
    drv.open()
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    drv.check("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(SPIN_PTX))
    drv.check("cuModuleGetFunction", ctypes.byref(function), module, b"spin")
    arg = ctypes.c_uint64(kernel_us)
    if "sim" not in os.path.basename(drv.path):
        khz = ctypes.c_int()
        drv.check("cuDeviceGetAttribute", ctypes.byref(khz), CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 0)
        arg.value = kernel_us * khz.value // 1000
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(arg), ctypes.c_void_p))
    launch = drv.lib.cuLaunchKernel
    kernels, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        drv.check_rc("cuLaunchKernel", launch(function, 1, 1, 1, 1, 1, 1, 0, None, params, None))
        kernels += 1
        if kernels % sync_every == 0:
            drv.check("cuCtxSynchronize")
    drv.check("cuCtxSynchronize")
    return {"kernels": kernels, "busy_us": kernels * kernel_us, "wall_us": (time.monotonic() - start) * 1e6}


def fill(chunk: int, maximum: int) -> dict[str, Any]:
    """Allocate `chunk`-sized blocks until refused or `maximum` is reached."""
    drv = Driver()
    drv.open()
    free_before, total = drv.mem_info()
    held: list[int] = []
    refused_with = None
    while (len(held) + 1) * chunk <= maximum:
        rc, ptr = drv.alloc(chunk)
        if rc != CUDA_SUCCESS:
            refused_with = rc
            break
        held.append(ptr)
    free_after, _ = drv.mem_info()
    for ptr in held:
        drv.free(ptr)
    return {
        "total": total,
        "free_before": free_before,
        "free_after": free_after,
        "allocated": len(held) * chunk,
        "refused_with": refused_with,
    }


def check(limit: int) -> dict[str, Any]:
    """Does the shim intercept? Over-limit allocation refused, quota in mem_info."""
    drv = Driver()
    result: dict[str, Any] = {"driver_version": drv.driver_version()}
    drv.open()
    _, total = drv.mem_info()
    rc, ptr = drv.alloc(limit + 1)
    if rc == CUDA_SUCCESS:
        drv.free(ptr)
    result.update(total=total, over_limit_rc=rc,
                  intercepted=total <= limit and rc == CUDA_ERROR_OUT_OF_MEMORY)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m py_vcuda.probe")
    sub = parser.add_subparsers(dest="command", required=True)
    p_fill = sub.add_parser("fill", help="allocate blocks until refused")
    p_fill.add_argument("--chunk", type=int, required=True)
    p_fill.add_argument("--max", type=int, required=True)
    p_check = sub.add_parser("check", help="check that the shim intercepts")
    p_check.add_argument("--limit", type=int, required=True)
    p_spin = sub.add_parser("spin", help="keep the GPU busy with kernels")
    p_spin.add_argument("--kernel-us", type=int, default=2000)
    p_spin.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "fill":
            out = fill(args.chunk, args.max)
        elif args.command == "check":
            out = check(args.limit)
        else:
            out = spin(args.kernel_us, args.seconds)
    except (OSError, CudaError, AttributeError) as exc:
        out = {"error": str(exc)}
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main())
