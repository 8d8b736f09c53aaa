"""A simulated node with known tenants, for the exporter, Prometheus and `vcuda top` tests.

Four simulated GPUs (4 GiB each) in one node state directory:

    GPU 0 vgpu  train (team-a/train-0/main, 30 %, 1 GiB, holds 256 MiB) and
                infer (60 %, 2 GiB, holds 512 MiB; its names come from pod-resources), both spinning
                (a 2 s scheduler window); run-a and run-b, two `vcuda run` records of one command
                (`python3 train.py`: no namespace/pod, GPUs from their ledgers, no core quota, no
                scheduler tenant) holding 128 MiB each: same names, told apart by `tenant`
    GPU 1 vgpu  hog (40 %, saturating), lat (50 %, one 0.5 ms kernel per ms) and full (10 %,
                512 MiB limit, allocates until refused: at its limit, OOM denials); its scheduler
                has a 10 s window, so stalling it starves hog and lat for a while (alert tests)
    GPU 2 pgpu  render (whole card, unthrottled, 1 GiB; names from pod-resources)
    GPU 3 mps   two MPS clients (30 % / 1 GiB and 70 % / 2 GiB, limits from the record only)

Tenants are cuprobe processes under libvcuda with each GPU's real token scheduler. A
container's record key (the `tenant` label) is `c-<name>`, a bare-metal run's is its name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from device_plugin.testing import TestPodResources
from node_state.layout import ContainerRecord, NodeLayout, ledger_in
from node_state.testing import wait_for  # noqa: F401  (for the tests)
from py_vcuda import native
from py_vcuda.ledger import Ledger
from py_vcuda.nvml import NVML
from py_vcuda.sim import SimConfig, SimReader
from token_scheduler.testing import AdminClient, spawn_daemon

MiB = 1 << 20
GiB = 1 << 30
NODE = "node-a"
KERNEL_US = 2000
SPIN_MS = 600_000  # until torn down
CORE = "tencent.com/vcuda-core"


@dataclass
class Tenant:
    key: str
    gpu: int
    request: int
    limit: int
    memory_limit: int | None
    holds: int                      # bytes the tenant allocates (0: none)
    spins: bool
    fill: bool = False              # allocate 16 MiB chunks until refused
    bursts: bool = False            # a short kernel every millisecond: waits more than it runs
    names: tuple[str, str, str] = ("", "", "")
    mode: str = "vgpu"
    bare: bool = False              # a `vcuda run` record (py_vcuda.launch's form), not a kubelet container
    priority: str = "normal"
    proc: subprocess.Popen[str] | None = None

    @property
    def record_key(self) -> str:
        """ContainerRecord.key: the `tenant` label of its series."""
        return self.key if self.bare else f"c-{self.key}"


@dataclass
class Node:
    root: Path
    cuprobe: Path
    daemons: list[subprocess.Popen[bytes]]
    layout: NodeLayout
    sim: SimConfig
    nvml: NVML
    uuids: list[str]
    tenants: dict[str, Tenant]
    kubelet_socket: Path
    expected_names: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    def reader(self) -> SimReader:
        return SimReader(self.sim.state_path)


def tenant_env(sim: SimConfig, ledger: Path | None, gpu: int, endpoint: str | None,
                memory_limit: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
    env.update(sim.env(), CUDA_VISIBLE_DEVICES=str(gpu))
    if ledger is not None:  # under libvcuda; a pGPU container runs without it
        env.update(LD_PRELOAD=str(native.lib_path(native.SHIM)), VCUDA_LEDGER=str(ledger))
    if endpoint:
        env["VCUDA_SCHEDULER"] = endpoint
    if memory_limit is not None:
        env["VCUDA_MEMORY_LIMIT"] = str(memory_limit)
    return env


def _probe_args(t: Tenant) -> list[str]:
    args = ["init", "ctx"]
    if t.holds:
        args.append(f"alloc:{t.holds}")
    if t.fill:
        args.append(f"fill:{16 * MiB}")
    args.append("info")
    if t.spins:
        args.append(f"spin:{KERNEL_US}:{SPIN_MS}:10")
    if t.bursts:
        args.append(f"bursts:500:1:{SPIN_MS}")
    args.append("hold")
    return args


SCENARIO = [
    Tenant("train", 0, 30, 30, 1 * GiB, 256 * MiB, True, names=("team-a", "train-0", "main")),
    Tenant("infer", 0, 60, 60, 2 * GiB, 512 * MiB, True),
    Tenant("run-a", 0, 0, 100, 1 * GiB, 128 * MiB, False, names=("", "", "python3 train.py"), bare=True),
    Tenant("run-b", 0, 0, 100, 1 * GiB, 128 * MiB, False, names=("", "", "python3 train.py"), bare=True),
    Tenant("hog", 1, 40, 40, 1 * GiB, 0, True, names=("team-s", "hog-0", "main")),
    Tenant("lat", 1, 50, 50, 1 * GiB, 0, False, bursts=True, names=("team-s", "lat-0", "main"), priority="high"),
    Tenant("full", 1, 10, 10, 512 * MiB, 0, False, fill=True, names=("team-m", "full-0", "main")),
    Tenant("render", 2, 100, 100, None, 1 * GiB, True, mode="pgpu"),
    Tenant("mps-a", 3, 30, 30, 1 * GiB, 0, False, mode="mps", names=("team-d", "mps-0", "a")),
    Tenant("mps-b", 3, 70, 70, 2 * GiB, 0, False, mode="mps", names=("team-d", "mps-1", "b")),
]
FROM_KUBELET = {"infer": ("team-b", "infer-0", "server"), "render": ("team-c", "render-0", "app")}


def _device_ids(t: Tenant, uuid: str) -> tuple[str, ...]:
    if t.mode == "pgpu":
        return (uuid,)
    return tuple(f"{uuid}::{i}" for i in range(t.request))


def _resource(t: Tenant) -> str:
    return {"vgpu": CORE, "pgpu": "nvidia.com/gpu", "mps": "nvidia.com/mps-core"}[t.mode]


@pytest.fixture(scope="module")
def node(build_c: Callable[..., Path]) -> Iterator[Node]:
    cuprobe = build_c(["cuprobe.c"])
    root = Path(tempfile.mkdtemp(prefix="vc", dir="/tmp"))
    sim = SimConfig(state_path=root / "sim.state", devices=4, memory=4 * GiB, context_overhead=64 * MiB)
    layout = NodeLayout(root / "n")
    daemons: list[subprocess.Popen[bytes]] = []
    tenants = {t.key: Tenant(**{k: v for k, v in t.__dict__.items() if k != "proc"}) for t in SCENARIO}
    kubelet: TestPodResources | None = None
    nvml: NVML | None = None
    with pytest.MonkeyPatch.context() as mp:
        for k, v in sim.env().items():
            mp.setenv(k, v)
        try:
            nvml = NVML()
            uuids = [g.uuid for g in nvml.gpus()]
            admins: dict[int, AdminClient] = {}
            for gpu, window in ((0, "2s"), (1, "10s")):
                directory = layout.scheduler_dir(uuids[gpu])
                daemons.append(spawn_daemon(directory, "--window", window, gpu=uuids[gpu]))
                admins[gpu] = AdminClient(directory / "admin.sock")
                admins[gpu].wait_ready(30)
            assignments = {}
            for t in tenants.values():
                uuid = uuids[t.gpu]
                names = t.names if t.key not in FROM_KUBELET else ("", "", "")
                if t.bare:  # as py_vcuda.launch writes it for `vcuda run --memory 1Gi -- python3 train.py`
                    record = ContainerRecord(
                        key=t.record_key, mode="vgpu", resource="", device_ids=(), gpus=(), core_request=0,
                        core_limit=100, memory_limit=t.memory_limit, container=names[2])
                else:
                    record = ContainerRecord(
                        key=t.record_key, mode=t.mode, resource=_resource(t), device_ids=_device_ids(t, uuid),
                        gpus=(uuid,), core_request=t.request, core_limit=t.limit, memory_limit=t.memory_limit,
                        tenant=t.key if t.mode == "vgpu" else None, namespace=names[0], pod=names[1],
                        container=names[2])
                directory = layout.write_record(record)
                if t.key in FROM_KUBELET:
                    ns, pod, container = FROM_KUBELET[t.key]
                    assignments[(ns, pod, container)] = {record.resource: list(record.device_ids)}
                if t.mode == "mps":
                    continue  # MPS clients: limits from the record, nothing running
                ledger = None
                endpoint = None
                if t.bare:
                    ledger = ledger_in(directory)
                    with Ledger(ledger, create=True) as book:  # its GPU, from the start (the shim adds it later)
                        book.set_limit(uuid, t.memory_limit)
                elif t.mode == "vgpu":
                    ledger = ledger_in(directory)
                    Ledger(ledger, create=True).close()
                    reply = admins[t.gpu].call("add", tenant=t.key, request=t.request, limit=t.limit,
                                               priority=t.priority)
                    assert reply.get("ok"), reply
                    endpoint = str(reply["endpoint"])
                env = tenant_env(sim, ledger, t.gpu, endpoint, t.memory_limit)
                t.proc = subprocess.Popen([str(cuprobe), *_probe_args(t)], env=env, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            for admin in admins.values():
                admin.close()
            kubelet_socket = root / "kubelet.sock"
            kubelet = TestPodResources(kubelet_socket)
            kubelet.owners = assignments
            kubelet.start()
            yield Node(root, cuprobe, daemons, layout, sim, nvml, uuids, tenants, kubelet_socket,
                       expected_names={t.key: FROM_KUBELET.get(t.key, t.names) for t in tenants.values()})
        finally:
            for t in tenants.values():
                if t.proc is not None:
                    t.proc.kill()
                    t.proc.wait()
            for d in daemons:
                d.kill()
                d.wait()
            if kubelet is not None:
                kubelet.stop()
            if nvml is not None:
                nvml.close()
            shutil.rmtree(root, ignore_errors=True)
