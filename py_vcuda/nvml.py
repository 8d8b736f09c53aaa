"""NVML for the Python components (device plugin, exporter, `vcuda top`), through nvidia-ml-py.

The library is the one nvidia-ml-py would load (`libnvidia-ml.so.1`), or
`VCUDA_REAL_LIBNVML` when set, so the GPU simulator can stand in (DESIGN.md).
nvidia-ml-py keeps one library per process; asking for a second, different
one is an error rather than a silent mix.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from types import TracebackType

import pynvml

DEFAULT_LIBRARY = "libnvidia-ml.so.1"
_load_lock = threading.Lock()
_loaded_path: str | None = None


class NVMLUnavailable(RuntimeError):
    """No NVML here (no driver, or the library refused to initialise)."""


@dataclass(frozen=True)
class GPUInfo:
    index: int
    uuid: str
    name: str
    memory_total: int          # bytes
    minor: int                 # /dev/nvidia<minor>
    numa_node: int | None      # None: unknown or not a NUMA machine


@dataclass(frozen=True)
class GPUUsage:
    utilization: float | None  # percent of time a kernel ran, NVML's sample period
    memory_used: int
    memory_total: int
    temperature_c: float | None
    power_w: float | None


def library_path() -> str:
    return os.environ.get("VCUDA_REAL_LIBNVML") or DEFAULT_LIBRARY


def _load(path: str) -> None:
    global _loaded_path
    with _load_lock:
        if _loaded_path == path:
            return
        if _loaded_path is not None or pynvml.nvmlLib is not None:
            raise NVMLUnavailable(f"NVML already loaded from {_loaded_path or 'elsewhere'}; cannot also load {path}")
        try:
            pynvml.nvmlLib = ctypes.CDLL(path)
        except OSError as exc:
            raise NVMLUnavailable(f"cannot load NVML ({path}): {exc}") from exc
        _loaded_path = path


def _optional(fn, *args):  # type: ignore[no-untyped-def]
    """The value, or None where this GPU or driver does not support the query."""
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


class NVML:
    """An initialised NVML session; use as a context manager (init and shutdown are counted by NVML)."""

    def __init__(self, library: str | None = None) -> None:
        self.path = library or library_path()
        _load(self.path)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NVMLUnavailable(f"NVML ({self.path}) did not initialise: {exc}") from exc
        self._open = True

    def close(self) -> None:
        if self._open:
            self._open = False
            _optional(pynvml.nvmlShutdown)

    def __enter__(self) -> NVML:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def count(self) -> int:
        return int(pynvml.nvmlDeviceGetCount())

    def handle(self, index: int):  # type: ignore[no-untyped-def]
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def gpu(self, index: int) -> GPUInfo:
        h = self.handle(index)
        numa = _optional(getattr(pynvml, "nvmlDeviceGetNumaNodeId", lambda _h: None), h)
        return GPUInfo(
            index=index,
            uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
            name=_text(pynvml.nvmlDeviceGetName(h)),
            memory_total=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
            minor=int(pynvml.nvmlDeviceGetMinorNumber(h)),
            numa_node=None if numa is None or numa < 0 else int(numa),
        )

    def gpus(self) -> list[GPUInfo]:
        return [self.gpu(i) for i in range(self.count())]

    def driver_version(self) -> str:
        return _text(pynvml.nvmlSystemGetDriverVersion())

    def cuda_driver_version(self) -> tuple[int, int]:
        """The CUDA version the driver supports, e.g. (12, 4)."""
        v = int(pynvml.nvmlSystemGetCudaDriverVersion())
        return v // 1000, (v % 1000) // 10

    def usage(self, index: int) -> GPUUsage:
        h = self.handle(index)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        util = _optional(pynvml.nvmlDeviceGetUtilizationRates, h)
        temp = _optional(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
        power = _optional(pynvml.nvmlDeviceGetPowerUsage, h)
        return GPUUsage(
            utilization=None if util is None else float(util.gpu),
            memory_used=int(mem.used),
            memory_total=int(mem.total),
            temperature_c=None if temp is None else float(temp),
            power_w=None if power is None else power / 1000.0,
        )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
