"""The context overhead a ledger charges is one context's, whatever other
containers do on the GPU while it is measured: start their own contexts at the
same time, or allocate. (Measured as the drop in the device's free memory
alone, two containers starting at once each charged both contexts.)

The simulator's VCUDA_SIM_CTX_CREATE_US makes a creation take a second, its
memory taken as it starts, so the test can act inside it."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from simcontainers import Container
from simtool import Children, lines

from py_vcuda.ledger import DeviceUsage, Ledger
from py_vcuda.sim import GiB, MiB, SimConfig, SimReader

OVERHEAD = 64 * MiB
SLOW = {"VCUDA_SIM_CTX_CREATE_US": "1000000"}


@pytest.fixture
def sim(tmp_path: Path) -> SimConfig:
    return SimConfig(state_path=tmp_path / "state", memory=4 * GiB, context_overhead=OVERHEAD)


@pytest.fixture
def children(sim_tool: Path, sim: SimConfig) -> Iterator[Children]:
    kids = Children(sim_tool, sim.env())
    yield kids
    kids.close()


def device(ledger: Path) -> DeviceUsage:
    with Ledger(ledger) as book:
        (dev,) = book.devices()
        return dev


def start_creating(sim: SimConfig, proc: Any) -> None:
    """Lets a child stopped before `primary` go on, and returns once its
    context holds memory: NVML's view before the creation is taken by then."""
    proc.stdin.write("\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 10
    while True:
        with SimReader(sim.state_path) as r:
            p = r.process(proc.pid)
        if p is not None and p.used >= OVERHEAD:
            return
        assert time.monotonic() < deadline, "the slow context never took its memory"
        time.sleep(0.005)


def test_two_containers_starting_at_once_each_charge_one_context(children: Children, sim: SimConfig,
                                                                 tmp_path: Path) -> None:
    a = Container("a", tmp_path / "a.ledger", offset=0)
    b = Container("b", tmp_path / "b.ledger", offset=0)
    pa = children.spawn("init", "ready", "primary", "0", "ready", env={**a.env(GiB), **SLOW})
    children.ready(pa)
    start_creating(sim, pa)
    # B's whole context creation falls inside A's.
    pb = children.spawn("init", "primary", "0", "ready", env=b.env(GiB))
    assert lines(children.ready(pb), "primary")[0].rc == 0
    assert lines(children.ready(pa), "primary")[0].rc == 0
    assert device(b.ledger).used == OVERHEAD
    assert device(b.ledger).context_overhead == OVERHEAD  # B saw A's context before its own: exact
    assert device(a.ledger).used == OVERHEAD  # two new contexts: their average
    assert device(a.ledger).context_overhead == 0  # not recorded: the next process measures again
    pa2 = children.spawn("init", "primary", "0", "ready", env=a.env(GiB))
    children.ready(pa2)
    assert device(a.ledger).used == 2 * OVERHEAD
    assert device(a.ledger).context_overhead == OVERHEAD


def test_a_context_created_between_two_nvml_reads_is_not_taken_for_ours(children: Children, sim: SimConfig,
                                                                         tmp_path: Path) -> None:
    """A's view after its creation reads the process list, then the free memory, which takes a second
    here (VCUDA_SIM_NVML_MEMINFO_US). B's context comes inside that second: in the free memory, not in
    the list. Read once, A took B's context for part of its own, charged both and recorded that for
    every later process of its container (a reconciler test saw 128 MiB charged for a 64 MiB context)."""
    a = Container("a", tmp_path / "a.ledger", offset=0)
    b = Container("b", tmp_path / "b.ledger", offset=0)
    slow_read = {"VCUDA_SIM_NVML_MEMINFO_US": "2000000"}
    pa = children.spawn("init", "ready", "primary", "0", "ready", env={**a.env(GiB), **SLOW, **slow_read})
    children.ready(pa)
    start_creating(sim, pa)
    # A's creation ends a second from now; its view after it then waits two seconds for the free
    # memory: B's context comes in the middle of that.
    time.sleep(1.5)
    pb = children.spawn("init", "primary", "0", "ready", env=b.env(GiB))
    assert lines(children.ready(pb), "primary")[0].rc == 0
    assert lines(children.ready(pa), "primary")[0].rc == 0
    assert device(b.ledger).used == OVERHEAD
    assert device(a.ledger).used == OVERHEAD
    assert device(a.ledger).context_overhead == 0  # two new contexts in its view: not recorded


def test_slow_nvml_memory_reads_are_a_simulator_setting_with_a_range(sim_tool: Path, sim: SimConfig,
                                                                      tmp_path: Path) -> None:
    """The shim's first context measurement starts the simulator's NVML, which refuses the setting."""
    a = Container("a", tmp_path / "a.ledger", offset=0)
    proc = subprocess.run([str(sim_tool), "init", "primary", "0"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **sim.env(), **a.env(GiB), "VCUDA_SIM_NVML_MEMINFO_US": "later"})
    assert "VCUDA_SIM_NVML_MEMINFO_US must be 0..10000000, not later" in proc.stderr


def test_a_neighbour_allocating_meanwhile_is_not_charged_to_the_new_context(
        children: Children, sim: SimConfig, tmp_path: Path) -> None:
    a = Container("a", tmp_path / "a.ledger", offset=0)
    n = Container("neighbour", tmp_path / "n.ledger", offset=0)
    pn = children.spawn("init", "primary", "0", "ready", "alloc", "256M", "ready", env=n.env(GiB))
    children.ready(pn)
    pa = children.spawn("init", "ready", "primary", "0", "ready", env={**a.env(GiB), **SLOW})
    children.ready(pa)
    start_creating(sim, pa)
    assert lines(children.step(pn), "alloc")[0].rc == 0
    assert lines(children.ready(pa), "primary")[0].rc == 0
    assert device(n.ledger).used == OVERHEAD + 256 * MiB
    assert device(a.ledger).used == OVERHEAD
    assert device(a.ledger).context_overhead == OVERHEAD


def test_slow_creation_is_a_simulator_setting_with_a_range(sim_tool: Path, sim: SimConfig) -> None:
    proc = subprocess.run([str(sim_tool), "init"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **sim.env(), "VCUDA_SIM_CTX_CREATE_US": "soon"})
    assert "init 1" in proc.stdout
    assert "VCUDA_SIM_CTX_CREATE_US must be 0..10000000, not soon" in proc.stderr
