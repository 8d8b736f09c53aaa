"""The benches' GPU workloads (bench/c/workload.c) and the GPU time each process
was served on the simulator, sampled over a run.

The simulator charges a process's busy time as its work is served (gpusim's
vcudasim.h), so the difference of two samples is the GPU time it got between
them, whatever its launch queue holds: the way to compare tenants over a
common window when some queue seconds of work between synchronizes.
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

from py_vcuda.sim import SimReader
from token_scheduler.testing import AdminClient, spawn_daemon

REPO = Path(__file__).resolve().parents[1]
SAMPLE_SPAN_NS = 1_000_000  # BusySampler: the most a sample's read may take


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


class BusySampler:
    """Samples (CLOCK_MONOTONIC ns, {pid: busy ns}) of device 0 every `interval_s` in a thread.

    A sample is timed by the clock read before and after it (the simulator serves work up to
    the moment it is read) and kept only when the two are at most SAMPLE_SPAN_NS apart: a
    sampler thread held up between the read and its timestamp (the GIL, a busy CPU) made a
    100 ms interval look up to that much fuller or emptier than it was. `dropped` counts the
    others."""

    def __init__(self, state_path: Path, interval_s: float = 0.05) -> None:
        self.state_path = state_path
        self.interval_s = interval_s
        self.samples: list[tuple[int, dict[int, int]]] = []
        self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="busy-sampler", daemon=True)

    def __enter__(self) -> BusySampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        reader = None
        while not self._stop.is_set():
            try:
                reader = reader or SimReader(self.state_path)
                before = time.monotonic_ns()
                busy = {p.pid: p.busy_ns for p in reader.processes(0)}
                after = time.monotonic_ns()
                if after - before <= SAMPLE_SPAN_NS:
                    self.samples.append(((before + after) // 2, busy))
                else:
                    self.dropped += 1
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
