"""deploy/image/build.py, loaded as a module (deploy/ is not a package), for tests/image; and how the
tests run an image with podman on this machine."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

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
