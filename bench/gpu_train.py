"""The `train` workload of bench/c/workload.c on a real GPU, with CuPy, for
`bench/horizon_bench.py --gpu`: DEPTH spin kernels of about KERNEL_US each, then a
synchronize, over and over, and when each kernel ended.

    python bench/gpu_train.py calibrate KERNEL_US
        without the shim: prints {"iters", "kernel_ns"}, the spin length that takes
        about KERNEL_US on this GPU and what one such kernel took
    python bench/gpu_train.py train ITERS KERNEL_NS DEPTH
        prints "ready" once the kernel is loaded and has run, then reads
        "START_NS END_NS" (CLOCK_MONOTONIC) from stdin, launches from START_NS until
        END_NS and prints {"intervals": [[start_ns, end_ns], ...]}

A kernel's end is read from a CUDA event recorded after it (the GPU's clock, set
against CLOCK_MONOTONIC once, at START_NS); its start is KERNEL_NS before its end,
or the previous kernel's end if that is later. The spin kernel fills every SM
(4 blocks of 256 threads per SM), so two processes' kernels do not overlap.
"""

from __future__ import annotations

import json
import sys
import time

import cupy

SOURCE = r"""
extern "C" __global__ void spin(float *out, int iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f;
    for (int i = 0; i < iters; ++i) { a = a * b + 1e-7f; b = b * 0.9999f + 1e-4f; }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a + b;
}
"""


class Spin:
    def __init__(self) -> None:
        self.fn = cupy.RawModule(code=SOURCE).get_function("spin")
        self.blocks = 4 * cupy.cuda.Device().attributes["MultiProcessorCount"]
        self.out = cupy.zeros(self.blocks * 256, dtype=cupy.float32)

    def __call__(self, iters: int) -> None:
        self.fn((self.blocks,), (256,), (self.out, cupy.int32(iters)))


def calibrate(kernel_us: float) -> dict[str, int]:
    spin, sync = Spin(), cupy.cuda.get_current_stream().synchronize
    iters = 4096
    spin(iters)
    sync()
    for _ in range(4):
        t = time.perf_counter_ns()
        for _ in range(5):
            spin(iters)
        sync()
        iters = max(64, int(iters * kernel_us * 1000 * 5 / (time.perf_counter_ns() - t)))
    t = time.perf_counter_ns()
    for _ in range(20):
        spin(iters)
    sync()
    return {"iters": iters, "kernel_ns": (time.perf_counter_ns() - t) // 20}


def train(iters: int, kernel_ns: int, depth: int) -> dict[str, list[list[int]]]:
    spin, stream = Spin(), cupy.cuda.get_current_stream()
    events = [cupy.cuda.Event() for _ in range(depth)]
    ref = cupy.cuda.Event()
    spin(iters)
    stream.synchronize()
    print("ready", flush=True)
    start_ns, end_ns = (int(x) for x in sys.stdin.readline().split())
    time.sleep(max(0.0, (start_ns - time.monotonic_ns()) / 1e9))
    ref.record()
    ref.synchronize()
    ref_ns = time.monotonic_ns()
    intervals: list[list[int]] = []
    last = ref_ns
    while time.monotonic_ns() < end_ns:
        for event in events:
            spin(iters)
            event.record()
        events[-1].synchronize()
        for event in events:
            end = ref_ns + int(cupy.cuda.get_elapsed_time(ref, event) * 1e6)
            intervals.append([max(end - kernel_ns, last), end])
            last = end
    return {"intervals": intervals}


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "calibrate":
        print(json.dumps(calibrate(float(argv[1]))), flush=True)
        return 0
    if len(argv) == 4 and argv[0] == "train":
        print(json.dumps(train(int(argv[1]), int(argv[2]), int(argv[3]))), flush=True)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
