"""Running the `vcuda` command in tests: a clean environment, a private runtime directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def vcuda_env(env: dict[str, str] | None = None) -> dict[str, str]:
    keep = {"VCUDA_LIB_DIR"}  # where the libraries are; nothing else of a caller's vcuda setup
    full = {k: v for k, v in os.environ.items() if (not k.startswith("VCUDA_") or k in keep) and k != "LD_PRELOAD"}
    full.update(env or {})
    return full


def vcuda(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "py_vcuda", *args], env=vcuda_env(env), capture_output=True,
                          text=True, timeout=timeout)


def vcuda_popen(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "py_vcuda", *args], env=vcuda_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def local_scheduler_dir(runtime_env: dict[str, str], simulated: bool) -> Path:
    """Where `vcuda run --core` keeps GPU 0's local scheduler under runtime_env's XDG_RUNTIME_DIR."""
    return (Path(runtime_env["XDG_RUNTIME_DIR"]) / f"vcuda-{os.getuid()}"
            / f"scheduler-{'sim-' if simulated else ''}gpu-0")
