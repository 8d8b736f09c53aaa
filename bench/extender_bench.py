"""Scheduler-extender figures: filter+prioritize latency, and fragmentation by policy.

    PYTHONPATH=. python3 bench/extender_bench.py [--quick]

Latency: one fractional pod against N nodes x 8 GPUs (half the GPUs partly used),
through the extender's filter and prioritize handlers with JSON decode/encode of
the kube-scheduler bodies (nodeCacheCapable: NodeNames), no socket, GC tuned as
the server tunes it.
Fragmentation: 10,000 random fractional pods arrive on 200 nodes x 8 GPUs while
others finish (load held near 75 %); each goes to the best-scored node, as
kube-scheduler would with our score alone.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kube_contract.names import MEMORY_UNIT_BYTES, Names  # noqa: E402
from kube_contract.testing import pod_json, topology  # noqa: E402
from scheduler_extender.extender import Extender  # noqa: E402
from scheduler_extender.placement import (  # noqa: E402
    ContainerRequest,
    PodRequest,
    Policy,
    Tags,
    best,
)
from scheduler_extender.server import tune_gc  # noqa: E402
from scheduler_extender.state import ClusterState  # noqa: E402

GiB = 1 << 30
NO_TAGS = Tags()


class NoBinder:
    def get_pod(self, namespace: str, name: str) -> dict:
        raise NotImplementedError

    def bind(self, *args: object) -> None:
        raise NotImplementedError


def half_used_cluster(nodes: int, rng: random.Random) -> ClusterState:
    state = ClusterState(Names())
    for i in range(nodes):
        name = f"node-{i:05d}"
        state.set_node(name, topology(name, 8, nvlink="pairs"))
        node = state.node(name)
        assert node is not None
        for g in node.gpus:
            if rng.random() < 0.5:
                g.add(rng.choice([10, 20, 30, 50, 70, 90]), rng.randint(1, 60) * GiB, NO_TAGS)
    return state


def latency(nodes: int, runs: int, rng: random.Random) -> tuple[float, float]:
    state = half_used_cluster(nodes, rng)
    tune_gc()  # as `vcuda extender` does after its first sync
    ext = Extender(state, NoBinder())
    names = state.node_names()
    samples = []
    for i in range(runs):
        pod = pod_json(f"bench-{i}", [(30, 16)], uid=f"bench-uid-{i}")
        body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
        t0 = time.perf_counter()
        filtered = ext.filter(json.loads(body))
        json.dumps(filtered)
        body2 = json.dumps({"Pod": pod, "NodeNames": filtered["NodeNames"]}).encode()
        json.dumps(ext.prioritize(json.loads(body2)))
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    p99 = samples[min(len(samples) - 1, int(round(0.99 * (len(samples) - 1))))]
    return statistics.median(samples), p99


def fragmentation(policy: Policy, pods: int, nodes: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    state = ClusterState(Names())
    for i in range(nodes):
        state.set_node(f"n{i:04d}", topology(f"n{i:04d}", 8))
    names = state.node_names()
    sizes = [5, 10, 20, 25, 30, 40, 50, 60, 75]
    # A pod leaves with probability live/target per try: equilibrium at live = target/2,
    # i.e. about 75 % of all cores in use.
    target = 2 * 0.75 * nodes * 8 * 100 / statistics.mean(sizes)
    live: list[str] = []
    failed = 0
    for i in range(pods):
        while live and rng.random() < len(live) / target:
            state.remove_pod(live.pop(rng.randrange(len(live))))
        cores = rng.choice(sizes)
        memory = rng.randint(1, 4 * cores // 10 + 1) * 4 * MEMORY_UNIT_BYTES  # ~1 GiB steps
        pod = PodRequest((ContainerRequest("c", cores, memory),), policy)
        choice = best(state.evaluate(pod, names).values())
        if choice is None:
            failed += 1
            continue
        state.reserve(f"p{i}", f"p{i}", pod, choice.node)
        live.append(f"p{i}")
    gpus = [g for name in names for g in state.node(name).gpus]  # type: ignore[union-attr]
    partly = sum(1 for g in gpus if 0 < g.used_cores < 100)
    free = sum(1 for g in gpus if g.tenants == 0)
    largest = max(gpus, key=lambda g: (g.free_cores, g.free_memory))
    return {"partly": partly / len(gpus), "free": free, "gpus": len(gpus),
            "largest_cores": largest.free_cores, "largest_mem": largest.free_memory / GiB,
            "failed": failed, "load": sum(g.used_cores for g in gpus) / (100 * len(gpus))}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer runs and pods")
    args = parser.parse_args()
    rng = random.Random(7)
    print("filter + prioritize, 1 pod (30 cores, 4Gi), 8 GPUs per node, half partly used")
    print(f"{'nodes':>7} {'GPUs':>7} {'runs':>5} {'p50 ms':>8} {'p99 ms':>8}")
    for nodes, runs in ((100, 200), (1000, 100), (5000, 50)):
        runs = max(10, runs // 5) if args.quick else runs
        p50, p99 = latency(nodes, runs, rng)
        print(f"{nodes:>7} {nodes * 8:>7} {runs:>5} {p50:>8.2f} {p99:>8.2f}")
    pods = 2000 if args.quick else 10000
    print()
    print(f"fragmentation after {pods} random fractional pods (with departures), "
          "200 nodes x 8 GPUs")
    print(f"{'policy':>8} {'load':>6} {'GPUs partly used':>17} {'GPUs free':>10} "
          f"{'largest fit':>20} {'unschedulable':>14}")
    for policy in Policy:
        r = fragmentation(policy, pods, 200, seed=11)
        fit = f"{r['largest_cores']:.0f} cores/{r['largest_mem']:.0f}Gi"
        print(f"{policy.value:>8} {r['load']:>6.0%} {r['partly']:>17.1%} "
              f"{r['free']:>4.0f}/{r['gpus']:<5.0f} {fit:>20} {r['failed']:>14.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
