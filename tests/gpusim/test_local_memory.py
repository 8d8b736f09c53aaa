"""Local memory and context limits (vcudasim.h "Local memory and limits"): a
context reserves stack bytes x SMs x threads per SM, raised at the launch of
a kernel with a bigger frame and by cuCtxSetLimit, never lowered by itself."""

from __future__ import annotations

from simtool import lines, mem

from py_vcuda.sim import GiB, KiB, MiB, SimConfig, SimReader

OOM, UNSUPPORTED_LIMIT, INVALID_VALUE = 2, 215, 1
SMS, THREADS = 16, 1024  # a small device: 16 Ki threads, 16 MiB per KiB of stack
PER_KIB = SMS * THREADS * KiB
MODULE = "vcudasim-module;kernel small local=512;kernel big local=8Ki;kernel huge local=64Ki"


def small(sim: SimConfig) -> SimConfig:
    sim.sms, sim.threads_per_sm = SMS, THREADS
    return sim


def test_device_reports_its_sms_and_threads(tool, sim: SimConfig) -> None:
    out = tool("init", "attr", "16", "attr", "39")
    assert [int(ln.rest[0]) for ln in lines(out, "attr")] == [132, 2048]  # H100-like defaults
    small(sim).reset()
    out = tool("init", "attr", "16", "attr", "39")
    assert [int(ln.rest[0]) for ln in lines(out, "attr")] == [SMS, THREADS]


def test_launch_raises_local_memory_to_the_high_water_mark(tool, sim: SimConfig) -> None:
    small(sim)
    out = tool("init", "primary", "0", "module", MODULE,
               "fn", "small", "run", "0", "getlimit", "stack", "mem",  # 512 < 1 KiB: nothing
               "fn", "big", "mem", "run", "0", "getlimit", "stack", "mem",
               "fn", "small", "run", "0", "getlimit", "stack", "mem")  # stays raised
    assert [int(ln.rest[0]) for ln in lines(out, "fn")] == [512, 8 * KiB, 512]
    assert [int(ln.rest[0]) for ln in lines(out, "getlimit")] == [1024, 8 * KiB, 8 * KiB]
    m = [mem(ln) for ln in lines(out, "mem")]
    assert m[0].local == 0
    assert m[1].local == 0  # looking the function up reserves nothing
    assert m[2].local == 7 * PER_KIB == m[3].local
    assert m[2].context == 64 * MiB  # the first KiB is in the context overhead


def test_big_frame_kernel_that_does_not_fit_is_refused(tool, sim: SimConfig) -> None:
    small(sim).memory = 512 * MiB  # 64 KiB frames need 63 x 16 MiB: far too much
    out = tool("init", "primary", "0", "module", MODULE, "fn", "huge", "mem", "run", "100",
               "mem", "getlimit", "stack", "fn", "big", "run", "0", "mem")
    run = lines(out, "run")
    assert run[0].rc == OOM and run[1].rc == 0
    m = [mem(ln) for ln in lines(out, "mem")]
    assert m[1] == m[0]  # nothing reserved
    assert int(lines(out, "getlimit")[0].rest[0]) == 1024
    assert m[2].local == 7 * PER_KIB
    with SimReader(sim.state_path) as r:
        assert r.device(0).kernels == 1  # the refused launch never ran


def test_stack_limit_raise_and_refund(tool, sim: SimConfig) -> None:
    small(sim).memory = 1 * GiB
    out = tool("init", "primary", "0", "setlimit", "stack", "4096", "mem", "getlimit", "stack",
               "setlimit", "stack", "2048", "mem",   # down: refunded
               "setlimit", "stack", "1M", "mem",     # 1 MiB x 16 Ki threads: does not fit
               "getlimit", "stack",
               "module", MODULE, "fn", "big", "run", "0", "mem",
               "setlimit", "stack", "1024", "mem",    # below what `big` needed: allowed
               "run", "0", "mem")                     # and the next launch raises it again
    setl = lines(out, "setlimit")
    assert [ln.rc for ln in setl] == [0, 0, OOM, 0]
    assert [int(ln.rest[0]) for ln in lines(out, "getlimit")] == [4096, 2048]
    m = [mem(ln).local for ln in lines(out, "mem")]
    assert m == [3 * PER_KIB, PER_KIB, PER_KIB, 7 * PER_KIB, 0, 7 * PER_KIB]


def test_heap_fifo_and_launch_pool_limits_take_memory(tool, sim: SimConfig) -> None:
    out = tool("init", "primary", "0",
               "setlimit", "heap", "72M", "mem",     # 64 MiB above the 8 MiB default
               "setlimit", "fifo", "9M", "mem",      # + 8 MiB
               "setlimit", "pending", "4096", "mem",  # + 2048 launches x 2 KiB
               "setlimit", "heap", "1M", "mem",      # below the default: nothing for the heap
               "getlimit", "heap", "getlimit", "fifo", "getlimit", "pending",
               "setlimit", "syncdepth", "4", "getlimit", "syncdepth",
               "setlimit", "heap", "2G")             # does not fit in 1 GiB
    m = [mem(ln).limits for ln in lines(out, "mem")]
    assert m == [64 * MiB, 72 * MiB, 72 * MiB + 4 * MiB, 8 * MiB + 4 * MiB]
    got = [int(ln.rest[0]) for ln in lines(out, "getlimit")[:3]]
    assert got == [1 * MiB, 9 * MiB, 4096]
    setl = lines(out, "setlimit")
    assert setl[4].rc == UNSUPPORTED_LIMIT and lines(out, "getlimit")[3].rc == UNSUPPORTED_LIMIT
    assert setl[5].rc == OOM


def test_kernel_attribute_and_destroyed_context_returns_its_local_memory(tool, sim: SimConfig) -> None:
    small(sim)
    out = tool("init", "ctx", "0", "library", MODULE, "fn", "big", "run", "0", "mem",
               "destroy", "ctx", "0", "mem")
    assert int(lines(out, "fn")[0].rest[0]) == 8 * KiB  # cuKernelGetAttribute
    m = [mem(ln) for ln in lines(out, "mem")]
    assert m[0].local == 7 * PER_KIB and m[1].local == 0
