"""The GPU simulator's Python side: configuration for child processes and a
reader of the simulator's shared state (devices, processes, busy time, and
the physical memory each process holds, broken down by what holds it).

The simulator is a stand-in ``libcuda`` / ``libnvidia-ml`` (built from
``gpusim/``) that child processes load through ``VCUDA_REAL_LIBCUDA`` and
``VCUDA_REAL_LIBNVML``. All processes given the same state path share the
simulated GPUs. A kernel runs for the microseconds in the ``uint64_t`` its
``kernelParams[0]`` points to; processes share a device round-robin in time
slices, as a GPU without MPS does (see ``gpusim/include/vcudasim.h``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import cffi

from py_vcuda import native
from py_vcuda.nvml import NVML, open_with_env

_CDEF = """
typedef struct vcudasim_state vcudasim_state;
typedef struct vcudasim_config {
    uint32_t devices;
    uint32_t max_pending;
    int32_t driver_version;
    uint64_t context_overhead;
    uint32_t nvswitch;
    uint32_t sms;
    uint32_t threads_per_sm;
    uint32_t mig_model;
    uint64_t pool_chunk;
    uint64_t kernel_code;
    uint32_t timeslice_us;
    uint32_t reserved2;
} vcudasim_config;
typedef struct vcudasim_device {
    uint32_t index;
    uint32_t processes;
    char uuid[96];
    char name[96];
    uint64_t capacity;
    uint64_t used;
    uint64_t busy_ns;
    uint64_t kernels;
    uint64_t busy_until_ns;
    int32_t numa_node;
    uint32_t nvlink_peers;
    uint32_t lost;
    uint32_t reserved;
    uint64_t xids;
    uint64_t mem[8];
} vcudasim_device;
typedef struct vcudasim_process {
    int32_t pid;
    uint32_t contexts;
    uint64_t used;
    uint64_t busy_ns;
    uint64_t kernels;
    int32_t host_pid;
    uint32_t reserved;
    uint64_t mem[8];
    uint64_t pending_ns;
} vcudasim_process;
typedef struct vcudasim_mig_instance {
    char profile[32];
    uint32_t gi_id;
    uint32_t ci_id;
    uint32_t start, size;
    uint32_t device;
    uint32_t processes;
    char uuid[96];
    uint64_t capacity;
    uint64_t used;
} vcudasim_mig_instance;
typedef struct vcudasim_mig {
    uint32_t capable;
    uint32_t mode;
    uint32_t count;
    uint32_t reserved;
    vcudasim_mig_instance instances[7];
} vcudasim_mig;
typedef struct vcudasim_stretch {
    uint64_t start_ns;
    uint64_t end_ns;
} vcudasim_stretch;
int vcudasim_api_version(void);
vcudasim_state *vcudasim_open(const char *path, int create);
void vcudasim_close(vcudasim_state *st);
const char *vcudasim_last_error(void);
int vcudasim_get_config(vcudasim_state *st, vcudasim_config *out);
int vcudasim_device_info(vcudasim_state *st, unsigned dev, vcudasim_device *out);
int vcudasim_processes(vcudasim_state *st, unsigned dev, vcudasim_process *out, int cap);
int vcudasim_served(vcudasim_state *st, unsigned dev, int32_t pid, vcudasim_stretch *out, int cap);
uint64_t vcudasim_busy_in_window(vcudasim_state *st, unsigned dev, uint64_t window_ns);
uint64_t vcudasim_now_ns(void);
int64_t vcudasim_inject_xid(vcudasim_state *st, unsigned dev, uint64_t xid);
int vcudasim_set_lost(vcudasim_state *st, unsigned dev, int lost);
int vcudasim_mig_info(vcudasim_state *st, unsigned dev, vcudasim_mig *out);
"""

API_VERSION = 6
STRETCHES = 64  # VCUDASIM_STRETCHES: service stretches the simulator keeps per process
MIG_MODELS = ("h100-80gb", "a100-40gb")  # VCUDA_SIM_MIG_MODEL, in vcudasim_config.mig_model order
GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10


# The breakdown of a process's (or device's) physical use, in vcudasim.h's
# VCUDASIM_MEM_* order.
MEMORY_KINDS = ("alloc", "context", "pool", "local", "limits", "module", "graph")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Physical device memory by what holds it (vcudasim.h "What the device
    holds beyond the pointers"); ``total`` is what NVML reports."""

    alloc: int = 0     # cuMemAlloc*, managed, arrays, cuMemCreate handles: the pointers
    context: int = 0   # per-context overhead
    pool: int = 0      # stream-ordered pools' reservations
    local: int = 0     # local memory above a fresh context's
    limits: int = 0    # malloc heap, printf FIFO, device launch pool above defaults
    module: int = 0    # module data and kernel code
    graph: int = 0     # graph-memory reserve

    @property
    def total(self) -> int:
        return sum(getattr(self, k) for k in MEMORY_KINDS)

    @classmethod
    def from_c(cls, mem: object) -> MemoryBreakdown:
        return cls(*(int(mem[i]) for i in range(len(MEMORY_KINDS))))  # type: ignore[index]


def default_state_path() -> Path:
    return Path(os.environ.get("VCUDA_SIM_STATE") or f"/tmp/vcuda-sim-{os.getuid()}/state")


@dataclass
class SimConfig:
    """Simulated GPUs; read by the first process that creates the state file."""

    state_path: Path = field(default_factory=default_state_path)
    devices: int = 1
    memory: int = 16 * GiB  # bytes per device
    context_overhead: int = 64 * MiB
    uuids: list[str] | None = None
    names: list[str] | None = None
    driver_version: int = 13000
    max_pending: int = 1024
    numa: list[int] | None = None  # NUMA node per device (-1: none); None: no NUMA at all
    nvlink: list[tuple[int, int]] | None = None  # device pairs joined by one NVLink
    nvswitch: bool = False  # every device on one NVSwitch fabric (instead of nvlink pairs)
    sms: int = 132  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    threads_per_sm: int = 2048  # CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR
    pool_chunk: int = 32 * MiB  # stream-ordered pools grow by multiples of this
    kernel_code: int = 0  # code bytes of a kernel no module descriptor describes
    timeslice_us: int = 2000  # round-robin slice between processes' kernels
    # MIG per device: "" not MIG-capable, "off", "on", or "on:1g.10gb,3g.40gb" (MIG mode
    # with these GPU instances, each with its compute instance, at the highest free
    # placements); None: no device is MIG-capable. MIG-capable devices are mig_model's
    # GPU ("h100-80gb" or "a100-40gb"): its memory, SMs and name.
    mig: list[str] | None = None
    mig_model: str = "h100-80gb"

    def env(self) -> dict[str, str]:
        """Environment variables a child process needs to use this simulator."""
        env = {
            "VCUDA_REAL_LIBCUDA": str(native.lib_path(native.SIM_CUDA)),
            "VCUDA_REAL_LIBNVML": str(native.lib_path(native.SIM_NVML)),
            "VCUDA_SIM_STATE": str(self.state_path),
            "VCUDA_SIM_DEVICES": str(self.devices),
            "VCUDA_SIM_MEMORY": str(self.memory),
            "VCUDA_SIM_CONTEXT_OVERHEAD": str(self.context_overhead),
            "VCUDA_SIM_DRIVER_VERSION": str(self.driver_version),
            "VCUDA_SIM_MAX_PENDING": str(self.max_pending),
            "VCUDA_SIM_SMS": str(self.sms),
            "VCUDA_SIM_THREADS_PER_SM": str(self.threads_per_sm),
            "VCUDA_SIM_POOL_CHUNK": str(self.pool_chunk),
            "VCUDA_SIM_KERNEL_CODE": str(self.kernel_code),
            "VCUDA_SIM_TIMESLICE_US": str(self.timeslice_us),
            "VCUDA_SIM_MIG_MODEL": self.mig_model,
        }
        if self.uuids:
            env["VCUDA_SIM_UUIDS"] = ",".join(self.uuids)
        if self.names:
            env["VCUDA_SIM_NAMES"] = ",".join(self.names)
        if self.numa is not None:
            env["VCUDA_SIM_NUMA"] = ",".join(str(n) for n in self.numa)
        if self.mig is not None:
            env["VCUDA_SIM_MIG"] = ";".join(self.mig)
        if self.nvswitch:
            env["VCUDA_SIM_NVLINK"] = "switch"
        elif self.nvlink:
            env["VCUDA_SIM_NVLINK"] = ",".join(f"{a}-{b}" for a, b in self.nvlink)
        return env

    def reset(self) -> None:
        """Remove the state file, so the next process creates it from this config."""
        self.state_path.unlink(missing_ok=True)


@dataclass(frozen=True)
class DeviceStats:
    index: int
    uuid: str
    name: str
    capacity: int
    used: int
    busy_ns: int  # kernel time served so far, exited processes included
    kernels: int  # launched, exited processes included
    busy_until_ns: int  # CLOCK_MONOTONIC when the queued work drains if nothing more is launched
    processes: int
    numa_node: int = -1  # -1: none configured
    nvlink_peers: frozenset[int] = frozenset()
    lost: bool = False
    xids: int = 0  # XIDs injected so far
    memory: MemoryBreakdown = MemoryBreakdown()  # `used` by what holds it


@dataclass(frozen=True)
class ProcessStats:
    pid: int  # as the process sees itself
    used: int  # physical bytes on the device: memory.total
    busy_ns: int  # kernel time served
    kernels: int  # launched
    contexts: int
    host_pid: int = 0  # what NVML reports (pid + its VCUDA_SIM_HOST_PID_OFFSET)
    memory: MemoryBreakdown = MemoryBreakdown()
    pending_ns: int = 0  # kernel time queued, not yet served


@dataclass(frozen=True)
class MigInstance:
    """A GPU instance and its compute instance (the MIG device)."""

    profile: str  # "1g.10gb"
    gi_id: int
    ci_id: int | None  # None: no compute instance (no MIG device)
    start: int  # placement, in memory slices
    size: int
    device: int | None  # the MIG device's index for SimReader.device()/processes()
    uuid: str  # "MIG-..." ("" without a compute instance)
    memory_total: int
    memory_used: int  # live processes
    processes: int  # live processes holding memory or a context on it


@dataclass(frozen=True)
class MigState:
    capable: bool
    enabled: bool
    instances: tuple[MigInstance, ...] = ()  # by GPU instance id

    def config_entry(self) -> str:
        """This GPU as a SimConfig.mig entry (instances by GPU instance id; without
        compute instances, and their placements, not kept)."""
        if not self.capable:
            return ""
        if not self.enabled:
            return "off"
        names = ",".join(i.profile for i in self.instances)
        return f"on:{names}" if names else "on"


class SimError(RuntimeError):
    """The simulator's state could not be read."""


_ffi = cffi.FFI()
_ffi.cdef(_CDEF)
_libs: dict[str, object] = {}


def _lib() -> object:
    path = str(native.lib_path(native.SIM_CUDA))
    if path not in _libs:
        lib = _ffi.dlopen(path)
        version = lib.vcudasim_api_version()
        if version != API_VERSION:
            raise SimError(f"{path} has vcudasim API {version}, py_vcuda needs {API_VERSION}")
        _libs[path] = lib
    return _libs[path]


class SimReader:
    """Reads a simulator state file through the vcudasim_* API."""

    def __init__(self, state_path: Path | str | None = None, *, create: bool = False) -> None:
        self._lib = _lib()
        path = str(state_path) if state_path is not None else str(default_state_path())
        self.path = path
        self._st = self._lib.vcudasim_open(path.encode(), 1 if create else 0)
        if self._st == _ffi.NULL:
            err = _ffi.string(self._lib.vcudasim_last_error()).decode(errors="replace")
            raise SimError(f"cannot read simulator state {path}: {err}")

    def close(self) -> None:
        if self._st is not None and self._st != _ffi.NULL:
            self._lib.vcudasim_close(self._st)
        self._st = None

    def __enter__(self) -> SimReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _state(self) -> object:
        if self._st is None:
            raise SimError("reader is closed")
        return self._st

    def config(self) -> SimConfig:
        c = _ffi.new("vcudasim_config *")
        self._lib.vcudasim_get_config(self._state(), c)
        devs = [self.device(i) for i in range(c.devices)]
        numa = [d.numa_node for d in devs]
        migs = [self.mig(i) for i in range(c.devices)]
        # MIG-capable devices have their model's memory, not the configured one
        plain = [d for d, m in zip(devs, migs, strict=True) if not m.capable] or devs
        links = sorted({(min(d.index, p), max(d.index, p)) for d in devs for p in d.nvlink_peers})
        return SimConfig(
            state_path=Path(self.path), devices=c.devices,
            memory=plain[0].capacity if plain else 0, context_overhead=c.context_overhead,
            uuids=[d.uuid for d in devs], names=[d.name for d in devs],
            driver_version=c.driver_version, max_pending=c.max_pending,
            numa=None if all(n < 0 for n in numa) else numa, nvlink=links or None,
            nvswitch=bool(c.nvswitch), sms=c.sms, threads_per_sm=c.threads_per_sm,
            pool_chunk=c.pool_chunk, kernel_code=c.kernel_code,
            timeslice_us=c.timeslice_us,
            mig=[m.config_entry() for m in migs] if any(m.capable for m in migs) else None,
            mig_model=MIG_MODELS[c.mig_model],
        )

    def device_count(self) -> int:
        c = _ffi.new("vcudasim_config *")
        self._lib.vcudasim_get_config(self._state(), c)
        return int(c.devices)

    def device(self, index: int) -> DeviceStats:
        d = _ffi.new("vcudasim_device *")
        if self._lib.vcudasim_device_info(self._state(), index, d) != 0:
            raise SimError(f"no simulated device {index} in {self.path}")
        return DeviceStats(
            index=d.index, uuid=_ffi.string(d.uuid).decode(), name=_ffi.string(d.name).decode(),
            capacity=d.capacity, used=d.used, busy_ns=d.busy_ns, kernels=d.kernels,
            busy_until_ns=d.busy_until_ns, processes=d.processes, numa_node=d.numa_node,
            nvlink_peers=frozenset(i for i in range(32) if d.nvlink_peers >> i & 1),
            lost=bool(d.lost), xids=d.xids, memory=MemoryBreakdown.from_c(d.mem),
        )

    def devices(self) -> list[DeviceStats]:
        return [self.device(i) for i in range(self.device_count())]

    def processes(self, device: int = 0) -> list[ProcessStats]:
        """Live processes with memory, a context or kernels on the device."""
        cap = 64
        while True:
            buf = _ffi.new("vcudasim_process[]", cap)
            n = self._lib.vcudasim_processes(self._state(), device, buf, cap)
            if n < 0:
                raise SimError(f"no simulated device {device} in {self.path}")
            if n <= cap:
                return [
                    ProcessStats(pid=p.pid, used=p.used, busy_ns=p.busy_ns, kernels=p.kernels,
                                 contexts=p.contexts, host_pid=p.host_pid,
                                 memory=MemoryBreakdown.from_c(p.mem), pending_ns=p.pending_ns)
                    for p in buf[0:n]
                ]
            cap = n

    def served(self, pid: int, device: int = 0) -> list[tuple[int, int]]:
        """When the process ``pid``'s work ran on the device: its last STRETCHES service
        stretches, (start, end) in CLOCK_MONOTONIC ns, oldest first (the newest may still
        grow). Their total is its ``busy_ns``; they say when (empty: no such process)."""
        buf = _ffi.new("vcudasim_stretch[]", STRETCHES)
        n = self._lib.vcudasim_served(self._state(), device, pid, buf, STRETCHES)
        if n < 0:
            raise SimError(f"no simulated device {device} in {self.path}")
        return [(g.start_ns, g.end_ns) for g in buf[0:min(n, STRETCHES)]]

    def process(self, pid: int, device: int = 0) -> ProcessStats | None:
        """The live process ``pid`` (as it sees itself) on the device, if it holds anything."""
        return next((p for p in self.processes(device) if p.pid == pid), None)

    def mig(self, device: int) -> MigState:
        """The GPU's MIG mode and instances."""
        m = _ffi.new("vcudasim_mig *")
        if self._lib.vcudasim_mig_info(self._state(), device, m) != 0:
            raise SimError(f"no simulated device {device} in {self.path}")
        return MigState(capable=bool(m.capable), enabled=bool(m.mode), instances=tuple(
            MigInstance(
                profile=_ffi.string(g.profile).decode(), gi_id=g.gi_id,
                ci_id=None if g.ci_id == 0xFFFFFFFF else g.ci_id, start=g.start, size=g.size,
                device=g.device if g.ci_id != 0xFFFFFFFF else None,
                uuid=_ffi.string(g.uuid).decode(), memory_total=g.capacity, memory_used=g.used,
                processes=g.processes)
            for g in m.instances[0:m.count]))

    def busy_in_window(self, device: int = 0, window_ns: int = 1_000_000_000) -> int:
        return int(self._lib.vcudasim_busy_in_window(self._state(), device, window_ns))

    def now_ns(self) -> int:
        return int(self._lib.vcudasim_now_ns())

    def inject_xid(self, device: int, xid: int) -> int:
        """Raises XID ``xid`` on the device: an NVML XID event for every process
        registered for it. Returns the event's sequence number on the device."""
        seq = int(self._lib.vcudasim_inject_xid(self._state(), device, xid))
        if seq < 0:
            raise SimError(f"no simulated device {device} in {self.path}")
        return seq

    def set_lost(self, device: int, lost: bool = True) -> None:
        """Makes the device fall off the bus (NVML says GPU_IS_LOST) or come back."""
        if self._lib.vcudasim_set_lost(self._state(), device, 1 if lost else 0) != 0:
            raise SimError(f"no simulated device {device} in {self.path}")


@contextmanager
def nvml_session(cfg: SimConfig) -> Iterator[NVML]:
    """An NVML session on this simulator inside this process (tests, demos).

    The process's first session picks the state file: NVML keeps it open
    while any session is, as the real library keeps its driver.
    """
    nvml = open_with_env(cfg.env())
    try:
        yield nvml
    finally:
        nvml.close()
