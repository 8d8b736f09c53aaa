"""This node's GPUs as a ResourceSlice (resource.k8s.io/v1), kept current in the API server.

One pool per node (named after the node), one slice holding it, one device per
healthy GPU not in MIG mode (``gpu-<index>``) and one per MIG instance
(``mig-<parent index>-<GPU instance id>``; a GPU in MIG mode is never offered
whole: it runs work only on its instances). Each device can be shared by several
claims (``allowMultipleAllocations``), each consuming part of its capacity:

    cores    100 per GPU or instance, requests in steps of 1 (1..100), default 100
    memory   the GPU's (instance's) bytes, requests in steps of 256 MiB, default all of it

A request that names neither consumes the defaults: the whole GPU (instance). Attributes
(qualified with the driver's domain in CEL: ``device.attributes["gpu.vcuda.io"].uuid``):
type (``gpu`` or ``mig``), uuid, index, productName, memory (bytes), driverVersion and
cudaDriverVersion (semver), numaNode (when known), nvlinkPeers (indexes of the
NVLink-connected GPUs, comma separated, sorted). A MIG instance's uuid is its
``MIG-<uuid>`` and its index its parent's; it adds parentUUID, profile (``1g.10gb``),
multiprocessors, slices (compute slices), gpuInstance, placementStart and placementSize
(memory slices).

Counter sets (partitionable devices, dra_driver.partitions) are laid out as the API server the
driver talks to accepts them (`lay_out`): 1.34 takes a counter set only in the slice of the
devices that consume it (``consumesCounters`` must name one of that slice's ``sharedCounters``);
1.35 on refuse a slice with both, so the set goes to a slice of its own in the same pool
(``<slice>-counters``; KEP-4815 as changed for 1.35). The builders put it beside its devices;
the publisher reads the server's version (``/version``) at its first sync and again at each
resync (a control plane upgraded under a running driver gets the other layout within
`resync_s`; the pool is rewritten, the slice that no longer belongs deleted).

`SlicePublisher` writes the slice when it starts, whenever a GPU's health
changes (an unhealthy GPU leaves the slice, so no new claim lands on it; it
comes back when it recovers), and checks it every `resync_s` (a slice someone
deleted or changed is written again). Each change of the devices bumps the
pool's generation, which tells the scheduler that older slices of the pool are
stale. The API server may be down: the publisher keeps retrying with a growing
pause, and the kubelet plugin serves meanwhile.

The publisher runs in the kubelet plugin's process, and its work (building the pools
over NVML, the kubernetes client's validation and serialization of each write) holds
the GIL: a prepare running beside it waits up to the switch interval after each of
its many syscalls (fsyncs, renames, NVML). So a kubelet call in flight (`busy()`,
entered by the Driver around NodePrepareResources and NodeUnprepareResources) holds
the publisher back: woken by `changed()`, it builds and writes only once no call is
in flight, waiting at most `max_hold_s` (200 ms) in all for one publication, so a
steady stream of prepares cannot keep a change out of the API server. Nothing of
the driver's waits on the publisher: the API calls never run under a claim's lock.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from dra_driver.claims import whole_memory
from dra_driver.names import CORES, DRIVER, MEMORY
from kube_contract.names import CORES_PER_GPU, MEMORY_UNIT_BYTES
from node_state.gpus import Inventory
from node_state.mig import MigDevice
from py_vcuda.nvml import GPUInfo

log = logging.getLogger(__name__)

API_VERSION = "resource.k8s.io/v1"
Slice = dict[str, Any]   # raw API JSON


@dataclass(frozen=True)
class DriverVersions:
    """The node's NVIDIA driver and the CUDA version it supports, as NVML reports them (None: unknown)."""

    driver: str | None = None
    cuda: tuple[int, int] | None = None


def semver(text: str) -> str | None:
    """A driver version as semver 2.0 ("535.104.05" -> "535.104.5", "12.4" -> "12.4.0"); None if it is not one."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))   # semver forbids leading zeros
    return ".".join(parts)


def device_name(index: int) -> str:
    return f"gpu-{index}"


def mig_device_name(d: MigDevice) -> str:
    return f"mig-{d.parent_index}-{d.gpu_instance}"


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


@dataclass(frozen=True)
class Offer:
    """A device of the slice and what a claim on it runs on: a GPU, or a MIG instance as a GPU of
    its own (node_state.gpus.Inventory.shareable: its MIG-<uuid> and its memory)."""

    name: str
    gpu: GPUInfo
    mig: MigDevice | None = None
    parent: GPUInfo | None = None    # a MIG instance's GPU


def offers(inventory: Inventory) -> list[Offer]:
    """The node's devices: its GPUs not in MIG mode (index order), then every MIG instance."""
    whole = sorted(inventory.whole().gpus, key=lambda g: g.index)
    out = [Offer(device_name(g.index), g) for g in whole]
    instances = inventory.shareable().gpus[len(whole):]
    for d, g in zip(inventory.mig_devices(), instances, strict=True):
        out.append(Offer(mig_device_name(d), g, d, inventory.by_uuid(d.parent_uuid)))
    return out


def capacity(memory_total: int) -> dict[str, Any]:
    """Consumable capacity of a GPU or MIG instance with this much memory."""
    memory = whole_memory(memory_total)
    return {
        CORES: {"value": str(CORES_PER_GPU), "requestPolicy": {
            "default": str(CORES_PER_GPU),
            "validRange": {"min": "1", "max": str(CORES_PER_GPU), "step": "1"}}},
        MEMORY: {"value": str(memory_total), "requestPolicy": {
            "default": str(memory),
            "validRange": {"min": str(MEMORY_UNIT_BYTES), "max": str(memory),
                           "step": str(MEMORY_UNIT_BYTES)}}},
    }


def mig_attributes(d: MigDevice) -> dict[str, Any]:
    return {"type": {"string": "mig"}, "parentUUID": {"string": d.parent_uuid}, "profile": {"string": d.profile},
            "multiprocessors": {"int": d.multiprocessors}, "slices": {"int": d.slices},
            "gpuInstance": {"int": d.gpu_instance}, "placementStart": {"int": d.placement.start},
            "placementSize": {"int": d.placement.size}}


def devices(inventory: Inventory, healthy: Callable[[str], bool], versions: DriverVersions) -> list[dict[str, Any]]:
    """The slice's devices: one per healthy GPU not in MIG mode, in index order, then one per MIG instance."""
    common: dict[str, Any] = {}
    if versions.driver and (v := semver(versions.driver)):
        common["driverVersion"] = {"version": v}
    if versions.cuda:
        common["cudaDriverVersion"] = {"version": f"{versions.cuda[0]}.{versions.cuda[1]}.0"}
    out = []
    for offer in offers(inventory):
        g = offer.gpu
        if not healthy(g.uuid):
            continue
        host = offer.parent or g
        attributes: dict[str, Any] = {
            "type": {"string": "gpu"},
            "uuid": {"string": g.uuid},
            "index": {"int": host.index},
            "productName": {"string": host.name},
            "memory": {"int": g.memory_total},
            **common,
        }
        if g.numa_node is not None:
            attributes["numaNode"] = {"int": g.numa_node}
        if offer.mig is not None:
            attributes.update(mig_attributes(offer.mig))
        else:
            peers = sorted(inventory.nvlink.get(g.index, ()))
            if peers:
                attributes["nvlinkPeers"] = {"string": ",".join(map(str, peers))}
        out.append({"name": offer.name, "attributes": attributes, "capacity": capacity(g.memory_total),
                    "allowMultipleAllocations": True})
    return out


Pool = dict[str, dict[str, Any]]   # slice name -> what its spec holds: "devices", "sharedCounters" or both
Pools = dict[str, Pool]            # pool name -> its slices

# Where a counter set goes (lay_out): in the slice of the devices that consume it (1.34), or in a
# slice of its own in the same pool (1.35 on).
WITH_DEVICES, OWN_SLICE = "with-devices", "own-slice"
SEPARATE_FROM = (1, 35)   # the first Kubernetes that wants OWN_SLICE (and refuses WITH_DEVICES)


def server_version(info: dict[str, Any]) -> tuple[int, int] | None:
    """(major, minor) of the API server from its /version answer (``gitVersion`` "v1.34.4-gke.100", else
    ``major`` and ``minor``, which some distributions write "34+"); None when neither says."""
    if m := re.match(r"v?(\d+)\.(\d+)", str(info.get("gitVersion") or "")):
        return int(m[1]), int(m[2])
    major, minor = (re.match(r"\d+", str(info.get(k) or "")) for k in ("major", "minor"))
    return (int(major[0]), int(minor[0])) if major and minor else None


def counter_layout(version: tuple[int, int] | None) -> str:
    """The layout the API server of `version` accepts; an unknown version gets the current API's."""
    return WITH_DEVICES if version is not None and version < SEPARATE_FROM else OWN_SLICE


def lay_out(pools: Pools, layout: str) -> Pools:
    """`pools` as built (each counter set in the slice of its devices) laid out as `layout` wants:
    with OWN_SLICE a slice holding both becomes ``<name>-counters`` (its counter sets) and ``<name>``
    (its devices), in that order, in the same pool."""
    if layout == WITH_DEVICES:
        return pools
    out: Pools = {}
    for pool, slices_ in pools.items():
        laid: Pool = {}
        for name, part in slices_.items():
            if "sharedCounters" in part and "devices" in part:
                laid[f"{name}-counters"] = {"sharedCounters": part["sharedCounters"]}
                laid[name] = {k: v for k, v in part.items() if k != "sharedCounters"}
            else:
                laid[name] = part
        out[pool] = laid
    return out


def resource_slice(node: str, node_uid: str | None, generation: int, devs: list[dict[str, Any]] | dict[str, Any],
                   *, name: str | None = None, count: int = 1, pool: str | None = None) -> Slice:
    """One slice of a pool of the node (the node's own by default; of `count` slices): `devs` its devices,
    or what its spec holds."""
    part = {"devices": devs} if isinstance(devs, list) else devs
    meta: dict[str, Any] = {"name": name or slice_name(node)}
    if node_uid:
        # Owned by the Node: the garbage collector removes the slice with it.
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                    "controller": True}]
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta,
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": count},
                     **part}}


class SliceAPI(Protocol):
    """The API calls the publisher makes (dra_driver.kube.KubeAPI); each raises on failure."""

    def node_uid(self, node: str) -> str: ...
    def server_version(self) -> dict[str, Any]: ...
    def list_slices(self, node: str) -> list[Slice]: ...
    def create_slice(self, body: Slice) -> Slice: ...
    def replace_slice(self, body: Slice) -> Slice: ...
    def delete_slice(self, name: str) -> None: ...


class Conflict(Exception):
    """The slice changed since it was read (HTTP 409); read it again and retry."""


class SlicePublisher:
    """Keeps the node's pools in the API server. `build` gives the devices of the node's pool's one slice,
    or every pool by name with its slices by name (MIG partitions: a pool per partitionable GPU, its
    counter set beside its devices; a change rewrites only the pool it is in), laid out as the API
    server's version wants (`layout`, read at the first sync and at each resync)."""

    def __init__(self, api: SliceAPI, node: str, build: Callable[[], list[dict[str, Any]] | Pools], *,
                 resync_s: float = 60.0, retry_s: float = 0.5, max_retry_s: float = 30.0,
                 max_hold_s: float = 0.2) -> None:
        self.api = api
        self.node = node
        self.name = slice_name(node)
        self.build = build
        self.resync_s = resync_s
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.max_hold_s = max_hold_s   # the longest kubelet calls in flight hold one publication back
        self.generations: dict[str, int] = {}   # pool name -> its generation, as last written or seen
        self.layout: str | None = None  # where counter sets go (lay_out): as the API server's version wants
        self.writes = 0                # successful creates and replaces, for tests and logs
        self.published = threading.Event()
        self._node_uid: str | None = None
        self._written: dict[str, tuple[str, str, dict[str, Any]]] = {}   # slice -> (pool, resourceVersion, part)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._quiet = threading.Condition()
        self._in_flight = 0            # kubelet calls in flight (busy())
        self._deadline: float | None = None   # while publishing from the thread: when holding back ends
        self.held = threading.Event()  # set when the thread held back for a call in flight, for tests

    @property
    def generation(self) -> int:
        """The node's own pool's generation, as last written."""
        return self.generations.get(self.node, 0)

    def changed(self) -> None:
        """The devices may have changed (a GPU's health): publish now, not at the next resync."""
        self._wake.set()

    @property
    def calls_in_flight(self) -> int:
        return self._in_flight

    @contextmanager
    def busy(self) -> Iterator[None]:
        """A kubelet call in flight: the thread's building and writing wait for its end (at most max_hold_s)."""
        with self._quiet:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._quiet:
                self._in_flight -= 1
                if not self._in_flight:
                    self._quiet.notify_all()

    def _hold(self) -> None:
        """Before each piece of the thread's work: wait while a kubelet call is in flight, until the deadline."""
        if self._deadline is None:
            return
        with self._quiet:
            if self._in_flight and not self._stop.is_set():
                self.held.set()
                self._quiet.wait_for(lambda: not self._in_flight or self._stop.is_set(),
                                     timeout=max(0.0, self._deadline - time.monotonic()))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="slice-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._quiet:
            self._quiet.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _run(self) -> None:
        pause = self.retry_s
        failures = 0
        local = False   # woken by changed(): the API server need not be read when our devices did not change
        while not self._stop.is_set():
            self._deadline = time.monotonic() + self.max_hold_s
            self._hold()
            self._wake.clear()   # after holding back: the changes made by the calls it waited for are taken in
            try:
                self.sync(local=local)
            except Exception as exc:   # the API server may be down or slow: keep trying, quietly after the first
                failures += 1
                (log.warning if failures == 1 else log.debug)("ResourceSlice %s not published (%s); retrying",
                                                              self.name, exc)
                self._wake.wait(pause)
                pause = min(pause * 2, self.max_retry_s)
                local = False
                continue
            if failures:
                log.info("ResourceSlice %s published after %d failed attempt(s)", self.name, failures)
            failures, pause = 0, self.retry_s
            local = self._wake.wait(self.resync_s)

    def sync(self, local: bool = False) -> bool:
        """Make the API server hold our slice with the current devices; True when it wrote something.

        `local`: only our devices may have changed (changed()): when they did not (a MIG partition made
        on a GPU whose others are still offered), nothing is read or written; the resync checks the API
        server (and its version)."""
        self._hold()
        if not local or self.layout is None:
            self._read_layout()
        if local and self._written:
            pools = self._pools()
            if self._parts(pools) == {name: (pool, part) for name, (pool, _rv, part) in self._written.items()}:
                return False
        for _ in range(5):
            try:
                return self._sync_once()
            except Conflict:
                continue   # someone changed it under us: read it again
        raise Conflict(f"ResourceSlice {self.name} kept changing under the driver")

    def _read_layout(self) -> None:
        info = self.api.server_version()
        version = server_version(info)
        layout = counter_layout(version)
        if layout != self.layout:
            (log.warning if version is None else log.info)(
                "API server %s: counter sets %s", info.get("gitVersion") or "of unknown version",
                "in the slice of the devices that consume them (the 1.34 layout)" if layout == WITH_DEVICES
                else "in a slice of their own (the layout of 1.35 on)")
        self.layout = layout

    def _pools(self) -> Pools:
        built = self.build()
        pools = built if isinstance(built, dict) else {self.node: {self.name: {"devices": built}}}
        return lay_out(pools, self.layout or OWN_SLICE)

    @staticmethod
    def _parts(pools: Pools) -> dict[str, tuple[str, dict[str, Any]]]:
        return {name: (pool, part) for pool, slices_ in pools.items() for name, part in slices_.items()}

    def _delete_stale(self, name: str) -> None:
        log.info("deleting stale ResourceSlice %s", name)
        self.api.delete_slice(name)

    def _sync_once(self) -> bool:
        self._hold()
        pools = self._pools()
        wanted = self._parts(pools)
        if self._node_uid is None:
            self._node_uid = self.api.node_uid(self.node)
        ours: dict[str, Slice] = {}
        stale: list[str] = []
        for s in self.api.list_slices(self.node):
            name = s["metadata"]["name"]
            pool = s["spec"].get("pool", {}).get("name", self.node)
            if wanted.get(name, ("",))[0] == pool:
                ours[name] = s
            elif name in wanted:   # the name moves to another pool: it must go before that pool's write
                self._delete_stale(name)
            else:
                stale.append(name)
            self.generations[pool] = max(self.generations.get(pool, 0),
                                         int(s["spec"].get("pool", {}).get("generation", 0)))
        wrote = False
        for pool, slices_ in pools.items():
            if all(name in ours and self._written.get(name) == (pool, ours[name]["metadata"].get("resourceVersion"),
                                                                 part)
                   and ours[name]["spec"]["pool"].get("resourceSliceCount") == len(slices_)
                   for name, part in slices_.items()):
                continue
            started = time.perf_counter()
            generation = self.generations.get(pool, 0) + 1   # every slice of the pool: the scheduler ignores older
            for name, part in slices_.items():
                self._hold()
                body = resource_slice(self.node, self._node_uid, generation, part, name=name, count=len(slices_),
                                      pool=pool)
                if name not in ours:
                    done = self.api.create_slice(body)
                else:
                    body["metadata"]["resourceVersion"] = ours[name]["metadata"].get("resourceVersion")
                    done = self.api.replace_slice(body)
                self._written[name] = (pool, done["metadata"].get("resourceVersion"), part)
            self.generations[pool] = generation
            wrote = True
            log.info("published pool %s (%s): %d device(s), generation %d (%.1f ms)", pool, ", ".join(slices_),
                     sum(len(p.get("devices") or ()) for p in slices_.values()), generation,
                     (time.perf_counter() - started) * 1000)
        # A slice we no longer publish (an older driver's, or a GPU's partitions that went) goes once
        # its pool's next generation is written: deleted first, the pool would be short of the slice
        # count it still declares, and a scheduler (or a reader) would see it incomplete meanwhile.
        for name in stale:
            self._delete_stale(name)
        for name in set(self._written) - set(wanted):
            del self._written[name]
        if wrote:
            self.writes += 1
        self.published.set()
        return wrote
