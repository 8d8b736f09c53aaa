"""SIGKILL the daemon process and restart it: tenants and quotas come back, clients
recover by themselves (PING shows the lost request, old leases are STALE_LEASE)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from token_scheduler.errors import ErrorCode
from token_scheduler.testing import REPO_ROOT, AdminClient, ErrorReply, TenantClient, spawn_daemon

pytestmark = pytest.mark.timeout(60)
ARGS = ("--window", "1s", "--quantum-max", "10ms", "--grace", "5ms")


def start(directory: Path, zctx: zmq.Context) -> tuple[subprocess.Popen[bytes], AdminClient]:
    proc = spawn_daemon(directory, *ARGS)
    admin = AdminClient(directory / "admin.sock", zctx)
    admin.wait_ready(15)
    return proc, admin


def run_greedy(client: TenantClient, seconds: float, first_lease: int | None = None) -> None:
    end = time.monotonic() + seconds
    lease = first_lease if first_lease is not None else client.acquire().fields[0]
    while time.monotonic() < end:
        time.sleep(0.002)
        client.release(lease, 2_000_000, more=True)
        lease = client.wait_grant(3).fields[0]
    client.release(lease, 0)


@pytest.mark.parametrize("priority", ["normal", "high"])
def test_sigkill_restart_restores_quotas(short_dir: Path, zctx: zmq.Context, priority: str) -> None:
    """With a `high` tenant next door (and as the `high` one itself): quotas and priorities
    come back, a `high` tenant is still held to its limit."""
    directory = short_dir / "sched"
    proc, admin = start(directory, zctx)
    other = "normal" if priority == "high" else "high"
    try:
        endpoint = admin.call("add", tenant="capped", request=10, limit=25, priority=priority)["endpoint"]
        assert admin.call("add", tenant="other", request=50, priority=other)["ok"]
        epoch = admin.call("stats")["epoch"]
        client = TenantClient(str(endpoint), zctx)
        old_lease = client.acquire().fields[0]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        restarted = time.monotonic()
        proc, admin = start(directory, zctx)
        assert {(t["tenant"], t["priority"]) for t in admin.call("list")["tenants"]} == {
            ("capped", priority), ("other", other)}
        assert admin.call("stats")["epoch"] != epoch
        # The old lease is from before the restart: the client is told, and re-requests.
        client.release(old_lease, 1000, more=True)
        with pytest.raises(ErrorReply) as info:
            client.wait_grant(2)
        assert info.value.code == ErrorCode.STALE_LEASE
        lease = client.acquire(3).fields[0]
        assert time.monotonic() - restarted < 5  # includes interpreter start-up
        run_greedy(client, 1.2, lease)
        share = admin.call("stats")["tenants"]["capped"]["share"]
        assert 0.15 <= share <= 0.30  # limit 25 % enforced by the new process
    finally:
        proc.kill()
        proc.wait(10)


def test_waiting_client_recovers_lost_request(short_dir: Path, zctx: zmq.Context) -> None:
    directory = short_dir / "sched"
    proc, admin = start(directory, zctx)
    try:
        holder = TenantClient(str(admin.call("add", tenant="h", request=50)["endpoint"]), zctx)
        waiter = TenantClient(str(admin.call("add", tenant="w", request=50)["endpoint"]), zctx)
        holder.acquire()
        waiter.request()
        proc.send_signal(signal.SIGKILL)  # the queued request dies with the daemon
        proc.wait(10)
        proc, admin = start(directory, zctx)
        # wait_grant PINGs, sees state IDLE, and sends REQUEST again.
        assert waiter.wait_grant(5).fields[0] >> 32 == admin.call("stats")["epoch"]
    finally:
        proc.kill()
        proc.wait(10)


def test_corrupt_state_refuses_to_start(short_dir: Path) -> None:
    directory = short_dir / "sched"
    directory.mkdir()
    (directory / "tenants.json").write_text("{not json")
    proc = spawn_daemon(directory)
    assert proc.wait(20) == 2


def test_state_of_another_gpu_refuses_to_start(short_dir: Path) -> None:
    directory = short_dir / "sched"
    directory.mkdir()
    doc = {"format": 1, "gpu": "GPU-other", "tenants": []}
    (directory / "tenants.json").write_text(json.dumps(doc))
    proc = spawn_daemon(directory, gpu="0")
    assert proc.wait(20) == 2


def test_sigterm_stops_cleanly(short_dir: Path, zctx: zmq.Context) -> None:
    proc, admin = start(short_dir / "sched", zctx)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_help_lists_options() -> None:
    out = subprocess.run([sys.executable, "-m", "token_scheduler", "--help"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=20, check=True).stdout
    for option in ("--gpu", "--dir", "--window", "--quantum-min", "--quantum-max", "--grace",
                   "--budget", "--budget-high", "--revoke-grace", "--log-level"):
        assert option in out


def test_a_second_daemon_on_the_directory_exits(short_dir: Path, zctx: zmq.Context) -> None:
    """One daemon per directory: a second exits (status 3) and leaves the first one's sockets alone."""
    directory = short_dir / "sched"
    proc, admin = start(directory, zctx)
    try:
        endpoint = admin.call("add", tenant="t", request=50)["endpoint"]
        second = spawn_daemon(directory)
        assert second.wait(20) == 3
        assert admin.call("list", timeout_s=2)["tenants"][0]["tenant"] == "t"
        client = TenantClient(str(endpoint), zctx)
        client.acquire(3)  # the first daemon still serves the tenant's socket
    finally:
        proc.kill()
        proc.wait(10)
    # The lock dies with its holder: a successor starts at once.
    proc, admin = start(directory, zctx)
    proc.terminate()
    assert proc.wait(10) == 0
