"""deploy/image/build.py, loaded as a module (deploy/ is not a package), for tests/image."""

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
