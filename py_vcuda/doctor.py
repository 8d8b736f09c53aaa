"""`vcuda doctor`: what CUDA this environment would run, and whether the shim works.

Reports the driver's version, every CUDA runtime (libcudart) the environment
could load (library path, ldconfig cache, pip wheels), the version rules each
one breaks (the driver must be at least as new as the runtime's major version;
a newer minor only works through minor-version compatibility), and whether
libvcuda intercepts a test allocation.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from py_vcuda import __version__, native
from py_vcuda.environ import overlay
from py_vcuda.launch import Tenant, runtime_dir, tenant_env

_CUDART = re.compile(r"libcudart\.so\.(\d+)(?:\.(\d+))?(?:\.(\d+))?$")


@dataclass(frozen=True)
class Runtime:
    path: str
    major: int
    minor: int | None
    source: str


@dataclass(frozen=True)
class Finding:
    level: str  # "ok", "warn", "error"
    text: str


def driver_version(path: str, env: dict[str, str] | None = None) -> int | None:
    """cuDriverGetVersion of the driver at `path`, or None if it cannot be loaded.

    `env` is set while it answers: the simulator reads its state file from it."""
    try:
        with overlay(env or {}):
            lib = ctypes.CDLL(path)
            v = ctypes.c_int()
            if lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
                return None
            return v.value
    except (OSError, AttributeError):
        return None


def nvml_driver_string(path: str) -> str | None:
    try:
        lib = ctypes.CDLL(path)
        if lib.nvmlInit_v2() != 0:
            return None
        buf = ctypes.create_string_buffer(80)
        ok = lib.nvmlSystemGetDriverVersion(buf, 80) == 0
        lib.nvmlShutdown()
        return buf.value.decode() if ok else None
    except (OSError, AttributeError):
        return None


def _version_from_name(path: str, source: str) -> Runtime | None:
    m = _CUDART.search(os.path.basename(path))
    if not m:
        return None
    return Runtime(path, int(m.group(1)), int(m.group(2)) if m.group(2) else None, source)


def _wheel_minor(path: Path) -> int | None:
    """pip wheels ship libcudart.so.12 only; the dist-info next door has the version."""
    site = path
    while site.name != "site-packages" and site != site.parent:
        site = site.parent
    for meta in glob.glob(str(site / "nvidia_cuda_runtime*.dist-info" / "METADATA")):
        with open(meta, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("Version:"):
                    parts = line.split(":", 1)[1].strip().split(".")
                    if len(parts) > 1 and parts[1].isdigit():
                        return int(parts[1])
    return None


def find_runtimes(env: dict[str, str] | None = None) -> list[Runtime]:
    env = dict(os.environ) if env is None else env
    found: dict[str, Runtime] = {}

    def add(path: str, source: str) -> None:
        real = os.path.realpath(path)
        if real in found or not os.path.exists(path):
            return
        rt = _version_from_name(real, source) or _version_from_name(path, source)
        if rt is not None:
            found[real] = Runtime(path, rt.major, rt.minor, source)

    for d in filter(None, env.get("LD_LIBRARY_PATH", "").split(":")):
        for p in glob.glob(os.path.join(d, "libcudart.so.*")):
            add(p, "LD_LIBRARY_PATH")
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if "libcudart.so." in line and "=>" in line:
                add(line.split("=>", 1)[1].strip(), "ldconfig")
    except (OSError, subprocess.SubprocessError):
        pass
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        patterns = ["nvidia/cuda_runtime/lib/libcudart.so.*", "nvidia/cu*/lib/libcudart.so.*",
                    "torch/lib/libcudart*.so*", "cupy*/.data/lib/libcudart.so.*"]
        for pattern in patterns:
            for p in glob.glob(os.path.join(site, pattern)):
                rt = _version_from_name(p, "pip wheel")
                if rt is None:
                    continue
                minor = rt.minor if rt.minor is not None else _wheel_minor(Path(p))
                found.setdefault(os.path.realpath(p), Runtime(p, rt.major, minor, "pip wheel"))
    return sorted(found.values(), key=lambda r: (r.major, r.minor or 0, r.path))


def judge(driver: int | None, runtimes: list[Runtime]) -> list[Finding]:
    """The version rules each runtime breaks against the driver."""
    if driver is None:
        return [Finding("error", "no CUDA driver could be loaded")]
    d_major, d_minor = driver // 1000, (driver % 1000) // 10
    findings = []
    for rt in runtimes:
        name = f"CUDA {rt.major}.{rt.minor if rt.minor is not None else 'x'} runtime ({rt.path})"
        if rt.major > d_major:
            findings.append(Finding("error", f"{name} needs a driver for CUDA {rt.major}; "
                                             f"this driver supports {d_major}.{d_minor}"))
        elif rt.major == d_major and rt.minor is not None and rt.minor > d_minor:
            findings.append(Finding("warn", f"{name} is newer than the driver ({d_major}.{d_minor}):"
                                            " works through minor-version compatibility, but PTX"
                                            " JIT and new APIs fail"))
        else:
            findings.append(Finding("ok", f"{name} runs on this driver"))
    return findings


def intercept_check(driver_path: str | None, extra_env: dict[str, str]) -> dict[str, object]:
    """Run the probe under the shim with a 64 MiB quota and see it enforced."""
    limit = 64 << 20
    ledger = runtime_dir() / f"doctor-{os.getpid()}.ledger"
    env = tenant_env(Tenant(memory=limit), {**os.environ, **extra_env}, ledger)
    if driver_path:
        env["VCUDA_REAL_LIBCUDA"] = driver_path
    try:
        out = subprocess.run([sys.executable, "-m", "py_vcuda.probe", "check", "--limit", str(limit)],
                             env=env, capture_output=True, text=True, timeout=60)
        lines = out.stdout.strip().splitlines()
        result = json.loads(lines[-1]) if lines else {"error": out.stderr.strip() or "no output"}
    except (subprocess.SubprocessError, json.JSONDecodeError) as exc:
        result = {"error": str(exc)}
    finally:
        ledger.unlink(missing_ok=True)
    return result


def report(simulate: bool = False) -> tuple[list[str], int]:
    """Lines to print and the exit status (1 when something is broken)."""
    if not simulate:
        return _report(None)
    # A private simulator state per check: a state file left by another vcuda version
    # (another layout) or by a concurrent doctor must not decide the verdict.
    with tempfile.TemporaryDirectory(prefix="vcuda-doctor-", dir=runtime_dir()) as tmp:
        return _report(Path(tmp) / "sim.state")


def _report(sim_state: Path | None) -> tuple[list[str], int]:
    simulate = sim_state is not None
    lines = [f"vcuda {__version__}"]
    status = 0
    try:
        shim = native.lib_path(native.SHIM)
        lines.append(f"libvcuda: {shim}")
    except native.NativeLibraryMissing as exc:
        return [*lines, f"error: {exc}"], 1
    extra: dict[str, str] = {}
    if simulate:
        from py_vcuda.sim import SimConfig

        extra = SimConfig(state_path=sim_state).env()
        os.environ.update(extra)  # the driver is loaded in this process too (driver_version)
        lines.append("using the GPU simulator (--simulate)")
    driver_path = extra.get("VCUDA_REAL_LIBCUDA") or os.environ.get("VCUDA_REAL_LIBCUDA") or "libcuda.so.1"
    nvml_path = extra.get("VCUDA_REAL_LIBNVML") or os.environ.get("VCUDA_REAL_LIBNVML") or "libnvidia-ml.so.1"
    driver = driver_version(driver_path, extra)
    if driver is None:
        lines.append(f"driver: none ({driver_path} cannot be loaded)")
    else:
        nvml = nvml_driver_string(nvml_path) if not simulate else None
        lines.append(f"driver: CUDA {driver // 1000}.{(driver % 1000) // 10}"
                     + (f", NVIDIA {nvml}" if nvml else "") + f" ({driver_path})")
    runtimes = find_runtimes()
    if not runtimes:
        lines.append("runtimes: no libcudart found on the library path or in pip wheels")
    for f in judge(driver, runtimes) if runtimes or driver is None else []:
        lines.append(f"{f.level}: {f.text}")
        if f.level == "error":
            status = 1
    if driver is not None:
        result = intercept_check(driver_path, extra)
        if result.get("intercepted"):
            lines.append("shim: intercepts (64Mi quota shown by cuMemGetInfo, larger allocation refused)")
        else:
            lines.append(f"error: shim does not intercept: {result}")
            status = 1
    elif not simulate:
        lines.append("hint: `vcuda doctor --simulate` checks the shim against the GPU simulator")
    return lines, status
