"""Stream-ordered pools as the driver's behave (vcudasim.h "Stream-ordered
pools"): chunked reservation, fragmentation, freed memory kept reserved until
a trim, the release threshold applied at synchronize, and the attributes."""

from __future__ import annotations

from simtool import lines, mem

from py_vcuda.sim import MiB, SimConfig, SimReader

OOM, INVALID_VALUE = 2, 1


def attrs(line) -> dict[str, int]:  # type: ignore[no-untyped-def]
    assert line.cmd == "pattr" and line.rc == 0, line
    keys = ("threshold", "reserved", "reserved_high", "used", "used_high")
    return dict(zip(keys, map(int, line.rest), strict=True))


START = ("init", "primary", "0", "stream", "pool", "default")


def test_pool_reserves_chunks_and_keeps_freed_memory(tool) -> None:
    out = tool(*START, "aalloc", "5M", "pattr", "mem",
               "aalloc", "20M", "aalloc", "10M", "pattr",  # 10M no longer fits chunk 1
               "afree", "0", "afree", "1", "afree", "2", "pattr", "mem",  # all freed: kept
               "aalloc", "40M", "pattr")  # bigger than a chunk: rounded up to 2 chunks
    p = [attrs(ln) for ln in lines(out, "pattr")]
    assert p[0] == {"threshold": 0, "reserved": 32 * MiB, "reserved_high": 32 * MiB,
                    "used": 5 * MiB, "used_high": 5 * MiB}
    assert (p[1]["reserved"], p[1]["used"]) == (64 * MiB, 35 * MiB)
    assert (p[2]["reserved"], p[2]["used"], p[2]["used_high"]) == (64 * MiB, 0, 35 * MiB)
    # 40 MiB fits neither 32 MiB chunk: a 64 MiB one.
    assert (p[3]["reserved"], p[3]["used"]) == (128 * MiB, 40 * MiB)
    m = [mem(ln) for ln in lines(out, "mem")]
    assert m[0].pool == 32 * MiB and m[0].alloc == 0 and m[0].context == 64 * MiB
    assert m[1].pool == 64 * MiB  # physical use is the reservation, not the 0 bytes in use


def test_fragmentation_makes_reserved_exceed_used(tool) -> None:
    # Eight 4 MiB blocks fill a chunk; freeing every other one leaves 16 MiB
    # free in 4 MiB holes, so an 8 MiB allocation needs a new chunk.
    cmds = [*START]
    for _ in range(8):
        cmds += ["aalloc", "4M"]
    for k in range(0, 8, 2):
        cmds += ["afree", str(k)]
    cmds += ["pattr", "aalloc", "8M", "pattr", "ssync", "pattr"]
    p = [attrs(ln) for ln in lines(tool(*cmds), "pattr")]
    assert (p[0]["reserved"], p[0]["used"]) == (32 * MiB, 16 * MiB)
    assert (p[1]["reserved"], p[1]["used"]) == (64 * MiB, 24 * MiB)
    # Synchronize releases only chunks with nothing in use: both are busy.
    assert p[2]["reserved"] == 64 * MiB


def test_synchronize_releases_above_the_threshold(tool) -> None:
    out = tool(*START, "aalloc", "50M", "aalloc", "10M", "afree", "0", "afree", "1",
               "pattr", "ssync", "pattr",            # threshold 0: all of it goes
               "threshold", "max", "aalloc", "50M", "afree", "2", "ssync", "pattr",
               "sync", "pattr",                      # UINT64_MAX: nothing goes
               "threshold", "32M", "ssync", "pattr",  # above 32 MiB: trims
               "ptrim", "0", "pattr", "mem")
    p = [attrs(ln) for ln in lines(out, "pattr")]
    assert p[0]["reserved"] == 64 * MiB  # one 64 MiB chunk holds both
    assert p[1]["reserved"] == 0
    assert p[2]["threshold"] == 2**64 - 1 and p[2]["reserved"] == 64 * MiB
    assert p[3]["reserved"] == 64 * MiB  # cuCtxSynchronize keeps it too
    # Above 32 MiB, but its only chunk is 64 MiB: releasing it is all or nothing.
    assert p[4]["reserved"] == 0
    assert p[5]["reserved"] == 0 and mem(lines(out, "mem")[0]).pool == 0


def test_trim_stops_below_what_to_keep_and_keeps_what_is_in_use(tool) -> None:
    out = tool(*START, "threshold", "max", "aalloc", "30M", "aalloc", "30M", "aalloc", "30M",
               "aalloc", "30M", "afree", "0", "afree", "1", "afree", "2",
               "pattr", "ptrim", "70M", "pattr", "ptrim", "0", "pattr")
    p = [attrs(ln) for ln in lines(out, "pattr")]
    assert p[0]["reserved"] == 128 * MiB  # four 32 MiB chunks, one in use
    assert p[1]["reserved"] == 64 * MiB  # released until fewer than 70 MiB are reserved
    assert p[2]["reserved"] == 32 * MiB  # the chunk in use stays


def test_high_water_marks_reset_to_current(tool) -> None:
    out = tool(*START, "aalloc", "40M", "afree", "0", "ssync", "pattr", "resethigh", "pattr")
    p = [attrs(ln) for ln in lines(out, "pattr")]
    assert (p[0]["reserved_high"], p[0]["used_high"]) == (64 * MiB, 40 * MiB)
    assert (p[1]["reserved_high"], p[1]["used_high"]) == (0, 0)


def test_created_pools_current_pool_and_destroy(tool) -> None:
    out = tool("init", "primary", "0", "stream",
               "pool", "create", "0", "getpool", "setpool", "getpool",
               "aalloc", "1M",      # from the created pool (current now)
               "pdestroy", "getpool", "mem",  # in use: kept until freed
               "mfree", "0", "mem",           # cuMemFree takes pool pointers
               "pool", "default", "pdestroy")  # the default pool cannot go
    assert [int(ln.rest[0]) for ln in lines(out, "getpool")] == [0, 1, 0]
    m = [mem(ln) for ln in lines(out, "mem")]
    assert m[0].pool == 32 * MiB and m[1].pool == 0
    assert lines(out, "pdestroy")[1].rc == INVALID_VALUE
    assert lines(out, "palloc") == []


def test_max_size_and_growth_that_does_not_fit(tool, sim: SimConfig) -> None:
    sim.memory = 512 * MiB  # 64 MiB context + 448 MiB
    out = tool("init", "primary", "0", "stream",
               "pool", "create", "64M", "palloc", "40M", "palloc", "40M",  # capped at 64 MiB
               "pool", "default", "threshold", "max",
               "aalloc", "100M", "afree", "1",  # 128 MiB reserved, nothing in use
               "aalloc", "300M",  # 320 MiB: fits once the pool lets its own 128 MiB go
               "pattr", "aalloc", "100M", "mem")
    assert [ln.rc for ln in lines(out, "palloc")] == [0, OOM]
    assert [ln.rc for ln in lines(out, "aalloc")] == [0, 0, OOM]
    assert attrs(lines(out, "pattr")[0])["reserved"] == 320 * MiB
    assert mem(lines(out, "mem")[0]).pool == 64 * MiB + 320 * MiB


def test_context_destroy_returns_blocks_to_the_pool(tool, sim: SimConfig) -> None:
    out = tool("init", "ctx", "0", "stream", "pool", "default", "aalloc", "8M", "destroy",
               "ctx", "0", "mem")
    assert mem(lines(out, "mem")[0]).pool == 32 * MiB  # reserved, nothing in use
    with SimReader(sim.state_path) as r:
        assert r.device(0).used == 0  # and all gone with the process
