"""Fixtures of the `vcuda` command tests."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def runtime_env() -> Iterator[dict[str, str]]:
    """A private runtime dir; token schedulers started under it are stopped afterwards."""
    short = Path(tempfile.mkdtemp(prefix="vc", dir="/tmp"))  # unix socket paths are limited to 107 bytes
    yield {"XDG_RUNTIME_DIR": str(short)}
    subprocess.run(["pkill", "-f", f"token_scheduler --gpu 0 --dir {short}/"], check=False)
    shutil.rmtree(short, ignore_errors=True)
