"""Fixtures for the GPU simulator's tests: a private state file per test and
the C client programs, linked against the simulator."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from simtool import Children, Line, parse

from py_vcuda.sim import GiB, MiB, SimConfig


@pytest.fixture
def sim(tmp_path: Path) -> SimConfig:
    """A small simulated GPU, private to the test."""
    return SimConfig(state_path=tmp_path / "state", memory=1 * GiB, context_overhead=64 * MiB)


@pytest.fixture
def tool(sim_tool: Path, sim: SimConfig) -> Callable[..., list[Line]]:
    """Runs sim_tool with commands; returns its parsed output lines."""
    exe = sim_tool

    def run(*cmds: str, env: dict[str, str] | None = None, timeout: float = 20) -> list[Line]:
        proc = subprocess.run([str(exe), *cmds], env={**os.environ, **sim.env(), **(env or {})},
                              capture_output=True, text=True, timeout=timeout, check=False)
        assert proc.returncode == 0, proc.stderr
        return parse(proc.stdout)

    run.exe = exe  # type: ignore[attr-defined]
    return run


@pytest.fixture
def children(tool: Callable[..., list[Line]], sim: SimConfig) -> Iterator[Children]:
    kids = Children(tool.exe, sim.env())  # type: ignore[attr-defined]
    yield kids
    kids.close()

