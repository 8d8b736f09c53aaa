"""What the driver holds beyond the pointers is charged (issue 12): after every step,
physical use (the simulator's per-process readout) <= the container's ledger <= its limit.

Scenarios: a PyTorch-cudaMallocAsync-like churn (release threshold UINT64_MAX, so the
pool keeps what is freed, and fragmentation makes it grow with free bytes to spare);
RMM-style priming (half of free memory reserved and freed) and trim before deny; a
big-frame kernel under a small quota; stack, heap and launch-pool limits raised and
refunded; a capture loop with relaunch, destroy and trim; NCCL-style sharing counted
once; two containers on one GPU, where one's pool never makes the other's in-quota
allocation fail.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import BuildC
from shimtest import OVERHEAD, MiB, StepProbe

from py_vcuda import native
from py_vcuda.ledger import Ledger
from py_vcuda.sim import SimReader

GiB = 1 << 30
CHUNK = 32 * MiB           # the simulator's pool growth unit (VCUDA_SIM_POOL_CHUNK)
UINT64_MAX = (1 << 64) - 1
# A small device shape for local memory: 16 SMs x 1024 threads, so 1 KiB more
# per thread is 16 MiB more per context.
SMS, THREADS_PER_SM = 16, 1024
PER_KIB = SMS * THREADS_PER_SM * 1024


@dataclass
class Container:
    """One container on the simulated GPU: its ledger, its limit, its processes."""

    name: str
    limit: int
    env: dict[str, str]
    cuprobe: Path
    probes: list[StepProbe] = field(default_factory=list)

    def start(self, door: str = "proc", *flags: str) -> StepProbe:
        probe = StepProbe(str(self.cuprobe), self.env, [f"--via={door}", *flags])
        self.probes.append(probe)
        return probe

    def physical(self) -> int:
        """What the simulator says this container's processes hold on the device."""
        pids = {p.pid for p in self.probes}
        with SimReader(self.env["VCUDA_SIM_STATE"]) as sim:
            return sum(p.used for p in sim.processes(0) if p.pid in pids)

    def charged(self) -> int:
        with Ledger(self.env["VCUDA_LEDGER"]) as ledger:
            devices = ledger.devices()
            return sum(d.used for d in devices)  # the reconciler's unattributed bytes are part of it

    def check(self, after: str) -> tuple[int, int]:
        """Asserts physical use <= ledger <= limit; returns (physical, ledger)."""
        physical, charged = self.physical(), self.charged()
        assert physical <= charged, f"{self.name} after {after!r}: the device holds {physical} bytes, " \
                                    f"the ledger only {charged}"
        assert charged <= self.limit, f"{self.name} after {after!r}: ledger {charged} > limit {self.limit}"
        return physical, charged

    def step(self, probe: StepProbe, command: str) -> dict[str, str]:
        out = probe.do(command)
        self.check(command)
        return out

    def ok(self, probe: StepProbe, *commands: str) -> None:
        """Steps that must each succeed."""
        for command in commands:
            assert self.step(probe, command)["rc"] == "0", command


MakeContainer = Callable[..., Container]


@pytest.fixture
def container(cuprobe: Path, shim: Path, sim_env: dict[str, str], tmp_path: Path) -> Iterator[MakeContainer]:
    made: list[Container] = []

    def make(limit: int, name: str = "c", **sim: str) -> Container:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
        env.update(sim_env, LD_PRELOAD=str(shim), VCUDA_LEDGER=str(tmp_path / f"{name}.ledger"),
                   VCUDA_MEMORY_LIMIT=str(limit), **sim)
        made.append(Container(name, limit, env, cuprobe))
        return made[-1]

    yield make
    for c in made:
        for p in c.probes:
            p.close()


def started(c: Container, door: str = "proc", *flags: str) -> StepProbe:
    probe = c.start(door, *flags)
    c.ok(probe, "init", "ctx")
    return probe


def churn(c: Container, probe: StepProbe, rng: random.Random, steps: int, held: list[int],
          after_step: Callable[[], None] = lambda: None) -> dict[str, int]:
    """Stream-ordered allocations of mixed sizes and frees in random order: the pool
    fragments (freed extents only merge within a chunk). Returns what was seen."""
    seen = {"refused": 0, "allocated": 0, "cached_max": 0}
    for i in range(steps):
        if held and (rng.random() < 0.45 or len(held) > 40):
            k = rng.randrange(len(held))
            assert c.step(probe, f"drop:{k}")["rc"] == "0"
            held[k] = held[-1]
            held.pop()
        else:
            size = rng.choice([1, 3, 7, 12, 20, 33, 48]) * MiB + rng.randrange(1, 4096)
            rc = int(c.step(probe, f"async:{size}")["rc"])
            assert rc in (0, 2), f"async:{size} -> {rc}"
            if rc == 0:
                held.append(size)
                seen["allocated"] += 1
            else:
                seen["refused"] += 1
        if i % 40 == 39:
            c.step(probe, "sync")
        physical, _ = c.check(f"step {i}")
        live = sum((s + 511) // 512 * 512 for s in held)
        seen["cached_max"] = max(seen["cached_max"], physical - OVERHEAD - live)
        after_step()
    return seen


def test_pool_churn_with_threshold_max_and_fragmentation(container: MakeContainer) -> None:
    c = container(512 * MiB)
    probe = started(c)
    assert c.step(probe, f"threshold:{UINT64_MAX}")["rc"] == "0"
    held: list[int] = []
    seen = churn(c, probe, random.Random(12), 250, held)
    # The scenario did what it is for: the pool held far more than the live
    # allocations (per-pointer charging would have let the device run past the
    # ledger), and the quota was reached.
    assert seen["cached_max"] > 2 * CHUNK, seen
    assert seen["refused"] > 0 and seen["allocated"] > 50, seen
    assert c.step(probe, "freeall")["rc"] == "0"
    assert c.step(probe, "trim:0")["rc"] == "0"
    assert c.check("trim") == (OVERHEAD, OVERHEAD)  # nothing left behind either side


def test_rmm_style_priming_and_trim_before_deny(container: MakeContainer) -> None:
    c = container(GiB)
    probe = started(c)
    assert c.step(probe, "mkpool")["rc"] == "0"
    assert c.step(probe, f"threshold:{UINT64_MAX}")["rc"] == "0"
    free = int(c.step(probe, "info")["free"])
    assert free == GiB - OVERHEAD
    assert c.step(probe, f"palloc:{free // 2}")["rc"] == "0"    # prime: half of what is free...
    assert c.step(probe, "drop:0")["rc"] == "0"                  # ...and free it: the pool keeps it
    pool = c.step(probe, "poolattr")
    reserved = int(pool["reserved"])
    assert reserved >= free // 2 and int(pool["used"]) == 0
    assert c.check("primed") == (OVERHEAD + reserved, OVERHEAD + reserved)
    # Allocations from the primed pool take no new device memory, and at most
    # one growth unit more of the quota.
    assert c.step(probe, f"palloc:{16 * MiB}")["rc"] == "0"
    physical, charged = c.check("palloc")
    assert physical == OVERHEAD + reserved and charged <= physical + CHUNK
    assert c.step(probe, "drop:0")["rc"] == "0"
    # A plain allocation the quota holds only without the pool's cache: trim before deny.
    assert c.step(probe, f"alloc:{GiB - OVERHEAD - 16 * MiB}")["rc"] == "0"
    assert int(c.step(probe, "poolattr")["reserved"]) == 0
    assert c.check("after trim") == (GiB - 16 * MiB, GiB - 16 * MiB)
    # Now nothing is cached: one byte over is refused.
    assert c.step(probe, f"alloc:{16 * MiB + 1}")["rc"] == "2"


MODULE = "vcudasim-module;kernel big local=64Ki;kernel mid local=5Ki;kernel small local=512"


def test_big_frame_kernel_under_a_small_quota(container: MakeContainer) -> None:
    c = container(256 * MiB, VCUDA_SIM_SMS=str(SMS), VCUDA_SIM_THREADS_PER_SM=str(THREADS_PER_SM))
    probe = started(c)
    assert c.step(probe, f"mod:{MODULE}")["rc"] == "0"
    # 63 KiB more per thread is 1008 MiB: refused at lookup, so never launched.
    assert c.step(probe, "func:big")["rc"] == "2"
    assert c.check("func:big") == (OVERHEAD, OVERHEAD)
    assert c.step(probe, "func:mid")["rc"] == "0"                 # 4 KiB more: 64 MiB
    assert c.check("func:mid") == (OVERHEAD, OVERHEAD + 4 * PER_KIB)
    assert c.step(probe, "launch:1")["rc"] == "0"
    assert c.check("launch") == (OVERHEAD + 4 * PER_KIB, OVERHEAD + 4 * PER_KIB)
    assert c.step(probe, "func:small")["rc"] == "0"               # below the high-water mark
    # The same through the library door CUDA 12+ runtimes use.
    assert c.step(probe, f"lib:{MODULE}")["rc"] == "0"
    assert c.step(probe, "kernel:big")["rc"] == "2"
    c.ok(probe, "kernel:mid", "klaunch:1", "kfunc")
    assert c.check("library") == (OVERHEAD + 4 * PER_KIB, OVERHEAD + 4 * PER_KIB)


STACK, FIFO, HEAP, PENDING = 0, 1, 2, 4


def test_context_limits_raised_and_refunded(container: MakeContainer) -> None:
    c = container(256 * MiB, VCUDA_SIM_SMS=str(SMS), VCUDA_SIM_THREADS_PER_SM=str(THREADS_PER_SM))
    probe = started(c)
    assert c.step(probe, f"setlimit:{STACK}:{9 * 1024}")["rc"] == "0"
    assert c.check("stack 9Ki") == (OVERHEAD + 8 * PER_KIB, OVERHEAD + 8 * PER_KIB)
    assert c.step(probe, f"setlimit:{STACK}:{20 * 1024}")["rc"] == "2"   # 304 MiB more: refused
    assert c.step(probe, f"getlimit:{STACK}")["value"] == str(9 * 1024)  # and nothing changed
    assert c.step(probe, f"setlimit:{STACK}:1024")["rc"] == "0"
    assert c.check("stack back") == (OVERHEAD, OVERHEAD)
    for limit, base, more, unit in ((HEAP, 8 * MiB, 64 * MiB, 1), (FIFO, MiB, 32 * MiB, 1),
                                    (PENDING, 2048, 16384, 2048)):
        assert c.step(probe, f"setlimit:{limit}:{base + more}")["rc"] == "0"
        assert c.check(f"limit {limit} up") == (OVERHEAD + more * unit, OVERHEAD + more * unit)
        assert c.step(probe, f"setlimit:{limit}:{base + 4 * GiB // unit}")["rc"] == "2"
        assert c.step(probe, f"getlimit:{limit}")["value"] == str(base + more)
        assert c.step(probe, f"setlimit:{limit}:{base}")["rc"] == "0"
        assert c.check(f"limit {limit} down") == (OVERHEAD, OVERHEAD)
    # Lowering the stack below a frame already obtained: the next launch takes
    # the frame again, so its charge stays.
    c.ok(probe, f"mod:{MODULE}", "func:mid", "launch:1", f"setlimit:{STACK}:1024")
    assert c.check("stack below frame") == (OVERHEAD, OVERHEAD + 4 * PER_KIB)
    assert c.step(probe, "launch:1")["rc"] == "0"
    assert c.check("relaunch") == (OVERHEAD + 4 * PER_KIB, OVERHEAD + 4 * PER_KIB)


def capture_graph(c: Container, probe: StepProbe, allocs: list[str]) -> None:
    assert c.step(probe, "capture")["rc"] == "0"
    for command in allocs:
        assert c.step(probe, command)["rc"] == "0"
    assert c.step(probe, "endcapture")["rc"] == "0"


def test_capture_loop_relaunch_destroy_trim(container: MakeContainer) -> None:
    c = container(512 * MiB)
    probe = started(c)
    assert c.step(probe, "stream")["rc"] == "0"
    footprint = 96 * MiB  # peak of live captured allocations: 64 + 32, then 80 alone
    for round_ in range(4):
        capture_graph(c, probe, [f"calloc:{64 * MiB}", f"calloc:{32 * MiB}", "cfree", "cfree",
                                 f"calloc:{80 * MiB}", "cfree"])
        assert int(c.step(probe, "poolattr")["reserved"]) == 0  # graph memory is not pool growth
        assert c.step(probe, "instantiate:2" if round_ == 3 else "instantiate")["rc"] == "0"
        assert c.check("instantiate")[1] == OVERHEAD + footprint
        assert c.step(probe, "glaunch")["rc"] == "0"
        assert c.step(probe, "graphtrim")["rc"] == "0"  # unmaps the idle graph...
        assert c.check("trim live graph")[0] == OVERHEAD
        assert c.step(probe, "glaunch")["rc"] == "0"   # ...which maps again at its next launch
        c.ok(probe, "glaunch", "execdestroy", "graphdestroy")
        # The reserve outlives the graph until trimmed.
        assert c.check("destroyed") == (OVERHEAD + footprint, OVERHEAD + footprint)
        if round_ % 2:
            assert c.step(probe, "graphtrim")["rc"] == "0"
            assert c.check("trimmed") == (OVERHEAD, OVERHEAD)
    # A graph whose memory does not fit is refused when instantiated, mapping nothing.
    capture_graph(c, probe, [f"calloc:{512 * MiB}", "cfree"])
    assert c.step(probe, "instantiate")["rc"] == "2"
    assert c.step(probe, "graphdestroy")["rc"] == "0"
    assert c.check("refused") == (OVERHEAD, OVERHEAD)
    # Graphs built node by node: charged in full. Allocations the graph does not
    # free outlive it (until cuMemFree), and a trim leaves them.
    c.ok(probe, "graphnew", f"graphalloc:{100 * MiB}", f"graphalloc:{100 * MiB}", "instantiate", "glaunch",
         "execdestroy", "graphtrim")
    assert c.check("end") == (OVERHEAD + 200 * MiB, OVERHEAD + 200 * MiB)


# The doors a legacy ABI comes through: cuGetProcAddress (4 arguments, as below 12000) and
# cuGetProcAddress_v2 asked at the legacy versions, with and without the per-thread flag, and dlsym.
LEGACY_DOORS = [("proc", "--cuda-version=11040"), ("proc", "--cuda-version=13000", "--ptds"), ("dlsym",),
                ("dlsym", "--ptds")]


@pytest.mark.parametrize("door", LEGACY_DOORS, ids=" ".join)
def test_legacy_abis_are_charged_like_their_v2(container: MakeContainer, door: tuple[str, ...]) -> None:
    """The legacy cuStreamBeginCapture(_ptsz) (below 10010), cuGraphInstantiate and
    cuDevicePrimaryCtxRelease/Reset (below 11000), as a runtime asking for an old
    cudaVersion gets them: a capture begun with one is followed, a graph instantiated
    with one is charged, a primary context released or reset with one is refunded."""
    c = container(512 * MiB)
    probe = started(c, *door)
    assert c.step(probe, "stream")["rc"] == "0"
    footprint = 96 * MiB
    for begin, instantiate in (("lcapture", "instantiate"), ("capture", "linstantiate")):
        c.ok(probe, begin, f"calloc:{64 * MiB}", f"calloc:{32 * MiB}", "cfree", "cfree", "endcapture",
             instantiate)
        assert c.check(f"{begin} {instantiate}")[1] == OVERHEAD + footprint
        c.ok(probe, "glaunch", "execdestroy", "graphdestroy", "graphtrim")
        assert c.check("trimmed") == (OVERHEAD, OVERHEAD)
    c.ok(probe, f"alloc:{8 * MiB}", "lrelease:0")
    assert c.check("released") == (0, 0)
    c.ok(probe, "ctx", f"alloc:{8 * MiB}", "lreset:0")
    assert c.check("reset") == (0, 0)
    assert "does not know" not in probe.stderr()


def test_shared_memory_is_charged_once_at_its_creator(container: MakeContainer) -> None:
    c = container(GiB)
    creator, peer = started(c), started(c)
    exported = c.step(creator, f"vmmexport:{256 * MiB}")
    assert exported["rc"] == "0"
    assert c.step(peer, f"import:{exported['pid']}:{exported['fd']}:{256 * MiB}")["rc"] == "0"
    assert c.check("import") == (2 * OVERHEAD + 256 * MiB, 2 * OVERHEAD + 256 * MiB)
    assert c.step(creator, f"alloc:{128 * MiB}")["rc"] == "0"
    handle = c.step(creator, "ipcget")
    assert handle["rc"] == "0"
    assert c.step(peer, f"ipcopen:{handle['handle']}")["rc"] == "0"
    assert c.check("ipc") == (2 * OVERHEAD + 384 * MiB, 2 * OVERHEAD + 384 * MiB)
    with Ledger(c.env["VCUDA_LEDGER"]) as ledger:
        slots = {p.pid: p.used[0] for p in ledger.processes()}
    assert slots == {creator.pid: OVERHEAD + 384 * MiB, peer.pid: OVERHEAD}


def test_one_containers_pool_never_fails_anothers_allocation(container: MakeContainer) -> None:
    """The device holds exactly both quotas: if A's pool ever held more than A's
    quota, B's allocation within its own would fail."""
    device = {"VCUDA_SIM_MEMORY": str(GiB)}
    a, b = container(512 * MiB, "a", **device), container(512 * MiB, "b", **device)
    pb = started(b)
    mine = 512 * MiB - OVERHEAD
    assert b.step(pb, f"alloc:{mine}")["rc"] == "0"
    pa = started(a)
    assert a.step(pa, f"threshold:{UINT64_MAX}")["rc"] == "0"
    steps = {"n": 0}

    def b_reallocates() -> None:
        steps["n"] += 1
        if steps["n"] % 10 == 0:
            assert b.step(pb, "drop:0")["rc"] == "0"
            assert b.step(pb, f"alloc:{mine}")["rc"] == "0", "B's in-quota allocation failed"

    seen = churn(a, pa, random.Random(7), 250, [], after_step=b_reallocates)
    assert seen["refused"] > 0 and seen["cached_max"] > CHUNK, seen


def test_unreported_attributes_are_charged_at_their_upper_bound(container: MakeContainer, build_c: BuildC,
                                                                 lib_dir: Path) -> None:
    """A driver that will not report a function's local size or a pool's reservation:
    the shim charges the upper bound and says so once, never runs unlimited."""
    mute = build_c(["mute_driver.c"], flags=["-shared", "-fPIC"],
                   libs=[f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", "-Wl,--no-as-needed", f"-l:{native.SIM_CUDA}"])
    c = container(GiB, VCUDA_REAL_LIBCUDA=str(mute))
    probe = started(c, door="dlsym")
    # Any frame may be up to 512 KiB per thread: no quota holds that for 132 x 2048 threads.
    assert c.step(probe, f"mod:{MODULE}")["rc"] == "0"
    assert c.step(probe, "func:small")["rc"] == "2"
    assert c.check("func") == (OVERHEAD, OVERHEAD)
    # Each allocation's whole allowance is taken as pool growth, and nothing is ever
    # given back on a guess: the quota runs out, the device never runs past it.
    results = []
    for _ in range(40):
        results.append(int(c.step(probe, f"async:{MiB}")["rc"]))
        if results[-1] == 0:
            c.ok(probe, "drop:0", "sync")
    assert results[:29] == [0] * 29 and results[-1] == 2, results
    stderr = probe.stderr()
    for what in ("a function's local memory size", "a memory pool's reservation"):
        assert stderr.count(f"does not report {what}") == 1, stderr
