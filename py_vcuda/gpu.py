"""Is there a real NVIDIA GPU here? (decides between hardware and the simulator)"""

from __future__ import annotations

import ctypes


def real_gpu_count(path: str = "libcuda.so.1") -> int:
    try:
        lib = ctypes.CDLL(path)
        if lib.cuInit(0) != 0:
            return 0
        n = ctypes.c_int()
        return n.value if lib.cuDeviceGetCount(ctypes.byref(n)) == 0 else 0
    except (OSError, AttributeError):
        return 0
