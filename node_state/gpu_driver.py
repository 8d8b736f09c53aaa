"""What the GPU driver puts into every GPU container, besides what vcuda adds.

On a real node that is nothing of ours: NVIDIA's container toolkit mounts the driver's
libcuda / libnvidia-ml and the device nodes when the runtime sees the GPUs named
(NVIDIA_VISIBLE_DEVICES, CDI). `NO_DRIVER` says so.

In the e2e tier the GPU simulator stands in for the driver (test only, chart value
``testing.simulator``; agent option ``--simulator``): every GPU container the agent sets up, in
every mode and through the DRA driver alike, then gets the simulator's libraries and shared state,
as the toolkit would bring the real driver's (**contract** with the e2e workloads):

    /usr/local/vcuda-sim/lib/libvcuda-sim-cuda.so   read-only (VCUDA_REAL_LIBCUDA names it)
    /usr/local/vcuda-sim/lib/libvcuda-sim-nvml.so   read-only (VCUDA_REAL_LIBNVML names it)
    /run/vcuda-sim/                                 read-write: the directory of the agent's VCUDA_SIM_STATE
    env: VCUDA_REAL_LIBCUDA, VCUDA_REAL_LIBNVML, VCUDA_SIM_STATE (container paths), the agent's other
         VCUDA_SIM_* settings, and VCUDA_SIM_PID_NAMESPACE (the agent's pid namespace, below)

libvcuda reads VCUDA_REAL_LIB* even where the quota file rules (they are not part of the quota).

It is refused unless the agent itself runs on the simulator (its NVML is the simulator's
library and VCUDA_SIM_STATE names its state): a production agent cannot hand the simulator out.

What the simulator cannot stand in for: it learns a process's pid with getpid(), so a process in
a pid namespace of its own would be recorded (and reported by NVML) under its namespace's pid,
and other namespaces (the agent's reconciler) would take it for a dead or foreign process. The
simulator therefore refuses cuInit in a pid namespace other than VCUDA_SIM_PID_NAMESPACE's, with a
message that says so: GPU pods on the simulator run with ``hostPID: true`` (podman ``--pid=host``).
A real driver learns host pids in the kernel and needs no such thing. Nor does the simulator have
device nodes: a container sees every simulated GPU unless libvcuda's quota file (vgpu, DRA) or
CUDA_VISIBLE_DEVICES narrows it; the toolkit's device-node isolation of pgpu and mps containers is
not simulated.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from node_state.daemon import StartError
from node_state.tenancy import Injection, Mount
from py_vcuda import native

CONTAINER_SIM_LIB_DIR = Path("/usr/local/vcuda-sim/lib")
CONTAINER_SIM_STATE_DIR = Path("/run/vcuda-sim")
STATE = "VCUDA_SIM_STATE"
PID_NAMESPACE = "VCUDA_SIM_PID_NAMESPACE"
# The agent's own simulator settings that a container must not inherit as they are.
_NOT_FORWARDED = (STATE, PID_NAMESPACE, "VCUDA_SIM_HOST_PID_OFFSET")

NO_DRIVER = Injection({}, ())   # a real node: NVIDIA's container toolkit brings the driver


def pid_namespace(proc: Path = Path("/proc")) -> str:
    """This process's pid namespace, as /proc/self/ns/pid names it ("pid:[4026531836]")."""
    return os.readlink(proc / "self" / "ns" / "pid")


def simulated(host_lib_dir: Path, env: Mapping[str, str], *, pid_ns: str | None = None) -> Injection:
    """The simulator's edits for every GPU container; StartError unless this agent runs on the simulator.

    `host_lib_dir` holds libvcuda-sim-*.so on the host (the DaemonSet's init step copies them there
    beside libvcuda.so); `env` is the agent's environment: its VCUDA_REAL_LIBNVML must be the
    simulator's library and its VCUDA_SIM_STATE a host path (mounted at the same path in the agent).
    """
    nvml = env.get("VCUDA_REAL_LIBNVML", "")
    if Path(nvml).name != native.SIM_NVML:
        raise StartError(f"--simulator: this agent does not run on the GPU simulator (its NVML is "
                         f"{nvml or 'libnvidia-ml.so.1'}, not {native.SIM_NVML} through VCUDA_REAL_LIBNVML); "
                         "the simulator is for tests only and is never handed to containers on a real node")
    state = Path(env.get(STATE, ""))
    if not state.is_absolute() or not state.parent.is_dir():
        raise StartError(f"--simulator: {STATE} must be an absolute path in an existing directory (a host "
                         f"path the agent sees at the same path), not {str(state) if state.name else 'unset'!r}")
    libs = [host_lib_dir / native.SIM_CUDA, host_lib_dir / native.SIM_NVML]
    missing = [str(p) for p in libs if not p.is_file()]
    if missing:
        raise StartError(f"--simulator: {', '.join(missing)} missing; the DaemonSet's init step copies the "
                         "simulator's libraries beside libvcuda.so (chart value testing.simulator)")
    sim_env = {k: v for k, v in env.items() if k.startswith("VCUDA_SIM_") and k not in _NOT_FORWARDED}
    sim_env.update({
        "VCUDA_REAL_LIBCUDA": str(CONTAINER_SIM_LIB_DIR / native.SIM_CUDA),
        "VCUDA_REAL_LIBNVML": str(CONTAINER_SIM_LIB_DIR / native.SIM_NVML),
        STATE: str(CONTAINER_SIM_STATE_DIR / state.name),
        PID_NAMESPACE: pid_ns if pid_ns is not None else pid_namespace(),
    })
    mounts = (*(Mount(p, CONTAINER_SIM_LIB_DIR / p.name, read_only=True) for p in libs),
              Mount(state.parent, CONTAINER_SIM_STATE_DIR, read_only=False))
    return Injection(dict(sorted(sim_env.items())), mounts)


def for_agent(simulator: bool, host_lib_dir: Path, env: Mapping[str, str] | None = None) -> Injection:
    """The driver's part of every GPU container of a node agent: the simulator's (`simulated`) or none."""
    return simulated(host_lib_dir, os.environ if env is None else env) if simulator else NO_DRIVER
