"""Helpers shared by the shim's tests: constants of the simulated GPU and the
parsed output of cuprobe (tests/c/cuprobe.c)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

MiB = 1 << 20
GiB = 1 << 30
SIM_MEMORY = 4 * GiB
OVERHEAD = 64 * MiB
@dataclass
class Result:
    """Parsed output of one cuprobe run."""

    returncode: int
    stdout: str
    stderr: str
    lines: list[dict[str, str]] = field(default_factory=list)

    def rc(self, command: str, nth: int = 0) -> int:
        hits = [d for d in self.lines if d["cmd"] == command]
        return int(hits[nth]["rc"])

    def get(self, command: str, key: str, nth: int = 0) -> int:
        return int([d for d in self.lines if d["cmd"] == command][nth][key])

    def resolved(self) -> dict[str, str]:
        return {d["name"]: d["lib"] for d in self.lines if d["cmd"] == "resolve"}


def parse(stdout: str) -> list[dict[str, str]]:
    out = []
    for line in stdout.splitlines():
        head, *pairs = line.split()
        entry = {"cmd": head}
        entry.update(p.split("=", 1) for p in pairs if "=" in p)
        out.append(entry)
    return out




Runner = Callable[..., Result]
