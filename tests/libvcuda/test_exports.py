"""libvcuda exports only the hooked driver names, dlsym and its vcuda_* API."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ALLOWED = re.compile(r"^(cu[A-Z]\w*|nvml[A-Z]\w*|dlsym|vcuda_\w+)$")


def exported(lib: Path) -> list[str]:
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    return [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]


def test_only_contract_names_are_exported(shim: Path) -> None:
    names = exported(shim)
    stray = [n for n in names if not ALLOWED.match(n)]
    assert stray == [], f"exported outside the contract: {stray}"
    # and the hooks really are there
    for name in ("cuGetProcAddress_v2", "cuMemAlloc_v2", "cuMemCreate", "cuLaunchKernel_ptsz", "dlsym",
                 "nvmlDeviceGetMemoryInfo_v2", "vcuda_version"):
        assert name in names


def test_exported_driver_names_are_exactly_the_hook_table(shim: Path) -> None:
    table = (Path(__file__).resolve().parents[2] / "libvcuda" / "src" / "hooks.h").read_text()
    hooks_section = table.split("/* Driver functions the shim calls itself")[0]
    hooked = set(re.findall(r"X\((cu\w+|nvml\w+),", hooks_section))
    driver_names = {n for n in exported(shim) if n.startswith(("cu", "nvml"))}
    assert driver_names == hooked
