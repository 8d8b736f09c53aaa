"""deploy/image/build.py, loaded as a module (deploy/ is not a package), for tests/image; and how the
tests run an image with podman on this machine."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD_PY = REPO / "deploy" / "image" / "build.py"


def load_build() -> ModuleType:
    name = "vcuda_image_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BUILD_PY)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module   # dataclasses look their module up by name
        spec.loader.exec_module(module)
    return sys.modules[name]


def podman_run_prefix() -> list[str]:
    """`podman run` with the options this machine needs, up to the image."""
    build = load_build()
    runtime = build.choose_runtime("podman", None, build.host_cgroup_v2())
    # podman raises the open-files and processes limits above the host's for root containers, which a
    # sandboxed host can refuse ("setrlimit: operation not permitted"); modest explicit limits always work.
    cmd = ["podman", "run", "--rm", "--network=none", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
    return cmd + (["--runtime", runtime] if runtime else [])


def need_tools(tools: Sequence[str], what: str, install: str = "apt-get install podman mmdebstrap runc") -> None:
    """Skip the test when a tool is missing, but fail under CI (`CI` set): .ci/run installs them, and a
    skip there would hide a broken image."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        message = f"{what} needs {', '.join(missing)} ({install})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: .ci/run installs them, so under CI this is a failure")
        pytest.skip(message)
