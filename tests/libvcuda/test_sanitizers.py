"""The shim built with AddressSanitizer and ThreadSanitizer, driven through the
quota scenarios and a multithreaded stress run under LD_PRELOAD."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from shimtest import OVERHEAD, MiB, Runner

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.sanitizer


def runtime(name: str) -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    path = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        pytest.skip(f"{name} is not installed")
    return path


@pytest.fixture(scope="module", params=["address", "thread"])
def sanitized(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    kind = request.param
    rt = runtime("libasan.so" if kind == "address" else "libtsan.so")
    build = tmp_path_factory.mktemp(f"build-{kind}")
    subprocess.run(["cmake", "-S", str(REPO), "-B", str(build), f"-DVCUDA_SANITIZE={kind}",
                    "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "vcuda", "-j2"], check=True, capture_output=True)
    return kind, f"{rt} {build / 'lib' / 'libvcuda.so'}"


def run_sanitized(run_probe: Runner, sanitized: tuple[str, str], args: list[str], env: dict[str, str]):
    kind, preload = sanitized
    options = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=66",
               "TSAN_OPTIONS": "exitcode=66:report_signal_unsafe=0"}
    res = run_probe(args, env={**env, **options, "LD_PRELOAD": preload}, preload=False, timeout=300)
    assert "Sanitizer" not in res.stderr, res.stderr[-4000:]
    assert res.returncode == 0, res.stderr[-4000:]
    return res


def test_quota_paths(run_probe: Runner, sanitized: tuple[str, str]) -> None:
    limit = 256 * MiB
    a = limit - OVERHEAD
    res = run_sanitized(run_probe, sanitized,
                        ["--via=proc", "init", "ctx", f"alloc:{a}", "alloc:1", "freeall", f"vmm:{a}", "freeall",
                         f"async:{a // 2}", f"pitch:4096:{a // 8192}", "freeall", "array3d:64:64:64", "freeall",
                         "newctx:0", "alloc:4096", "destroyctx", "info", "fork:4096"],
                        {"VCUDA_MEMORY_LIMIT": str(limit)})
    assert res.rc("alloc", 1) == 2
    assert res.get("info", "free") == a


def test_threads_stress(run_probe: Runner, sanitized: tuple[str, str]) -> None:
    res = run_sanitized(run_probe, sanitized, ["--via=proc", "init", "ctx", "stress:16:3:4194304", "info"],
                        {"VCUDA_MEMORY_LIMIT": "128Mi"})
    assert res.get("info", "free") == 128 * MiB - OVERHEAD


def test_held_memory_paths(run_probe: Runner, sanitized: tuple[str, str]) -> None:
    """Pools, local memory and limits, graph memory (issue 12)."""
    module = "vcudasim-module;kernel mid local=2Ki"
    res = run_sanitized(run_probe, sanitized,
                        ["--via=proc", "init", "ctx", f"threshold:{(1 << 64) - 1}", f"async:{40 * MiB}",
                         f"async:{3 * MiB}", "drop:0", "sync", "mkpool:1", f"async:{8 * MiB}", "freeall", "trim:0",
                         "destroypool", "trim:0", f"mod:{module}", "func:mid", "launch:1", "setlimit:2:16777216",
                         "setlimit:2:8388608", "stream", "capture", f"calloc:{4 * MiB}", "cfree", "endcapture",
                         "instantiate", "glaunch", "execdestroy", "graphdestroy", "graphtrim", "info"],
                        {"VCUDA_MEMORY_LIMIT": "1Gi", "VCUDA_SIM_SMS": "4", "VCUDA_SIM_THREADS_PER_SM": "256"})
    assert all(d["rc"] == "0" for d in res.lines if "rc" in d), res.stdout
    assert res.get("info", "free") == (1 << 30) - OVERHEAD - 1024 * 4 * 256  # the frame's high-water mark stays
