"""Reading a claim's allocation and planning its shares (pure: no sockets, no files)."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver import testing as t
from dra_driver.claims import ClaimError, Result, ShareConfig, parse_claim, plan, share_config_fields, whole_memory
from node_state.testing import gpu
from py_vcuda.nvml import GPUInfo
from py_vcuda.sim import GiB, MiB

NODE = t.NODE
GPUS = {f"gpu-{i}": gpu(i, memory=16 * GiB) for i in range(4)}


def gpu_of(result: Result) -> GPUInfo | None:
    return GPUS.get(result.device) if result.pool == NODE else None


def shares(doc: dict[str, Any]):  # type: ignore[no-untyped-def]
    return plan(parse_claim(doc), gpu_of)


def test_only_our_driver_counts():
    doc = t.claim("c", NODE, [t.foreign(NODE), t.share(NODE, 2, 30, "8Gi", share_id="s1")], pod="p")
    claim = parse_claim(doc)
    (r,) = claim.results
    assert (r.request, r.pool, r.device, r.share_id, r.cores, r.memory) == ("gpu", NODE, "gpu-2", "s1", 30, 8 * GiB)
    assert [(c.name, c.uid) for c in claim.consumers] == [("p", "uid-p")]
    assert plan(parse_claim(t.claim("n", NODE, [t.foreign(NODE)])), gpu_of) == []


def test_consumed_capacity_may_be_qualified_with_the_driver_domain():
    doc = t.claim("c", NODE, [{**t.share(NODE, 0, 30, GiB),
                               "consumedCapacity": {"gpu.vcuda.io/cores": "25", "gpu.vcuda.io/memory": "1Gi"}}])
    (r,) = parse_claim(doc).results
    assert (r.cores, r.memory) == (25, GiB)


def test_a_share_of_one_gpu():
    (s,) = shares(t.claim("c", NODE, [t.share(NODE, 1, 30, 4 * GiB)]))
    assert (s.gpus, s.core_request, s.core_limit, s.memory_limit, s.fractional) == (
        (GPUS["gpu-1"].uuid,), 30, 30, 4 * GiB, True)


@pytest.mark.parametrize("devices,memory", [
    ([t.whole(NODE, 0)], None),                                 # allocated whole: no capacity consumed
    ([t.share(NODE, 0, 100, 16 * GiB)], None),                  # the defaults: all of it
    ([t.share(NODE, 0, 100, 4 * GiB)], 4 * GiB),                # all the cores, part of the memory
])
def test_whole_gpus_run_unthrottled(devices, memory):
    (s,) = shares(t.claim("c", NODE, devices))
    assert (s.core_request, s.core_limit, s.fractional, s.memory_limit) == (100, 100, False, memory)


def test_a_share_that_books_no_memory_is_refused_not_unlimited():
    device = t.share(NODE, 0, 30, GiB)
    del device["consumedCapacity"][t.MEMORY]
    with pytest.raises(ClaimError, match="records no consumed memory capacity"):
        shares(t.claim("c", NODE, [device]))


def test_memory_that_is_not_a_multiple_of_the_step_books_all_of_it_by_default():
    odd = 16 * GiB - 3 * MiB
    assert whole_memory(odd) == 16 * GiB - 256 * MiB
    GPUS["gpu-3"] = gpu(3, memory=odd)
    try:
        (s,) = shares(t.claim("c", NODE, [t.share(NODE, 3, 100, whole_memory(odd))]))
        assert s.memory_limit is None
    finally:
        GPUS["gpu-3"] = gpu(3, memory=16 * GiB)


def test_config_from_class_then_claim_per_request():
    doc = t.claim("c", NODE, [t.share(NODE, 0, 30, GiB, request="small/a")], config=[
        t.share_config(source="FromClaim", coreLimit=80),
        t.share_config(source="FromClass", coreLimit=40, preload=False),
        t.share_config(source="FromClaim", requests=["other"], coreLimit=99),
    ])
    claim = parse_claim(doc)
    assert claim.config("small/a") == ShareConfig(core_limit=80, preload=False)   # the claim overrides its class
    assert claim.config("other") == ShareConfig(core_limit=99, preload=False)
    (s,) = plan(claim, gpu_of)
    assert (s.core_request, s.core_limit, s.preload, s.priority) == (30, 80, False, "normal")


def test_a_high_priority_share():
    (s,) = shares(t.claim("c", NODE, [t.share(NODE, 0, 30, GiB)], config=[t.share_config(priority="high")]))
    assert (s.priority, s.core_limit) == ("high", 30)


def test_a_config_naming_a_request_covers_its_subrequests():
    doc = t.claim("c", NODE, [t.share(NODE, 0, 30, GiB, request="gpu/small")],
                  config=[t.share_config(requests=["gpu"], coreLimit=60)])
    (s,) = shares(doc)
    assert s.core_limit == 60


def test_another_drivers_config_is_not_ours_to_check():
    other = {"source": "FromClaim", "requests": [], "opaque": {"driver": "net.example.com",
                                                               "parameters": {"anything": True}}}
    (s,) = shares(t.claim("c", NODE, [t.share(NODE, 0, 30, GiB)], config=[other]))
    assert s.core_limit == 30


@pytest.mark.parametrize("params,message", [
    ({"apiVersion": "gpu.vcuda.io/v1", "kind": "GpuShareConfig"}, "apiVersion/kind must be gpu.vcuda.io/v1alpha1"),
    ({"apiVersion": "gpu.vcuda.io/v1alpha1", "kind": "ShareConfig"}, "apiVersion/kind must be"),
    ({"apiVersion": "gpu.vcuda.io/v1alpha1", "kind": "GpuShareConfig", "coreLimit": 0}, "GpuShareConfig.coreLimit"),
    ({"apiVersion": "gpu.vcuda.io/v1alpha1", "kind": "GpuShareConfig", "coreLimit": 101}, "1-100"),
    ({"apiVersion": "gpu.vcuda.io/v1alpha1", "kind": "GpuShareConfig", "coreLimit": True}, "coreLimit"),
    ({"apiVersion": "gpu.vcuda.io/v1alpha1", "kind": "GpuShareConfig", "memory": "4Gi"}, "GpuShareConfig.memory: "
     "unknown field"),
    ("not an object", "parameters must be an object"),
])
def test_bad_share_config_names_the_field(params, message):
    with pytest.raises(ClaimError, match=message.replace(".", r"\.")):
        share_config_fields(params, "here")


@pytest.mark.parametrize("doc,message", [
    (t.claim("c", NODE, [t.share(NODE, 0, 30, GiB)], config=[t.share_config(coreLimit=20)]),
     r"GpuShareConfig.coreLimit 20 is below the core request \(30\)"),
    (t.claim("c", NODE, [t.whole(NODE, 0)], config=[t.share_config(coreLimit=50)]),
     "cannot apply to whole GPUs"),
    (t.claim("c", NODE, [t.whole(NODE, 0)], config=[t.share_config(priority="high")]),
     "GpuShareConfig.priority 'high' cannot apply to whole GPUs"),
    (t.claim("c", NODE, [t.share(NODE, 0, 30, GiB), t.share(NODE, 1, 30, GiB)]),
     "a share of a GPU is one GPU"),
    (t.claim("c", NODE, [t.share(NODE, 0, 30, GiB, request="a"), t.whole(NODE, 1, request="b")]),
     "put each share in its own claim"),
    (t.claim("c", NODE, [t.share(NODE, 7, 30, GiB)]), "device node-1/gpu-7 is not a GPU of this node"),
    (t.claim("c", NODE, [t.share("node-2", 0, 30, GiB)]), "device node-2/gpu-0 is not a GPU of this node"),
    (t.claim("c", NODE, [t.share(NODE, 0, 100, 4 * GiB), t.share(NODE, 1, 100, 8 * GiB)]),
     "different amounts of memory"),
    (t.claim("c", NODE, [{**t.share(NODE, 0, 30, GiB), "consumedCapacity": {"cores": "30", "memory": "lots"}}]),
     r"results\[0\]\.consumedCapacity\.memory"),
])
def test_claims_that_cannot_run_say_why(doc, message):
    with pytest.raises(ClaimError, match=message):
        shares(doc)


def test_an_unallocated_claim_is_refused():
    doc = t.claim("c", NODE, [])
    del doc["status"]["allocation"]
    with pytest.raises(ClaimError, match="not allocated"):
        parse_claim(doc)
