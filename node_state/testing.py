"""Test doubles of the node, for tests and benchmarks of the node daemons (device plugin, DRA driver),
importable outside pytest: GPUs with the simulator's UUIDs (a simulated program sees the same cards),
and waiting for a condition without sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pynvml

from node_state.gpus import Inventory
from node_state.mig import MigView, fit
from py_vcuda.nvml import GPUInfo, MigDevice, MigPlacement, MigProfile, ProcessMemory
from py_vcuda.sim import GiB


def gpu(index: int, *, numa: int | None = None, memory: int = 16 * GiB) -> GPUInfo:
    """A GPU with the simulator's UUID scheme, so a simulated program sees the same card."""
    return GPUInfo(index=index, uuid=f"GPU-5157a0c0-{index:04x}-4000-8000-{index:012x}",
                   name="vcuda simulated GPU", memory_total=memory, minor=index, numa_node=numa)


def inventory(n: int, **kw: Any) -> Inventory:
    return Inventory(tuple(gpu(i, **kw) for i in range(n)))


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


# ---- MIG: a stand-in for NVML's MIG calls (node_state.mig.MigBackend) ----------------------

def _h100_profiles() -> tuple[MigProfile, ...]:
    """NVIDIA H100 80GB HBM3's GPU-instance profiles (MIG user guide), 8 memory slices."""
    def p(pid: int, name: str, slices: int, mib: int, sms: int, count: int, size: int, starts: list[int]
          ) -> MigProfile:
        return MigProfile(id=pid, name=name, slices=slices, memory=mib << 20, multiprocessors=sms,
                          max_instances=count, placements=tuple(MigPlacement(s, size) for s in starts))
    # NVML's profile ids, as nvidia-smi mig -lgip shows them on an H100.
    return (p(19, "1g.10gb", 1, 9856, 16, 7, 1, list(range(7))),
            p(20, "1g.10gb+me", 1, 9856, 16, 1, 1, list(range(7))),
            p(15, "1g.20gb", 1, 19968, 26, 4, 2, [0, 2, 4, 6]),
            p(14, "2g.20gb", 2, 19968, 32, 3, 2, [0, 2, 4]),
            p(9, "3g.40gb", 3, 40192, 60, 2, 4, [0, 4]),
            p(5, "4g.40gb", 4, 40192, 64, 1, 4, [0]),
            p(0, "7g.80gb", 7, 80896, 132, 1, 8, [0]))


H100_PROFILES = _h100_profiles()


class FakeMig:
    """NVML's MIG calls on fake GPUs, for unit tests of node_state.mig and its users.

    ``mig`` per GPU as the simulator's SimConfig.mig spells it: "" (not capable), "off",
    "on" or "on:1g.10gb,3g.40gb" (instances at their first free placement). ``processes``
    maps a GPU or MIG UUID to pids; ``fail_create_at`` makes the n-th create (0-based) fail."""

    def __init__(self, mig: Sequence[str], *, memory: int = 80 * GiB, name: str = "NVIDIA H100 80GB HBM3") -> None:
        self.gpus_ = [GPUInfo(g.index, g.uuid, name, g.memory_total, g.minor, g.numa_node)
                      for g in (gpu(i, memory=memory) for i in range(len(mig)))]
        self.modes: dict[int, bool] = {}
        self.instances: dict[int, list[MigDevice]] = {}
        self.processes_on: dict[str, list[int]] = {}
        self.memory_used: dict[str, int] = {}   # MIG uuid -> bytes in use
        self.fail_create_at: int | None = None
        self.creates = 0
        self.calls: list[str] = []
        self._next_gi: dict[int, int] = {}
        for i, spec in enumerate(mig):
            if not spec:
                continue
            mode, _, profiles = spec.partition(":")
            self.modes[i] = mode == "on"
            self.instances[i] = []
            for name_ in filter(None, profiles.split(",")):
                prof = self._profile(name_)
                taken = [d.placement for d in self.instances[i]]
                placed = fit([prof], taken)
                assert placed, f"{name_} does not fit on GPU {i}"
                self._make(i, prof, placed[0][1])

    # --- MigBackend ---
    def count(self) -> int:
        return len(self.gpus_)

    def gpu(self, index: int) -> GPUInfo:
        return self.gpus_[index]

    def mig_mode(self, index: int) -> tuple[bool, bool] | None:
        return None if index not in self.modes else (self.modes[index], self.modes[index])

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        self.calls.append(f"mode {index} {enabled}")
        if index not in self.modes:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if self.processes_on.get(self.gpus_[index].uuid) or (not enabled and self.instances[index]):
            raise _nvml_error(pynvml.NVML_ERROR_IN_USE)
        self.modes[index] = enabled

    def mig_profiles(self, index: int) -> list[MigProfile]:
        return list(H100_PROFILES) if self.modes.get(index) else []   # as NVML: only in MIG mode

    def mig_devices(self, index: int) -> list[MigDevice]:
        return list(self.instances.get(index, [])) if self.modes.get(index) else []

    def create_mig_device(self, index: int, profile_id: int, placement: MigPlacement) -> MigDevice:
        self.calls.append(f"create {index} {profile_id}@{placement.start}")
        n, self.creates = self.creates, self.creates + 1
        if n == self.fail_create_at:
            raise _nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        prof = next(p for p in H100_PROFILES if p.id == profile_id)
        if not self.modes.get(index) or placement not in prof.placements or any(
                placement.overlaps(d.placement) for d in self.instances[index]):
            raise _nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        return self._make(index, prof, placement)

    def destroy_mig_device(self, index: int, gpu_instance: int) -> None:
        self.calls.append(f"destroy {index} {gpu_instance}")
        dev = next((d for d in self.instances.get(index, []) if d.gpu_instance == gpu_instance), None)
        if dev is None:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        if self.processes_on.get(dev.uuid):
            raise _nvml_error(pynvml.NVML_ERROR_IN_USE)
        self.instances[index].remove(dev)

    def processes(self, uuid: str) -> list[ProcessMemory]:
        return [ProcessMemory(pid, None) for pid in self.processes_on.get(uuid, [])]

    # --- the rest of NVML the agent asks (labels, inventory) ---
    def gpus(self) -> list[GPUInfo]:
        return list(self.gpus_)

    def nvlink_links(self, index: int) -> dict[int, int]:
        return {}

    def cuda_driver_version(self) -> tuple[int, int]:
        return 12, 4

    def compute_capability(self, index: int) -> tuple[int, int] | None:
        return None

    def mig_memory(self, uuid: str) -> tuple[int, int]:
        dev = next(d for devs in self.instances.values() for d in devs if d.uuid == uuid)
        return self.memory_used.get(uuid, 0), dev.memory_total

    # --- helpers ---
    def _profile(self, name: str) -> MigProfile:
        return next(p for p in H100_PROFILES if p.name == name)

    def _make(self, index: int, prof: MigProfile, placement: MigPlacement) -> MigDevice:
        gi = self._next_gi.get(index, 1)
        self._next_gi[index] = gi + 1
        parent = self.gpus_[index]
        dev = MigDevice(parent_index=index, parent_uuid=parent.uuid,
                        uuid=f"MIG-5157a0c0-{index:04x}-4{gi:03x}-8000-{index:06x}{gi:06x}",
                        profile=prof.name, profile_id=prof.id, gpu_instance=gi, compute_instance=0,
                        placement=placement, memory_total=prof.memory, multiprocessors=prof.multiprocessors,
                        slices=prof.slices)
        self.instances[index].append(dev)
        return dev

    def view(self) -> MigView:
        return MigView.read(self)

    def inventory(self) -> Inventory:
        return Inventory(tuple(self.gpus_), mig=self.view())


def _nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


# The issue's MIG node: GPU 0 in MIG mode (1g.10gb, 1g.10gb, 3g.40gb), GPU 1 MIG-capable with MIG off,
# GPU 2 without MIG (FakeMig's and the simulator's SimConfig.mig spelling).
ISSUE_NODE_MIG = ("on:1g.10gb,1g.10gb,3g.40gb", "off", "")

# mig-parted layouts for the H100 80GB profiles, for tests.
EXAMPLE_LAYOUTS = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  mixed-1:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.40gb": 1, "2g.20gb": 2}
    - devices: [1]
      mig-enabled: true
      mig-devices: {"4g.40gb": 1, "1g.10gb": 3}
  first-two-1g:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  too-big:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.40gb": 3}
"""
