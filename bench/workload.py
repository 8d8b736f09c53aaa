"""The benches' GPU workloads (bench/c/workload.c) and the GPU time each process
was served on the simulator, sampled over a run.

The simulator charges a process's busy time as its work is served (gpusim's
vcudasim.h), so the difference of two samples is the GPU time it got between
them, whatever its launch queue holds: the way to compare tenants over a
common window when some queue seconds of work between synchronizes. Between two
samples the time is interpolated; with `served=True` the sampler also keeps when each
process ran (the simulator's service stretches, `ServedLog`), exact at every instant.
"""

from __future__ import annotations

import bisect
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from py_vcuda.sim import STRETCHES, SimReader
from token_scheduler.shares import cumulative
from token_scheduler.testing import AdminClient, spawn_daemon

REPO = Path(__file__).resolve().parents[1]
SAMPLE_SPAN_NS = 1_000_000  # BusySampler: the most a sample's read may take
HELD_UP_NS = 20_000_000  # BusySampler: woken this much past its interval, the host held it up


def build(out_dir: Path) -> Path:
    """Compile bench/c/workload.c into out_dir; returns the executable."""
    exe = out_dir / "workload"
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    subprocess.run([cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", f"-I{REPO / 'libvcuda' / 'include'}",
                    "-o", str(exe), str(REPO / "bench" / "c" / "workload.c"), "-ldl", "-lm"], check=True)
    return exe


@contextmanager
def scheduler(*flags: str) -> Iterator[tuple[subprocess.Popen[bytes], AdminClient]]:
    """A token_scheduler daemon (with `flags`) in a fresh directory, ready; then gone."""
    directory = Path(tempfile.mkdtemp(prefix="vb", dir="/tmp"))  # unix socket paths are short
    daemon = spawn_daemon(directory, *flags)
    admin = AdminClient(directory / "admin.sock")
    try:
        admin.wait_ready()
        yield daemon, admin
    finally:
        admin.close()
        daemon.kill()
        daemon.wait()
        shutil.rmtree(directory, ignore_errors=True)


def kill_all(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
        p.wait()


class ServedLog:
    """When one process's work ran, from reads of the simulator's last STRETCHES service
    stretches (`SimReader.served`): their union. A stretch read again may have grown (its
    process ran on); `lost` says that the ring turned over between two reads, and a
    stretch in between was never seen."""

    def __init__(self) -> None:
        self.ends: dict[int, int] = {}  # start -> end, the longest read
        self.newest = -1  # start of the newest stretch read
        self.lost = False

    def add(self, stretches: list[tuple[int, int]]) -> None:
        if stretches and len(stretches) >= STRETCHES and 0 <= self.newest < stretches[0][0]:
            self.lost = True
        for start, end in stretches:
            if end > self.ends.get(start, start):
                self.ends[start] = end
            self.newest = max(self.newest, start)

    def points(self) -> list[tuple[int, int]]:
        """(time, GPU time so far) at the ends of every stretch: exact, linear in between."""
        return cumulative(sorted(self.ends.items()))


class Background:
    """A daemon thread that runs `_run` from the `with` block's start; at its end `_stop`
    is set and the thread joined (for up to JOIN_S)."""

    JOIN_S = 5.0

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(self.JOIN_S)

    def _run(self) -> None:
        raise NotImplementedError


class BusySampler(Background):
    """Samples (CLOCK_MONOTONIC ns, {pid: busy ns}) of device 0 every `interval_s` in a thread.

    A sample is timed by the clock read before and after it (the simulator serves work up to
    the moment it is read) and kept only when the two are at most SAMPLE_SPAN_NS apart: a
    sampler thread held up between the read and its timestamp (the GIL, a busy CPU) made a
    100 ms interval look up to that much fuller or emptier than it was. `dropped` counts the
    others. With `served`, each read also adds every process's service stretches to
    `served[pid]`, whatever the read took (each stretch carries its own times).

    `held_up`: (from, to) of each wait between two reads that lasted HELD_UP_NS past the
    interval: the host ran none of this process's threads then, and likely held up the
    tenants' processes too (a shared VM's CPU taken away, not a choice of the scheduler)."""

    def __init__(self, state_path: Path, interval_s: float = 0.05, served: bool = False) -> None:
        self.state_path = state_path
        self.interval_s = interval_s
        self.samples: list[tuple[int, dict[int, int]]] = []
        self.dropped = 0
        self.served: dict[int, ServedLog] | None = {} if served else None
        self.held_up: list[tuple[int, int]] = []
        super().__init__("busy-sampler")

    def _run(self) -> None:
        reader = None
        last: int | None = None
        while not self._stop.is_set():
            woke = time.monotonic_ns()
            if last is not None and woke - last > self.interval_s * 1e9 + HELD_UP_NS:
                self.held_up.append((last, woke))
            last = woke
            try:
                reader = reader or SimReader(self.state_path)
                before = time.monotonic_ns()
                busy = {p.pid: p.busy_ns for p in reader.processes(0)}
                after = time.monotonic_ns()
                if after - before <= SAMPLE_SPAN_NS:
                    self.samples.append(((before + after) // 2, busy))
                else:
                    self.dropped += 1
                if self.served is not None:
                    for pid in busy:
                        self.served.setdefault(pid, ServedLog()).add(reader.served(pid))
            except Exception:  # the state file appears with the first process
                reader = None
            self._stop.wait(self.interval_s)
        if reader is not None:
            reader.close()

    def _span(self, start_ns: int, end_ns: int) -> tuple[int, int]:
        """The first sample at or after start and the last at or before end (the process lives then)."""
        times = [t for t, _ in self.samples]
        i, j = bisect.bisect_left(times, start_ns), bisect.bisect_right(times, end_ns) - 1
        if i >= j:
            raise RuntimeError("fewer than two simulator samples in the window: run longer")
        return i, j

    def busy_between(self, pid: int, start_ns: int, end_ns: int) -> float:
        """GPU seconds `pid` was served over the window (between the samples _span picks)."""
        i, j = self._span(start_ns, end_ns)
        return (self.samples[j][1].get(pid, 0) - self.samples[i][1].get(pid, 0)) / 1e9

    def window(self, start_ns: int, end_ns: int) -> float:
        """Seconds between the samples busy_between uses for this window."""
        i, j = self._span(start_ns, end_ns)
        return (self.samples[j][0] - self.samples[i][0]) / 1e9
