"""Helpers shared by the shim's tests: constants of the simulated GPU, the
parsed output of cuprobe (tests/c/cuprobe.c), and the environment that holds a
process run on the host as a container set up by the node agent or the DRA
driver holds its own (from the container's quota file)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from py_vcuda import native, quota_file
from py_vcuda.quota_file import CONTAINER_QUOTA_DIR, QUOTA_FILE, QuotaFile, bare_metal_env

MiB = 1 << 20
GiB = 1 << 30
SIM_MEMORY = 4 * GiB
OVERHEAD = 64 * MiB


def one_gpu_sim_env(lib_dir: Path, state: Path) -> dict[str, str]:
    """Environment of a simulated GPU (one device of SIM_MEMORY, OVERHEAD per context) keeping its state in
    `state`, with the simulator's libraries from `lib_dir` as the real driver."""
    return {
        "VCUDA_REAL_LIBCUDA": str(lib_dir / native.SIM_CUDA),
        "VCUDA_REAL_LIBNVML": str(lib_dir / native.SIM_NVML),
        "VCUDA_SIM_STATE": str(state),
        "VCUDA_SIM_DEVICES": "1",
        "VCUDA_SIM_MEMORY": str(SIM_MEMORY),
        "VCUDA_SIM_CONTEXT_OVERHEAD": str(OVERHEAD),
    }


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


def on_host(value: str, mounts: Mapping[str, str]) -> str:
    """A value with the container path in it mapped to the host path the mounts ({container path: host
    path}) name (the longest mount that matches)."""
    inside = next((c for c in sorted(mounts, key=len, reverse=True) if c in value), None)
    return value.replace(inside, mounts[inside]) if inside else value


def container_quota(mounts: Mapping[str, str]) -> QuotaFile:
    """The container's quota file, read from the host directory mounted at /run/vcuda-quota."""
    return quota_file.read(Path(mounts[str(CONTAINER_QUOTA_DIR)]) / QUOTA_FILE)


def container_env_on_host(env: Mapping[str, str], mounts: Mapping[str, str]) -> dict[str, str]:
    """What a process of the container run on the host (no mount namespace, so no quota file at its fixed
    path) needs to be held as in the container: the container's env, plus its quota file said in libvcuda's
    bare-metal variables (py_vcuda.quota_file.bare_metal_env), container paths mapped to the host paths the
    mounts name, and libvcuda preloaded the way /etc/ld.so.preload would (LD_PRELOAD: ld.so.preload needs
    root)."""
    full = {**env, **bare_metal_env(container_quota(mounts))}
    out = {key: on_host(value, mounts) for key, value in full.items()}
    preloaded = Path(mounts["/etc/ld.so.preload"]).read_text().strip()
    out["LD_PRELOAD"] = mounts[preloaded]
    return out


def cdi_container(edits: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """A CDI device's containerEdits as (env, {container path: host path}), for the helpers above."""
    return (dict(kv.split("=", 1) for kv in edits["env"]),
            {m["containerPath"]: m["hostPath"] for m in edits["mounts"]})


class StepProbe:
    """cuprobe driven one command at a time (``--stdin``), so a test can look at the
    simulator and the ledger between any two steps."""

    def __init__(self, exe: str, env: dict[str, str], flags: list[str] | None = None) -> None:
        self.proc = subprocess.Popen([exe, *(flags or []), "--stdin"], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def do(self, command: str) -> dict[str, str]:
        """Runs one command; returns its (last) parsed output line."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        lines = []
        for line in self.proc.stdout:
            if line.strip() == "--":
                break
            lines.append(line)
        else:
            raise AssertionError(f"cuprobe ended at {command!r}: {self.stderr()}")
        parsed = parse("".join(lines))
        assert parsed, f"{command!r} printed nothing"
        return parsed[-1]

    def rc(self, command: str) -> int:
        return int(self.do(command)["rc"])

    def stderr(self) -> str:
        self.close()
        return self.proc.stderr.read() if self.proc.stderr else ""

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
