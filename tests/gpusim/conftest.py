"""Fixtures for the GPU simulator's tests: a private state file per test and
the C client programs, linked against the simulator."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from simtool import Line, parse

from py_vcuda.sim import GiB, MiB, SimConfig

REPO = Path(__file__).resolve().parents[2]
SIM_FLAGS = (f"-I{REPO / 'gpusim' / 'src'}", f"-I{REPO / 'gpusim' / 'include'}")


@pytest.fixture
def sim(tmp_path: Path) -> SimConfig:
    """A small simulated GPU, private to the test."""
    return SimConfig(state_path=tmp_path / "state", memory=1 * GiB, context_overhead=64 * MiB)


@pytest.fixture(scope="session")
def build_sim(build_c: Callable[..., Path], lib_dir: Path) -> Callable[..., Path]:
    """Builds tests/c/<name> (and more sources) linked against libvcuda-sim-cuda.so."""

    def build(name: str, *more: str) -> Path:
        return build_c([name, *more], flags=SIM_FLAGS,
                       libs=[f"-L{lib_dir}", "-lvcuda-sim-cuda", f"-Wl,-rpath,{lib_dir}"])

    return build


@pytest.fixture
def tool(build_sim: Callable[..., Path], sim: SimConfig) -> Callable[..., list[Line]]:
    """Runs sim_tool with commands; returns its parsed output lines."""
    exe = build_sim("sim_tool.c", "sim_tool_mem.c")

    def run(*cmds: str, env: dict[str, str] | None = None, timeout: float = 20) -> list[Line]:
        proc = subprocess.run([str(exe), *cmds], env={**os.environ, **sim.env(), **(env or {})},
                              capture_output=True, text=True, timeout=timeout, check=False)
        assert proc.returncode == 0, proc.stderr
        return parse(proc.stdout)

    run.exe = exe  # type: ignore[attr-defined]
    return run


class Children:
    """Background sim_tool processes; each stops at its `ready` command until
    released (a line on stdin). All are killed at the end of the test."""

    def __init__(self, exe: Path, env: dict[str, str]) -> None:
        self.exe, self.env = exe, env
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self, *cmds: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen([str(self.exe), *cmds], env={**os.environ, **self.env, **(env or {})},
                                text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    @staticmethod
    def ready(proc: subprocess.Popen[str]) -> list[Line]:
        """Reads the child's output up to its `ready` line."""
        assert proc.stdout is not None
        seen = []
        for raw in proc.stdout:
            seen.extend(parse(raw))
            if raw.startswith("ready"):
                return seen
        err = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"child exited before ready: {err}")

    @staticmethod
    def release(proc: subprocess.Popen[str]) -> list[Line]:
        out, _ = proc.communicate("\n", timeout=30)
        return parse(out)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


@pytest.fixture
def children(tool: Callable[..., list[Line]], sim: SimConfig) -> Iterator[Children]:
    kids = Children(tool.exe, sim.env())  # type: ignore[attr-defined]
    yield kids
    kids.close()

