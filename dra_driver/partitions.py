"""MIG partitions made on demand (``vcuda dra-driver --mig=dynamic``): partitionable devices.

Every MIG-capable GPU whose profiles the driver knows has a pool of its own,
``<node>-gpu-<i>`` (a partition made or destroyed rewrites that pool only, not
every GPU's), holding its whole device ``gpu-<i>`` (while MIG mode is off). When
the GPU has no work on it (no whole-GPU or shared claim prepared on it, no
process on it, no MIG instance the driver did not make) the pool also offers its
partitions, built as one slice ``<node>-gpu.vcuda.io-gpu-<i>`` holding

- the counter set ``gpu-<i>-counters`` with one counter per memory slice
  position (``memory-slice-0`` ...), the GPU's compute slices, its engines
  (copy engines, decoders, encoders, JPEG, OFA, where a profile uses them)
  and, for a profile the GPU holds fewer of than it has placements for
  (``1g.10gb+me``), its instance count;
- one device per profile and placement (``gpu-<i>-mig-1g-10gb-6``) consuming
  its memory slices, compute slices and engines, and the whole GPU
  (``gpu-<i>``, while MIG mode is off) consuming every counter. Two partitions
  that overlap both need one memory slice counter of value 1, so the scheduler
  never picks both; the whole GPU and any partition exclude each other the
  same way.

That is the layout Kubernetes 1.34 accepts; from 1.35 on a slice may not hold
both, and the publisher moves the counter set to a slice of its own in the same
pool, ``<node>-gpu.vcuda.io-gpu-<i>-counters`` (dra_driver.slices.lay_out).

Prepare of a partition records the intent in the driver's MIG record
(node_state.mig.MigRecord, ``dra/mig.json``) BEFORE making anything, turns MIG
mode on if it is off (the GPU is idle: nothing else runs on it), creates the GPU
and compute instance at the placement the scheduler chose, and records it made.
Unprepare destroys it and, when the driver turned MIG mode on and no instance is
left, turns it off again (so the GPU can be offered whole). At start, `recover`
destroys every instance the record holds for a claim that is not prepared (made,
half made, or only intended: an instance found at the intended placement is the
half-made one) and turns MIG mode off where the driver turned it on and nothing
is left. Instances the driver did not make are never touched: their GPU is
offered as its static instances (dra_driver.slices), not as partitions.

NVML lists a GPU's profiles only in MIG mode: at start, an idle MIG-capable GPU
with MIG mode off is switched on to read them and off again.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dra_driver.claims import ClaimError
from dra_driver.slices import Pools, device_name, mig_attributes, slice_name
from node_state.gpus import Inventory
from node_state.mig import MigBackend, MigDevice, MigPlacement, MigProfile, MigRecord, MigView
from py_vcuda.nvml import GPUInfo

log = logging.getLogger(__name__)

ENGINES = {"copy_engines": "copy-engines", "decoders": "decoders", "encoders": "encoders", "jpegs": "jpegs",
           "ofas": "ofas"}
INTENT, MADE = "intent", "made"


def slug(text: str) -> str:
    """A profile name as part of a DNS label ("1g.10gb+me" -> "1g-10gb-me")."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def partition_name(index: int, profile: str, start: int) -> str:
    return f"gpu-{index}-mig-{slug(profile)}-{start}"


def pool_name(node: str, index: int) -> str:
    return f"{node}-gpu-{index}"


def counter_set_name(index: int) -> str:
    return f"gpu-{index}-counters"


def counters(profiles: Collection[MigProfile]) -> dict[str, int]:
    """A GPU's shared counters: what its partitions consume, so that no two that overlap fit together."""
    positions = max((p.start + p.size for prof in profiles for p in prof.placements), default=0)
    out = {f"memory-slice-{k}": 1 for k in range(positions)}
    out["compute-slices"] = max((p.slices for p in profiles), default=0)
    for attr, name in ENGINES.items():
        total = max((getattr(p, attr) * p.max_instances for p in profiles), default=0)
        if total:
            out[name] = total
    for p in profiles:
        if p.max_instances < len(p.placements):
            out[f"{slug(p.name)}-instances"] = p.max_instances
    return out


def consumption(profile: MigProfile, placement: MigPlacement, totals: Mapping[str, int]) -> dict[str, int]:
    """What a partition of `profile` at `placement` consumes of its GPU's counters."""
    out = {f"memory-slice-{k}": 1 for k in range(placement.start, placement.start + placement.size)}
    out["compute-slices"] = profile.slices
    for attr, name in ENGINES.items():
        if getattr(profile, attr) and name in totals:
            out[name] = getattr(profile, attr)
    if f"{slug(profile.name)}-instances" in totals:
        out[f"{slug(profile.name)}-instances"] = 1
    return out


def _consumes(index: int, amounts: Mapping[str, int]) -> list[dict[str, Any]]:
    return [{"counterSet": counter_set_name(index),
             "counters": {k: {"value": str(v)} for k, v in sorted(amounts.items())}}]


@dataclass(frozen=True)
class Partition:
    pool: str
    name: str
    gpu: GPUInfo           # the parent GPU
    profile: MigProfile
    placement: MigPlacement


Busy = Callable[[str], str | None]   # GPU uuid -> why whole-GPU or shared work holds it (prepared claims), or None


class Partitioner:
    """The partitions of the node's MIG-capable GPUs: what to publish, and making and destroying them."""

    def __init__(self, node: str, backend: MigBackend, record: MigRecord, inventory: Inventory, *, busy: Busy,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.node = node
        self.backend = backend
        self.record = record
        self.inventory = inventory
        self.busy = busy
        self.on_change = on_change
        self.profiles: dict[int, tuple[MigProfile, ...]] = {}   # GPU index -> its profiles (partitionable GPUs)
        self.catalog: dict[str, Partition] = {}
        # GPU index -> (parent uuid, its partition devices): fixed once its profiles are known, and built
        # once, not at every republish (the publisher's thread shares the GIL with prepare).
        self._partition_devices: dict[int, tuple[str, list[dict[str, Any]]]] = {}

    # ---- start -----------------------------------------------------------------------------------

    def discover(self) -> None:
        """Read every MIG-capable GPU's profiles (switching an idle GPU's MIG mode on and off to list them)."""
        view = MigView.read(self.backend, [g.index for g in self.inventory.gpus])
        for index, mig in sorted(view.gpus.items()):
            profiles = mig.profiles
            if not profiles and not mig.enabled:
                why = self._work_on(mig.uuid)
                if why:
                    log.warning("GPU %d: MIG profiles unknown (NVML lists them in MIG mode only) and the GPU is "
                                "busy (%s): not partitioned this run", index, why)
                    continue
                try:
                    self.backend.set_mig_mode(index, True)
                    try:
                        profiles = tuple(self.backend.mig_profiles(index))
                    finally:
                        self.backend.set_mig_mode(index, False)
                except Exception as exc:   # NVML refused: the GPU is offered as it is
                    log.warning("GPU %d: MIG profiles not read (%s): not partitioned", index, exc)
                    continue
            if profiles:
                self.profiles[index] = profiles
        for index, profiles in self.profiles.items():
            gpu = next(g for g in self.inventory.gpus if g.index == index)
            for p in profiles:
                for pl in p.placements:
                    name = partition_name(index, p.name, pl.start)
                    self.catalog[name] = Partition(pool_name(self.node, index), name, gpu, p, pl)

    def recover(self, prepared: Collection[str]) -> None:
        """Destroy what the record holds for claims that are not prepared (made, half made or intended),
        then turn MIG mode off where the driver turned it on and nothing is left."""
        for parent, entries in list(self.record.created.items()):
            for entry in list(entries):
                if entry.get("claim") not in prepared:
                    log.info("claim %s is not prepared: removing its MIG partition %s (%s)", entry.get("claim"),
                             entry.get("device"), entry.get("state"))
                    try:
                        self._remove(parent, entry)
                    except Exception:   # in use: stays recorded (so never offered), tried again at the next start
                        log.exception("MIG partition %s of claim %s not removed", entry.get("device"),
                                      entry.get("claim"))
        for parent in list(self.record.enabled):
            self._mode_off_if_empty(parent)
        self.on_change()

    # ---- what to publish -------------------------------------------------------------------------

    def view(self) -> MigView:
        return MigView.read(self.backend, [g.index for g in self.inventory.gpus])

    def static_inventory(self, view: MigView) -> Inventory:
        """The inventory without the instances the driver made (those are partitions, not static devices),
        nor one it is making (intended: at its placement)."""
        gpus = {i: replace(g, devices=tuple(d for d in g.devices if not self._ours(g.uuid, d)))
                for i, g in view.gpus.items()}
        inv = self.inventory
        return Inventory(inv.gpus, inv.nvlink, inv.links, MigView(gpus))

    def _ours(self, parent: str, d: MigDevice) -> bool:
        for e in list(self.record.created.get(parent, [])):
            if e.get("uuid") == d.uuid or (e.get("state") == INTENT and e.get("profile_id") == d.profile_id
                                           and e.get("start") == d.placement.start):
                return True
        return False

    def partitionable(self, view: MigView, index: int) -> str | None:
        """Why GPU `index` is not offered as partitions now (None: it is)."""
        mig = view.gpus.get(index)
        if index not in self.profiles or mig is None:
            return "not MIG-capable, or its profiles are unknown"
        foreign = [d.uuid for d in mig.devices if not self._ours(mig.uuid, d)]
        if foreign:
            return f"it holds MIG instances the driver did not make ({', '.join(foreign)})"
        if mig.enabled and not mig.devices and mig.uuid not in self.record.enabled:
            return None   # MIG mode on, nothing on it: partitions only
        return self._work_on(mig.uuid) if not mig.devices else self.busy(mig.uuid)

    def pool(self, static: list[dict[str, Any]], healthy: Callable[[str], bool], view: MigView) -> Pools:
        """The node's pools: its own with the static devices (`static`, dra_driver.slices.devices) but the
        whole devices of the GPUs with profiles, each of which is in a pool of its own with, while it is
        idle, its counter set and partitions (in one slice: dra_driver.slices.lay_out splits it where the
        API server wants that)."""
        base = slice_name(self.node)
        main = list(static)
        per_gpu: Pools = {}
        for index, profiles in sorted(self.profiles.items()):
            whole = next((d for d in main if d["name"] == device_name(index)), None)
            if whole is not None:
                main.remove(whole)
            mig = view.gpus.get(index)
            if mig is None or not healthy(mig.uuid):
                continue
            name = f"{base}-gpu-{index}"
            if self.partitionable(view, index) is None:
                totals = counters(profiles)
                devices = [{**whole, "consumesCounters": _consumes(index, totals)}] if whole is not None else []
                devices += self._partitions(mig.uuid, index, profiles, totals)
                per_gpu[pool_name(self.node, index)] = {name: {"sharedCounters": [{
                    "name": counter_set_name(index), "counters": {k: {"value": str(v)} for k, v in totals.items()}}],
                    "devices": devices}}
            elif whole is not None:   # busy: shared or taken whole, not partitioned
                per_gpu[pool_name(self.node, index)] = {name: {"devices": [whole]}}
        return {self.node: {base: {"devices": main}}, **per_gpu}

    def _partitions(self, parent: str, index: int, profiles: Sequence[MigProfile], totals: Mapping[str, int]
                    ) -> list[dict[str, Any]]:
        """A GPU's partition devices, one per profile and placement (read-only: shared between builds)."""
        cached = self._partition_devices.get(index)
        if cached is None or cached[0] != parent:
            cached = (parent, [self._device(parent, index, p, pl, totals) for p in profiles for pl in p.placements])
            self._partition_devices[index] = cached
        return cached[1]

    def _device(self, parent: str, index: int, p: MigProfile, pl: MigPlacement, totals: Mapping[str, int]
                ) -> dict[str, Any]:
        gpu = next(g for g in self.inventory.gpus if g.index == index)
        dev = MigDevice(parent_index=index, parent_uuid=parent, uuid="", profile=p.name, profile_id=p.id,
                        gpu_instance=0, compute_instance=0, placement=pl, memory_total=p.memory,
                        multiprocessors=p.multiprocessors, slices=p.slices)
        attributes = {"type": {"string": "mig"}, "index": {"int": index}, "productName": {"string": gpu.name},
                      "memory": {"int": p.memory},
                      **{k: v for k, v in mig_attributes(dev).items() if k != "gpuInstance"}}
        return {"name": partition_name(index, p.name, pl.start), "attributes": attributes,
                "consumesCounters": _consumes(index, consumption(p, pl, totals))}

    # ---- prepare and unprepare -------------------------------------------------------------------

    def whole_ok(self, index: int) -> None:
        """ClaimError when GPU `index` runs partitions (a whole-GPU or shared claim cannot run on it)."""
        mig = self.view().gpus.get(index)
        if mig is not None and mig.enabled:
            raise ClaimError(f"GPU {index} is in MIG mode (partitions in use); it is not offered whole: "
                             "the claim was allocated from an older ResourceSlice, reschedule it")

    def whole_gpu(self, pool: str, name: str) -> GPUInfo | None:
        """The GPU whose whole device (`gpu-<i>`, in its own pool) this is; None for any other device."""
        return next((g for g in self.inventory.gpus if g.index in self.profiles and device_name(g.index) == name
                     and pool_name(self.node, g.index) == pool), None)

    def partition(self, pool: str, name: str) -> Partition | None:
        part = self.catalog.get(name)
        return part if part is not None and part.pool == pool else None

    def check_whole(self, uuid: str) -> None:
        """ClaimError when the partitionable GPU `uuid` runs partitions (no whole-GPU or shared claim on it)."""
        gpu = next((g for g in self.inventory.gpus if g.uuid == uuid and g.index in self.profiles), None)
        if gpu is not None:
            self.whole_ok(gpu.index)

    def made(self, claim_uid: str) -> dict[str, GPUInfo]:
        """The claim's partitions that exist, by device name, as GPUs of their own."""
        out = {}
        devices = {d.uuid: d for d in self.view().devices()}
        for entries in self.record.created.values():
            for e in entries:
                if e.get("claim") == claim_uid and e.get("state") == MADE and e.get("uuid") in devices:
                    out[str(e["device"])] = self._info(devices[e["uuid"]])
        return out

    def make(self, claim_uid: str, device: str) -> GPUInfo:
        """The claim's partition `device`, made now (or found made); ClaimError when it cannot be."""
        part = self.catalog[device]
        done = self.made(claim_uid).get(device)
        if done is not None:
            return done
        parent = part.gpu.uuid
        for e in list(self.record.created.get(parent, [])):   # a half-made one of an earlier try
            if e.get("claim") == claim_uid and e.get("device") == device:
                self._remove(parent, e)
        view = self.view()
        mig = view.gpus.get(part.gpu.index)
        why = self.partitionable(view, part.gpu.index) if mig is not None else "not MIG-capable"
        if why:
            raise ClaimError(f"MIG partition {device} cannot be made: GPU {part.gpu.index}: {why}")
        entry: dict[str, Any] = {"claim": claim_uid, "device": device, "profile": part.profile.name,
                                 "profile_id": part.profile.id, "start": part.placement.start,
                                 "size": part.placement.size, "state": INTENT, "uuid": "", "gpu_instance": None}
        self.record.created.setdefault(parent, []).append(entry)
        self.record.save()   # the intent first: a crash from here on leaves something recover finds
        try:
            if not mig.enabled:
                self.record.enabled.append(parent)
                self.record.save()
                self.backend.set_mig_mode(part.gpu.index, True)
            dev = self.backend.create_mig_device(part.gpu.index, part.profile.id, part.placement)
        except Exception as exc:
            self._remove(parent, entry)
            self._mode_off_if_empty(parent)
            raise ClaimError(f"MIG partition {device} ({part.profile.name} at memory slice "
                             f"{part.placement.start} of GPU {part.gpu.index}) not made: {exc}") from None
        entry.update(state=MADE, uuid=dev.uuid, gpu_instance=dev.gpu_instance)
        self.record.save()
        log.info("made MIG partition %s for claim %s: %s", device, claim_uid, dev.uuid)
        self.on_change()
        return self._info(dev)

    def release(self, claim_uid: str) -> None:
        """Destroy the claim's partitions (and MIG mode, where the driver turned it on and nothing is left)."""
        parents = []
        for parent, entries in list(self.record.created.items()):
            for e in list(entries):
                if e.get("claim") == claim_uid:
                    self._remove(parent, e)
                    parents.append(parent)
        for parent in parents:
            self._mode_off_if_empty(parent)
        if parents:
            self.on_change()

    # ---- helpers ---------------------------------------------------------------------------------

    def _work_on(self, uuid: str) -> str | None:
        why = self.busy(uuid)
        if why:
            return why
        try:
            procs = self.backend.processes(uuid)
        except Exception as exc:   # cannot tell: treat as busy rather than repartition someone's GPU
            return f"cannot list its processes ({exc})"
        return f"{len(procs)} process(es) run on it" if procs else None

    def _index(self, parent: str) -> int:
        return next(g.index for g in self.inventory.gpus if g.uuid == parent)

    def _remove(self, parent: str, entry: dict[str, Any]) -> None:
        """Destroy the entry's instance (found by its id, or, when only intended, at its placement), then
        forget it. An instance that will not go (in use) stays recorded, and the error passes on."""
        index = self._index(parent)
        mig = self.view().gpus.get(index)
        present = list(mig.devices) if mig is not None else []
        owned = {e.get("uuid") for e in self.record.created.get(parent, []) if e is not entry}
        target = next((d for d in present if entry.get("uuid") and d.uuid == entry["uuid"]), None)
        if target is None and entry.get("state") == INTENT:
            target = next((d for d in present if d.profile_id == entry.get("profile_id")
                           and d.placement.start == entry.get("start") and d.uuid not in owned), None)
        if target is not None:
            self.backend.destroy_mig_device(index, target.gpu_instance)
            log.info("destroyed MIG partition %s (%s) of claim %s", entry.get("device"), target.uuid,
                     entry.get("claim"))
        entries = self.record.created.get(parent, [])
        if entry in entries:
            entries.remove(entry)
        if not entries:
            self.record.created.pop(parent, None)
        self.record.save()

    def _mode_off_if_empty(self, parent: str) -> None:
        if parent not in self.record.enabled or self.record.created.get(parent):
            return
        index = self._index(parent)
        mig = self.view().gpus.get(index)
        if mig is not None and mig.enabled and mig.devices:
            return   # someone else's instances came: MIG mode stays
        try:
            if mig is not None and mig.enabled:
                self.backend.set_mig_mode(index, False)
        except Exception as exc:   # busy: stays on, tried again at the next unprepare or start
            log.warning("GPU %d: MIG mode not turned off again (%s)", index, exc)
            return
        self.record.enabled.remove(parent)
        self.record.save()

    def _info(self, d: MigDevice) -> GPUInfo:
        parent = next(g for g in self.inventory.gpus if g.uuid == d.parent_uuid)
        return GPUInfo(index=parent.index, uuid=d.uuid, name=f"{parent.name} MIG {d.profile}",
                       memory_total=d.memory_total, minor=parent.minor, numa_node=parent.numa_node)


__all__ = ["Partition", "Partitioner", "counters", "consumption", "partition_name", "pool_name", "counter_set_name"]
