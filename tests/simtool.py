"""Running tests/c/sim_tool and reading its output: one line
"<cmd> <CUresult> [values]" per command."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from py_vcuda.sim import MemoryBreakdown


@dataclass
class Line:
    cmd: str
    rc: int
    rest: list[str]


def parse(out: str) -> list[Line]:
    lines = []
    for raw in out.splitlines():
        parts = raw.split()
        if len(parts) >= 2 and parts[1].lstrip("-").isdigit():
            lines.append(Line(parts[0], int(parts[1]), parts[2:]))
    return lines


def lines(out: list[Line], cmd: str) -> list[Line]:
    """The lines of one command, in order."""
    return [ln for ln in out if ln.cmd == cmd]


def mem(line: Line) -> MemoryBreakdown:
    """The physical use a `mem` line prints (this process, device 0)."""
    assert line.cmd == "mem" and line.rc == 0, line
    m = MemoryBreakdown(*(int(v) for v in line.rest[1:8]))
    assert m.total == int(line.rest[0])  # the total is always the sum of the kinds
    return m


class Children:
    """Background sim_tool processes; each stops at its `ready` command until
    released (a line on stdin). All are killed at the end of the test."""

    def __init__(self, exe: Path, env: dict[str, str]) -> None:
        self.exe, self.env = exe, env
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self, *cmds: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen([str(self.exe), *cmds], env={**os.environ, **self.env, **(env or {})},
                                text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    @staticmethod
    def ready(proc: subprocess.Popen[str]) -> list[Line]:
        """Reads the child's output up to its `ready` line."""
        assert proc.stdout is not None
        seen = []
        for raw in proc.stdout:
            seen.extend(parse(raw))
            if raw.startswith("ready"):
                return seen
        err = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"child exited before ready: {err}")

    @classmethod
    def step(cls, proc: subprocess.Popen[str]) -> list[Line]:
        """Lets the child past its `ready` and reads its output up to the next one."""
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        return cls.ready(proc)

    @staticmethod
    def release(proc: subprocess.Popen[str]) -> list[Line]:
        out, _ = proc.communicate("\n", timeout=30)
        return parse(out)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
