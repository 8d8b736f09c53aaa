"""What the host's ``/proc`` says about a process, for mapping the host pids
NVML reports to the containers (or ``vcuda run``) they belong to.

A containerised process has one pid per pid namespace; ``/proc/<host pid>/status``
lists them (``NSpid:``, outermost first), so the last one is the pid the
process sees itself, the one libvcuda records in its ledger slot. The start
time (``/proc/<pid>/stat`` field 22, clock ticks after boot) is the same in
every namespace, so (pid it sees, start time) names a ledger slot without
ambiguity. ``/proc/<pid>/cgroup`` names its pod on Kubernetes; the parent
pid chains it to a process tree on bare metal.

The root is injectable: tests use a fixture tree, a node agent in a container
reads the host's ``/proc`` mounted elsewhere.
"""

from __future__ import annotations

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
        text = self._read(host_pid, "stat")
        # comm (field 2) may hold spaces and parentheses: split after the last ')'.
        fields = text[text.rfind(")") + 2:].split()
        try:
            return int(fields[1]), int(fields[19])  # fields 4 (ppid) and 22 (starttime)
        except (IndexError, ValueError):
            raise ProcError(host_pid, "unreadable", f"malformed {self.root}/{host_pid}/stat") from None

    def identity(self, host_pid: int) -> ProcIdentity:
        ppid, start = self.stat(host_pid)
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
                            ppid=ppid, cgroup=cgroup)

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
