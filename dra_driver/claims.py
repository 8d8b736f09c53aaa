"""What a ResourceClaim asks of this driver, read from its ``status.allocation``, and
the shares that follow from it (pure: no API calls, no files).

A claim's allocation lists devices of every driver; only ours count (a claim
for another driver's device has nothing for us to prepare). Each of our
devices is a GPU with what the kube-scheduler booked on it: ``consumedCapacity``
(``cores``, ``memory``) when the GPU is shared through consumable capacity,
nothing when it was allocated whole (no capacity request policy in play).

Opaque configuration (``gpu.vcuda.io/v1alpha1``, kind ``GpuShareConfig``) comes
from the DeviceClass and the claim; for each request the class's entries apply
first, then the claim's, field by field. Fields::

    coreLimit: 60        # elastic cap, percent: request <= coreLimit <= 100 (whole GPUs: 100 only)
    priority: normal     # normal | high (latency-sensitive: revokes normal tenants' leases; not on whole GPUs)
    preload: true        # false: no /etc/ld.so.preload (the container preloads libvcuda itself); on a
                         # share of a GPU only in a namespace the driver's --allow-opt-out-namespaces lists

A config that cannot be used fails its claim with an error naming the field.

Shares (`plan`): one per claim request. A request whose device is booked below
100 cores is a share of one GPU (a token-scheduler tenant); a request of whole
GPUs (100 cores each) runs unthrottled, as vgpu mode's multiples of 100 do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dra_driver.names import CONFIG_API_VERSION, CONFIG_KIND, CORES, DRIVER, MEMORY
from kube_contract.names import CORES_PER_GPU, MEMORY_UNIT_BYTES
from py_vcuda.nvml import GPUInfo
from py_vcuda.quantity import QuantityError, parse_quantity
from token_scheduler.policy import HIGH, PRIORITIES


class ClaimError(ValueError):
    """A claim this driver cannot prepare; the message names the claim's field and says what to fix."""


@dataclass(frozen=True)
class Consumer:
    """A pod the claim is reserved for (``status.reservedFor``)."""

    name: str
    uid: str


@dataclass(frozen=True)
class Result:
    """One of our devices in the claim's allocation."""

    request: str                # the claim's request ("gpu", or "gpu/sub" for a subrequest)
    pool: str
    device: str
    share_id: str | None        # set when the device is shared (consumable capacity)
    cores: int | None           # consumedCapacity; None: none reported (allocated whole)
    memory: int | None          # bytes


@dataclass(frozen=True)
class ShareConfig:
    core_limit: int | None = None
    priority: str = "normal"
    preload: bool = True


@dataclass(frozen=True)
class _Config:
    requests: tuple[str, ...]       # empty: every request
    fields: dict[str, Any]          # the fields it sets, validated

    def applies(self, request: str) -> bool:
        # A config naming a request applies to its subrequests ("gpu" covers "gpu/small").
        return not self.requests or request in self.requests or request.split("/", 1)[0] in self.requests


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str
    results: tuple[Result, ...]                     # ours only
    consumers: tuple[Consumer, ...] = ()
    configs: tuple[_Config, ...] = field(default=(), repr=False)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def config(self, request: str) -> ShareConfig:
        fields: dict[str, Any] = {}
        for c in self.configs:
            if c.applies(request):
                fields.update(c.fields)
        return ShareConfig(**fields)


@dataclass(frozen=True)
class Share:
    """What one claim request gets: the GPUs and the quota on them."""

    request: str
    results: tuple[Result, ...]
    gpus: tuple[str, ...]               # UUIDs
    core_request: int                   # percent of one GPU; 100 per whole GPU
    core_limit: int
    memory_limit: int | None            # bytes per GPU; None: unlimited
    preload: bool = True
    priority: str = "normal"

    @property
    def fractional(self) -> bool:
        return self.core_request < CORES_PER_GPU


# ---- parsing -----------------------------------------------------------------------------------

def _quantity(value: Any, what: str) -> int:
    try:
        return parse_quantity(str(value))
    except QuantityError as exc:
        raise ClaimError(f"{what}: {exc}") from None


def _consumed(consumed: Mapping[str, Any], name: str, where: str) -> int | None:
    """A consumed capacity by the name the slice gave it ("cores"), or qualified with our domain."""
    for key in (name, f"{DRIVER}/{name}"):
        if key in consumed:
            return _quantity(consumed[key], f"{where}.{key}")
    return None


def share_config_fields(params: Any, where: str) -> dict[str, Any]:
    """The fields a GpuShareConfig sets (ShareConfig names), validated; ClaimError names the bad one."""
    if not isinstance(params, Mapping):
        raise ClaimError(f"{where}: parameters must be an object ({CONFIG_KIND}), got {type(params).__name__}")
    if params.get("apiVersion") != CONFIG_API_VERSION or params.get("kind") != CONFIG_KIND:
        raise ClaimError(f"{where}: apiVersion/kind must be {CONFIG_API_VERSION}/{CONFIG_KIND}, got "
                         f"{params.get('apiVersion')!r}/{params.get('kind')!r}")
    out: dict[str, Any] = {}
    for key, value in params.items():
        path = f"{where}: {CONFIG_KIND}.{key}"
        if key in ("apiVersion", "kind"):
            continue
        if key == "coreLimit":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= CORES_PER_GPU:
                raise ClaimError(f"{path}: {value!r} is not a whole percentage 1-{CORES_PER_GPU}")
            out["core_limit"] = value
        elif key == "priority":
            if value not in PRIORITIES:
                raise ClaimError(f"{path}: {value!r} is not one of {', '.join(PRIORITIES)}")
            out["priority"] = value
        elif key == "preload":
            if not isinstance(value, bool):
                raise ClaimError(f"{path}: {value!r} is not true or false")
            out["preload"] = value
        else:
            raise ClaimError(f"{path}: unknown field (known: coreLimit, priority, preload)")
    return out


def _configs(entries: Any, ref: str, driver: str) -> tuple[_Config, ...]:
    out: list[tuple[int, int, _Config]] = []
    for i, entry in enumerate(entries or []):
        opaque = (entry or {}).get("opaque") or {}
        if opaque.get("driver") != driver:
            continue   # another driver's, or not opaque
        source = entry.get("source", "")
        where = f"ResourceClaim {ref}: status.allocation.devices.config[{i}] (from the " \
                f"{'class' if source == 'FromClass' else 'claim'})"
        fields = share_config_fields(opaque.get("parameters"), where)
        # The class's configs first, then the claim's: the claim overrides its class.
        out.append((0 if source == "FromClass" else 1, i, _Config(tuple(entry.get("requests") or ()), fields)))
    return tuple(c for _, _, c in sorted(out, key=lambda t: t[:2]))


def parse_claim(doc: Mapping[str, Any], driver: str = DRIVER) -> Claim:
    """Our part of a ResourceClaim (raw API JSON); ClaimError when it is not allocated or malformed."""
    meta = doc.get("metadata") or {}
    ref = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    allocation = (doc.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"ResourceClaim {ref} is not allocated (no status.allocation)")
    devices = allocation.get("devices") or {}
    results = []
    for i, r in enumerate(devices.get("results") or []):
        if r.get("driver") != driver:
            continue
        where = f"ResourceClaim {ref}: status.allocation.devices.results[{i}]"
        consumed = r.get("consumedCapacity") or {}
        cores, memory = (_consumed(consumed, name, f"{where}.consumedCapacity") for name in (CORES, MEMORY))
        if not r.get("pool") or not r.get("device") or not r.get("request"):
            raise ClaimError(f"{where}: request, pool and device must be set")
        results.append(Result(request=str(r["request"]), pool=str(r["pool"]), device=str(r["device"]),
                              share_id=r.get("shareID"), cores=cores, memory=memory))
    consumers = tuple(Consumer(str(c.get("name", "")), str(c.get("uid", "")))
                      for c in (doc.get("status") or {}).get("reservedFor") or []
                      if c.get("resource") == "pods" and not c.get("apiGroup"))
    return Claim(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
                 uid=str(meta.get("uid", "")), results=tuple(results), consumers=consumers,
                 configs=_configs(devices.get("config"), ref, driver))


# ---- shares ------------------------------------------------------------------------------------

def whole_memory(total: int) -> int:
    """The memory a claim books by default: the GPU's, down to a multiple of the request step."""
    return total // MEMORY_UNIT_BYTES * MEMORY_UNIT_BYTES


def _memory_limit(result: Result, gpu: GPUInfo) -> int | None:
    # Booking all of it (the default) is no limit, as for vgpu whole cards without memory units.
    if result.memory is None or result.memory >= whole_memory(gpu.memory_total):
        return None
    return result.memory


def plan(claim: Claim, gpu_of: Callable[[Result], GPUInfo | None]) -> list[Share]:
    """One Share per request of the claim with our devices; ClaimError says why the claim cannot run."""
    groups: dict[str, list[Result]] = {}
    for r in claim.results:
        groups.setdefault(r.request, []).append(r)
    shares = [_share(claim, request, results, gpu_of) for request, results in groups.items()]
    if len(shares) > 1 and any(s.fractional for s in shares):
        # A container using the whole claim would get two sets of VCUDA_* variables: neither would hold.
        raise ClaimError(f"ResourceClaim {claim.ref}: requests {', '.join(sorted(groups))} each get devices of "
                         f"{DRIVER}, and one is a share of a GPU; a container can be held to one share only: "
                         "put each share in its own claim")
    return shares


def _share(claim: Claim, request: str, results: list[Result], gpu_of: Callable[[Result], GPUInfo | None]) -> Share:
    where = f"ResourceClaim {claim.ref}, request {request!r}"
    gpus = []
    for r in results:
        gpu = gpu_of(r)
        if gpu is None:
            raise ClaimError(f"{where}: device {r.pool}/{r.device} is not a GPU of this node (was the node's "
                             "ResourceSlice replaced since the claim was allocated?)")
        gpus.append(gpu)
    cores = [CORES_PER_GPU if r.cores is None else r.cores for r in results]
    if min(cores) < CORES_PER_GPU and any(r.memory is None for r in results):
        # Our slices give memory a default, so a share always books some: a share without it is
        # not ours to guess, and must not run with no memory quota at all (fail closed).
        raise ClaimError(f"{where}: a share of {min(cores)} cores records no consumed memory capacity; "
                         "a share of a GPU must book memory (the device's `memory` capacity)")
    config = claim.config(request)
    limits = {_memory_limit(r, g) for r, g in zip(results, gpus, strict=True)}
    if len(limits) > 1:
        raise ClaimError(f"{where}: its GPUs got different amounts of memory; ask for the same on each")
    share = Share(request=request, results=tuple(results), gpus=tuple(g.uuid for g in gpus),
                  core_request=min(cores), core_limit=min(cores), memory_limit=limits.pop(),
                  preload=config.preload, priority=config.priority)
    if share.fractional and len(results) > 1:
        raise ClaimError(f"{where}: {len(results)} devices with {min(cores)} cores of each; a share of a GPU "
                         f"is one GPU (ask for one device, or {CORES_PER_GPU} cores of each)")
    if not 1 <= share.core_request <= CORES_PER_GPU:
        raise ClaimError(f"{where}: consumed {share.core_request} cores; a GPU has {CORES_PER_GPU}")
    if share.priority == HIGH and not share.fractional:
        raise ClaimError(f"{where}: {CONFIG_KIND}.priority 'high' cannot apply to whole GPUs, which share with "
                         f"nobody; remove it, or ask for fewer than {CORES_PER_GPU} cores to share a GPU")
    limit = config.core_limit
    if limit is None:
        return share
    field_name = f"{CONFIG_KIND}.coreLimit"
    if not share.fractional and limit != CORES_PER_GPU:
        raise ClaimError(f"{where}: {field_name} {limit} cannot apply to whole GPUs, which run unthrottled; "
                         f"remove it, or ask for fewer than {CORES_PER_GPU} cores to share a GPU")
    if limit < share.core_request:
        raise ClaimError(f"{where}: {field_name} {limit} is below the core request ({share.core_request}); "
                         f"it must be between the request and {CORES_PER_GPU}")
    return replace(share, core_limit=limit)
