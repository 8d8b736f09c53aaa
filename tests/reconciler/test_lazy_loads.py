"""Memory no hook sees - module code loaded lazily at a kernel's first launch -
reaches the ledger within one reconciler interval, and later allocations must
fit beneath it: physical use <= ledger <= limit at every step."""

from __future__ import annotations

import time
from pathlib import Path

from simcontainers import Container, FakeProc
from simtool import Children, lines, mem

from py_vcuda.ledger import Ledger
from py_vcuda.memory_reconciler import MemoryReconciler
from py_vcuda.nvml import NVML
from py_vcuda.procfs import ProcFS
from py_vcuda.sim import GiB, MiB, SimConfig, SimReader

OOM = 2
SCRIPT = ("init", "primary", "0", "mem", "ready",
          "module", "vcudasim-module;kernel k code=300Mi", "fn", "k", "run", "0", "mem", "ready",
          "alloc", "700M", "mem", "ready")


def wait_for(cond, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def used(ledger: Path) -> int:
    with Ledger(ledger) as book:
        return sum(d.used for d in book.devices())


def test_lazy_module_loads_are_caught_within_one_interval(children: Children, fake_proc: FakeProc,
                                                          nvml: NVML, sim: SimConfig,
                                                          tmp_path: Path) -> None:
    uuid = nvml.gpu(0).uuid
    watched = Container("watched", tmp_path / "w.ledger", offset=100_000)
    unwatched = Container("unwatched", tmp_path / "u.ledger", offset=200_000)  # no reconciler: the gap
    pw = children.spawn(*SCRIPT, env=watched.env(GiB))
    pu = children.spawn(*SCRIPT, env=unwatched.env(GiB))
    for p, c in ((pw, watched), (pu, unwatched)):
        children.ready(p)
        fake_proc.add(p.pid, p.pid + c.offset)
    rec = MemoryReconciler(lambda: [watched.account(uuid)], nvml, procfs=ProcFS(fake_proc.root),
                           interval_s=0.2)
    rec.start()
    try:
        wait_for(lambda: rec.passes >= 1)
        assert used(watched.ledger) == 64 * MiB  # nothing unattributed yet
        held = mem(lines(children.step(pw), "mem")[0]).total  # the lazy load happens now
        children.step(pu)
        assert held == 64 * MiB + 300 * MiB
        at_load = rec.passes
        wait_for(lambda: used(watched.ledger) >= held)
        # The pass running during the load may have read NVML before it: the next one catches it.
        assert rec.passes - at_load <= 2
        assert used(unwatched.ledger) == 64 * MiB  # what the hooks alone see
        # A later allocation must fit beneath what the GPU really holds.
        after = children.step(pw)
        assert lines(after, "alloc")[0].rc == OOM
        with SimReader(sim.state_path) as r:
            physical = r.process(pw.pid).used  # type: ignore[union-attr]
        assert physical <= used(watched.ledger) <= GiB
        # Without the reconciler the same allocation passes and the process holds more than its quota.
        gap = children.step(pu)
        assert lines(gap, "alloc")[0].rc == 0
        assert mem(lines(gap, "mem")[0]).total == 64 * MiB + 300 * MiB + 700 * MiB > GiB
    finally:
        rec.stop()
