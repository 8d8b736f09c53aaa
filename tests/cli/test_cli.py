"""The `vcuda` command and py_vcuda's Python API, end to end against the simulator."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from vcudacli import vcuda

from py_vcuda.doctor import Runtime, judge
from py_vcuda.ledger import Ledger, LedgerError
from py_vcuda.quantity import QuantityError, format_bytes, parse_quantity

MiB = 1 << 20


@pytest.mark.parametrize(("text", "expected"), [
    ("1048576", 1 << 20), ("512Mi", 512 * MiB), ("4Gi", 4 << 30), ("1.5Gi", 3 << 29), ("4G", 4 * 10**9),
    ("2k", 2000), ("  64Ki ", 64 << 10), ("0", 0),
])
def test_quantities(text: str, expected: int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["abc", "-1", "5Qi", "1.5.3Gi", "", "0x10", "1e9", "4 Gi extra", "0.3"])
def test_bad_quantities_say_why(text: str) -> None:
    with pytest.raises(QuantityError, match="invalid quantity"):
        parse_quantity(text)


def test_format_bytes() -> None:
    assert format_bytes(4 << 30) == "4Gi"
    assert format_bytes(1536 * MiB) == "1536Mi"
    assert format_bytes(100) == "100"


def test_lib_path() -> None:
    out = vcuda("lib-path")
    assert out.returncode == 0
    assert Path(out.stdout.strip()).name == "libvcuda.so"


def test_run_enforces_memory_on_the_simulator(tmp_path: Path) -> None:
    out = vcuda("run", "--simulate", "--sim-state", str(tmp_path / "sim"), "--memory", "512Mi", "--",
                sys.executable, "-m", "py_vcuda.probe", "fill", "--chunk", str(64 * MiB), "--max", str(2 << 30))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["total"] == 512 * MiB
    assert result["refused_with"] == 2
    assert 0 < result["allocated"] <= 512 * MiB


def test_run_shares_a_ledger_and_removes_its_own(tmp_path: Path) -> None:
    ledger = tmp_path / "shared.ledger"
    out = vcuda("run", "--simulate", "--sim-state", str(tmp_path / "sim"), "--memory", "1Gi", "--ledger",
                str(ledger), "--", sys.executable, "-m", "py_vcuda.probe", "check", "--limit", str(1 << 30))
    assert out.returncode == 0, out.stderr
    with Ledger(ledger) as led:
        (dev,) = led.devices()
        assert dev.limit == 1 << 30
        assert dev.used == 0  # the process is gone and gave everything back


def test_run_with_a_compute_quota(tmp_path: Path, runtime_env: dict[str, str]) -> None:
    """--core starts (or reuses) the GPU's local scheduler and registers the run as a tenant."""
    env = runtime_env
    out = vcuda("run", "--simulate", "--sim-state", str(tmp_path / "sim"), "--core", "40", "--core-limit", "40",
                "--", sys.executable, "-m", "py_vcuda.probe", "spin", "--seconds", "3", env=env)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0.3 <= result["busy_us"] / result["wall_us"] <= 0.5
    out = vcuda("run", "--core", "50", "--core-limit", "20", "--", "true")
    assert out.returncode == 2 and "below --core" in out.stderr
    out = vcuda("run", "--core", "101", "--", "true")
    assert out.returncode == 2 and "1-100" in out.stderr
    out = vcuda("run", "--core", "30", "--gpu", "0,1", "--", "true")
    assert out.returncode == 2 and "one GPU" in out.stderr


LIST_TENANTS = ("import json; from py_vcuda.launch import scheduler_dir; "
                "from token_scheduler.admin_client import AdminClient; "
                "print(json.dumps(AdminClient(scheduler_dir('0', True) / 'admin.sock').call('list')['tenants']))")


def test_run_with_priority(tmp_path: Path, runtime_env: dict[str, str]) -> None:
    """--priority high registers the run as a `high` tenant of the GPU's scheduler."""
    out = vcuda("run", "--simulate", "--sim-state", str(tmp_path / "sim"), "--core", "30", "--priority", "high",
                "--", sys.executable, "-c", LIST_TENANTS, env=runtime_env)
    assert out.returncode == 0, out.stderr
    (tenant,) = json.loads(out.stdout.strip().splitlines()[-1])
    assert (tenant["request"], tenant["priority"]) == (30, "high")
    out = vcuda("run", "--core", "30", "--priority", "urgent", "--", "true")
    assert out.returncode == 2 and "invalid choice: 'urgent'" in out.stderr and "'high', 'normal'" in out.stderr
    out = vcuda("run", "--priority", "high", "--", "true")
    assert out.returncode == 2 and "--priority needs --core" in out.stderr


def test_run_passes_the_exit_status_through() -> None:
    assert vcuda("run", "--", sys.executable, "-c", "raise SystemExit(7)").returncode == 7


def test_run_errors_are_clear() -> None:
    out = vcuda("run", "--memory", "lots", "--", "true")
    assert out.returncode == 2
    assert "invalid quantity 'lots'" in out.stderr
    out = vcuda("run", "--memory", "1Gi")
    assert out.returncode == 2
    assert "no command given" in out.stderr
    out = vcuda("run", "--", "/nonexistent/program")
    assert out.returncode != 0
    assert "command not found" in out.stderr


def test_doctor_against_the_simulator() -> None:
    out = vcuda("doctor", "--simulate")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "driver: CUDA 13.0" in out.stdout
    assert "shim: intercepts" in out.stdout


def test_doctor_without_a_driver_says_so() -> None:
    out = vcuda("doctor", env={"VCUDA_REAL_LIBCUDA": "/nonexistent/libcuda.so.1"})
    assert out.returncode == 1
    assert "no CUDA driver could be loaded" in out.stdout


def test_version_rules() -> None:
    runtimes = [Runtime("/a/libcudart.so.12", 12, 8, "pip wheel"), Runtime("/b/libcudart.so.13", 13, 1, "ldconfig"),
                Runtime("/c/libcudart.so.11", 11, 8, "ldconfig")]
    levels = {f.text.split(" runtime")[0]: f.level for f in judge(12040, runtimes)}
    assert levels == {"CUDA 12.8": "warn", "CUDA 13.1": "error", "CUDA 11.8": "ok"}
    assert judge(None, runtimes)[0].level == "error"


def test_demo_on_the_simulator(runtime_env: dict[str, str]) -> None:
    out = vcuda("demo", "--simulate", env=runtime_env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "simulator" in out.stdout
    assert "tenant-a" in out.stdout and "tenant-b" in out.stdout
    assert "compute shares: configured vs achieved" in out.stdout


def test_help_lists_the_commands() -> None:
    out = vcuda("--help")
    for command in ("run", "doctor", "demo", "lib-path", "scheduler", "extender"):
        assert command in out.stdout


def test_ledger_reader_refuses_foreign_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(b"x" * 100)
    with pytest.raises(LedgerError, match=str(bad)):
        Ledger(bad)
    with Ledger(tmp_path / "new", create=True) as led:
        led.set_limit("GPU-1234", 5 * MiB)
        assert led.devices()[0].limit == 5 * MiB
        assert led.processes() == []
