"""NVML for the Python components (device plugin, exporter, `vcuda top`), through nvidia-ml-py.

The library is the one nvidia-ml-py would load (`libnvidia-ml.so.1`), or
`VCUDA_REAL_LIBNVML` when set, so the GPU simulator can stand in (DESIGN.md).
nvidia-ml-py keeps one library per process; asking for a second, different
one is an error rather than a silent mix.

Topology (NUMA node, NVLink peers), XID events (`watch_xids`) and a cheap
health query (`probe`) serve the device plugin's placement and health checks;
per-process memory (`processes`) the memory reconciler. MIG (mode, profiles,
instances, create/destroy at a placement) serves node_state.mig, the node's one
MIG view for the device plugin and the DRA driver.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

import pynvml

from py_vcuda.environ import overlay

DEFAULT_LIBRARY = "libnvidia-ml.so.1"
SYSFS = Path("/sys")
_load_lock = threading.Lock()
_loaded_path: str | None = None


class NVMLUnavailable(RuntimeError):
    """No NVML here (no driver, or the library refused to initialise)."""


@dataclass(frozen=True)
class GPUInfo:
    index: int
    uuid: str
    name: str
    memory_total: int          # bytes
    minor: int                 # /dev/nvidia<minor>
    numa_node: int | None      # None: unknown or not a NUMA machine


@dataclass(frozen=True)
class GPUUsage:
    utilization: float | None  # percent of time a kernel ran, NVML's sample period
    memory_used: int
    memory_total: int
    temperature_c: float | None
    power_w: float | None


@dataclass(frozen=True)
class ProcessMemory:
    """A compute process on a GPU as NVML reports it."""

    pid: int            # in the host's pid namespace, whatever namespace the process lives in
    used: int | None    # device memory it holds, everything the driver holds for it; None: NVML cannot tell


@dataclass(frozen=True)
class MigPlacement:
    """Where a GPU instance sits, in NVML's memory-slice units: slices [start, start + size)."""

    start: int
    size: int

    def overlaps(self, other: MigPlacement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile a MIG-capable GPU offers (nvmlDeviceGetGpuInstanceProfileInfoV)."""

    id: int                  # NVML's profile id, what create takes
    name: str                # "1g.10gb", "1g.10gb+me"
    slices: int              # compute slices
    memory: int              # bytes
    multiprocessors: int
    max_instances: int       # instances of this profile the GPU can hold at once
    placements: tuple[MigPlacement, ...]
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0


@dataclass(frozen=True)
class MigDevice:
    """One MIG device: a GPU instance with its one compute instance spanning it."""

    parent_index: int
    parent_uuid: str
    uuid: str                # MIG-<uuid>, what NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES take
    profile: str             # "1g.10gb"
    profile_id: int
    gpu_instance: int        # GI id on its parent
    compute_instance: int    # CI id within the GI
    placement: MigPlacement
    memory_total: int        # bytes
    multiprocessors: int
    slices: int


def library_path() -> str:
    return os.environ.get("VCUDA_REAL_LIBNVML") or DEFAULT_LIBRARY


def _load(path: str) -> None:
    global _loaded_path
    with _load_lock:
        if _loaded_path == path:
            return
        if _loaded_path is not None or pynvml.nvmlLib is not None:
            raise NVMLUnavailable(f"NVML already loaded from {_loaded_path or 'elsewhere'}; cannot also load {path}")
        try:
            pynvml.nvmlLib = ctypes.CDLL(path)
        except OSError as exc:
            raise NVMLUnavailable(f"cannot load NVML ({path}): {exc}") from exc
        _loaded_path = path


def _optional(fn, *args):  # type: ignore[no-untyped-def]
    """The value, or None where this GPU or driver does not support the query."""
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def open_with_env(env: Mapping[str, str]) -> NVML:
    """An NVML session as a child process with `env` would open it: the library
    `env` names (VCUDA_REAL_LIBNVML), and only its VCUDA_* variables set while
    NVML initialises, which is when the GPU simulator reads its configuration."""
    with overlay({k: v for k, v in env.items() if k.startswith("VCUDA_")}, clear_prefix="VCUDA_"):
        return NVML(env.get("VCUDA_REAL_LIBNVML") or DEFAULT_LIBRARY)


class NVML:
    """An initialised NVML session; use as a context manager (init and shutdown are counted by NVML).

    ``sysfs``: where to look up a GPU's NUMA node when NVML does not say
    (``<sysfs>/bus/pci/devices/<bus id>/numa_node``). Default: ``/sys`` for
    the real library; none for a stand-in named by ``VCUDA_REAL_LIBNVML``
    (the simulator), whose PCI addresses are not this machine's.
    """

    def __init__(self, library: str | None = None, *,
                 sysfs: Path | None | Literal["auto"] = "auto") -> None:
        self.path = library or library_path()
        self.sysfs: Path | None = sysfs if sysfs != "auto" else (
            SYSFS if self.path == DEFAULT_LIBRARY else None)
        _load(self.path)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NVMLUnavailable(f"NVML ({self.path}) did not initialise: {exc}") from exc
        self._open = True
        self._profiles: dict[int, list[MigProfile]] = {}   # a GPU's MIG profiles, once listed, never change

    def close(self) -> None:
        if self._open:
            self._open = False
            _optional(pynvml.nvmlShutdown)

    def __enter__(self) -> NVML:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def count(self) -> int:
        return int(pynvml.nvmlDeviceGetCount())

    def handle(self, index: int):  # type: ignore[no-untyped-def]
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def gpu(self, index: int) -> GPUInfo:
        h = self.handle(index)
        return GPUInfo(
            index=index,
            uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
            name=_text(pynvml.nvmlDeviceGetName(h)),
            memory_total=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
            minor=int(pynvml.nvmlDeviceGetMinorNumber(h)),
            numa_node=self.numa_node(index),
        )

    def numa_node(self, index: int) -> int | None:
        """The GPU's NUMA node: NVML's answer, else sysfs for its PCI address; None if unknown."""
        h = self.handle(index)
        numa = _optional(getattr(pynvml, "nvmlDeviceGetNumaNodeId", lambda _h: None), h)
        if numa is not None:
            return None if numa < 0 else int(numa)
        bus = _optional(self.pci_bus_id, index) if self.sysfs is not None else None
        if bus is None:
            return None
        try:
            node = int((self.sysfs / "bus/pci/devices" / bus / "numa_node").read_text())
        except (OSError, ValueError):
            return None
        return None if node < 0 else node  # -1: not a NUMA machine

    def pci_bus_id(self, index: int) -> str:
        """The GPU's PCI address as sysfs spells it: ``0000:3b:00.0``."""
        return _sysfs_bus_id(_text(pynvml.nvmlDeviceGetPciInfo_v3(self.handle(index)).busId))

    def nvlink_peers(self, index: int) -> set[int]:
        """Indexes of the GPUs with an active NVLink to this one (empty without NVLink)."""
        return set(self.nvlink_links(index))

    def nvlink_links(self, index: int) -> dict[int, int]:
        """Active NVLink links from this GPU, counted per peer GPU index.

        GPUs on an NVSwitch fabric (HGX/DGX boards) reach every other GPU on it
        through the switches: each such pair counts the fewer of the two GPUs'
        switch links."""
        by_bus = {self.pci_bus_id(i): i for i in range(self.count())}
        links, switched = self._link_ends(index, by_bus)
        if switched:
            for other in range(self.count()):
                theirs = self._link_ends(other, by_bus)[1] if other != index else 0
                if theirs:
                    links[other] = links.get(other, 0) + min(switched, theirs)
        return links

    def _link_ends(self, index: int, by_bus: dict[str, int]) -> tuple[dict[int, int], int]:
        """(links to each GPU, links to NVSwitches) of one GPU's active NVLinks."""
        h = self.handle(index)
        gpus: dict[int, int] = {}
        switched = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if not pynvml.nvmlDeviceGetNvLinkState(h, link):
                    continue
                remote = _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_INVALID_ARGUMENT or (
                        link == 0 and exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED):
                    break  # past the device's last link, or no NVLink at all
                continue
            kind = _optional(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
            peer = by_bus.get(_sysfs_bus_id(remote))
            if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switched += 1
            elif peer is not None and peer != index:
                gpus[peer] = gpus.get(peer, 0) + 1
        return gpus, switched

    def probe(self, index: int) -> bool:
        """A cheap query that needs the GPU to answer: False if it is lost or not responding."""
        try:
            pynvml.nvmlDeviceGetMemoryInfo(self.handle(index))
        except pynvml.NVMLError:
            return False
        return True

    def watch_xids(self, uuids: Iterable[str]) -> XidWatch:
        """XID events of these GPUs, from now on (see XidWatch)."""
        return XidWatch(list(uuids))

    def gpus(self) -> list[GPUInfo]:
        return [self.gpu(i) for i in range(self.count())]

    def driver_version(self) -> str:
        return _text(pynvml.nvmlSystemGetDriverVersion())

    def cuda_driver_version(self) -> tuple[int, int]:
        """The CUDA version the driver supports, e.g. (12, 4)."""
        v = int(pynvml.nvmlSystemGetCudaDriverVersion())
        return v // 1000, (v % 1000) // 10

    def processes(self, uuid: str) -> list[ProcessMemory]:
        """The compute processes on the GPU with this UUID and the memory each holds."""
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        return [ProcessMemory(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]

    def compute_capability(self, index: int) -> tuple[int, int] | None:
        """The GPU's CUDA compute capability, e.g. (9, 0); None where NVML cannot tell."""
        cc = _optional(pynvml.nvmlDeviceGetCudaComputeCapability, self.handle(index))
        return None if cc is None else (int(cc[0]), int(cc[1]))

    # ---- MIG --------------------------------------------------------------

    def mig_mode(self, index: int) -> tuple[bool, bool] | None:
        """(enabled now, enabled after the next reset); None: the GPU is not MIG-capable."""
        try:
            current, pending = pynvml.nvmlDeviceGetMigMode(self.handle(index))
        except pynvml.NVMLError as exc:
            if exc.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                return None
            raise
        return current == pynvml.NVML_DEVICE_MIG_ENABLE, pending == pynvml.NVML_DEVICE_MIG_ENABLE

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """Enable or disable MIG mode; raises NVMLError (IN_USE on a busy GPU, or while instances exist)."""
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        pynvml.nvmlDeviceSetMigMode(self.handle(index), mode)

    def mig_profiles(self, index: int) -> list[MigProfile]:
        """The GPU-instance profiles this GPU supports (empty when not MIG-capable)."""
        if index in self._profiles:
            return list(self._profiles[index])
        profiles = self._read_profiles(index)
        if profiles:   # none while MIG mode is off (NVML lists them in MIG mode only): ask again later
            self._profiles[index] = profiles
        return profiles

    def _read_profiles(self, index: int) -> list[MigProfile]:
        h = self.handle(index)
        out = []
        for pindex in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pindex)
            except pynvml.NVMLError:
                continue   # not a profile of this GPU
            out.append(MigProfile(
                id=int(info.id), name=_profile_name(info), slices=int(info.sliceCount),
                memory=int(info.memorySizeMB) << 20, multiprocessors=int(info.multiprocessorCount),
                max_instances=int(info.instanceCount), placements=self._placements(h, int(info.id)),
                copy_engines=int(info.copyEngineCount), decoders=int(info.decoderCount),
                encoders=int(info.encoderCount), jpegs=int(info.jpegCount), ofas=int(info.ofaCount)))
        return out

    @staticmethod
    def _placements(h, profile_id: int) -> tuple[MigPlacement, ...]:  # type: ignore[no-untyped-def]
        count = ctypes.c_uint(0)
        try:
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, None, ctypes.byref(count))
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
                return ()
        if not count.value:
            return ()
        arr = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, arr, ctypes.byref(count))
        return tuple(MigPlacement(int(p.start), int(p.size)) for p in arr[:count.value])

    def mig_devices(self, index: int) -> list[MigDevice]:
        """The GPU's MIG devices, in NVML's MIG index order (empty when MIG mode is off)."""
        parent = self.handle(index)
        parent_uuid = _text(pynvml.nvmlDeviceGetUUID(parent))
        profiles = {p.id: p for p in self.mig_profiles(index)}
        try:
            top = int(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent))
        except pynvml.NVMLError:
            return []
        out = []
        for i in range(top):
            try:
                h = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
                    continue   # no MIG device at this index
                raise
            out.append(self._mig_device(index, parent, parent_uuid, h, profiles))
        return out

    def _mig_device(self, index: int, parent, parent_uuid: str, h,  # type: ignore[no-untyped-def]
                    profiles: dict[int, MigProfile]) -> MigDevice:
        gi_id = int(pynvml.nvmlDeviceGetGpuInstanceId(h))
        gi = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(parent, gi_id))
        profile = profiles.get(int(gi.profileId))
        attrs = _optional(pynvml.nvmlDeviceGetAttributes_v2, h)
        return MigDevice(
            parent_index=index, parent_uuid=parent_uuid, uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
            profile=profile.name if profile else f"profile-{int(gi.profileId)}", profile_id=int(gi.profileId),
            gpu_instance=gi_id, compute_instance=int(pynvml.nvmlDeviceGetComputeInstanceId(h)),
            placement=MigPlacement(int(gi.placement.start), int(gi.placement.size)),
            memory_total=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
            multiprocessors=int(attrs.multiprocessorCount) if attrs is not None else (
                profile.multiprocessors if profile else 0),
            slices=int(attrs.gpuInstanceSliceCount) if attrs is not None else (profile.slices if profile else 0))

    def mig_memory(self, uuid: str) -> tuple[int, int]:
        """(used, total) bytes of the MIG device with this MIG-<uuid>."""
        mem = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByUUID(uuid.encode()))
        return int(mem.used), int(mem.total)

    def create_mig_device(self, index: int, profile_id: int, placement: MigPlacement) -> MigDevice:
        """A GPU instance of this profile at this placement, with one compute instance spanning it
        (as ``nvidia-smi mig -cgi <p> -C`` makes). Raises NVMLError; a half-made GI is destroyed."""
        parent = self.handle(index)
        place = pynvml.c_nvmlGpuInstancePlacement_t()
        place.start, place.size = placement.start, placement.size
        # NVML takes a pointer to the placement; pynvml passes its argument on as it is.
        gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(parent, profile_id, ctypes.byref(place))
        try:
            gi_info = pynvml.nvmlGpuInstanceGetInfo(gi)
            ci_profile = _full_compute_profile(gi, self._profile_slices(index, profile_id))
            pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
        except BaseException:
            _optional(pynvml.nvmlGpuInstanceDestroy, gi)
            raise
        made = next((d for d in self.mig_devices(index) if d.gpu_instance == int(gi_info.id)), None)
        if made is None:
            raise NVMLUnavailable(f"GPU {index}: created GPU instance {int(gi_info.id)} has no MIG device handle")
        return made

    def _profile_slices(self, index: int, profile_id: int) -> int:
        return next((p.slices for p in self.mig_profiles(index) if p.id == profile_id), 1)

    def destroy_mig_device(self, index: int, gpu_instance: int) -> None:
        """Destroy a GPU instance and its compute instances. Raises NVMLError (IN_USE on a busy instance)."""
        gi = pynvml.nvmlDeviceGetGpuInstanceById(self.handle(index), gpu_instance)
        for ci in _compute_instances(gi):
            pynvml.nvmlComputeInstanceDestroy(ci)
        pynvml.nvmlGpuInstanceDestroy(gi)

    def usage(self, index: int) -> GPUUsage:
        h = self.handle(index)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        util = _optional(pynvml.nvmlDeviceGetUtilizationRates, h)
        temp = _optional(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
        power = _optional(pynvml.nvmlDeviceGetPowerUsage, h)
        return GPUUsage(
            utilization=None if util is None else float(util.gpu),
            memory_used=int(mem.used),
            memory_total=int(mem.total),
            temperature_c=None if temp is None else float(temp),
            power_w=None if power is None else power / 1000.0,
        )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# Compute-instance profile index of the one CI that spans a GI of this many slices.
_CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


def _full_compute_profile(gi, slices: int) -> int:  # type: ignore[no-untyped-def]
    """NVML's id of the compute-instance profile that spans the whole GI."""
    index = _CI_PROFILE_BY_SLICES.get(slices, 0)
    info = _optional(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, index,
                     pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    return index if info is None else int(info.id)


def _compute_instances(gi) -> list:  # type: ignore[no-untyped-def]
    out = []
    for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        info = _optional(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, index,
                         pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        if info is None:
            continue
        count = ctypes.c_uint(0)
        arr = (pynvml.c_nvmlComputeInstance_t * 8)()
        if _optional(pynvml.nvmlGpuInstanceGetComputeInstances, gi, int(info.id), arr, ctypes.byref(count)) is None:
            continue
        out.extend(arr[:count.value])
    return out


def _profile_name(info) -> str:  # type: ignore[no-untyped-def]
    """"1g.10gb" from NVML's "MIG 1g.10gb"; from slices and memory where the driver gives no name."""
    name = _text(getattr(info, "name", b"") or b"").strip()
    if name:
        return name.removeprefix("MIG ").strip()
    return f"{int(info.sliceCount)}g.{(int(info.memorySizeMB) + 1023) // 1024}gb"


def _sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` (or legacy ``0000:3B:00.0``) as sysfs names it: ``0000:3b:00.0``."""
    domain, _, rest = bus_id.strip().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest.lower()}"
    except ValueError:
        return bus_id.lower()


def _address(handle) -> int:  # type: ignore[no-untyped-def]
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class XidWatch:
    """Critical XID events (nvmlEventTypeXidCriticalError) of a set of GPUs.

    GPUs whose driver cannot deliver events (or that are lost when the watch
    starts) are left out and listed in ``unwatched``; watch them by probing.
    One thread at a time may wait; close() only when nobody is waiting.
    """

    def __init__(self, uuids: list[str]) -> None:
        self._set = pynvml.nvmlEventSetCreate()
        self._uuid_of: dict[int, str] = {}
        self.unwatched: dict[str, str] = {}  # uuid -> why
        try:
            for uuid in uuids:
                h = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
                try:
                    supported = pynvml.nvmlDeviceGetSupportedEventTypes(h)
                    if not supported & pynvml.nvmlEventTypeXidCriticalError:
                        self.unwatched[uuid] = "no XID events on this GPU"
                        continue
                    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._set)
                except pynvml.NVMLError as exc:
                    self.unwatched[uuid] = str(exc)
                    continue
                self._uuid_of[_address(h)] = uuid
        except BaseException:
            self.close()
            raise

    def wait(self, timeout_ms: int) -> list[tuple[str, int]]:
        """(uuid, xid) of the events that arrived, waiting up to timeout_ms for the first;
        [] on timeout. uuid is "" for an event NVML did not tie to a watched GPU."""
        if self._set is None:
            raise NVMLUnavailable("XID watch is closed")
        events: list[tuple[str, int]] = []
        timeout = max(0, int(timeout_ms))
        while True:
            try:
                data = pynvml.nvmlEventSetWait_v2(self._set, timeout)
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_TIMEOUT:
                    return events
                if events:
                    return events
                raise
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                events.append((self._uuid_of.get(_address(data.device), ""), int(data.eventData)))
            timeout = 0  # then take whatever else is already there

    def close(self) -> None:
        if self._set is not None:
            _optional(pynvml.nvmlEventSetFree, self._set)
            self._set = None

    def __enter__(self) -> XidWatch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
