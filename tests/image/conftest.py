"""tests/image: deploy/image/build.py as a module."""

from __future__ import annotations

from types import ModuleType

import pytest
from imagebuild import load_build


@pytest.fixture(scope="session")
def build() -> ModuleType:
    return load_build()
