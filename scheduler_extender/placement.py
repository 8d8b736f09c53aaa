"""The placement core: which GPU(s) of a node a pod's containers get, and how good that is.

Pure: no I/O, no clock, no locks. ``place`` reads a node's GPU usage and returns
a ``Placement`` (with a score in [0, 1]) or an ``Unfit`` whose reason names the
node, the GPU and the constraint. The caller (``state``) owns usage and locking.

Rules, in the order they are checked for each GPU:

1. model: ``include`` (the model must contain one of the words) / ``exclude``
   (it must contain none), case-insensitive substrings.
2. tags (Gemini's placement labels): *affinity* T shares a GPU only with pods
   tagged T (and an untagged pod never joins a T group); *anti-affinity* A never
   shares with another pod tagged A; *exclusion*: a GPU carries at most one
   exclusion tag (untagged pods may join).
3. capacity: a fractional container (cores 1..99) needs free cores and free
   memory on one GPU; a multiple of 100 takes that many completely free cards,
   NVLink-best set first.

Policies: ``binpack`` puts a fractional container on an already-used GPU whenever
one fits (tightest fit first) and scores nodes so that placements opening no new
GPU always beat those that do; ``spread`` takes the least-loaded GPU and prefers
emptier nodes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from kube_contract.assignment import Assignment, ContainerAssignment, GPUShare
from kube_contract.names import CORES_PER_GPU
from kube_contract.topology import NodeTopology

MAX_COMBINATIONS = 5000  # above this, multi-card choice is greedy instead of exhaustive


class Policy(StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"


@dataclass(frozen=True)
class Tags:
    affinity: str | None = None
    anti_affinity: str | None = None
    exclusion: str | None = None

    def __bool__(self) -> bool:
        return bool(self.affinity or self.anti_affinity or self.exclusion)


@dataclass(frozen=True)
class ContainerRequest:
    name: str
    cores: int  # percent of one GPU, or a multiple of 100 for whole cards
    memory: int  # bytes

    @property
    def whole_cards(self) -> int:
        return self.cores // CORES_PER_GPU if self.cores >= CORES_PER_GPU else 0


@dataclass(frozen=True)
class PodRequest:
    containers: tuple[ContainerRequest, ...]
    policy: Policy = Policy.BINPACK
    model_include: tuple[str, ...] = ()
    model_exclude: tuple[str, ...] = ()
    tags: Tags = field(default_factory=Tags)
    # App containers that run on the devices of the init container in containers[0]: kubelet hands
    # an init container's devices on to the app containers after it, so they go on its GPU and add
    # nothing to what the pod holds there (podspec.parse_pod, held_per_gpu).
    riders: tuple[ContainerRequest, ...] = ()
    lead_memory: int = 0    # with riders: the init container's own memory (containers[0] reserves the max)


class GPU:
    """One GPU's capacity and current usage (mutated only by ``state`` under its lock)."""

    __slots__ = ("index", "uuid", "model", "memory", "used_cores", "used_memory", "tenants",
                 "affinity", "anti_affinity", "exclusion", "owners")

    def __init__(self, index: int, uuid: str, model: str, memory: int) -> None:
        self.index = index
        self.uuid = uuid
        self.model = model
        self.memory = memory
        self.used_cores = 0
        self.used_memory = 0
        self.tenants = 0  # pods holding a share
        # tag -> number of tenant pods carrying it
        self.affinity: dict[str, int] = {}
        self.anti_affinity: dict[str, int] = {}
        self.exclusion: dict[str, int] = {}
        self.owners: list[NodeGPUs] = []  # nodes whose GPU order ``add`` keeps current

    @property
    def free_cores(self) -> int:
        return CORES_PER_GPU - self.used_cores

    @property
    def free_memory(self) -> int:
        return self.memory - self.used_memory

    def add(self, cores: int, memory: int, tags: Tags, sign: int = 1) -> None:
        """Account one pod's share (sign=-1 takes it back)."""
        self.used_cores += sign * cores
        self.used_memory += sign * memory
        self.tenants += sign
        for counter, tag in ((self.affinity, tags.affinity),
                             (self.anti_affinity, tags.anti_affinity),
                             (self.exclusion, tags.exclusion)):
            if tag:
                n = counter.get(tag, 0) + sign
                if n:
                    counter[tag] = n
                else:
                    del counter[tag]
        for node in self.owners:
            node.refresh()

    def describe(self) -> str:
        return (f"GPU{self.index} ({self.model}, {fmt_bytes(self.memory)}): "
                f"{self.used_cores}/{CORES_PER_GPU} cores, "
                f"{fmt_bytes(self.used_memory)} memory used")


class NodeGPUs:
    """A node's GPUs and NVLink map.

    ``orders`` holds what the one-fractional-container fast path needs and no
    request changes: the GPUs in binpack and in spread preference order, and the
    node's used cores. ``GPU.add`` refreshes it on every usage change (a sort of
    the node's few GPUs), so a request re-derives nothing for the nodes it reads.
    """

    __slots__ = ("name", "gpus", "nvlink", "by_uuid", "orders")

    def __init__(self, name: str, gpus: Sequence[GPU],
                 nvlink: dict[tuple[int, int], int] | None = None) -> None:
        self.name = name
        self.gpus = list(gpus)
        self.nvlink = dict(nvlink or {})
        self.by_uuid = {g.uuid: g for g in self.gpus}
        for g in self.gpus:
            g.owners.append(self)
        self.orders: tuple[list[GPU] | None, list[GPU], int] = self._orders()

    @classmethod
    def from_topology(cls, name: str, topo: NodeTopology) -> NodeGPUs:
        gpus = [GPU(g.index, g.uuid, g.model, g.memory) for g in topo.gpus]
        return cls(name, gpus, topo.nvlink)

    def refresh(self) -> None:
        """Recompute ``orders`` after a GPU's usage changed."""
        self.orders = self._orders()

    def _orders(self) -> tuple[list[GPU] | None, list[GPU], int]:
        """(binpack order or None, spread order, used cores).

        Binpack prefers used GPUs, then the fewest free cores, then the least free
        memory relative to the card's size, then the index. Subtracting the request
        keeps that order only if all cards have the same memory, so a node with mixed
        cards gets None and the fast path scans all of its GPUs instead. Spread's key
        (used cores, used memory fraction, index) never depends on the request.
        """
        gpus = self.gpus
        binpack = None
        if all(g.memory == gpus[0].memory for g in gpus):
            binpack = sorted(gpus, key=lambda g: (0 if g.tenants else 1, -g.used_cores,
                                                  -g.used_memory, g.index))
        spread = sorted(gpus, key=lambda g: (g.used_cores, g.used_memory / g.memory, g.index))
        return binpack, spread, sum(g.used_cores for g in gpus)

    def links(self, a: int, b: int) -> int:
        return self.nvlink.get((a, b) if a < b else (b, a), 0)

    def gpus_by_index(self, index: int) -> GPU:
        return next(g for g in self.gpus if g.index == index)


@dataclass(slots=True)  # not frozen: built per node per pod, init cost matters
class Share:
    index: int
    uuid: str
    cores: int
    memory: int


K = TypeVar("K")  # how a GPU is named: index on a node, or UUID in an assignment


def held_per_gpu(shares: Iterable[tuple[bool, K, int, int]]) -> dict[K, tuple[int, int]]:
    """Cores and memory a pod holds per GPU from (is init container, GPU, cores, memory) shares.

    kube-scheduler's rule, per GPU: init containers run one at a time before the app containers,
    which reuse their devices, so a pod holds max(largest init container, sum of app containers).
    """
    init: dict[K, tuple[int, int]] = {}
    apps: dict[K, tuple[int, int]] = {}
    for is_init, gpu, cores, memory in shares:
        c, m = (init if is_init else apps).get(gpu, (0, 0))
        if is_init:
            init[gpu] = (max(c, cores), max(m, memory))
        else:
            apps[gpu] = (c + cores, m + memory)
    return {g: (max(init.get(g, (0, 0))[0], apps.get(g, (0, 0))[0]),
                max(init.get(g, (0, 0))[1], apps.get(g, (0, 0))[1])) for g in {**init, **apps}}


@dataclass(slots=True)  # not frozen: built per node per pod, init cost matters
class Placement:
    node: str
    containers: tuple[tuple[str, tuple[Share, ...]], ...]
    score: float  # 0..1, higher is better under the pod's policy
    opened: int  # GPUs without tenants that now get a fractional share
    init: frozenset[str] = frozenset()  # which of containers are init containers

    def to_assignment(self) -> Assignment:
        return Assignment(
            node=self.node,
            containers=tuple(
                ContainerAssignment(name, tuple(GPUShare(s.uuid, s.cores, s.memory)
                                                for s in shares))
                for name, shares in self.containers
            ),
        )

    def gpu_totals(self) -> dict[int, tuple[int, int]]:
        """Cores and memory per GPU index this pod takes (containers may share a GPU)."""
        return held_per_gpu((name in self.init, s.index, s.cores, s.memory)
                            for name, shares in self.containers for s in shares)


@dataclass(slots=True)  # not frozen: built per node per pod, init cost matters
class Unfit:
    node: str
    reason: str
    unresolvable: bool  # True when evicting pods could not help (preemption is pointless)


def fmt_bytes(n: int) -> str:
    for unit, size in (("Gi", 1 << 30), ("Mi", 1 << 20)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f}Gi"
    return f"{n}B" if n < 1 << 20 else f"{n / (1 << 20):.1f}Mi"


def model_reason(model: str, pod: PodRequest) -> str | None:
    """Why a GPU model is ruled out by the pod's include/exclude lists, or None."""
    low = model.lower()
    if pod.model_include and not any(w.lower() in low for w in pod.model_include):
        return f"model {model!r} not in include list {','.join(pod.model_include)!r}"
    for w in pod.model_exclude:
        if w.lower() in low:
            return f"model {model!r} matches exclude entry {w!r}"
    return None


def tag_conflict(gpu: GPU, tags: Tags) -> str | None:
    """Why the pod's placement tags forbid sharing this GPU, or None."""
    if tags.affinity:
        if gpu.affinity.get(tags.affinity, 0) != gpu.tenants:
            return f"affinity '{tags.affinity}': GPU is shared with pods outside the group"
    elif gpu.affinity:
        return f"affinity: GPU is reserved for group '{next(iter(gpu.affinity))}'"
    if tags.anti_affinity and gpu.anti_affinity.get(tags.anti_affinity):
        return f"anti-affinity '{tags.anti_affinity}': GPU already runs a pod with that tag"
    if tags.exclusion:
        other = next((t for t in gpu.exclusion if t != tags.exclusion), None)
        if other is not None:
            return f"exclusion '{tags.exclusion}': GPU carries exclusion tag '{other}'"
    return None  # untagged pods may join an exclusion-tagged GPU


Overlay = dict[int, list[int]]  # GPU index -> [cores, memory] this pod already takes


def place(node: NodeGPUs, pod: PodRequest) -> Placement | Unfit:
    """Place every container of ``pod`` on ``node`` or say why it cannot be."""
    return placer(pod)(node)


def placer(pod: PodRequest) -> Callable[[NodeGPUs], Placement | Unfit]:
    """``place`` for one pod, with the per-pod checks done once (for many nodes)."""
    if pod.riders:
        lead = _placer(pod)
        return lambda node: _with_riders(lead(node), pod)
    return _placer(pod)


def _with_riders(result: Placement | Unfit, pod: PodRequest) -> Placement | Unfit:
    """The init container's placement, with the app containers that reuse its devices on its GPU."""
    if isinstance(result, Unfit):
        return result
    (name, (share,)), = result.containers
    riders = tuple((r.name, (Share(share.index, share.uuid, r.cores, r.memory),)) for r in pod.riders)
    lead = (name, (Share(share.index, share.uuid, share.cores, pod.lead_memory),))
    return Placement(result.node, (lead, *riders), result.score, result.opened, frozenset({name}))


def _placer(pod: PodRequest) -> Callable[[NodeGPUs], Placement | Unfit]:
    if not pod.containers:
        return lambda node: Placement(node.name, (), 0.5, 0)
    if (len(pod.containers) == 1 and not pod.containers[0].whole_cards
            and not pod.model_include and not pod.model_exclude):
        return _single_placer(pod, pod.containers[0])
    return lambda node: _place_general(node, pod)


def _place_general(node: NodeGPUs, pod: PodRequest) -> Placement | Unfit:
    eligible: list[GPU] = []
    excluded: list[str] = []
    for g in node.gpus:
        why = model_reason(g.model, pod) if (pod.model_include or pod.model_exclude) else None
        if why is None:
            eligible.append(g)
        else:
            excluded.append(f"GPU{g.index}: {why}")
    if not eligible:
        reason = ("node has no vcuda GPU" if not node.gpus
                  else "no GPU passes the model filter: " + "; ".join(excluded))
        return Unfit(node.name, f"node {node.name}: {reason}", True)

    overlay: Overlay = {}
    chosen: dict[int, tuple[Share, ...]] = {}
    link_quality: list[float] = []
    opened = 0
    # Whole cards first (they need empty GPUs), then the largest fractions.
    order = sorted(range(len(pod.containers)),
                   key=lambda i: (-pod.containers[i].whole_cards, -pod.containers[i].cores,
                                  -pod.containers[i].memory))
    for i in order:
        c = pod.containers[i]
        if c.whole_cards:
            result = _place_whole(node, eligible, c, pod, overlay)
        else:
            result = _place_fraction(eligible, c, pod, overlay)
        if isinstance(result, Unfit):
            suffix = f" ({'; '.join(excluded)})" if excluded else ""
            return Unfit(node.name, f"node {node.name}: container {c.name!r}: "
                         f"{result.reason}{suffix}", result.unresolvable)
        shares, quality = result
        if quality is not None:
            link_quality.append(quality)
        for s in shares:
            g = _gpu(eligible, s.index)
            if not c.whole_cards and g.tenants == 0 and s.index not in overlay:
                opened += 1
            ov = overlay.setdefault(s.index, [0, 0])
            ov[0] += s.cores
            ov[1] += s.memory
        chosen[i] = shares
    score = _score(node, pod.policy, overlay, opened, link_quality)
    containers = tuple((pod.containers[i].name, chosen[i]) for i in range(len(pod.containers)))
    return Placement(node.name, containers, score, opened)


def _single_placer(pod: PodRequest, c: ContainerRequest) -> Callable[[NodeGPUs], Placement | Unfit]:
    """Fast path for the common pod: one fractional container, no model filter.

    Same choice and score as the general path. The GPUs are walked in the node's
    preference order (``NodeGPUs.orders``), so the first one that fits is
    the choice and usually only a card or two is looked at; nodes with mixed card
    sizes under binpack are scanned in full. When nothing fits, the general path
    explains why.
    """
    cores, memory, tags, name = c.cores, c.memory, pod.tags, c.name
    has_tags = bool(tags)
    binpack = pod.policy is Policy.BINPACK

    def run(node: NodeGPUs) -> Placement | Unfit:
        binpack_order, spread_order, used_total = node.orders
        chosen: GPU | None = None
        order = binpack_order if binpack else spread_order
        if order is not None:
            for g in order:
                if (CORES_PER_GPU - g.used_cores >= cores and g.memory - g.used_memory >= memory
                        and not ((has_tags or g.affinity) and tag_conflict(g, tags) is not None)):
                    chosen = g
                    break
        else:  # binpack on a node with mixed card sizes: the key depends on the request
            best_key: tuple[float, ...] = ()
            for g in node.gpus:
                free_c = CORES_PER_GPU - g.used_cores
                free_m = g.memory - g.used_memory
                if free_c < cores or free_m < memory:
                    continue
                if (has_tags or g.affinity) and tag_conflict(g, tags) is not None:
                    continue
                key = (0 if g.tenants else 1, free_c - cores, (free_m - memory) / g.memory, g.index)
                if chosen is None or key < best_key:
                    chosen, best_key = g, key
        if chosen is None:
            return _place_general(node, pod)
        # _policy_score with one touched GPU, spelled out (same arithmetic; the
        # conditional expressions are max() and min() without the calls)
        util = (chosen.used_cores + cores) / CORES_PER_GPU
        util_m = (chosen.used_memory + memory) / chosen.memory
        if util_m > util:
            util = util_m
        if util > 1.0:
            util = 1.0
        node_util = (used_total + cores) / (CORES_PER_GPU * len(node.gpus))
        if node_util > 1.0:
            node_util = 1.0
        opened = 0 if chosen.tenants else 1
        if binpack:
            score = 0.5 * (opened == 0) + 0.3 * util + 0.19 * node_util
        else:
            score = 0.6 * (1.0 - util) + 0.39 * (1.0 - node_util)
        share = Share(chosen.index, chosen.uuid, cores, memory)
        return Placement(node.name, ((name, (share,)),), score, opened)

    return run


def _gpu(gpus: Sequence[GPU], index: int) -> GPU:
    return next(g for g in gpus if g.index == index)


def _place_fraction(eligible: Sequence[GPU], c: ContainerRequest, pod: PodRequest,
                    overlay: Overlay) -> tuple[tuple[Share, ...], None] | Unfit:
    cores, memory, tags = c.cores, c.memory, pod.tags
    binpack = pod.policy is Policy.BINPACK
    best: GPU | None = None
    best_key: tuple[float, ...] = ()
    for g in eligible:
        ov = overlay.get(g.index)
        used_c = g.used_cores + (ov[0] if ov else 0)
        used_m = g.used_memory + (ov[1] if ov else 0)
        free_c = CORES_PER_GPU - used_c
        free_m = g.memory - used_m
        if free_c < cores or free_m < memory:
            continue
        if (tags or g.affinity) and tag_conflict(g, tags) is not None:
            continue
        if binpack:
            # Used GPUs first, then the tightest fit (fewest cores, then memory left).
            key: tuple[float, ...] = (0 if (g.tenants or ov) else 1, free_c - cores,
                                      (free_m - memory) / g.memory, g.index)
        else:
            key = (used_c, used_m / g.memory, g.index)
        if best is None or key < best_key:
            best, best_key = g, key
    if best is not None:
        return (Share(best.index, best.uuid, cores, memory),), None
    return _fraction_reason(eligible, c, pod, overlay)


def _fraction_reason(eligible: Sequence[GPU], c: ContainerRequest, pod: PodRequest,
                     overlay: Overlay) -> Unfit:
    """Slow path: say, GPU by GPU, why the container does not fit."""
    parts = []
    could_ever = False
    for g in eligible:
        ov = overlay.get(g.index) or [0, 0]
        free_c = CORES_PER_GPU - g.used_cores - ov[0]
        free_m = g.memory - g.used_memory - ov[1]
        if g.memory < c.memory:
            parts.append(f"GPU{g.index} ({g.model}) has only {fmt_bytes(g.memory)} in total")
            continue
        could_ever = True
        conflict = tag_conflict(g, pod.tags)
        if conflict:
            parts.append(f"GPU{g.index}: {conflict}")
        elif free_c < c.cores:
            parts.append(f"GPU{g.index}: {free_c} cores free")
        else:
            parts.append(f"GPU{g.index}: {fmt_bytes(free_m)} memory free")
    want = f"{c.cores} cores and {fmt_bytes(c.memory)} on one GPU"
    return Unfit("", f"needs {want}; " + "; ".join(parts), not could_ever)


def _place_whole(node: NodeGPUs, eligible: Sequence[GPU], c: ContainerRequest,
                 pod: PodRequest, overlay: Overlay,
                 ) -> tuple[tuple[Share, ...], float | None] | Unfit:
    k = c.whole_cards
    per_card = math.ceil(c.memory / k)
    big_enough = [g for g in eligible if g.memory >= per_card]
    free = [g for g in big_enough
            if g.tenants == 0 and g.used_cores == 0 and g.used_memory == 0
            and g.index not in overlay]
    if len(free) < k:
        busy = [g.describe() for g in big_enough if g not in free]
        small = [f"GPU{g.index} has only {fmt_bytes(g.memory)}"
                 for g in eligible if g.memory < per_card]
        detail = "; ".join(busy + small)
        return Unfit("", f"needs {k} whole GPU(s) with {fmt_bytes(per_card)} each, "
                     f"{len(free)} free" + (f"; {detail}" if detail else ""),
                     len(big_enough) < k)
    if k == 1:
        # Keep well-connected and large cards for bigger requests.
        pick = min(free, key=lambda g: (g.memory, _degree(node, g, free), g.index))
        chosen: Sequence[GPU] = (pick,)
        quality = None
    else:
        chosen, quality = _best_set(node, free, k)
    shares = tuple(Share(g.index, g.uuid, CORES_PER_GPU, g.memory) for g in chosen)
    return shares, quality


def _degree(node: NodeGPUs, g: GPU, others: Iterable[GPU]) -> int:
    return sum(1 for o in others if o is not g and node.links(g.index, o.index))


def _set_key(node: NodeGPUs, gpus: Sequence[GPU]) -> tuple[int, int]:
    connected = links = 0
    for a, b in itertools.combinations(gpus, 2):
        n = node.links(a.index, b.index)
        links += n
        connected += n > 0
    return connected, links


def _best_set(node: NodeGPUs, free: Sequence[GPU], k: int) -> tuple[Sequence[GPU], float]:
    """The k free cards with the most NVLink-connected pairs (then links, then smallest)."""
    pairs = k * (k - 1) // 2
    if math.comb(len(free), k) <= MAX_COMBINATIONS:
        best = max(itertools.combinations(free, k),
                   key=lambda s: (*_set_key(node, s), -sum(g.memory for g in s),
                                  [-g.index for g in s]))
    else:
        # Greedy: grow from each start card by the card with most links into the set.
        candidates = []
        for start in free:
            group = [start]
            while len(group) < k:
                rest = [g for g in free if g not in group]
                group.append(max(rest, key=lambda g: (
                    sum(node.links(g.index, m.index) > 0 for m in group),
                    sum(node.links(g.index, m.index) for m in group), -g.index)))
            candidates.append(group)
        best = max(candidates, key=lambda s: _set_key(node, s))
    return list(best), _set_key(node, best)[0] / pairs


def _score(node: NodeGPUs, policy: Policy, overlay: Overlay, opened: int,
           link_quality: list[float]) -> float:
    if not node.gpus:
        return 0.0
    touched = []
    for g in node.gpus:
        ov = overlay.get(g.index)
        if ov:
            touched.append(max((g.used_cores + ov[0]) / CORES_PER_GPU,
                               (g.used_memory + ov[1]) / g.memory))
    added = sum(ov[0] for ov in overlay.values())
    node_util = (sum(g.used_cores for g in node.gpus) + added) / (CORES_PER_GPU * len(node.gpus))
    score = _policy_score(policy, opened, touched, node_util)
    if link_quality:
        score = 0.5 * score + 0.5 * (sum(link_quality) / len(link_quality))
    return score


def _policy_score(policy: Policy, opened: int, touched: list[float], node_util: float) -> float:
    """``touched``: utilisation after placement of each GPU the pod lands on."""
    if policy is Policy.BINPACK:
        mean = sum(touched) / len(touched) if touched else 0.0
        # Opening no GPU outranks everything else: 0.5 step vs at most 0.49 of fullness.
        return 0.5 * (opened == 0) + 0.3 * min(mean, 1.0) + 0.19 * min(node_util, 1.0)
    fullest = max(touched) if touched else 0.0
    return 0.6 * (1.0 - min(fullest, 1.0)) + 0.39 * (1.0 - min(node_util, 1.0))


def best(results: Iterable[Placement | Unfit]) -> Placement | None:
    """What kube-scheduler would pick on our score alone: highest score, then node name."""
    top: Placement | None = None
    for r in results:
        if isinstance(r, Placement) and (top is None or r.score > top.score
                                         or (r.score == top.score and r.node < top.node)):
            top = r
    return top


def to_priority(score: float, max_priority: int = 10) -> int:
    """Map a [0, 1] score to kube-scheduler's 0..MaxExtenderPriority."""
    return max(0, min(max_priority, round(score * max_priority)))
