"""Helpers shared by the shim's tests: constants of the simulated GPU, the
parsed output of cuprobe (tests/c/cuprobe.c), and the environment a container
set up by the node agent or the DRA driver gives a process run on the host."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

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


def container_env_on_host(env: Mapping[str, str], mounts: Mapping[str, str]) -> dict[str, str]:
    """A container's env as a process on the host sees it: container paths mapped to the host paths
    the mounts ({container path: host path}) name, and libvcuda preloaded the way /etc/ld.so.preload
    would (LD_PRELOAD: ld.so.preload needs root)."""
    longest_first = sorted(mounts, key=len, reverse=True)
    out = {}
    for key, value in env.items():
        inside = next((c for c in longest_first if c in value), None)
        out[key] = value.replace(inside, mounts[inside]) if inside else value
    preloaded = Path(mounts["/etc/ld.so.preload"]).read_text().strip()
    out["LD_PRELOAD"] = mounts[preloaded]
    return out
