"""Reading the output of tests/c/sim_tool: one line "<cmd> <CUresult> [values]"
per command."""

from __future__ import annotations

from dataclasses import dataclass

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
