"""Shared fixtures: where the native libraries are, a C compiler for test programs, short socket dirs."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from py_vcuda import native

REPO = Path(__file__).resolve().parent.parent
ABI_INCLUDE = REPO / "libvcuda" / "include"
C_TESTS = REPO / "tests" / "c"


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"vcuda native libraries: {native.lib_dir()}"]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory for unix sockets (their paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="vc", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def lib_dir() -> Path:
    path = native.lib_dir()
    if not (path / native.SIM_CUDA).is_file():
        pytest.fail(f"native libraries missing in {path}: run `pip install .` first")
    return path


BuildC = Callable[..., Path]


@pytest.fixture(scope="session")
def cuprobe_exe(build_c: BuildC) -> Path:
    """cuprobe (tests/c/cuprobe.c), the simulated CUDA program the container tests run."""
    return build_c(["cuprobe.c"])


@pytest.fixture(scope="session")
def build_c(tmp_path_factory: pytest.TempPathFactory) -> BuildC:
    """Compile a C test program once per session; returns the executable's path.

    Sources are relative to tests/c unless absolute; the vcuda ABI headers are on
    the include path.
    """
    out_dir = tmp_path_factory.mktemp("cbin")
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"

    def build(sources: Sequence[str | Path], *, flags: Sequence[str] = (),
              libs: Sequence[str] = ()) -> Path:
        srcs = [Path(s) if Path(s).is_absolute() else C_TESTS / s for s in sources]
        key = hashlib.sha1(
            "\0".join([*map(str, srcs), *flags, *libs]).encode()
        ).hexdigest()[:12]
        exe = out_dir / f"{srcs[0].stem}-{key}"
        if not exe.exists():
            cmd = [cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror",
                   f"-I{ABI_INCLUDE}", f"-I{C_TESTS}", *flags, "-o", str(exe),
                   *map(str, srcs), *libs, "-ldl", "-lpthread"]
            subprocess.run(cmd, check=True)
        return exe

    return build


@pytest.fixture(scope="session")
def build_sim(build_c: BuildC, lib_dir: Path) -> Callable[..., Path]:
    """Builds tests/c/<name> (and more sources) linked against libvcuda-sim-cuda.so."""
    flags = (f"-I{REPO / 'gpusim' / 'src'}", f"-I{REPO / 'gpusim' / 'include'}")

    def build(name: str, *more: str) -> Path:
        return build_c([name, *more], flags=flags,
                       libs=[f"-L{lib_dir}", "-lvcuda-sim-cuda", f"-Wl,-rpath,{lib_dir}"])

    return build


@pytest.fixture(scope="session")
def sim_tool(build_sim: Callable[..., Path]) -> Path:
    """tests/c/sim_tool with its memory commands: a scriptable simulator client."""
    return build_sim("sim_tool.c", "sim_tool_mem.c")
