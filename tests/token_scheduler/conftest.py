"""Fixtures: a daemon in a thread with an admin client, in a short temp dir (ipc paths
are limited to 107 bytes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from token_scheduler.daemon import Daemon
from token_scheduler.policy import MS, SECOND, PolicyConfig
from token_scheduler.testing import AdminClient, daemon_thread

DAEMON_CFG = PolicyConfig(window_ns=1 * SECOND, quantum_min_ns=1 * MS, quantum_max_ns=10 * MS,
                          grace_ns=5 * MS)


@pytest.fixture
def zctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def daemon(short_dir: Path) -> Iterator[Daemon]:
    with daemon_thread(short_dir / "sched", DAEMON_CFG) as running:
        yield running


@pytest.fixture
def admin(daemon: Daemon, zctx: zmq.Context) -> Iterator[AdminClient]:
    client = AdminClient(daemon.directory / "admin.sock", zctx)
    client.wait_ready()
    yield client
    client.close()
