"""`vcuda doctor` inside a vgpu container: one line per check (preload, ledger, scheduler, limits)
and a non-zero exit when one fails. Without a quota file the container's quota is in its environment
(VCUDA_LEDGER, VCUDA_SCHEDULER, VCUDA_MEMORY_LIMIT, VCUDA_CORE_*, libvcuda preloaded), as in a
container set up by hand; with its quota file at /run/vcuda-quota (a private mount namespace), as
the node agent and the DRA driver set containers up, doctor says the quota comes from the file,
names the environment variables it ignores, and checks what the file says."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubecontainer import skip_unless_namespaces
from vcudacli import vcuda, vcuda_env

from py_vcuda import native
from py_vcuda.ledger import Ledger
from py_vcuda.quota_file import GPUQuota, QuotaFile, render
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


# In a private mount namespace: the quota directory at its fixed container path, read-only, as the
# node agent's mount puts it; then `vcuda doctor` with the rest of the arguments as its environment.
QUOTA_MOUNT = """
mount -t tmpfs vcuda-test /run
mkdir -p /run/vcuda-quota
mount --bind "$1" /run/vcuda-quota
mount -o remount,bind,ro /run/vcuda-quota
shift
exec env -i "$@"
"""


def doctor_with_quota_file(quota_dir: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    full = {k: v for k, v in vcuda_env(env).items() if k in ("PATH", "HOME", "VCUDA_LIB_DIR", "PYTHONPATH")
            or k in env}
    proc = subprocess.run(["unshare", "-m", "/bin/sh", "-ec", QUOTA_MOUNT, "doctor", str(quota_dir),
                           *(f"{k}={v}" for k, v in full.items()), sys.executable, "-m", "py_vcuda", "doctor"],
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    return proc.returncode, (proc.stdout + proc.stderr).splitlines()


def write_quota(quota_dir: Path, container: dict[str, str], *, memory: int = GiB,
                before: tuple[GPUQuota, ...] = ()) -> None:
    """The container's quota as a file: its GPU (after the `before` ones) with its memory and scheduler."""
    quota_dir.mkdir()
    (quota_dir / "quota.conf").write_text(render(QuotaFile(
        ledger=container["VCUDA_LEDGER"], core_request=30, core_limit=50, priority="normal",
        gpus=(*before, GPUQuota(UUID, memory, container["VCUDA_SCHEDULER"])))))


def test_with_the_quota_file_the_environment_is_ignored_and_named(container: dict[str, str], short_dir: Path) -> None:
    skip_unless_namespaces()
    write_quota(short_dir / "quota", container)
    # what a pod's spec might set to loosen its quota: the file holds, doctor says what it ignored
    env = {"LD_PRELOAD": container["LD_PRELOAD"], "VCUDA_MEMORY_LIMIT": "8Gi", "VCUDA_DISABLE": "1",
           "VCUDA_SCHEDULER": "", "VCUDA_CORE_LIMIT": "100"}
    code, lines = doctor_with_quota_file(short_dir / "quota", env)
    assert code == 0, lines
    assert [line.split(":")[0].split() for line in lines] == [
        ["ok", "quota"], ["ok", "ignored"], ["ok", "preload"], ["ok", "ledger"], ["ok", "scheduler"], ["ok", "limits"]]
    assert lines[0].startswith("ok    quota: from /run/vcuda-quota/quota.conf")
    assert f"cores 30% guaranteed, at most 50%, priority normal; ledger {container['VCUDA_LEDGER']}" in lines[0]
    assert f"1 GPU(s): {UUID} memory 1Gi, scheduler {container['VCUDA_SCHEDULER']}" in lines[0]
    assert "VCUDA_CORE_LIMIT='100', VCUDA_DISABLE='1', VCUDA_MEMORY_LIMIT='8Gi', VCUDA_SCHEDULER=''" in lines[1]
    assert "memory 1Gi per GPU; GPU time 30% guaranteed, at most 50%" in lines[5]


def test_a_clean_environment_finds_its_quota_in_the_file(container: dict[str, str], short_dir: Path) -> None:
    skip_unless_namespaces()
    write_quota(short_dir / "quota", container)
    code, lines = doctor_with_quota_file(short_dir / "quota", {"LD_PRELOAD": container["LD_PRELOAD"]})
    assert code == 0, lines
    assert "VCUDA_* quota variables in this environment: none set" in lines[1]
    assert lines[3].startswith(f"ok    ledger: {container['VCUDA_LEDGER']} is writable")


def test_the_scheduler_of_a_quotas_second_gpu_is_checked(container: dict[str, str], short_dir: Path) -> None:
    """Said per GPU (VCUDA_SCHEDULER_1 in the environment doctor checks): still pinged, still a share."""
    skip_unless_namespaces()
    write_quota(short_dir / "quota", container, before=(GPUQuota("GPU-5157a0c0-0001-4000-8000-000000000001", None),))
    code, lines = doctor_with_quota_file(short_dir / "quota", {"LD_PRELOAD": container["LD_PRELOAD"]})
    assert code == 0, lines
    assert lines[4].startswith(f"ok    scheduler: {container['VCUDA_SCHEDULER']} answers"), lines
    assert "GPU time 30% guaranteed, at most 50%" in lines[5], lines


@pytest.mark.parametrize(("content", "why"), [
    (None, "cannot read"),
    ("version=2\nend\n", "version 2, this vcuda reads 1"),
    ("version=1\nledger=/l\ncore_request=30\n", "no 'end' line"),
])
def test_a_bad_quota_file_fails_and_says_cuda_is_refused(container: dict[str, str], short_dir: Path,
                                                         content: str | None, why: str) -> None:
    skip_unless_namespaces()
    quota_dir = short_dir / "quota"
    quota_dir.mkdir()
    if content is not None:
        (quota_dir / "quota.conf").write_text(content)
    code, lines = doctor_with_quota_file(quota_dir, {"LD_PRELOAD": container["LD_PRELOAD"]})
    assert code == 1, lines
    (line,) = lines
    assert line.startswith("FAIL  quota: /run/vcuda-quota/quota.conf") and why in line, line
    assert "refuses CUDA in this container" in line
