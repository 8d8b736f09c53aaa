"""Real-hardware test suite: fixtures shared by gpu_tests/ (see gpu_tests/RESULTS.md).

Every test here needs a real NVIDIA GPU. Without one (no libcuda.so.1, cuInit
fails, no device) every test is collected and skipped with that reason, so
`pytest gpu_tests` passes cleanly on CPU-only machines and in CI.

Tests never load CUDA in the pytest process beyond `cuInit` for detection: each
scenario runs in child processes (``python -c SNIPPET``) under a tenant's
environment (``LD_PRELOAD=libvcuda.so``, ``VCUDA_MEMORY_LIMIT``, ``VCUDA_LEDGER``)
built by :func:`py_vcuda.launch.tenant_env`, exactly what `vcuda run` builds.

Children talk to the test over a tiny line protocol: the snippet prelude
defines ``say(**kw)`` (print one JSON line, then wait for a line on stdin, so
the test can measure while the child holds its state) and ``done(**kw)`` (print
the final JSON line). The figures a test records go to ``$VCUDA_GPU_RESULTS``.

Knobs (environment): ``VCUDA_GPU_TEST_GPU`` (NVML index or UUID of the GPU to
use, default index 0), ``VCUDA_GPU_TEST_QUOTA`` (single-tenant quota, default
4Gi), ``VCUDA_GPU_TEST_SHARED_QUOTA`` (quota of the 4-process tenant, default
6Gi), ``VCUDA_GPU_RESULTS`` (JSON file written at the end of the session),
``VCUDA_CUDA12_PYTHON`` (an interpreter whose CuPy/PyTorch use a CUDA 12
runtime), ``VCUDA_GPU_TEST_SECONDS`` (measurement window of compute tests).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
MiB = 1 << 20
GiB = 1 << 30

# --------------------------------------------------------------------------
# Is there a GPU? Decided once, at import, so collection can skip everything.
# --------------------------------------------------------------------------


def _gpu_skip_reason() -> str | None:
    try:
        from py_vcuda.gpu import real_gpu_count
    except ImportError as exc:  # py_vcuda not importable: cannot even ask
        return f"py_vcuda is not importable ({exc}); run from the checkout or install vcuda"
    if real_gpu_count() < 1:
        return "no NVIDIA GPU here (libcuda.so.1 missing, cuInit failed or no device): real-hardware tests skipped"
    return None


GPU_SKIP_REASON = _gpu_skip_reason()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu_figures: the test records figures for gpu_tests/RESULTS.md")


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"vcuda gpu_tests: {GPU_SKIP_REASON or 'real GPU found'}"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if GPU_SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)


# --------------------------------------------------------------------------
# Figures: one JSON document per session, written to $VCUDA_GPU_RESULTS.
# --------------------------------------------------------------------------

RESULTS: dict[str, Any] = {
    "suite": "vcuda gpu_tests",
    "started": datetime.now(UTC).isoformat(timespec="seconds"),
    "skip_reason": GPU_SKIP_REASON,
    "gpu": {},
    "tests": {},
}


def _entry(nodeid: str) -> dict[str, Any]:
    return RESULTS["tests"].setdefault(nodeid, {"outcome": None, "figures": {}})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _entry(report.nodeid)
    if report.when == "call" or report.outcome != "passed":
        if entry["outcome"] in (None, "passed"):
            entry["outcome"] = report.outcome
        entry["duration_s"] = round(entry.get("duration_s", 0.0) + report.duration, 3)
        if report.skipped and isinstance(report.longrepr, tuple):
            entry["reason"] = str(report.longrepr[2])
        elif report.failed:
            entry["reason"] = str(report.longreprtext)[-4000:]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("VCUDA_GPU_RESULTS")
    if not path:
        return
    RESULTS["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    RESULTS["exitstatus"] = int(exitstatus)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(RESULTS, indent=2, sort_keys=True, default=str) + "\n")


Record = Callable[..., None]


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Record:
    """``record(name=value, ...)``: figures of this test, kept in the results file."""
    figures = _entry(request.node.nodeid)["figures"]

    def put(**values: Any) -> None:
        figures.update(values)

    return put


# --------------------------------------------------------------------------
# Configuration knobs
# --------------------------------------------------------------------------

_UNITS = {"": 1, "Ki": 1 << 10, "Mi": MiB, "Gi": GiB, "Ti": 1 << 40, "K": 10**3, "M": 10**6, "G": 10**9}


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|K|M|G)?\s*", text)
    if not m:
        raise ValueError(f"not a byte quantity: {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def env_bytes(name: str, default: str) -> int:
    return parse_bytes(os.environ.get(name) or default)


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def need_module(name: str) -> None:
    if not has_module(name):
        pytest.skip(f"{name} is not importable in {sys.executable}")


# --------------------------------------------------------------------------
# NVML: real per-process and per-device memory, read outside the shim
# --------------------------------------------------------------------------


class NvmlReader:
    """Real memory figures of one GPU: nvidia-ml-py (pynvml) if importable,
    else `nvidia-smi`. The pytest process has no LD_PRELOAD, so these are the
    driver's own figures, not the quota view."""

    def __init__(self, selector: str) -> None:
        self.backend = ""
        self._nvml: Any = None
        self._handle: Any = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            if selector.isdigit():
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(int(selector))
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(selector)
            self._nvml = pynvml
            self.backend = "pynvml"
        except Exception:  # any failure: fall back to nvidia-smi
            self._nvml = None
        if self._nvml is None:
            if shutil.which("nvidia-smi") is None:
                raise RuntimeError("neither nvidia-ml-py (pynvml) nor nvidia-smi is available")
            self.backend = "nvidia-smi"
            self._selector = selector
        info = self.info()
        self.uuid: str = info["uuid"]
        self._selector = self.uuid

    def _smi(self, *args: str) -> list[list[str]]:
        out = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], check=True,
                             capture_output=True, text=True, timeout=60, env=plain_env()).stdout
        return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]

    def info(self) -> dict[str, Any]:
        if self._nvml is not None:
            n, h = self._nvml, self._handle

            def s(v: Any) -> str:
                return v.decode() if isinstance(v, bytes) else str(v)

            mem = n.nvmlDeviceGetMemoryInfo(h)
            return {"name": s(n.nvmlDeviceGetName(h)), "uuid": s(n.nvmlDeviceGetUUID(h)),
                    "driver_version": s(n.nvmlSystemGetDriverVersion()), "memory_total": int(mem.total),
                    "nvml": "pynvml"}
        row = self._smi("-i", self._selector, "--query-gpu=name,uuid,driver_version,memory.total")[0]
        return {"name": row[0], "uuid": row[1], "driver_version": row[2], "memory_total": int(row[3]) * MiB,
                "nvml": "nvidia-smi"}

    def device_used(self) -> int:
        if self._nvml is not None:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        return int(self._smi("-i", self._selector, "--query-gpu=memory.used")[0][0]) * MiB

    def device_free(self) -> int:
        if self._nvml is not None:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).free)
        return int(self._smi("-i", self._selector, "--query-gpu=memory.free")[0][0]) * MiB

    def process_used(self) -> dict[int, int]:
        """pid -> bytes for every compute process on the GPU (pids as NVML sees them)."""
        if self._nvml is not None:
            out: dict[int, int] = {}
            for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
                if p.usedGpuMemory is not None:
                    out[int(p.pid)] = out.get(int(p.pid), 0) + int(p.usedGpuMemory)
            return out
        out = {}
        for row in self._smi("-i", self._selector, "--query-compute-apps=pid,used_memory"):
            if len(row) == 2 and row[0].isdigit() and row[1].isdigit():
                out[int(row[0])] = out.get(int(row[0]), 0) + int(row[1]) * MiB
        return out

    def usage_of(self, pids: Sequence[int], baseline_used: int) -> tuple[dict[int, int] | None, int, str]:
        """Real usage of `pids`: per process when NVML lists them all, else (in a
        container whose pids NVML cannot see) the device-wide increase over
        `baseline_used`. Returns (per-pid or None, total, method)."""
        by_pid = self.process_used()
        if pids and all(p in by_pid for p in pids):
            per = {p: by_pid[p] for p in pids}
            return per, sum(per.values()), "nvml-per-process"
        return None, max(0, self.device_used() - baseline_used), "nvml-device-delta"


def plain_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without any vcuda variable or preload: the no-shim baseline."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith("VCUDA_") or k in ("VCUDA_LIB_DIR",)}
    env.pop("LD_PRELOAD", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="session")
def no_shim_env() -> dict[str, str]:
    """plain_env(): children without vcuda's variables or preload, any GPU visible."""
    return plain_env()


@pytest.fixture(scope="session")
def nvml() -> NvmlReader:
    try:
        return NvmlReader(os.environ.get("VCUDA_GPU_TEST_GPU", "0"))
    except Exception as exc:
        pytest.fail(f"cannot read real GPU memory: {exc} (install nvidia-ml-py or put nvidia-smi on PATH)")


@pytest.fixture(scope="session")
def gpu(nvml: NvmlReader) -> dict[str, Any]:
    """The GPU under test: name, uuid, driver, total memory, CUDA driver version."""
    info = nvml.info()
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            info["cuda_driver_version"] = v.value
    except OSError:
        pass
    RESULTS["gpu"] = info
    return info


@pytest.fixture(scope="session")
def shim() -> Path:
    """libvcuda.so; a GPU run without it is a setup error, not a skip."""
    from py_vcuda import native

    try:
        path = native.lib_path(native.SHIM)
    except native.NativeLibraryMissing as exc:
        pytest.fail(str(exc))
    RESULTS["shim"] = str(path)
    return path


# --------------------------------------------------------------------------
# Tenants and child processes
# --------------------------------------------------------------------------

PRELUDE = textwrap.dedent("""\
    import json as _json, os as _os, sys as _sys, time as _time
    def say(**kw):
        kw.setdefault("pid", _os.getpid())
        print(_json.dumps(kw), flush=True)
        _sys.stdin.readline()
    def done(**kw):
        kw.setdefault("pid", _os.getpid())
        print(_json.dumps(kw), flush=True)
    def vcuda_maps():
        # runtime libraries this process loaded (which libcudart, libvcuda present?)
        libs = set()
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1]
                if "libcudart" in p or "libvcuda" in p or "libcuda.so" in p or "libnvidia-ml" in p:
                    libs.add(p)
        return sorted(libs)
    """)


class ChildError(AssertionError):
    pass


@dataclass
class Child:
    """A `python -c SNIPPET` child speaking the say/done line protocol."""

    proc: subprocess.Popen[bytes]
    label: str
    err: Any  # a temporary file holding the child's stderr (a pipe could fill and block it)
    messages: list[dict[str, Any]] = field(default_factory=list)
    _buf: bytes = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read(self, timeout: float = 300.0) -> dict[str, Any]:
        """The next JSON line the child prints (non-JSON lines are ignored)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                text = line.decode(errors="replace").strip()
                if text.startswith("{"):
                    try:
                        msg = json.loads(text)
                    except json.JSONDecodeError:
                        continue
                    self.messages.append(msg)
                    return msg
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise ChildError(f"{self.label}: no message within {timeout:.0f}s; stderr:\n{self.stderr()}")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    rc = self.proc.wait()
                    raise ChildError(f"{self.label}: exited (rc={rc}) before its next message; "
                                     f"stderr:\n{self.stderr()}")
                self._buf += chunk

    def go(self) -> None:
        """Let the child past its current `say`."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def finish(self, timeout: float = 300.0) -> dict[str, Any]:
        """Release the child, read its `done` message and wait for it to exit 0."""
        self.go()
        msg = self.read(timeout)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ChildError(f"{self.label}: did not exit; stderr:\n{self.stderr()}") from None
        if rc != 0:
            raise ChildError(f"{self.label}: exit status {rc}; stderr:\n{self.stderr()}")
        return msg

    def stderr(self, limit: int | None = 8000) -> str:
        """What the child wrote to stderr so far (the last `limit` characters; None: all)."""
        self.err.flush()
        self.err.seek(0)
        text = self.err.read().decode(errors="replace")
        return text if limit is None else text[-limit:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class RunResult:
    rc: int
    data: dict[str, Any]
    messages: list[dict[str, Any]]
    stdout: str
    stderr: str


class Py:
    """Runs Python snippets in child processes, in a given environment."""

    def __init__(self) -> None:
        self.children: list[Child] = []

    def spawn(self, code: str, env: Mapping[str, str], *, python: str | None = None,
              argv: Sequence[str] = (), prefix: Sequence[str] = (), label: str = "child") -> Child:
        cmd = [*prefix, python or sys.executable, "-u", "-c", PRELUDE + textwrap.dedent(code), *argv]
        err = tempfile.TemporaryFile()  # noqa: SIM115 - closed in cleanup(), after the child is gone
        proc = subprocess.Popen(cmd, env=dict(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, cwd=str(REPO))
        child = Child(proc, label, err)
        self.children.append(child)
        return child

    def run(self, code: str, env: Mapping[str, str], *, python: str | None = None, timeout: float = 300.0,
            argv: Sequence[str] = ()) -> RunResult:
        """Run to completion (stdin closed: `say` does not wait); `data` is the last JSON line."""
        cmd = [python or sys.executable, "-u", "-c", PRELUDE + textwrap.dedent(code), *argv]
        proc = subprocess.run(cmd, env=dict(env), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, cwd=str(REPO))
        messages = []
        for line in proc.stdout.splitlines():
            if line.strip().startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    messages.append(json.loads(line))
        return RunResult(proc.returncode, messages[-1] if messages else {}, messages, proc.stdout, proc.stderr)

    def cleanup(self) -> None:
        for child in self.children:
            child.kill()
            child.err.close()


@pytest.fixture
def py() -> Iterator[Py]:
    runner = Py()
    yield runner
    runner.cleanup()


@pytest.fixture(scope="module")
def py_module() -> Iterator[Py]:
    """A snippet runner for module-scoped fixtures (baselines measured once per module)."""
    runner = Py()
    yield runner
    runner.cleanup()


@dataclass
class TenantEnv:
    """One tenant: its quota, its ledger, and the environment its processes run in."""

    quota: int
    ledger: Path
    env: dict[str, str]
    uuid: str

    def ledger_device(self) -> Any:
        """This tenant's ledger record for the GPU under test (None before any process used it)."""
        from py_vcuda.ledger import Ledger

        if not self.ledger.exists():
            return None
        with Ledger(self.ledger) as led:
            for dev in led.devices():
                if dev.uuid == self.uuid:
                    return dev
        return None

    def ledger_processes(self) -> list[Any]:
        from py_vcuda.ledger import Ledger

        with Ledger(self.ledger) as led:
            return led.processes()

    def with_env(self, **extra: str | None) -> dict[str, str]:
        env = dict(self.env)
        for k, v in extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env


MakeTenant = Callable[..., TenantEnv]


@pytest.fixture
def make_tenant(shim: Path, gpu: dict[str, Any], nvml: NvmlReader, tmp_path: Path) -> MakeTenant:
    """``make_tenant(quota=None, name="t", log_level=None)``: a fresh tenant (own ledger)
    pinned to the GPU under test. Every process started with its ``env`` shares
    the tenant's quota, like the processes of one container or one `vcuda run`."""
    from py_vcuda.launch import Tenant, tenant_env

    def make(quota: int | None = None, name: str = "tenant", log_level: str | None = None) -> TenantEnv:
        quota = env_bytes("VCUDA_GPU_TEST_QUOTA", "4Gi") if quota is None else quota
        free = nvml.device_free()
        if quota + 2 * GiB > free:
            pytest.skip(f"quota {quota >> 20} MiB does not fit the GPU's {free >> 20} MiB free memory "
                        "with room to spare (set VCUDA_GPU_TEST_QUOTA lower)")
        ledger = tmp_path / f"{name}.ledger"
        tenant = Tenant(memory=quota, gpu=gpu["uuid"], log_level=log_level)
        env = tenant_env(tenant, plain_env(), ledger)
        return TenantEnv(quota=quota, ledger=ledger, env=env, uuid=gpu["uuid"])

    return make


@pytest.fixture(scope="session")
def shared_quota() -> int:
    """Quota of the tenant whose 4 processes share it (VCUDA_GPU_TEST_SHARED_QUOTA, default 6Gi)."""
    return env_bytes("VCUDA_GPU_TEST_SHARED_QUOTA", "6Gi")


@pytest.fixture(scope="session")
def baseline_env(gpu: dict[str, Any]) -> dict[str, str]:
    """No shim, same GPU: the reference the shim is compared with."""
    env = plain_env()
    env["CUDA_VISIBLE_DEVICES"] = gpu["uuid"]
    return env


def vcuda_command() -> list[str]:
    """How to invoke the `vcuda` CLI from this checkout or installation."""
    return [sys.executable, "-m", "py_vcuda"]
