"""Reader (and limit writer) for a container's ledger file, via libvcuda's C API,
so the layout is defined in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from py_vcuda._native import ffi, lib

UNLIMITED = 2**64 - 1
MAX_DEVICES = 16
MAX_PROCESSES = 1024


class LedgerError(OSError):
    """A ledger that cannot be opened or is not a vcuda ledger."""


@dataclass(frozen=True)
class DeviceUsage:
    index: int
    uuid: str
    limit: int | None  # None: unlimited
    used: int
    peak: int
    oom_denials: int
    context_overhead: int
    unattributed: int = 0  # part of used: found by the memory reconciler, charged by no hook


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    alive: bool
    start_time: int
    used: tuple[int, ...]  # by device record index


class Ledger:
    """A mapped ledger file; use as a context manager."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool = False) -> None:
        self.path = Path(path)
        err = ffi.new("char[]", 4352)
        handle = lib().vcuda_ledger_open_file(str(self.path).encode(), int(create), err, 4352)
        if handle == ffi.NULL:
            raise LedgerError(ffi.string(err).decode())
        self._handle = handle

    def close(self) -> None:
        if self._handle is not None:
            lib().vcuda_ledger_close_file(self._handle)
            self._handle = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def devices(self) -> list[DeviceUsage]:
        out = ffi.new("vcuda_device_usage[]", MAX_DEVICES)
        n = lib().vcuda_ledger_read_devices(self._handle, out, MAX_DEVICES)
        return [
            DeviceUsage(
                index=int(d.index),
                uuid=ffi.string(d.uuid).decode(),
                limit=None if d.limit == UNLIMITED else int(d.limit),
                used=int(d.used),
                peak=int(d.peak),
                oom_denials=int(d.oom_denials),
                context_overhead=int(d.context_overhead),
                unattributed=int(d.unattributed),
            )
            for d in out[0:n]
        ]

    def processes(self) -> list[ProcessUsage]:
        out = ffi.new("vcuda_process_usage[]", MAX_PROCESSES)
        n = lib().vcuda_ledger_read_processes(self._handle, out, MAX_PROCESSES)
        return [
            ProcessUsage(pid=int(p.pid), alive=bool(p.alive), start_time=int(p.start_time),
                         used=tuple(int(u) for u in p.used))
            for p in out[0:n]
        ]

    def reclaim_dead(self) -> int:
        return int(lib().vcuda_ledger_reclaim_dead(self._handle))

    def set_unattributed(self, uuid: str, nbytes: int) -> None:
        """Charge the device ``nbytes`` that no hook charged (the memory reconciler's
        finding); ``used`` moves by the change, so later allocations fit beneath it."""
        if nbytes < 0:
            raise ValueError(f"unattributed bytes must be >= 0, not {nbytes}")
        if lib().vcuda_ledger_set_unattributed(self._handle, uuid.encode(), nbytes) != 0:
            raise LedgerError(f"ledger {self.path} has no room for another device")

    def set_limit(self, uuid: str, limit: int | None) -> None:
        value = UNLIMITED if limit is None else limit
        if lib().vcuda_ledger_set_limit(self._handle, uuid.encode(), value) != 0:
            raise LedgerError(f"ledger {self.path} has no room for another device")
