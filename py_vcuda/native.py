"""Where the native libraries shipped with py_vcuda live.

`pip install .` builds them into ``py_vcuda/lib``; ``VCUDA_LIB_DIR`` points
elsewhere (a standalone CMake build, a container image's copy).
"""

from __future__ import annotations

import os
from pathlib import Path

SHIM = "libvcuda.so"
SIM_CUDA = "libvcuda-sim-cuda.so"
SIM_NVML = "libvcuda-sim-nvml.so"


class NativeLibraryMissing(FileNotFoundError):
    """A native library is not where py_vcuda expects it."""


def lib_dir() -> Path:
    override = os.environ.get("VCUDA_LIB_DIR")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / "lib"


def lib_path(name: str) -> Path:
    path = lib_dir() / name
    if not path.is_file():
        raise NativeLibraryMissing(
            f"{name} not found in {path.parent}: install vcuda with `pip install .` "
            "or set VCUDA_LIB_DIR to a directory holding the built libraries"
        )
    return path
