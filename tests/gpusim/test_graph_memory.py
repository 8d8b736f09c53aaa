"""Graph memory nodes (vcudasim.h "Graph memory"): mapped at upload or launch
into the device's graph reserve, kept across launches and after the graph is
destroyed, returned only by cuDeviceGraphMemTrim."""

from __future__ import annotations

from simtool import lines, mem

from py_vcuda.sim import MiB, SimConfig

OOM, INVALID_VALUE = 2, 1
MODULE = "vcudasim-module;kernel step"


def gattr(line) -> dict[str, int]:  # type: ignore[no-untyped-def]
    assert line.cmd == "gattr" and line.rc == 0, line
    return dict(zip(("used", "used_high", "reserved", "reserved_high"), map(int, line.rest),
                    strict=True))


def test_capture_loop_relaunch_destroy_and_trim(tool) -> None:
    out = tool("init", "primary", "0", "stream", "module", MODULE, "fn", "step",
               "pool", "default",
               "capture", "aalloc", "10M", "run", "0", "afree", "0",  # one step of a loop
               "aalloc", "20M", "run", "0", "afree", "1", "endcapture",
               "pattr", "mem", "instantiate", "mem",   # nothing until it runs
               "glaunch", "ssync", "mem", "gattr",
               "glaunch", "glaunch", "ssync", "mem",   # relaunches reuse the mapping
               "execdestroy", "gdestroy", "ssync", "mem", "gattr",  # kept after destruction
               "gtrim", "mem", "gattr")
    assert all(ln.rc == 0 for ln in out), [ln for ln in out if ln.rc]
    assert lines(out, "pattr")[0].rest[1] == "0"  # captured allocations take nothing from the pool
    m = [mem(ln) for ln in lines(out, "mem")]
    assert [x.graph for x in m] == [0, 0, 20 * MiB, 20 * MiB, 20 * MiB, 0]
    assert all(x.pool == 0 for x in m)
    g = [gattr(ln) for ln in lines(out, "gattr")]
    assert g[0] == {"used": 20 * MiB, "used_high": 20 * MiB, "reserved": 20 * MiB,
                    "reserved_high": 20 * MiB}
    assert (g[1]["used"], g[1]["reserved"]) == (0, 20 * MiB)
    assert (g[2]["used"], g[2]["reserved"], g[2]["reserved_high"]) == (0, 0, 20 * MiB)


def test_footprint_reuse_captured_but_not_explicit_nodes(tool) -> None:
    out = tool("init", "primary", "0", "stream",
               "gcreate", "galloc", "3M", "gfree", "0", "galloc", "5M", "gfree", "1",
               "instantiate", "upload", "mem",  # explicit nodes: 4 + 6 MiB, no reuse
               "execdestroy", "gtrim", "mem")
    assert [mem(ln).graph for ln in lines(out, "mem")] == [10 * MiB, 0]


def test_trim_keeps_what_a_running_graph_holds(tool) -> None:
    out = tool("init", "primary", "0", "stream", "module", MODULE, "fn", "step",
               "capture", "aalloc", "8M", "run", "300000", "afree", "0", "endcapture",
               "instantiate", "glaunch", "gtrim", "mem",  # still executing: kept
               "ssync", "gtrim", "mem",                  # idle: trimmed even though it exists
               "glaunch", "ssync", "mem")                # maps again
    assert [mem(ln).graph for ln in lines(out, "mem")] == [8 * MiB, 0, 8 * MiB]


def test_unfreed_graph_allocation_lives_until_freed(tool) -> None:
    out = tool("init", "primary", "0", "stream",
               "capture", "aalloc", "6M", "endcapture", "instantiate", "glaunch", "ssync",
               "gtrim", "mem", "mfree", "0", "gtrim", "mem")
    assert [ln.rc for ln in lines(out, "mfree")] == [0]
    assert [mem(ln).graph for ln in lines(out, "mem")] == [6 * MiB, 0]


def test_graph_memory_that_does_not_fit_fails_the_launch(tool, sim: SimConfig) -> None:
    sim.memory = 256 * MiB
    out = tool("init", "primary", "0", "stream",
               "capture", "aalloc", "300M", "afree", "0", "endcapture", "instantiate",
               "glaunch", "upload", "mem",
               "alloc", "1M", "capture", "afree", "1", "endcapture")  # a cuMemAlloc pointer
    assert [ln.rc for ln in lines(out, "glaunch")] == [OOM]
    assert [ln.rc for ln in lines(out, "upload")] == [OOM]
    assert mem(lines(out, "mem")[0]).graph == 0
    assert lines(out, "afree")[-1].rc == INVALID_VALUE  # not an allocation of this graph
