"""Issue 24's table through the DRA driver's prepare: a container built from the claim's CDI spec
as a CDI-aware runtime builds it (tests/kubecontainer.py: the spec's mounts, /etc/ld.so.preload and
the read-only quota directory included, in a private mount namespace; the spec's env, then the
pod's own), on a node with two simulated GPUs. Whatever the pod's spec adds, and for a process
started with a clean environment, the container is held to its claim (1 GiB, 13 % of the GPU) and
to its GPU."""

from __future__ import annotations

import json

import pytest
from kubecontainer import NODE_MEMORY, ROW_IDS, ROWS, MountSpec, Row, check_held, node_sim

from dra_driver import testing as t
from node_state.testing import gpu, inventory
from py_vcuda.sim import GiB

NODE = t.NODE
CORES = 13


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_a_pods_spec_cannot_loosen_its_claim(agent_factory, kubelet, api, short_dir, cuprobe_exe, row: Row):
    sim = node_sim(short_dir)
    agent = agent_factory(inv=inventory(2, memory=NODE_MEMORY))
    own, other = gpu(1).uuid, gpu(0).uuid   # its GPU is not device 0 of the node
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 1, CORES, GiB)]))
    assert kubelet.prepare(claim).claims[claim["metadata"]["uid"]].error == ""
    spec = json.loads(agent.driver.specs.path(claim["metadata"]["uid"]).read_text())
    (device,) = spec["devices"]
    edits = device["containerEdits"]
    mounts = [MountSpec(m["hostPath"], m["containerPath"], "ro" in m["options"]) for m in edits["mounts"]]
    check_held(row, mounts, dict(kv.split("=", 1) for kv in edits["env"]), sim, cuprobe_exe, own, other)
