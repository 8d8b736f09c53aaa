"""One daemon per scheduler directory: an exclusive lock on DIR/daemon.lock.

Taken before the daemon touches anything in DIR (tenant list, sockets) and held
for its whole life; the kernel drops it when the process dies, SIGKILL
included, so a crashed daemon never blocks its successor. Two `vcuda run`s
that start a scheduler at the same instant both spawn one: the second to lock
exits instead of stealing the first one's sockets (it would unlink and re-bind
them, leaving two daemons that each grant their own token).

A daemon that is alive but hung (stopped, or stuck) keeps the lock, so no
successor can start: `stop_hung_daemon` is for a client that has seen it stop
answering. It kills only the process the kernel names as the lock's holder
(/proc/locks), and only if that is a token_scheduler daemon for this very
directory (/proc/PID/cmdline): never an unrelated process that reuses a pid
or happens to lock the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
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


def lock_holder(directory: Path) -> int | None:
    """The pid of the live process holding DIR's lock, as the kernel tells (/proc/locks); None if none."""
    try:
        st = os.stat(directory / LOCK_FILE)
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; a blocked waiter's line has "->" after "1:"
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode:
            with contextlib.suppress(ValueError):
                return int(fields[4]) or None   # 0: a holder outside our pid namespace
    return None


def process_argv(pid: int) -> list[str] | None:
    """Process `pid`'s command line (/proc/PID/cmdline), None when it is gone."""
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return None


def is_daemon_for(pid: int, directory: Path) -> bool:
    """Whether process `pid` is a token_scheduler daemon started with --dir `directory`."""
    argv = process_argv(pid)
    if argv is None:
        return False
    module = any(a == "token_scheduler" or a.endswith("/token_scheduler/__main__.py") for a in argv)
    dirs = [Path(argv[i + 1]) for i, a in enumerate(argv[:-1]) if a == "--dir"]
    dirs += [Path(a.removeprefix("--dir=")) for a in argv if a.startswith("--dir=")]
    return module and any(d.absolute() == directory.absolute() for d in dirs)


def stop_hung_daemon(directory: Path, timeout_s: float = 5.0) -> int | None:
    """SIGKILL the token_scheduler daemon that holds DIR's lock and wait until the lock is free.

    For a caller that has seen the daemon stop answering: SIGKILL works on a stopped process too,
    and the daemon's saved tenant list lets a successor restore its tenants. Returns the killed pid;
    None when no process holds the lock, or when the holder is not a token_scheduler daemon for
    DIR (then nothing is touched).
    """
    pid = lock_holder(directory)
    if pid is None or pid == os.getpid() or not is_daemon_for(pid, directory):
        return None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while lock_holder(directory) == pid and time.monotonic() < deadline:
        time.sleep(0.02)
    return pid
