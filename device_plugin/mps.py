"""mps mode: ``nvidia.com/mps-core`` in percent of a GPU, enforced by CUDA MPS.

The plugin runs one MPS control daemon per GPU (``nvidia-cuda-mps-control -d``
with its own pipe and log directories, CUDA_VISIBLE_DEVICES=<uuid>) and
supervises it through the pid file the daemon writes in its pipe directory.
A container gets the GPU, the daemon's pipe directory, its share of SMs
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and the same share of device memory
(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT). Device IDs are ``<uuid>::<percent>``.

The daemons belong to the agent: stopping it quits them (and with them the
MPS server its clients talk to), and Allocate refuses a GPU whose daemon is
down rather than hand out a pipe directory nobody answers on.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc

from device_plugin import device_list
from device_plugin.inventory import NodeResource, logical_devices, parse_ids
from device_plugin.kubelet import AllocationError, answer
from kube_contract.api import deviceplugin_v1beta1_pb2 as pb
from node_state import tenancy
from node_state.containers import ContainerStore, new_key
from node_state.gpu_driver import NO_DRIVER
from node_state.gpus import Health, Inventory
from node_state.layout import ContainerRecord, NodeLayout, gpu_key
from node_state.tenancy import Injection, Mount
from py_vcuda.nvml import GPUInfo

RESOURCE = "nvidia.com/mps-core"
PERCENT = 100
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTAINER_PIPE_DIR = Path("/run/nvidia-mps")

TOO_BIG = ("{size}% is more than one GPU: an MPS client talks to one GPU's control daemon; "
           "ask for at most 100, or use a pgpu node (nvidia.com/gpu) for several GPUs")

log = logging.getLogger(__name__)


def percent_of(_gpu: GPUInfo) -> int:
    return PERCENT


def mps_dir(layout: NodeLayout, uuid: str) -> Path:
    return layout.root / "mps" / gpu_key(uuid)


def is_program(pid: int, binary: str, proc: Path = Path("/proc")) -> bool:
    """Whether process `pid` runs `binary`: its command name, or its first or (a script under an
    interpreter) second argument, names the same file."""
    name = os.path.basename(binary)
    try:
        comm = (proc / str(pid) / "comm").read_text().strip()
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if comm and comm == name[:15]:   # the kernel keeps 15 characters of the name
        return True
    return any(os.path.basename(a.decode(errors="replace")) == name for a in argv[:2] if a)


class MPSDaemon:
    """One GPU's control daemon, started detached (-d) and watched via its pid file."""

    def __init__(self, uuid: str, layout: NodeLayout, binary: str, *, ready_timeout_s: float = 10.0) -> None:
        self.uuid = uuid
        self.name = f"MPS control daemon for {uuid}"
        self.pipe_dir = mps_dir(layout, uuid) / "pipe"
        self.log_dir = mps_dir(layout, uuid) / "log"
        self.binary = binary
        self.ready_timeout_s = ready_timeout_s

    def env(self) -> dict[str, str]:
        return {**os.environ, "CUDA_VISIBLE_DEVICES": self.uuid,
                "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def pid(self) -> int | None:
        try:
            return int((self.pipe_dir / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        """A live process with the pid file's pid that is our control binary.

        The pid file outlives the daemon (a node reboot, a SIGKILL), and the pid may be reused by any
        process since: adopting that one would leave the GPU without MPS and stop a stranger later.
        """
        pid = self.pid()
        return pid is not None and is_program(pid, self.binary)

    def start(self) -> None:
        if self.alive():
            return   # survived our own restart: adopt it (alive() checked it is the control daemon)
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.pipe_dir / PID_FILE).unlink(missing_ok=True)
        # Output to a file, not a pipe: the daemon inherits it and a pipe would never reach EOF.
        start_log = self.log_dir / "control-start.log"
        with open(start_log, "wb") as out:
            try:
                rc = subprocess.run([self.binary, "-d"], env=self.env(), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=out, timeout=self.ready_timeout_s).returncode
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"{self.binary} -d did not return within {self.ready_timeout_s} s") from None
        if rc != 0:
            said = start_log.read_text(errors="replace").strip()[-300:]
            raise OSError(f"{self.binary} -d exited with {rc}: {said}")
        deadline = time.monotonic() + self.ready_timeout_s
        while not self.alive():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no live pid in {self.pipe_dir / PID_FILE}")
            time.sleep(0.05)
        log.info("%s running (pid %s)", self.name, self.pid())

    def after_start(self) -> None:
        pass

    def stop(self) -> None:
        if not self.alive():
            return
        try:
            subprocess.run([self.binary], env=self.env(), input="quit\n", stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, text=True, timeout=self.ready_timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("%s: quit failed (%s)", self.name, exc)
            return
        deadline = time.monotonic() + self.ready_timeout_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)


class MPSPlugin(NodeResource):
    resource = RESOURCE
    socket_name = "nvidia-mps-core.sock"

    def __init__(self, inventory: Inventory, health: Health, store: ContainerStore,
                 daemons: Mapping[str, MPSDaemon], *, device_list: Sequence[str] = (device_list.ENVVAR,),
                 gpu_driver: Injection = NO_DRIVER) -> None:
        super().__init__(inventory, health, store, device_list=device_list, gpu_driver=gpu_driver)
        self.daemons = daemons

    def devices(self) -> list[pb.Device]:
        return logical_devices(self.inventory, self.health, percent_of)

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        free = parse_ids(available, self.inventory, percent_of)
        forced = parse_ids(must_include, self.inventory, percent_of)
        if size > PERCENT:
            raise AllocationError(TOO_BIG.format(size=size))
        fits = [u for u, ids in free.items() if len(ids) >= size and (not forced or u in forced)]
        if not fits:
            raise AllocationError(f"no single GPU has {size}% free")
        uuid = min(fits, key=lambda u: (len(free[u]), u))   # best fit
        return [f"{uuid}::{i}" for i in sorted(free[uuid])[:size]]

    def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        groups = parse_ids(device_ids, self.inventory, percent_of)
        if not groups:
            raise AllocationError("no device IDs in the request")
        if len(device_ids) > PERCENT:
            raise AllocationError(TOO_BIG.format(size=len(device_ids)))
        if len(groups) > 1:
            raise AllocationError(f"{len(device_ids)}% must stay on one GPU, got devices of {len(groups)} GPUs; "
                                  "let kubelet use the plugin's preferred allocation")
        uuid, share = next(iter(groups)), len(device_ids)
        daemon = self.daemons.get(uuid)
        if daemon is None or not daemon.alive():
            # Without its control daemon an MPS client's cuInit fails inside the container, far from the cause.
            where = f"; see {daemon.log_dir}" if daemon is not None else ""
            raise AllocationError(f"the MPS control daemon for GPU {uuid} is not running (the plugin keeps "
                                  f"restarting it{where}); the pod can be re-created once it runs",
                                  grpc.StatusCode.UNAVAILABLE)
        gpu = self.inventory.by_uuid(uuid)
        assert gpu is not None   # parse_ids checked
        memory = gpu.memory_total * share // PERCENT
        self.store.layout.write_record(ContainerRecord(
            key=new_key(), mode="mps", resource=RESOURCE, device_ids=tuple(device_ids), gpus=(uuid,),
            core_request=share, core_limit=share, memory_limit=memory, created=time.time()))
        pipe = mps_dir(self.store.layout, uuid) / "pipe"
        edits = tenancy.gpu_container([uuid], self.gpu_driver,
                                      env={"CUDA_MPS_PIPE_DIRECTORY": str(CONTAINER_PIPE_DIR),
                                           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(share),
                                           "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory >> 20}M"},
                                      mounts=[Mount(pipe, CONTAINER_PIPE_DIR, read_only=False)])
        return device_list.apply(answer(edits), [uuid], self.device_list)
