"""The pure placement core, case by case."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kube_contract.names import MEMORY_UNIT_BYTES as U
from kube_contract.testing import A100, T4, V100, topology
from scheduler_extender.placement import (
    ContainerRequest,
    NodeGPUs,
    Placement,
    PodRequest,
    Policy,
    Tags,
    Unfit,
    best,
    fmt_bytes,
    place,
    to_priority,
)

GiB = 1 << 30
NO_TAGS = Tags()


def node(gpus: list[tuple[str, int]] | int = 4, name: str = "n1", nvlink: object = "none",
         used: dict[int, tuple[int, int]] | None = None,
         tags: dict[int, Tags] | None = None) -> NodeGPUs:
    """A node with ``used[i] = (cores, bytes)`` already held on GPU i by one pod."""
    n = NodeGPUs.from_topology(name, topology(name, gpus, nvlink=nvlink))  # type: ignore[arg-type]
    for i, (cores, mem) in (used or {}).items():
        n.gpus[i].add(cores, mem, (tags or {}).get(i, Tags()))
    for i, t in (tags or {}).items():
        if i not in (used or {}):
            n.gpus[i].add(1, 0, t)
    return n


def pod(*containers: tuple[int, int], policy: Policy = Policy.BINPACK, tags: Tags = NO_TAGS,
        include: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> PodRequest:
    return PodRequest(tuple(ContainerRequest(f"c{i}", c, m) for i, (c, m) in
                            enumerate(containers)), policy, include, exclude, tags)


def gpus_of(result: Placement | Unfit) -> list[list[int]]:
    assert isinstance(result, Placement), getattr(result, "reason", result)
    return [[s.index for s in shares] for _, shares in result.containers]


@dataclass
class Case:
    desc: str
    node: NodeGPUs
    pod: PodRequest
    gpus: list[list[int]] | None = None  # expected GPU indices per container
    reason: list[str] = field(default_factory=list)  # expected substrings when unfit
    unresolvable: bool = False


CASES = [
    Case("fraction on empty node takes the lowest GPU", node(), pod((30, 4 * GiB)), [[0]]),
    Case("binpack joins the used GPU", node(used={2: (50, GiB)}), pod((30, GiB)), [[2]]),
    Case("binpack tightest fit among used GPUs",
         node(used={0: (20, 0), 1: (60, 0), 2: (90, 0)}), pod((30, 0)), [[1]]),
    Case("binpack skips a used GPU without enough memory",
         node(used={0: (10, 79 * GiB)}), pod((10, 2 * GiB)), [[1]]),
    Case("spread takes the least loaded GPU",
         node(used={0: (20, 0), 1: (10, 0), 2: (30, 0), 3: (40, 0)}),
         pod((30, 0), policy=Policy.SPREAD), [[1]]),
    Case("spread uses memory share as tie breaker",
         node(used={0: (10, 40 * GiB), 1: (10, 4 * GiB), 2: (50, 0), 3: (50, 0)}),
         pod((10, 0), policy=Policy.SPREAD), [[1]]),
    Case("100 cores is one whole free card",
         node(used={0: (10, 0)}), pod((100, 0)), [[1]]),
    Case("whole card prefers the smallest card that fits",
         node([A100, T4, V100]), pod((100, 10 * GiB)), [[1]]),
    Case("whole card memory above the card", node([T4, T4]), pod((100, 20 * GiB)),
         reason=["needs 1 whole GPU(s) with 20Gi each", "GPU0 has only 16Gi"],
         unresolvable=True),
    Case("two cards pick an NVLink pair",
         node(4, nvlink=[(1, 2, 12), (0, 3, 4)]), pod((200, 0)), [[1, 2]]),
    Case("two cards: nvlinked pair among busy GPUs",
         node(4, nvlink="pairs", used={0: (10, 0)}), pod((200, 0)), [[2, 3]]),
    Case("four of eight cards: fully connected quad",
         node(8, nvlink=[(a, b, 1) for a in range(4, 8) for b in range(a + 1, 8)]),
         pod((400, 0)), [[4, 5, 6, 7]]),
    Case("not enough free cards", node(2, used={0: (5, 0)}), pod((200, 0)),
         reason=["needs 2 whole GPU(s)", "1 free", "GPU0 (NVIDIA A100-SXM4-80GB, 80Gi): 5/100"]),
    Case("fraction does not fit: reasons per GPU",
         node(2, used={0: (80, 0), 1: (10, 79 * GiB)}), pod((30, 2 * GiB)),
         reason=["node n1: container 'c0'", "needs 30 cores and 2Gi on one GPU",
                 "GPU0: 20 cores free", "GPU1: 1Gi memory free"]),
    Case("fraction larger than every card", node([T4]), pod((10, 20 * GiB)),
         reason=["GPU0 (Tesla T4) has only 16Gi in total"], unresolvable=True),
    Case("heterogeneous: memory-heavy fraction lands on the big card",
         node([T4, A100]), pod((10, 40 * GiB)), [[1]]),
    Case("model include", node([T4, A100]), pod((10, 0), include=("a100",)), [[1]]),
    Case("model exclude", node([A100, T4]), pod((10, 0), exclude=("A100",)), [[1]]),
    Case("model filter leaves nothing", node([T4]), pod((10, 0), include=("H100",)),
         reason=["no GPU passes the model filter", "not in include list 'H100'"],
         unresolvable=True),
    Case("affinity joins its group", node(used={0: (10, 0), 1: (10, 0)},
                                          tags={1: Tags(affinity="g")}),
         pod((10, 0), tags=Tags(affinity="g")), [[1]]),
    Case("affinity avoids GPUs shared with others",
         node(2, used={0: (10, 0)}), pod((10, 0), tags=Tags(affinity="g")), [[1]]),
    Case("untagged pod avoids an affinity group", node(2, used={0: (10, 0)},
                                                       tags={0: Tags(affinity="g")}),
         pod((10, 0)), [[1]]),
    Case("anti-affinity avoids the tag", node(2, used={0: (10, 0)},
                                              tags={0: Tags(anti_affinity="db")}),
         pod((10, 0), tags=Tags(anti_affinity="db")), [[1]]),
    Case("anti-affinity with other tag may share", node(2, used={0: (10, 0)},
                                                        tags={0: Tags(anti_affinity="web")}),
         pod((10, 0), tags=Tags(anti_affinity="db")), [[0]]),
    Case("exclusion: one tag per GPU", node(2, used={0: (10, 0)},
                                            tags={0: Tags(exclusion="a")}),
         pod((10, 0), tags=Tags(exclusion="b")), [[1]]),
    Case("exclusion: same tag shares", node(2, used={0: (10, 0)}, tags={0: Tags(exclusion="a")}),
         pod((10, 0), tags=Tags(exclusion="a")), [[0]]),
    Case("exclusion: untagged pods may join", node(2, used={0: (10, 0)},
                                                   tags={0: Tags(exclusion="a")}),
         pod((10, 0)), [[0]]),
    Case("constraint named in the reason", node(1, used={0: (10, 0)},
                                                tags={0: Tags(anti_affinity="db")}),
         pod((10, 0), tags=Tags(anti_affinity="db")),
         reason=["GPU0: anti-affinity 'db': GPU already runs a pod with that tag"]),
    Case("two fractions of one pod may share a GPU", node(1), pod((40, 0), (50, 0)), [[0], [0]]),
    Case("whole card placed before fractions", node(2, used={0: (10, 0)}),
         pod((20, 0), (100, 0)), [[0], [1]]),
    Case("second container does not fit after the first", node(1), pod((60, 0), (60, 0)),
         reason=["container 'c1'", "40 cores free"]),
    Case("no GPUs at all", NodeGPUs("n1", []), pod((10, 0)), reason=["node has no vcuda GPU"],
         unresolvable=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.desc for c in CASES])
def test_place(case: Case) -> None:
    result = place(case.node, case.pod)
    if case.gpus is not None:
        assert gpus_of(result) == case.gpus
        assert 0.0 <= result.score <= 1.0  # type: ignore[union-attr]
    else:
        assert isinstance(result, Unfit), result
        for part in case.reason:
            assert part in result.reason, (part, result.reason)
        assert result.unresolvable == case.unresolvable


def test_place_does_not_mutate_usage() -> None:
    n = node(used={1: (30, GiB)})
    before = [(g.used_cores, g.used_memory, g.tenants) for g in n.gpus]
    place(n, pod((50, GiB), (100, 0)))
    assert [(g.used_cores, g.used_memory, g.tenants) for g in n.gpus] == before


def test_assignment_from_placement() -> None:
    result = place(node([T4, A100]), pod((100, 0), (25, GiB)))
    assert isinstance(result, Placement)
    a = result.to_assignment()
    assert a.node == "n1"
    assert a.containers[0].gpus[0].uuid == "GPU-n1-0" and a.containers[0].gpus[0].cores == 100
    assert a.containers[0].gpus[0].memory == 16 * GiB  # whole card: all of its memory
    assert a.containers[1].gpus[0].uuid == "GPU-n1-1" and a.containers[1].gpus[0].memory == GiB


def test_binpack_score_prefers_no_new_gpu_over_fuller_new_gpu() -> None:
    shared = place(node(2, "a", used={0: (10, 0)}), pod((80, 0)))
    opened = place(node(2, "b", used={0: (90, 0)}), pod((80, 0)))
    assert isinstance(shared, Placement) and isinstance(opened, Placement)
    assert shared.opened == 0 and opened.opened == 1
    assert shared.score > opened.score
    assert best([opened, shared]) == shared


def test_spread_score_prefers_emptier_node() -> None:
    busy = place(node(2, "a", used={0: (50, 0), 1: (50, 0)}), pod((10, 0), policy=Policy.SPREAD))
    idle = place(node(2, "b"), pod((10, 0), policy=Policy.SPREAD))
    assert idle.score > busy.score  # type: ignore[union-attr]


def test_nvlink_score_prefers_connected_node() -> None:
    linked = place(node(2, "a", nvlink="all"), pod((200, 0)))
    unlinked = place(node(2, "b"), pod((200, 0)))
    assert linked.score > unlinked.score  # type: ignore[union-attr]


def test_greedy_multi_card_on_large_node() -> None:
    links = [(a, b, 2) for a in range(8, 16) for b in range(a + 1, 16)]
    result = place(node(24, nvlink=links), pod((800, 0)))
    assert gpus_of(result) == [list(range(8, 16))]


def test_helpers() -> None:
    assert fmt_bytes(4 * GiB) == "4Gi" and fmt_bytes(768 << 20) == "768Mi"
    assert fmt_bytes(3 * U + 1) == "768.0Mi" and fmt_bytes(5) == "5B"
    assert to_priority(0.0) == 0 and to_priority(1.0) == 10 and to_priority(0.54) == 5
    assert best([Unfit("n", "x", False)]) is None
    assert place(node(), PodRequest(())).containers == ()  # type: ignore[union-attr]
