"""One daemon per scheduler directory: an exclusive lock on DIR/daemon.lock.

Taken before the daemon touches anything in DIR (tenant list, sockets) and held
for its whole life; the kernel drops it when the process dies, SIGKILL
included, so a crashed daemon never blocks its successor. Two `vcuda run`s
that start a scheduler at the same instant both spawn one: the second to lock
exits instead of stealing the first one's sockets (it would unlink and re-bind
them, leaving two daemons that each grant their own token).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_FILE = "daemon.lock"


class DirectoryBusy(RuntimeError):
    """Another live scheduler holds DIR's lock."""


def acquire(directory: Path) -> int:
    """Lock DIR for this process; returns the descriptor to keep open (closing it unlocks)."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise DirectoryBusy(f"another scheduler (pid {holder}) serves {directory}") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for people and tests: who serves DIR
    return fd


def holder_pid(directory: Path) -> int | None:
    """The pid written by the daemon that last locked DIR (it may have died since)."""
    with contextlib.suppress(OSError, ValueError):
        return int((directory / LOCK_FILE).read_text().strip())
    return None
