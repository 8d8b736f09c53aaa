"""Every allocation API at, just under and just over the limit."""

from __future__ import annotations

import pytest
from shimtest import OVERHEAD, MiB, Runner

LIMIT = 256 * MiB
A = LIMIT - OVERHEAD  # what the quota leaves after the process's context
GRAN = 2 * MiB        # VMM granularity

# name, exactly at the limit, one unit over, one unit under
CASES = [
    ("alloc", f"alloc:{A}", f"alloc:{A + 1}", f"alloc:{A - 1}"),
    ("managed", f"managed:{A}", f"managed:{A + 1}", f"managed:{A - 1}"),
    ("async", f"async:{A}", f"async:{A + 1}", f"async:{A - 1}"),
    ("pool", f"pool:{A}", f"pool:{A + 1}", f"pool:{A - 1}"),
    ("vmm", f"vmm:{A}", f"vmm:{A + GRAN}", f"vmm:{A - GRAN}"),
    ("pitch", f"pitch:4096:{A // 4096}", f"pitch:4096:{A // 4096 + 1}", f"pitch:4096:{A // 4096 - 1}"),
    ("array", f"array:4096:{A // 16384}", f"array:4096:{A // 16384 + 1}",
     f"array:4096:{A // 16384 - 1}"),
    ("array3d", f"array3d:1024:64:{A // 262144}", f"array3d:1024:64:{A // 262144 + 1}",
     f"array3d:1024:64:{A // 262144 - 1}"),
    ("mipmap", f"mipmap:1024:64:{A // 262144}:1", f"mipmap:1024:64:{A // 262144}:2",
     f"mipmap:1024:64:{A // 262144 - 1}:1"),
]


@pytest.mark.parametrize(("name", "exact", "over", "under"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("via", ["dlsym", "proc"])
def test_allocation_api_at_the_limit(run_probe: Runner, via: str, name: str, exact: str, over: str,
                                     under: str) -> None:
    res = run_probe([f"--via={via}", "init", "ctx", exact, "info", "freeall", "info", over,
                     under, "info", "freeall"], env={"VCUDA_MEMORY_LIMIT": str(LIMIT)})
    assert res.returncode == 0, res.stderr
    kind = exact.split(":")[0]
    assert res.rc(kind, 0) == 0, "exactly the quota must fit"
    assert res.get("info", "free", 0) == 0
    assert res.rc("freeall", 0) == 0
    assert res.get("info", "free", 1) == A, "freeing must return every byte"
    assert res.rc(kind, 1) == 2, "one unit over must be CUDA_ERROR_OUT_OF_MEMORY"
    assert res.rc(kind, 2) == 0, "just under must fit"
    assert res.get("info", "total", 2) == LIMIT


def test_refused_allocation_allocates_nothing(run_probe: Runner) -> None:
    res = run_probe(["init", "ctx", f"alloc:{A + 1}", "info", f"alloc:{A}"],
                    env={"VCUDA_MEMORY_LIMIT": str(LIMIT)})
    assert res.rc("alloc", 0) == 2
    assert res.get("info", "free") == A
    assert res.rc("alloc", 1) == 0


def test_free_of_unknown_pointer_passes_through(run_probe: Runner) -> None:
    res = run_probe(["init", "ctx", "freeunknown", "alloc:4096", "info"],
                    env={"VCUDA_MEMORY_LIMIT": str(LIMIT)})
    assert res.rc("freeunknown") != 0          # the driver's own answer
    assert res.get("info", "free") == A - 4096  # and nothing released on our side


def test_per_device_limit_overrides(run_probe: Runner) -> None:
    res = run_probe(["init", "ctx", "info", "total:0"],
                    env={"VCUDA_MEMORY_LIMIT": "1Gi", "VCUDA_MEMORY_LIMIT_0": "512Mi"})
    assert res.get("info", "total") == 512 * MiB
    assert res.get("total", "total") == 512 * MiB


def test_unlimited_by_default(run_probe: Runner) -> None:
    res = run_probe(["init", "ctx", "info"])
    assert res.get("info", "total") == 4 << 30


def test_context_destroy_returns_its_allocations(run_probe: Runner) -> None:
    res = run_probe(["--via=proc", "init", "ctx", "newctx:0", f"alloc:{32 * MiB}", "destroyctx",
                     "info"], env={"VCUDA_MEMORY_LIMIT": str(LIMIT)})
    assert res.rc("newctx") == 0
    assert res.rc("destroyctx") == 0
    # the destroyed context's overhead and allocation are back; the primary's stays
    assert res.get("info", "free") == A
