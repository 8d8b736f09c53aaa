"""Where the native libraries shipped with py_vcuda live.

Looked up, in order: ``VCUDA_LIB_DIR`` (a container image's copy, another
build); ``py_vcuda/lib`` next to this module (where ``pip install .`` puts
them); the installed distribution's ``py_vcuda/lib`` (when this module is
imported from a source checkout, e.g. ``python -m pytest`` in the repo); and
``build/lib`` of a standalone CMake build in the checkout.
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

SHIM = "libvcuda.so"
SIM_CUDA = "libvcuda-sim-cuda.so"
SIM_NVML = "libvcuda-sim-nvml.so"


class NativeLibraryMissing(FileNotFoundError):
    """A native library is not where py_vcuda expects it."""


def _installed_lib_dir() -> Path | None:
    try:
        dist = metadata.distribution("vcuda")
    except metadata.PackageNotFoundError:
        return None
    return Path(str(dist.locate_file("py_vcuda/lib")))


def lib_dir() -> Path:
    override = os.environ.get("VCUDA_LIB_DIR")
    if override:
        return Path(override)
    here = Path(__file__).resolve().parent
    candidates = [here / "lib", _installed_lib_dir(), here.parent / "build" / "lib"]
    for candidate in candidates:
        if candidate is not None and (candidate / SHIM).is_file():
            return candidate
    return here / "lib"


def lib_path(name: str) -> Path:
    path = lib_dir() / name
    if not path.is_file():
        raise NativeLibraryMissing(
            f"{name} not found in {path.parent}: install vcuda with `pip install .` "
            "or set VCUDA_LIB_DIR to a directory holding the built libraries"
        )
    return path
