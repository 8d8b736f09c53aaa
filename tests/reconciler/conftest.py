"""Fixtures for the memory reconciler's tests: a simulated GPU, its NVML, and
a fake host /proc (tests/simcontainers.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from simcontainers import FakeProc
from simtool import Children

from py_vcuda.nvml import NVML
from py_vcuda.sim import GiB, MiB, SimConfig, nvml_session


@pytest.fixture
def sim(tmp_path: Path) -> SimConfig:
    return SimConfig(state_path=tmp_path / "state", memory=4 * GiB, context_overhead=64 * MiB)


@pytest.fixture
def nvml(sim: SimConfig, sim_tool: Path) -> Iterator[NVML]:
    with nvml_session(sim) as session:
        yield session


@pytest.fixture
def children(sim_tool: Path, sim: SimConfig) -> Iterator[Children]:
    kids = Children(sim_tool, sim.env())
    yield kids
    kids.close()


@pytest.fixture
def fake_proc(tmp_path: Path) -> Iterator[FakeProc]:
    proc = FakeProc(tmp_path / "proc")
    yield proc
    shutil.rmtree(proc.root, ignore_errors=True)
