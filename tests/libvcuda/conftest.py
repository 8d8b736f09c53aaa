"""Fixtures for the shim's tests: a fresh simulated GPU per test, the probe
program built two ways, and a runner that parses its output."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from shimtest import Result, Runner, one_gpu_sim_env, parse

from py_vcuda import native
from token_scheduler.testing import AdminClient, spawn_daemon


@pytest.fixture
def sim_env(tmp_path: Path, lib_dir: Path) -> dict[str, str]:
    """Environment of a fresh simulated GPU (one device, 4 GiB, 64 MiB per context)."""
    return one_gpu_sim_env(lib_dir, tmp_path / "sim.state")


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[AdminClient]:
    """A token scheduler daemon (2 s window) in the test's directory; its admin client."""
    directory = tmp_path / "sched"
    daemon = spawn_daemon(directory, "--window", "2s")
    admin = AdminClient(directory / "admin.sock")
    try:
        admin.wait_ready()
        yield admin
    finally:
        admin.close()
        daemon.kill()
        daemon.wait()


@pytest.fixture(scope="session")
def shim(lib_dir: Path) -> Path:
    return lib_dir / native.SHIM


@pytest.fixture(scope="session")
def cuprobe(build_c: Callable[..., Path]) -> Path:
    return build_c(["cuprobe.c"])


@pytest.fixture(scope="session")
def cuprobe_linked(build_c: Callable[..., Path], lib_dir: Path) -> Path:
    """cuprobe linked directly against the driver (the simulator), like a CUDA C program."""
    return build_c(["cuprobe.c"], flags=["-DVIA_LINK"],
                   libs=[f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", f"-l:{native.SIM_CUDA}"])


@pytest.fixture
def run_probe(cuprobe: Path, shim: Path, sim_env: dict[str, str], tmp_path: Path) -> Runner:
    """Run cuprobe under the shim; `env` adds to the simulated GPU's environment."""

    def run(args: Sequence[str], *, env: dict[str, str] | None = None, preload: bool = True,
            exe: Path | None = None, timeout: float = 60) -> Result:
        full = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
        full.update(sim_env)
        full.setdefault("VCUDA_LEDGER", str(tmp_path / "ledger"))
        if preload:
            full["LD_PRELOAD"] = str(shim)
        full.update(env or {})
        proc = subprocess.run([str(exe or cuprobe), *args], env=full, capture_output=True,
                              text=True, timeout=timeout)
        return Result(proc.returncode, proc.stdout, proc.stderr, parse(proc.stdout))

    return run
