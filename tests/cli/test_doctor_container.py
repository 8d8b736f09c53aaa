"""`vcuda doctor` inside a vgpu container: one line per check (preload, ledger, scheduler, limits)
and a non-zero exit when one fails. The container is what the node agent's Allocate gives one:
VCUDA_LEDGER, VCUDA_SCHEDULER, VCUDA_MEMORY_LIMIT, VCUDA_CORE_* and libvcuda preloaded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vcudacli import vcuda

from py_vcuda import native
from py_vcuda.ledger import Ledger
from token_scheduler.policy import MS, SECOND, PolicyConfig
from token_scheduler.testing import AdminClient, daemon_thread

GiB = 1 << 30
UUID = "GPU-5157a0c0-0000-4000-8000-000000000000"


@pytest.fixture
def container(short_dir: Path) -> Iterator[dict[str, str]]:
    """The environment of a vgpu container with 1 GiB and 30 % (limit 50 %) of a GPU."""
    config = PolicyConfig(window_ns=SECOND, quantum_min_ns=MS, quantum_max_ns=10 * MS, grace_ns=5 * MS)
    with daemon_thread(short_dir / "sched", config) as daemon:
        admin = AdminClient(daemon.directory / "admin.sock")
        endpoint = admin.call("add", tenant="c1", request=30, limit=50)["endpoint"]
        admin.close()
        ledger = short_dir / "ledger"
        with Ledger(ledger, create=True) as book:
            book.set_limit(UUID, GiB)
        yield {"LD_PRELOAD": str(native.lib_path(native.SHIM)), "VCUDA_LEDGER": str(ledger),
               "VCUDA_SCHEDULER": str(endpoint), "VCUDA_MEMORY_LIMIT": str(GiB),
               "VCUDA_CORE_REQUEST": "30", "VCUDA_CORE_LIMIT": "50"}


def doctor(env: dict[str, str]) -> tuple[int, list[str]]:
    out = vcuda("doctor", env=env, timeout=60)
    return out.returncode, out.stdout.splitlines()


def test_every_check_passes_in_a_well_set_container(container: dict[str, str]) -> None:
    code, lines = doctor(container)
    assert code == 0, lines
    assert [line.split(":")[0].split() for line in lines] == [
        ["ok", "preload"], ["ok", "ledger"], ["ok", "scheduler"], ["ok", "limits"]]
    assert "libvcuda.so is loaded" in lines[0]
    assert "memory 1Gi per GPU; GPU time 30% guaranteed, at most 50%" in lines[3]


@pytest.mark.parametrize(("check", "change", "why"), [
    ("preload", {"LD_PRELOAD": ""}, "not loaded in this process"),
    ("ledger", {"VCUDA_LEDGER": "/nonexistent/ledger"}, "not writable by uid"),
    ("scheduler", {"VCUDA_SCHEDULER": "ipc:///nonexistent/sched.sock"}, "does not answer"),
    ("limits", {"VCUDA_MEMORY_LIMIT": "2Gi"}, "the ledger holds 1Gi"),
])
def test_a_failing_check_says_why_and_fails_the_command(container: dict[str, str], check: str,
                                                        change: dict[str, str], why: str) -> None:
    code, lines = doctor({**container, **change})
    assert code == 1, lines
    (failed,) = [line for line in lines if line.startswith("FAIL")]
    assert failed.startswith(f"FAIL  {check}:") and why in failed, failed
    assert len(lines) == 4
