"""The node's MIG: what each GPU's MIG mode and instances are, and the layouts the agent applies.

One home for MIG on the node, used by the device plugin (strategies, layouts by
node label) and meant for the DRA driver (instances as devices, partitions made
at a placement):

- ``MigView.read(backend)``: every MIG-capable GPU with its mode, its profiles
  (slices, memory, SMs, placements) and its MIG devices (profile, parent and
  instance UUIDs, memory, SMs, slices, placement). A GPU in MIG mode is never a
  whole GPU to offer: ``MigView.enabled`` names them.
- ``MigBackend``: the NVML calls this needs (py_vcuda.nvml.NVML implements it;
  node_state.testing.FakeMig stands in for unit tests), including
  ``create_mig_device(index, profile_id, placement)`` and ``destroy_mig_device``.
- ``parse_layouts`` reads mig-parted's config format (``version: v1``,
  ``mig-configs: {name: [{devices: all|[i, ...], mig-enabled: bool,
  mig-devices: {profile: count}}]}``); ``plan`` checks a layout against the GPUs
  (profiles, instance counts, placements) and says what changes;
  ``LayoutApplier.apply`` makes the changes only when every GPU it changes is
  idle, and rolls back what it did if a step fails, so a layout either applies
  whole or changes nothing.
- ``MigRecord``: the instances the agent created (by parent GPU), kept in the
  state directory, so they are never confused with instances someone else made.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import yaml

from py_vcuda.files import write_atomic
from py_vcuda.nvml import GPUInfo, MigDevice, MigPlacement, MigProfile, ProcessMemory

__all__ = ["MigDevice", "MigPlacement", "MigProfile", "MigBackend", "MigGPU", "MigView", "LayoutEntry",
           "LayoutError", "BusyError", "GPUChange", "Outcome", "outcome", "parse_layouts", "plan", "fit",
           "LayoutApplier", "MigRecord"]

log = logging.getLogger(__name__)

class MigBackend(Protocol):
    """What the node's MIG code asks NVML (py_vcuda.nvml.NVML)."""

    def count(self) -> int: ...
    def gpu(self, index: int) -> GPUInfo: ...
    def mig_mode(self, index: int) -> tuple[bool, bool] | None: ...
    def set_mig_mode(self, index: int, enabled: bool) -> None: ...
    def mig_profiles(self, index: int) -> list[MigProfile]: ...
    def mig_devices(self, index: int) -> list[MigDevice]: ...
    def create_mig_device(self, index: int, profile_id: int, placement: MigPlacement) -> MigDevice: ...
    def destroy_mig_device(self, index: int, gpu_instance: int) -> None: ...
    def processes(self, uuid: str) -> list[ProcessMemory]: ...


@dataclass(frozen=True)
class MigGPU:
    """One MIG-capable GPU: its mode, what it can hold and what it holds."""

    index: int
    uuid: str
    name: str
    enabled: bool
    profiles: tuple[MigProfile, ...]
    devices: tuple[MigDevice, ...]

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    @property
    def max_slices(self) -> int:
        return max((p.slices for p in self.profiles), default=0)

    def layout(self) -> Counter[str]:
        """Its instances counted by profile."""
        return Counter(d.profile for d in self.devices)


@dataclass(frozen=True)
class MigView:
    """The node's MIG-capable GPUs by index (GPUs without MIG are absent)."""

    gpus: Mapping[int, MigGPU] = field(default_factory=dict)

    @classmethod
    def read(cls, backend: MigBackend, indexes: Iterable[int] | None = None) -> MigView:
        gpus = {}
        for index in range(backend.count()) if indexes is None else indexes:
            try:
                mode = backend.mig_mode(index)
            except Exception as exc:   # an NVML that cannot say: the GPU is treated as without MIG
                log.warning("GPU %d: MIG mode unreadable (%s); treated as not MIG-capable", index, exc)
                continue
            if mode is None:
                continue
            info = backend.gpu(index)
            enabled = mode[0]
            try:
                profiles = tuple(backend.mig_profiles(index))
                devices = tuple(backend.mig_devices(index)) if enabled else ()
            except Exception as exc:   # in MIG mode all the same: never offered whole, nothing on it offered
                log.warning("GPU %d: MIG instances unreadable (%s); none offered", index, exc)
                profiles, devices = (), ()
            gpus[index] = MigGPU(index=index, uuid=info.uuid, name=info.name, enabled=enabled,
                                 profiles=profiles, devices=devices)
        return cls(gpus)

    def capable(self, index: int) -> bool:
        return index in self.gpus

    @property
    def enabled(self) -> frozenset[str]:
        """UUIDs of the GPUs in MIG mode: never offered whole."""
        return frozenset(g.uuid for g in self.gpus.values() if g.enabled)

    def devices(self) -> list[MigDevice]:
        return [d for g in sorted(self.gpus.values(), key=lambda g: g.index) for d in g.devices]

    def device(self, uuid: str) -> MigDevice | None:
        return next((d for d in self.devices() if d.uuid == uuid), None)

    def profiles_in_use(self) -> list[str]:
        return sorted({d.profile for d in self.devices()})


# ---- layouts (mig-parted's config format) ----------------------------------

class LayoutError(ValueError):
    """A layout that cannot be applied; the message says why (it goes to the Node's Event)."""


class BusyError(LayoutError):
    """A layout that changes a GPU in use: it can apply later, once the GPU is idle."""


@dataclass(frozen=True)
class LayoutEntry:
    devices: tuple[int, ...] | None      # None: all GPUs
    mig_enabled: bool
    mig_devices: Mapping[str, int]


def parse_layouts(text: str, source: str = "MIG config") -> dict[str, tuple[LayoutEntry, ...]]:
    """The named layouts of a mig-parted config file; LayoutError names what is wrong."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise LayoutError(f"{source}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise LayoutError(f"{source}: expected a mapping with 'version: v1' and 'mig-configs'")
    if doc.get("version") != "v1":
        raise LayoutError(f"{source}: version {doc.get('version')!r} is not supported (expected v1)")
    configs = doc.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise LayoutError(f"{source}: 'mig-configs' must map layout names to lists of entries")
    return {str(name): _entries(entries, f"{source}: mig-configs.{name}") for name, entries in configs.items()}


def _entries(entries: Any, where: str) -> tuple[LayoutEntry, ...]:
    if not isinstance(entries, list) or not entries:
        raise LayoutError(f"{where}: must be a list of entries (devices, mig-enabled, mig-devices)")
    out = []
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise LayoutError(f"{at}: must be a mapping")
        unknown = set(entry) - {"devices", "mig-enabled", "mig-devices"}
        if unknown:
            raise LayoutError(f"{at}: unsupported key(s) {', '.join(sorted(map(str, unknown)))} "
                              "(supported: devices, mig-enabled, mig-devices)")
        devices = entry.get("devices")
        if devices == "all":
            indexes = None
        elif isinstance(devices, list) and devices and all(isinstance(d, int) and d >= 0 for d in devices):
            indexes = tuple(devices)
        else:
            raise LayoutError(f"{at}: devices must be 'all' or a list of GPU indexes, not {devices!r}")
        enabled = entry.get("mig-enabled")
        if not isinstance(enabled, bool):
            raise LayoutError(f"{at}: mig-enabled must be true or false, not {enabled!r}")
        wanted = entry.get("mig-devices") or {}
        if not isinstance(wanted, dict):
            raise LayoutError(f"{at}: mig-devices must map profile names to counts")
        for profile, count in wanted.items():
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise LayoutError(f"{at}: mig-devices.{profile}: count must be a whole number >= 0, not {count!r}")
        if not enabled and any(wanted.values()):
            raise LayoutError(f"{at}: mig-devices given with mig-enabled: false")
        out.append(LayoutEntry(indexes, enabled, {str(k): v for k, v in wanted.items() if v}))
    return tuple(out)


@dataclass(frozen=True)
class GPUChange:
    """What applying a layout does to one GPU."""

    index: int
    uuid: str
    enable: bool                                         # MIG mode wanted
    set_mode: bool                                       # the mode changes
    destroy: tuple[MigDevice, ...]                       # its instances that go
    create: tuple[tuple[MigProfile, MigPlacement], ...]  # instances to make, at these placements


def plan(view: MigView, gpus: Sequence[GPUInfo], entries: Sequence[LayoutEntry],
         skip: Collection[int] = ()) -> list[GPUChange]:
    """The changes a layout makes to these GPUs (but those in `skip`); raises LayoutError before
    anything is changed.

    A GPU named by no entry is left as it is; a GPU whose mode and instances already match
    needs no change (whoever made its instances). An entry for `devices: all` leaves the GPUs that
    are not MIG-capable alone (mig-parted's "Skipping -- non MIG-capable GPU"), so a node with a
    MIG GPU beside a plain one takes the stock all-<profile> layouts; an entry naming such a GPU
    by index and enabling MIG is refused."""
    by_index = {g.index: g for g in gpus}
    chosen: dict[int, LayoutEntry] = {}
    for n, entry in enumerate(entries):
        for index in entry.devices if entry.devices is not None else sorted(by_index):
            if index not in by_index:
                raise LayoutError(f"entry {n}: GPU index {index} does not exist on this node "
                                  f"({len(by_index)} GPU(s))")
            if index in chosen:
                raise LayoutError(f"entry {n}: GPU {index} is already configured by an earlier entry")
            chosen[index] = entry
    changes = []
    for index, entry in sorted(chosen.items()):
        if index in skip:
            continue
        mig = view.gpus.get(index)
        if mig is None:
            # As mig-parted: `devices: all` passes over a GPU without MIG; naming one is an error.
            if entry.mig_enabled and entry.devices is not None:
                raise LayoutError(f"GPU {index} ({by_index[index].name}) is not MIG-capable")
            continue
        change = _gpu_change(mig, entry)
        if change is not None:
            changes.append(change)
    return changes


def _gpu_change(mig: MigGPU, entry: LayoutEntry) -> GPUChange | None:
    if not entry.mig_enabled:
        if not mig.enabled:
            return None
        return GPUChange(mig.index, mig.uuid, False, True, mig.devices, ())
    wanted: list[MigProfile] = []
    for name, count in entry.mig_devices.items():
        profile = mig.profile(name)
        if profile is None and not mig.profiles:
            raise LayoutError(f"GPU {mig.index} ({mig.name}) lists no MIG profiles (NVML lists them in MIG mode "
                              "only; LayoutApplier turns MIG on first)")
        if profile is None:
            raise LayoutError(f"GPU {mig.index} ({mig.name}) has no MIG profile {name!r}; its profiles: "
                              f"{', '.join(p.name for p in mig.profiles)}")
        if count > profile.max_instances:
            raise LayoutError(f"GPU {mig.index} holds at most {profile.max_instances} instance(s) of {name}, "
                              f"not {count}")
        wanted.extend([profile] * count)
    slices = sum(p.slices for p in wanted)
    if slices > mig.max_slices:
        raise LayoutError(f"GPU {mig.index}: the layout needs {slices} compute slices, the GPU has "
                          f"{mig.max_slices}")
    if mig.enabled and mig.layout() == Counter(p.name for p in wanted):
        return None
    placed = fit(wanted)
    if placed is None:
        raise LayoutError(f"GPU {mig.index}: {', '.join(p.name for p in wanted)} do not fit together "
                          "on the GPU (no placement of each without overlap)")
    return GPUChange(mig.index, mig.uuid, True, not mig.enabled, mig.devices, tuple(placed))


Outcome = dict[int, Counter[str] | None]   # GPU index -> its instances by profile in MIG mode, None: not in MIG mode


def outcome(view: MigView, gpus: Sequence[GPUInfo], changes: Sequence[GPUChange] = ()) -> Outcome:
    """Every GPU's MIG state as it is, or as it will be once `changes` are made."""
    out: Outcome = {}
    for g in gpus:
        mig = view.gpus.get(g.index)
        out[g.index] = mig.layout() if mig is not None and mig.enabled else None
    for c in changes:
        out[c.index] = Counter(p.name for p, _ in c.create) if c.enable else None
    return out


def _turned_on(view: MigView, gpus: Sequence[GPUInfo], entries: Sequence[LayoutEntry]) -> list[int]:
    """MIG-capable GPUs in MIG mode off that an entry turns MIG on for."""
    known = {g.index for g in gpus}
    out = []
    for entry in entries:
        if not entry.mig_enabled:
            continue
        for i in entry.devices if entry.devices is not None else sorted(known):
            mig = view.gpus.get(i)
            if mig is not None and not mig.enabled and i not in out:
                out.append(i)
    return out


def fit(profiles: Sequence[MigProfile], taken: Sequence[MigPlacement] = ()
        ) -> list[tuple[MigProfile, MigPlacement]] | None:
    """A placement for each profile, none overlapping each other or `taken`; None if there is none.

    Largest first, lowest start first, backtracking: a handful of instances per GPU."""
    order = sorted(profiles, key=lambda p: (-p.placements[0].size if p.placements else 0, p.id))
    chosen: list[tuple[MigProfile, MigPlacement]] = []

    def place(i: int) -> bool:
        if i == len(order):
            return True
        used = [*taken, *(pl for _, pl in chosen)]
        for pl in sorted(order[i].placements, key=lambda x: x.start):
            if any(pl.overlaps(u) for u in used):
                continue
            chosen.append((order[i], pl))
            if place(i + 1):
                return True
            chosen.pop()
        return False

    return chosen if place(0) else None


# ---- what the agent made ---------------------------------------------------

class MigRecord:
    """The MIG instances this agent created, by parent GPU UUID, in a JSON file in the state directory.

    ``{"config": <layout name>, "created": {<parent uuid>: [{"gpu_instance": 1, "uuid": "MIG-…",
    "profile": "1g.10gb"}]}, "enabled": [<uuid of a GPU whose MIG mode the agent turned on>]}``.
    Its user may add keys to an instance's entry (the DRA driver: the claim, the placement, and
    whether it is only intended yet). Written atomically after every change."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.config: str | None = None
        self.created: dict[str, list[dict[str, Any]]] = {}
        self.enabled: list[str] = []
        if path is not None and path.exists():
            try:
                doc = json.loads(path.read_text())
                self.config = doc.get("config")
                self.created = {str(k): list(v) for k, v in (doc.get("created") or {}).items()}
                self.enabled = [str(u) for u in doc.get("enabled") or []]
            except (OSError, ValueError, AttributeError) as exc:
                log.warning("MIG record %s unreadable (%s); starting a new one", path, exc)

    def owned(self, parent_uuid: str) -> set[str]:
        """UUIDs of the instances on this GPU that the agent made."""
        return {str(e.get("uuid")) for e in self.created.get(parent_uuid, [])}

    def replace(self, parent_uuid: str, devices: Sequence[MigDevice]) -> None:
        self.created[parent_uuid] = [{"gpu_instance": d.gpu_instance, "uuid": d.uuid, "profile": d.profile}
                                     for d in devices]
        if not devices:
            del self.created[parent_uuid]

    def forget_missing(self, view: MigView) -> None:
        """Drop instances that no longer exist (destroyed by someone else, or the GPU left MIG mode)."""
        present = {d.uuid for d in view.devices()}
        for parent in list(self.created):
            kept = [e for e in self.created[parent] if e.get("uuid") in present]
            if kept:
                self.created[parent] = kept
            else:
                del self.created[parent]

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {"config": self.config, "created": self.created}
        if self.enabled:
            doc["enabled"] = self.enabled
        # Durable, not only atomic: the DRA driver records an instance's intent here before making it,
        # and recovery after a power loss needs that record (py_vcuda.files).
        write_atomic(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())


# ---- applying a layout -------------------------------------------------------

Busy = Callable[[str], str | None]   # GPU or MIG device UUID -> why it is in use (allocated containers), or None


class LayoutApplier:
    """Applies a layout when the GPUs it changes are idle; all or nothing."""

    def __init__(self, backend: MigBackend, record: MigRecord, busy: Busy | None = None) -> None:
        self.backend = backend
        self.record = record
        self.busy = busy or (lambda _uuid: None)

    def apply(self, name: str, entries: Sequence[LayoutEntry],
              check: Callable[[Outcome], str | None] | None = None) -> list[GPUChange]:
        """Apply layout `name`; returns the changes made. LayoutError when it cannot (nothing changed):
        `check` may refuse the outcome (the device plugin's MIG strategy does), BusyError when a GPU
        it changes is in use."""
        gpus = [self.backend.gpu(i) for i in range(self.backend.count())]
        view = MigView.read(self.backend)
        # NVML tells a GPU's profiles only in MIG mode: the GPUs the layout turns MIG on for are
        # switched first (when idle), so the layout is checked against their real profiles; any
        # refusal below turns them back.
        enabled_first = _turned_on(view, gpus, entries)
        for change in plan(view, gpus, entries, skip=enabled_first):   # the others, checked before any switch
            self._idle_or_raise(view.gpus[change.index])
        for i in enabled_first:
            self._idle_or_raise(view.gpus[i])
        switched: list[int] = []
        try:
            for i in enabled_first:
                self.backend.set_mig_mode(i, True)
                switched.append(i)
            read = MigView.read(self.backend)
            view = MigView({i: replace(g, enabled=False) if i in switched else g for i, g in read.gpus.items()})
            changes = plan(view, gpus, entries)
            why = check(outcome(view, gpus, changes)) if check is not None else None
            if why:
                raise LayoutError(why)
            for change in changes:
                if change.index not in switched:
                    self._idle_or_raise(view.gpus[change.index])
        except Exception as exc:
            undo = self._switch_back(switched)
            if isinstance(exc, LayoutError):
                raise type(exc)(f"{exc}{undo}") from None
            raise LayoutError(f"{_step_error(exc)}{undo}") from None
        for change in changes:
            foreign = [d.uuid for d in change.destroy if d.uuid not in self.record.owned(change.uuid)]
            if foreign:   # the layout names the GPU's whole configuration, as mig-parted's does
                log.info("GPU %d: the layout replaces %d instance(s) this agent did not make: %s",
                         change.index, len(foreign), ", ".join(foreign))
        done: list[tuple[GPUChange, list[MigDevice], list[MigDevice], bool]] = []
        for change in changes:
            destroyed: list[MigDevice] = []
            created: list[MigDevice] = []
            mode_set = False
            done.append((change, destroyed, created, mode_set))
            try:
                for dev in change.destroy:
                    self.backend.destroy_mig_device(change.index, dev.gpu_instance)
                    destroyed.append(dev)
                if change.set_mode:
                    if change.index not in switched:
                        self.backend.set_mig_mode(change.index, change.enable)
                    done[-1] = (change, destroyed, created, True)
                for profile, placement in change.create:
                    created.append(self.backend.create_mig_device(change.index, profile.id, placement))
            except Exception as exc:
                rollback = self._roll_back(done)
                restored = {c.index for c, _d, _c, mode_set in done if mode_set}
                rollback += self._switch_back([i for i in switched if i not in restored])
                raise LayoutError(f"GPU {change.index}: {_step_error(exc)}; {rollback}") from None
        self.record.config = name
        for change, _destroyed, created, _mode in done:
            self.record.replace(change.uuid, created)
        self.record.forget_missing(MigView.read(self.backend))
        self.record.save()
        return changes

    def _idle_or_raise(self, mig: MigGPU) -> None:
        why = self.in_use(mig)
        if why:
            raise BusyError(f"GPU {mig.index} ({mig.uuid}) is busy: {why}; the layout changes it, "
                            "so it is applied once the GPU is idle")

    def _switch_back(self, switched: Sequence[int]) -> str:
        """Turn MIG off again on the GPUs switched on to read their profiles; '' or what failed."""
        failures = []
        for i in reversed(switched):
            try:
                self.backend.set_mig_mode(i, False)
            except Exception as exc:
                failures.append(f"GPU {i}: MIG mode not turned off again: {_step_error(exc)}")
        if failures:
            log.error("MIG layout: %s", "; ".join(failures))
            return " (" + "; ".join(failures) + ")"
        return ""

    def in_use(self, mig: MigGPU) -> str | None:
        """Why this GPU is not idle: processes on it or its instances, or containers allocated on them."""
        for uuid in (mig.uuid, *(d.uuid for d in mig.devices)):
            try:
                procs = self.backend.processes(uuid)
            except Exception as exc:   # cannot tell: treat as busy rather than destroy someone's work
                return f"cannot list its processes ({exc})"
            if procs:
                return f"{len(procs)} process(es) run on {uuid} (pid {', '.join(str(p.pid) for p in procs[:5])})"
            why = self.busy(uuid)
            if why:
                return why
        return None

    def _roll_back(self, done: list[tuple[GPUChange, list[MigDevice], list[MigDevice], bool]]) -> str:
        """Undo the steps taken, newest first: destroy what was made, restore the mode, remake what went."""
        failures = []
        for change, destroyed, created, mode_set in reversed(done):
            steps: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = [
                (f"destroy {d.uuid}", self.backend.destroy_mig_device, (change.index, d.gpu_instance))
                for d in reversed(created)]
            if mode_set:
                steps.append(("restore MIG mode", self.backend.set_mig_mode, (change.index, not change.enable)))
            steps += [(f"remake {d.profile} at slice {d.placement.start}", self.backend.create_mig_device,
                       (change.index, d.profile_id, d.placement)) for d in destroyed]
            for what, call, args in steps:
                try:
                    call(*args)
                except Exception as exc:   # keep undoing the rest; say what could not be undone
                    failures.append(f"GPU {change.index}: {what}: {_step_error(exc)}")
        if failures:
            log.error("MIG layout rollback incomplete: %s", "; ".join(failures))
            return "rolled back, except: " + "; ".join(failures)
        return "every change was rolled back"


def _step_error(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
