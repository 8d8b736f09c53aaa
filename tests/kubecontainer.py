"""A container built the way kubelet and the runtime build it, on the GPU simulator: the mounts of
an Allocate answer (or a CDI spec) at their container paths in a private mount namespace,
``/etc/ld.so.preload`` and ``/run/vcuda-quota`` read-only included, and the environment in kubelet's
order (the plugin's env first, then the pod's own ``env``, which wins).

Processes start under ``env -i`` with only that environment: nothing of the test's, no LD_PRELOAD
(the shim comes from the mounted /etc/ld.so.preload, as in a real container). What stands for the
node's hardware is always there: the simulator's variables (the "driver") and, standing for the
runtime's device nodes, CUDA_VISIBLE_DEVICES naming the GPUs the runtime shows. A runtime that
honours the pod's ``NVIDIA_VISIBLE_DEVICES=all`` shows every GPU, as the issue found.

Needs root (mounts in the namespace): /etc is replaced by a copy in a tmpfs so that the bind over
/etc/ld.so.preload stays inside the namespace; /run and /usr/local get a tmpfs for the same reason.

The rows of issue 24's table (a pod's spec trying to loosen its quota) are `ROWS`; `check_row`
asserts that the container was held to its quota and its GPU.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from shimtest import parse

from py_vcuda.quota_file import ignored_env
from py_vcuda.sim import GiB, MiB, SimConfig

NODE_MEMORY = 4 * GiB   # each of the node's two simulated GPUs
OUT_OF_MEMORY = 2
INVALID_DEVICE = 101
IGNORING = "vcuda: warning: ignoring"   # libvcuda's one line naming the VCUDA_* variables the quota file overrides
ROOTS = ("/run", "/usr/local")   # a tmpfs on each, so that mount points can be made without touching the host
DEVICE_LIST_ROOT = "/var/run/nvidia-container-devices/"


def skip_unless_namespaces() -> None:
    """Skips the test unless this process may build mounts in a private mount namespace."""
    if os.geteuid() != 0:
        pytest.skip("needs root to build mounts in a private mount namespace")
    if not shutil.which("unshare"):
        pytest.skip("needs unshare (util-linux)")
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot create a mount namespace here")


def skip_unless_others_can_read(path: str | Path) -> None:
    """Skips the test unless a user other than root can read `path` (the file readable by
    others, every directory above it searchable): a non-root container maps the shim from
    where vcuda is installed, and an install under a private home (pip as root into
    /root/.pyenv) is out of its reach. vcuda's image installs it where any user can read it."""
    target = Path(path).resolve()
    if not target.stat().st_mode & stat.S_IROTH:
        pytest.skip(f"other users cannot read {target}")
    for parent in target.parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            pytest.skip(f"other users cannot reach {target}: {parent} is private (install vcuda where they can)")


@dataclass(frozen=True)
class MountSpec:
    host: str
    container: str
    read_only: bool


def _script(mounts: Sequence[MountSpec]) -> str:
    q = shlex.quote
    lines = ["set -e"]
    lines += [f"mount -t tmpfs vcuda-test {root}" for root in ROOTS]
    lines += ["mkdir /run/.etc", "cp -a /etc/. /run/.etc/", "mount --bind /run/.etc /etc"]
    preload = None
    for m in sorted(mounts, key=lambda m: len(m.container)):
        if m.container == "/etc/ld.so.preload":
            preload = m   # last: from then on every program started here preloads libvcuda
            continue
        if m.container.startswith(DEVICE_LIST_ROOT):
            continue   # the volume-mounts device list: for the NVIDIA runtime, not the container's programs
        if not any(m.container.startswith(root + "/") for root in ROOTS):
            raise AssertionError(f"container path {m.container} is outside what the emulation can mount")
        make = f"mkdir -p {q(m.container)}" if os.path.isdir(m.host) else \
            f"mkdir -p {q(os.path.dirname(m.container))} && touch {q(m.container)}"
        lines += [make, f"mount --bind {q(m.host)} {q(m.container)}"]
        if m.read_only:
            lines.append(f"mount -o remount,bind,ro {q(m.container)}")
    if preload is not None:
        lines += ["touch /etc/ld.so.preload", f"mount --bind {q(preload.host)} /etc/ld.so.preload",
                  "mount -o remount,bind,ro /etc/ld.so.preload"]
    lines.append('exec env -i "$@"')
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Container:
    """One container: its mounts and its environment (kubelet's order already applied)."""

    mounts: tuple[MountSpec, ...]
    env: dict[str, str]
    hardware: dict[str, str]    # the simulated driver and the runtime's GPUs (CUDA_VISIBLE_DEVICES)

    def run(self, argv: Sequence[str], *, clean: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
        """A process of the container; `clean`: started with an empty environment (sshd, cron, `su -`)."""
        env = {"PATH": "/usr/bin:/bin", **self.hardware, **({} if clean else self.env)}
        return subprocess.run(["unshare", "-m", "/bin/sh", "-c", _script(self.mounts), "container",
                               *(f"{k}={v}" for k, v in env.items()), *argv],
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, capture_output=True,
                              text=True, timeout=timeout)


def container(mounts: Sequence[MountSpec], plugin_env: Mapping[str, str], pod_env: Mapping[str, str],
              sim: SimConfig, gpus: Sequence[str], all_gpus: Sequence[str]) -> Container:
    """kubelet's order: the plugin's env, then the pod's. The runtime shows the container `gpus`, or every
    GPU when the final NVIDIA_VISIBLE_DEVICES says all (a runtime that honours the pod's variable)."""
    env = {**plugin_env, **pod_env}
    shown = all_gpus if env.get("NVIDIA_VISIBLE_DEVICES") == "all" else gpus
    hardware = {**sim.env(), "CUDA_VISIBLE_DEVICES": ",".join(shown)}
    return Container(tuple(mounts), env, hardware)


@dataclass(frozen=True)
class Row:
    """A row of issue 24's table: what the pod's spec adds, and whether the process starts clean."""

    name: str
    pod_env: dict[str, str]
    clean: bool = False


ROWS = [
    Row("nothing", {}),
    Row("memory-limit-8Gi", {"VCUDA_MEMORY_LIMIT": "8Gi"}),
    Row("disable", {"VCUDA_DISABLE": "1"}),
    Row("no-scheduler-core-limit-100", {"VCUDA_SCHEDULER": "", "VCUDA_CORE_LIMIT": "100"}),
    Row("all-gpus", {"CUDA_VISIBLE_DEVICES": "0,1", "NVIDIA_VISIBLE_DEVICES": "all"}),
    Row("clean-environment", {}, clean=True),
]
ROW_IDS = [r.name for r in ROWS]


def probe_commands(row: Row, share_ms: int = 1500) -> list[str]:
    """cuprobe's commands for a row: a context on the container's GPU (device 0 as the runtime shows it;
    device 1 when the pod shows itself both GPUs, after trying device 0, which is not its own), two
    512 MiB allocations (with the context, more than 1 GiB), and kernels for `share_ms`."""
    contexts = ["ctx:0", "ctx:1"] if row.pod_env.get("CUDA_VISIBLE_DEVICES") == "0,1" else ["ctx:0"]
    return ["init", *contexts, f"alloc:{512 * MiB}", f"alloc:{512 * MiB}", f"spin:2000:{share_ms}"]


def check_row(row: Row, proc: subprocess.CompletedProcess, foreign_uuid: str, max_share: float = 0.6) -> None:
    """Held to its quota (1 GiB: the second 512 MiB fails; its share of GPU time, far from all of it)
    and to its GPU (another GPU's context is refused, with one log line naming it). libvcuda warns that
    it ignores VCUDA_* variables only when the pod's spec set some: the node's env adds none."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    warned = [line for line in proc.stderr.splitlines() if line.startswith(IGNORING)]
    pod_set = [] if row.clean else ignored_env(row.pod_env)
    if pod_set:
        assert len(warned) == 1 and all(name in warned[0] for name in pod_set), out
    else:
        assert warned == [], out
    lines = parse(proc.stdout)
    contexts = [int(d["rc"]) for d in lines if d["cmd"] == "ctx"]
    if row.pod_env.get("CUDA_VISIBLE_DEVICES") == "0,1":
        assert contexts == [INVALID_DEVICE, 0], out
        refused = [line for line in proc.stderr.splitlines() if line.startswith("vcuda:") and foreign_uuid in line]
        assert len(refused) == 1, out
    else:
        assert contexts == [0], out
    allocs = [int(d["rc"]) for d in lines if d["cmd"] == "alloc"]
    assert allocs == [0, OUT_OF_MEMORY], out
    (spin,) = [d for d in lines if d["cmd"] == "spin"]
    assert int(spin["rc"]) == 0, out
    share = int(spin["busy_us"]) / float(spin["wall_us"])
    assert share < max_share, f"{row.name}: {share:.2f} of the GPU (unthrottled would be ~1.0)\n{out}"


def node_sim(directory: Path) -> SimConfig:
    """The node's simulated GPUs: two of NODE_MEMORY, a context costing 64 MiB."""
    skip_unless_namespaces()
    return SimConfig(state_path=directory / "sim", devices=2, memory=NODE_MEMORY, context_overhead=64 * MiB)


def check_held(row: Row, mounts: Sequence[MountSpec], plugin_env: Mapping[str, str], sim: SimConfig, probe: Path,
               own: str, other: str) -> None:
    """A process of the container (its GPU `own`, the node's other GPU `other`) is held to its quota and GPU."""
    assert {(m.container, m.read_only) for m in mounts} >= {("/run/vcuda-quota", True), ("/etc/ld.so.preload", True)}
    c = container(mounts, plugin_env, row.pod_env, sim, gpus=[own], all_gpus=[other, own])
    check_row(row, c.run([str(probe), *probe_commands(row)], clean=row.clean), foreign_uuid=other)
