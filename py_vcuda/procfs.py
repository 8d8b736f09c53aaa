"""What the host's ``/proc`` says about a process, for mapping the host pids
NVML reports to the containers (or ``vcuda run``) they belong to.

A containerised process has one pid per pid namespace; ``/proc/<host pid>/status``
lists them (``NSpid:``, outermost first), so the last one is the pid the
process sees itself, the one libvcuda records in its ledger slot. The start
time (``/proc/<pid>/stat`` field 22, clock ticks after boot) is the same in
every namespace, so (pid it sees, start time) names a ledger slot without
ambiguity. ``/proc/<pid>/cgroup`` names its pod on Kubernetes; the parent
pid chains it to a process tree on bare metal. ``/proc/<pid>/maps`` says
whether libvcuda is loaded in it (a container's process without it escapes
its quota), and ``kill`` ends such a process, guarded against pid reuse.

The root is injectable: tests use a fixture tree, a node agent in a container
reads the host's ``/proc`` mounted elsewhere.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path("/proc")


class ProcError(OSError):
    """A process whose identity cannot be read; ``reason`` is a short code for metrics."""

    def __init__(self, host_pid: int, reason: str, detail: str) -> None:
        super().__init__(f"host pid {host_pid}: {detail}")
        self.host_pid = host_pid
        self.reason = reason


@dataclass(frozen=True)
class ProcIdentity:
    host_pid: int
    ns_pid: int       # the pid the process sees (last NSpid entry; the host pid without namespaces)
    nested: bool      # in a pid namespace of its own (NSpid has more than one entry)
    start_time: int   # clock ticks after boot: equal in every pid namespace
    ppid: int         # the parent's host pid
    cgroup: str       # /proc/<pid>/cgroup as read
    comm: str = ""    # its command name (stat field 2)


class ProcFS:
    def __init__(self, root: Path = DEFAULT_ROOT) -> None:
        self.root = Path(root)

    def _read(self, host_pid: int, name: str) -> str:
        try:
            return (self.root / str(host_pid) / name).read_text()
        except FileNotFoundError:
            raise ProcError(host_pid, "exited", f"no {self.root}/{host_pid}: the process is gone") from None
        except OSError as exc:
            raise ProcError(host_pid, "unreadable", f"cannot read {self.root}/{host_pid}/{name}: "
                            f"{exc.strerror or exc}") from None

    def stat(self, host_pid: int) -> tuple[int, int]:
        """(parent's host pid, start time)."""
        ppid, start, _ = self._stat(host_pid)
        return ppid, start

    def _stat(self, host_pid: int) -> tuple[int, int, str]:
        """(parent's host pid, start time, comm)."""
        text = self._read(host_pid, "stat")
        # comm (field 2) may hold spaces and parentheses: split after the last ')'.
        fields = text[text.rfind(")") + 2:].split()
        try:
            return int(fields[1]), int(fields[19]), text[text.find("(") + 1:text.rfind(")")]
        except (IndexError, ValueError):
            raise ProcError(host_pid, "unreadable", f"malformed {self.root}/{host_pid}/stat") from None

    def identity(self, host_pid: int) -> ProcIdentity:
        ppid, start, comm = self._stat(host_pid)
        ns_pids = [host_pid]
        for line in self._read(host_pid, "status").splitlines():
            if line.startswith("NSpid:"):
                try:
                    ns_pids = [int(v) for v in line.split()[1:]] or ns_pids
                except ValueError:
                    raise ProcError(host_pid, "unreadable",
                                    f"malformed NSpid in {self.root}/{host_pid}/status") from None
                break
        try:
            cgroup = self._read(host_pid, "cgroup")
        except ProcError:
            cgroup = ""  # cgroups only help; a slot match does not need them
        return ProcIdentity(host_pid=host_pid, ns_pid=ns_pids[-1], nested=len(ns_pids) > 1, start_time=start,
                            ppid=ppid, cgroup=cgroup, comm=comm)

    def maps_library(self, host_pid: int, library: str) -> bool:
        """Whether the process has `library` (a file name: libvcuda.so) mapped.

        A file replaced on disk since it was mapped (a DaemonSet upgrade rewrites libvcuda.so)
        shows as "<path> (deleted)" and still counts. Reading another user's maps needs
        CAP_SYS_PTRACE; ProcError ("unreadable") when it cannot be read."""
        for line in self._read(host_pid, "maps").splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) < 6:
                continue   # an anonymous mapping
            name = fields[5].removesuffix(" (deleted)").rpartition("/")[2]
            if name == library or name.startswith(library + "."):
                return True
        return False

    def kill(self, host_pid: int, start_time: int) -> None:
        """SIGKILL the process, only if it is still the one that started at `start_time`.

        The pid is pinned first (pidfd_open), then its start time read again: a pid reused by
        another process since the caller read it is not signalled. Kill by host pid needs this
        root to be the /proc of the caller's pid namespace (the agent runs with hostPID).
        ProcError: gone ("exited"), reused ("reused"), or not ours to signal ("not-killable")."""
        try:
            here = os.readlink(self.root / "self")
        except OSError:
            here = ""
        if here != str(os.getpid()):
            raise ProcError(host_pid, "not-killable", f"{self.root} is not the /proc of this process's pid "
                            "namespace: its host pids cannot be signalled from here")
        try:
            pidfd = os.pidfd_open(host_pid)
        except ProcessLookupError:
            raise ProcError(host_pid, "exited", "the process is gone") from None
        except OSError as exc:
            raise ProcError(host_pid, "not-killable", f"pidfd_open: {exc.strerror or exc}") from None
        try:
            if self.stat(host_pid)[1] != start_time:
                raise ProcError(host_pid, "reused", f"pid {host_pid} is now another process (started later)")
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            raise ProcError(host_pid, "exited", "the process is gone") from None
        except PermissionError as exc:
            raise ProcError(host_pid, "not-killable", f"SIGKILL: {exc.strerror} (the agent needs CAP_KILL for "
                            "processes of other users)") from None
        finally:
            os.close(pidfd)

    def ancestors(self, host_pid: int, limit: int = 64) -> Iterator[int]:
        """The host pids of the process's parent, grandparent, ... up to init (at most `limit`)."""
        pid = host_pid
        for _ in range(limit):
            try:
                pid = self.stat(pid)[0]
            except ProcError:
                return
            if pid <= 0:
                return
            yield pid
