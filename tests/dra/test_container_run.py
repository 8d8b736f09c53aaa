"""Processes started with what a prepared claim's CDI spec injects are held to the claim's share:
cuprobe (a simulated CUDA program) runs with the spec's env, its container paths mapped to the
host paths the spec's mounts name, libvcuda preloaded as /etc/ld.so.preload would (shimtest)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from shimtest import cdi_container, container_env_on_host, parse

from dra_driver import testing as t
from node_state.testing import gpu, inventory
from py_vcuda.ledger import Ledger
from py_vcuda.sim import GiB, MiB, SimConfig

NODE = t.NODE
OUT_OF_MEMORY = 2
KERNEL_US = 2000


@pytest.fixture(scope="module")
def cuprobe(build_c) -> Path:  # type: ignore[no-untyped-def]
    return build_c(["cuprobe.c"])


def claim_env(agent: Any, claim: dict[str, Any], sim: SimConfig) -> dict[str, str]:
    """The environment of a process in a container of this claim, as seen from the host."""
    spec = json.loads(agent.driver.specs.path(claim["metadata"]["uid"]).read_text())
    (device,) = spec["devices"]
    edits = device["containerEdits"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
    env.update(sim.env())
    env.update(container_env_on_host(*cdi_container(edits)))
    return env


def prepared(kubelet: t.TestKubelet, claim: dict[str, Any]) -> None:
    resp = kubelet.prepare(claim)
    assert resp.claims[claim["metadata"]["uid"]].error == ""


def test_a_process_with_the_cdi_env_is_held_to_the_claim(agent_factory, kubelet, api, short_dir, cuprobe):
    sim = SimConfig(state_path=short_dir / "sim", devices=1, memory=4 * GiB, context_overhead=64 * MiB)
    agent = agent_factory(inv=inventory(1, memory=4 * GiB))
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, GiB)]))
    prepared(kubelet, claim)
    env = claim_env(agent, claim, sim)
    assert env["VCUDA_SCHEDULER"].startswith(f"ipc://{agent.layout.scheduler_dir(gpu(0).uuid)}")

    proc = subprocess.run([str(cuprobe), "init", "ctx", f"alloc:{512 * MiB}", f"alloc:{512 * MiB}",
                           f"spin:{KERNEL_US}:3000"], env=env, capture_output=True, text=True, timeout=120)
    lines = parse(proc.stdout)
    allocs = [int(d["rc"]) for d in lines if d["cmd"] == "alloc"]
    assert allocs == [0, OUT_OF_MEMORY], proc.stdout + proc.stderr   # 64 MiB context + 2 x 512 MiB > 1 GiB
    (spin,) = [d for d in lines if d["cmd"] == "spin"]
    assert int(spin["rc"]) == 0 and int(spin["busy_us"]) / float(spin["wall_us"]) < 0.6, spin   # 30 %, not ~1.0
    (record,) = agent.store.records()
    with Ledger(agent.layout.ledger_path(record.key)) as book:
        (device,) = book.devices()
    assert (device.uuid, device.limit, device.oom_denials) == (gpu(0).uuid, GiB, 1)


def test_two_claims_on_one_gpu_get_two_tenants_whose_shares_hold(agent_factory, kubelet, api, short_dir, cuprobe):
    sim = SimConfig(state_path=short_dir / "sim", devices=1, memory=4 * GiB, context_overhead=64 * MiB)
    agent = agent_factory(inv=inventory(1, memory=4 * GiB))
    requests = {"small": 30, "large": 70}
    claims = {name: api.put("resourceclaims", t.claim(name, NODE, [t.share(NODE, 0, cores, GiB)]))
              for name, cores in requests.items()}
    for claim in claims.values():
        prepared(kubelet, claim)
    tenants = agent.schedulers[gpu(0).uuid].call("stats")["tenants"]
    records = {r.extra["claim"]: r for r in agent.store.records()}
    assert {name: (tenants[records[name].tenant]["request"], tenants[records[name].tenant]["limit"])
            for name in requests} == {name: (c, c) for name, c in requests.items()}

    procs = {name: subprocess.Popen([str(cuprobe), "init", "ctx", f"spin:{KERNEL_US}:6000:10"],
                                    env=claim_env(agent, claim, sim), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, claim in claims.items()}
    busy = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        (spin,) = [d for d in parse(out) if d["cmd"] == "spin"]
        assert spin["rc"] == "0", err
        busy[name] = int(spin["busy_us"])
    total = sum(busy.values())
    shares = {name: 100 * b / total for name, b in busy.items()}
    for name, want in requests.items():
        assert abs(shares[name] - want) <= 5.0, f"configured {requests}, achieved {shares}"
