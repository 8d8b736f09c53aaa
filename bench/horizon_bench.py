"""Requests and limits at every horizon (issue 31), on the GPU simulator: the
policy before issue 31 (`--short-horizon off`, the window alone) and the new
one (`--short-horizon on`, the default) side by side, scenario by scenario.

Each tenant is bench/c/workload.c `train` (2 ms kernels, 10 launches between
synchronizes) under libvcuda with its own scheduler endpoint; one
token_scheduler daemon (window 10 s, the default) decides. Scenarios:

  steady          A 50/50 and B 13/13, both busy from the start
  idle-then-busy  A busy; B 13/13 registered with it, idle 20 s (two windows), then busy
  fresh           A busy 20 s; then B 13/13 registered and busy at once
  elastic         B 13 request, 60 limit, busy; A 50/50 registered, idle 20 s, then busy
  three           20/20, 30/30 and 50/50, all busy
  pair            30/30 and 60/60, both busy (the monitoring tests' loaded GPU)

Per tenant, from 1 s after it starts to 1 s before the end (GPU time the
simulator served it, exactly when it was served: the simulator's service
stretches of the process, read every 10 ms; samples of its busy time,
interpolated in between, only for a tenant whose stretches were not all read,
and counted; a sample whose read took over 1 ms is dropped, its time too
uncertain, and counted too. Interpolated, a 13 % tenant's leases of 13 ms
every 100 ms, exactly, read as 11.6-12.0 % in its worst 100 ms and 13.8-14.4 in
its best): the lowest and highest share over
any 1 s and any 100 ms interval, its share over the last 10 s, and its shares
of each of its first 6 seconds; per run the scheduler's grants (renewals
included) per second, its CPU time per second, and the share of the run the token
sat free while tenants waited, every one held back by its limit or horizons (the
scheduler's `held_back_ms`). Per tenant too, its token time over the same last
10 s as the scheduler charged it (what the policy holds to request and limit),
and how much of that each lease lost on the GPU (wake-up, launch and release of
a lease, the process's own gaps): the GPU share is the token share less that.
And its lowest share of that token time over any 1 s and any 100 ms (the
scheduler's admin `charges`, read every 2 s): the leases the policy gave it.

Goals: highest share over 1 s <= limit + 1 pp, over 100 ms <= limit + 10 pp;
a tenant whose share is its request keeps >= request - 2 pp over any 1 s and
>= request / 2 over any 100 ms (checked on the intervals clear of the host's
hold-ups: the bench's own sampler thread woken 20 ms or more past its turn, a
shared machine's CPU taken from every process at once; each run's hold-ups are
printed, and a miss only where they were is listed apart, "the host's"; so
is a miss where the tenant's leases held its request goals at both horizons
with a point to spare (more than their handoffs lose) and its GPU time fell
short only inside them, both figures printed: the scheduler neither sees nor
decides what a holder's process leaves idle);
10 s shares within 1 pp of the old policy's;
per-second shares of a capped tenant within 2 pp of its limit after its first
second; grants/s and CPU at most 2x the old policy's.

`--fake-clock`: the same scenarios and figures for the policy alone on a fake
clock (token_scheduler/simulate.py: no overrun, no handoff cost, no noise;
what tests/token_scheduler/test_policy_horizons.py checks).

`--budget 10ms`: the scheduler's in-flight budget for both policies (default its own, 4 ms):
each lease ends up to that much off its quantum, which is what the worst seconds feel.

Run: python bench/horizon_bench.py [--runs 2] [--only steady,fresh] [--fake-clock] [--budget 10ms]
(also `python bench/compute_bench.py --horizons`), after `pip install .` or
with VCUDA_LIB_DIR and PYTHONPATH pointing at a build and the checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workload import Background, BusySampler, build, kill_all, scheduler  # noqa: E402

from py_vcuda.launch import Tenant, tenant_env  # noqa: E402
from py_vcuda.sim import SimConfig  # noqa: E402
from token_scheduler.admin_client import AdminClient  # noqa: E402
from token_scheduler.duration import parse_duration  # noqa: E402
from token_scheduler.policy import PolicyConfig  # noqa: E402
from token_scheduler.shares import cumulative, extreme_shares, share_between  # noqa: E402
from token_scheduler.simulate import SimTenant, Simulation  # noqa: E402

GPU_TRAIN = REPO / "bench" / "gpu_train.py"
LEASE_LINE = re.compile(r"quantum (?P<quantum>\d+) us, held (?P<held>\d+) us")
SECOND = 1_000_000_000
KERNEL_US, DEPTH = 2000, 10
SAMPLE_S = 0.01
POLICIES = ("off", "on")
# How far above a request goal a tenant's leases must be for a miss of its GPU time to be
# set apart as its own (`report`): its leases lose a few tenths of a millisecond each to their
# handoffs (printed per scenario), which is the system's cost, not the tenant's; the policy
# leaves a 13 % tenant a millisecond above half its request in every 100 ms for that
# (HALF_REQUEST_SPARE_NS). A miss whose leases held less than a point above the goal is a
# miss: a 50/50 tenant among three whose leases held 48.4 % in their worst second got 48.0.
LEASE_MARGIN_PP = 1.0


@dataclass(frozen=True)
class Load:
    name: str
    request: int
    limit: int
    register_s: float  # when it is added to the scheduler
    start_s: float  # when its process starts launching


SCENARIOS: dict[str, tuple[list[Load], float]] = {
    "steady": ([Load("A", 50, 50, 0, 0), Load("B", 13, 13, 0, 0)], 16),
    "idle-then-busy": ([Load("A", 50, 50, 0, 0), Load("B", 13, 13, 0, 20)], 32),
    "fresh": ([Load("A", 50, 50, 0, 0), Load("B", 13, 13, 20, 20)], 32),
    "elastic": ([Load("A", 50, 50, 0, 20), Load("B", 13, 60, 0, 0)], 32),
    "three": ([Load("A", 20, 20, 0, 0), Load("B", 30, 30, 0, 0), Load("C", 50, 50, 0, 0)], 16),
    "pair": ([Load("A", 30, 30, 0, 0), Load("B", 60, 60, 0, 0)], 16),
}


@dataclass
class Figures:
    one_s: tuple[float, float]  # lowest, highest share over any 1 s (percent)
    tenth_s: tuple[float, float]  # ... over any 100 ms
    last_10_s: float
    per_second: list[float]
    # The token time the scheduler charged it over the same 10 s, and its leases there
    # (None on the fake clock, where the two are the same): what the policy holds to its
    # request and limit; the GPU time above is that less what its handoffs cost.
    token_10_s: float | None = None
    leases_10_s: int = 0
    # The lowest share over any 1 s and any 100 ms that overlap no host hold-up (the bench's
    # own sampler not run for 20 ms or more past its turn): what the request goal is checked on.
    clear_lows: tuple[float, float] | None = None
    # The lowest share over any 1 s and any 100 ms of the token time the scheduler charged it
    # (its leases, from `charges`; None on the fake clock): where these meet its request and
    # its GPU time does not, the time went missing inside its own leases (their handoffs, its
    # process's synchronizes and wake-ups), which the scheduler neither sees nor decides.
    held_lows: tuple[float, float] | None = None


@dataclass
class Run:
    tenants: dict[str, Figures]
    grants_per_s: float
    cpu_percent: float | None  # the scheduler daemon's; None on the fake clock
    held_back_percent: float = 0.0  # the token free while every waiting tenant was held back
    samples_dropped: int = 0  # GPU time samples whose read took too long to time (BusySampler)
    stalls_ms: list[float] = field(default_factory=list)  # the daemon's turns held up by the host (its stats)
    held_up_ms: list[float] = field(default_factory=list)  # the bench's sampler held up by the host (BusySampler)
    interpolated: int = 0  # tenants whose GPU time is from samples: their service stretches were lost


Marks = list[tuple[int, dict[str, Any]]]  # (when, the scheduler's per-tenant stats then)


def charged_marks(admin: AdminClient, end: int) -> Marks:
    """The scheduler's per-tenant counters at both ends of the last 10 s that `figures`
    reads ([end - 11 s, end - 1 s]), waiting for each."""
    marks = []
    for at in (end - 11 * SECOND, end - SECOND):
        time.sleep(max(0.0, at / 1e9 - time.monotonic()))
        tenants = admin.call("stats")["tenants"]
        assert isinstance(tenants, dict)
        marks.append((time.monotonic_ns(), tenants))
    return marks


class ChargeReader(Background):
    """Reads the daemon's `charges` (every tenant's charged holds, within its 10 s window)
    every READ_S in a thread of its own with its own admin socket, and keeps them all:
    a run is longer than the window."""

    READ_S = 2.0
    JOIN_S = 10.0  # the last read may wait out an admin call's 5 s timeout

    def __init__(self, admin_path: str) -> None:
        self.admin_path = admin_path
        self.holds: dict[str, set[tuple[int, int]]] = {}
        self.failed: str | None = None  # why a read failed: the holds then have a hole
        super().__init__("charge-reader")

    def _run(self) -> None:
        client = AdminClient(self.admin_path)
        try:
            while True:
                stopping = self._stop.wait(self.READ_S)
                try:
                    reply = client.call("charges")
                except TimeoutError as exc:
                    self.failed = str(exc)
                    return
                for name, holds in dict(reply["tenants"]).items():  # type: ignore[call-overload]
                    self.holds.setdefault(name, set()).update((int(a), int(b)) for a, b in holds)
                if stopping:
                    return
        finally:
            client.close()

    def points(self, name: str) -> list[tuple[int, int]] | None:
        """(time, token time so far) of the tenant's holds, overlaps merged; None if a read failed."""
        if self.failed is not None:
            return None
        merged: list[tuple[int, int]] = []
        for start, end in sorted(self.holds.get(name, ())):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return cumulative(merged)


def add_held(figs: Figures, points: list[tuple[int, int]] | None, start: int, end: int) -> None:
    """The tenant's lowest shares of charged token time over any 1 s and any 100 ms."""
    if points is None:
        return
    figs.held_lows = (100 * extreme_shares(points, SECOND, start + SECOND, end)[0],
                      100 * extreme_shares(points, SECOND // 10, start + SECOND, end)[0])


def add_token(tenants: dict[str, Figures], marks: Marks) -> None:
    """Each tenant's token time over those 10 s, as the scheduler charged it, and its leases."""
    (t1, first), (t2, last) = marks
    for name, figs in tenants.items():
        a, b = first.get(name), last.get(name)
        if a is not None and b is not None:
            held_ms = float(b["held_ms_total"]) - float(a["held_ms_total"])
            figs.token_10_s = 100 * held_ms * 1e6 / (t2 - t1)
            figs.leases_10_s = int(b["grants"]) - int(a["grants"])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def clear_spans(start: int, end: int, held_up: list[tuple[int, int]], horizon: int) -> list[tuple[int, int]]:
    """The parts of [start, end] between host hold-ups that hold an interval of `horizon`."""
    spans, at = [], start
    for low, high in sorted(held_up):
        if high <= at or low >= end:
            continue
        if low - at >= horizon:
            spans.append((at, low))
        at = high
    if end - at >= horizon:
        spans.append((at, end))
    return spans


def figures(points: list[tuple[int, int]], start: int, end: int,
            held_up: list[tuple[int, int]] | None = None) -> Figures:
    """A tenant's figures from its (time, GPU time so far) points; it started at `start`.
    With `held_up`, the host's hold-ups of the bench: the lowest shares clear of them too."""
    one = extreme_shares(points, SECOND, start + SECOND, end)
    tenth = extreme_shares(points, SECOND // 10, start + SECOND, end)
    per = [share_between(points, start + i * SECOND, start + (i + 1) * SECOND) for i in range(6)]
    figs = Figures((100 * one[0], 100 * one[1]), (100 * tenth[0], 100 * tenth[1]),
                   100 * share_between(points, end - 10 * SECOND, end), [100 * p for p in per])
    if held_up:
        lows = []
        for horizon in (SECOND, SECOND // 10):
            spans = clear_spans(start + SECOND, end, held_up, horizon)
            # No interval clear of them at all: the lowest of all counts.
            lows.append(100 * min(extreme_shares(points, horizon, a, b)[0] for a, b in spans) if spans
                        else (figs.one_s if horizon == SECOND else figs.tenth_s)[0])
        figs.clear_lows = (lows[0], lows[1])
    return figs


def run_fake_clock(loads: list[Load], seconds: float, policy: str) -> Run:
    """The same scenario, the policy alone on the fake clock (token_scheduler.simulate):
    processes that hold exactly what they are lent, no overrun, no handoff cost."""
    config = PolicyConfig(short_horizon=policy == "on")
    specs = {load.name: SimTenant(load.name, load.request, load.limit, active_from=int(load.start_s * SECOND))
             for load in loads}
    sim = Simulation(config, [specs[x.name] for x in loads if x.register_s == 0], keep_grants=True)
    for load in sorted((x for x in loads if x.register_s > 0), key=lambda x: x.register_s):
        sim.run(int(load.register_s * SECOND))
        sim.add_tenant(specs[load.name])
    end = int(seconds * SECOND)
    result = sim.run(end)
    tenants = {load.name: figures(cumulative(result.hold[load.name]), int(load.start_s * SECOND), end - SECOND)
               for load in loads}
    return Run(tenants, len(result.grants) / seconds, None, 100 * sim.policy.held_back_ns / (seconds * SECOND))


def scheduler_flags(policy: str, record: Path | None, tag: str, budget: str | None = None) -> list[str]:
    """The daemon's flags: the policy, the in-flight budget when --budget sets one, and with
    --record its record for this run (this bench's own file name: a record of an earlier
    bench run there is replaced)."""
    flags = ["--short-horizon", policy] + (["--budget", budget] if budget else [])
    if record is None:
        return flags
    path = record / f"{tag}.jsonl"
    path.unlink(missing_ok=True)
    return [*flags, "--record", str(path)]


def run_scenario(exe: Path, tmp: Path, tag: str, loads: list[Load], seconds: float, policy: str,
                 record: Path | None = None, budget: str | None = None) -> Run:
    sim = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_") and k != "LD_PRELOAD"}
    sim.update(SimConfig(state_path=tmp / f"sim-{tag}").env())
    procs: dict[str, subprocess.Popen[bytes]] = {}
    with scheduler(*scheduler_flags(policy, record, tag, budget)) as (daemon, admin):
        try:
            with (BusySampler(Path(sim["VCUDA_SIM_STATE"]), SAMPLE_S, served=True) as sampler,
                  ChargeReader(admin.endpoint.removeprefix("ipc://")) as charges):
                t0 = time.monotonic_ns()
                cpu0 = cpu_seconds(daemon.pid)
                for load in sorted(loads, key=lambda x: x.register_s):
                    time.sleep(max(0.0, t0 / 1e9 + load.register_s - time.monotonic()))
                    reply = admin.call("add", tenant=load.name, request=load.request, limit=load.limit)
                    env = tenant_env(Tenant(), sim, tmp / f"{tag}-{load.name}.ledger")
                    env["VCUDA_SCHEDULER"] = str(reply["endpoint"])
                    delay = max(0.0, t0 / 1e9 + load.start_s - time.monotonic())
                    cmd = [str(exe), "train", str(KERNEL_US), str(DEPTH), str(seconds - load.start_s + 1)]
                    procs[load.name] = subprocess.Popen(["sh", "-c", f'sleep {delay:.3f}; exec "$@"', "-", *cmd],
                                                        env=env, stdout=subprocess.DEVNULL)
                end = t0 + int(seconds * SECOND)
                marks = charged_marks(admin, end)
                time.sleep(max(0.0, end / 1e9 - time.monotonic()) + 0.1)
                cpu = cpu_seconds(daemon.pid) - cpu0
                reply = admin.call("stats")
                stats = reply["tenants"]
        finally:
            kill_all(procs.values())
    tenants = {}
    interpolated = 0
    for load in loads:
        pid = procs[load.name].pid
        served = (sampler.served or {}).get(pid)
        if served is not None and not served.lost:
            points = served.points()
        else:
            points = [(t, busy.get(pid, 0)) for t, busy in sampler.samples]
            interpolated += 1
        tenants[load.name] = figures(points, t0 + int(load.start_s * SECOND), end - SECOND, sampler.held_up)
        add_held(tenants[load.name], charges.points(load.name), t0 + int(load.start_s * SECOND), end - SECOND)
    add_token(tenants, marks)
    grants = sum(s["grants"] + s["renewals"] for s in stats.values())
    return Run(tenants, grants / seconds, 100 * cpu / seconds, float(reply["held_back_ms"]) / seconds / 10,
               sampler.dropped, stalls_between(reply, t0, end), interpolated=interpolated,
               held_up_ms=[(b - a) / 1e6 for a, b in sampler.held_up if t0 <= b and a <= end])


def stalls_between(stats: dict[str, Any], t0: int, end: int) -> list[float]:
    """How long each of the daemon's stalls (turns the host held up 5 ms or more) in [t0, end]
    lasted, in ms: the daemon's clock is this process's CLOCK_MONOTONIC."""
    return [float(length) for at, length in stats.get("stalls", []) if t0 / 1e6 <= float(at) <= end / 1e6]


def calibrate_gpu() -> tuple[int, int]:
    """(spin iterations, nanoseconds) of a KERNEL_US kernel on this GPU, measured without the shim."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_") and k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, str(GPU_TRAIN), "calibrate", str(KERNEL_US)], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    reply = json.loads(out.stdout.splitlines()[-1])
    return int(reply["iters"]), int(reply["kernel_ns"])


def holds_past_leases(log: Path) -> list[float]:
    """Milliseconds each lease was held past its quantum, from the shim's debug log."""
    return [(int(m["held"]) - int(m["quantum"])) / 1000 for m in LEASE_LINE.finditer(log.read_text(errors="replace"))]


def run_gpu_scenario(kernel: tuple[int, int], tmp: Path, tag: str, loads: list[Load], seconds: float,
                     policy: str, logs: Path | None, record: Path | None = None, budget: str | None = None) -> Run:
    """The scenario on this machine's GPU: each tenant bench/gpu_train.py under libvcuda,
    its GPU time read from when each of its kernels ended (CUDA events)."""
    if any(load.register_s for load in loads):
        raise SystemExit("--gpu: tenants registered late (fresh) are not supported; use --only")
    base = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_") and k != "LD_PRELOAD"}
    procs: dict[str, subprocess.Popen[str]] = {}
    with scheduler(*scheduler_flags(policy, record, tag, budget)) as (daemon, admin):
        try:
            for load in loads:
                reply = admin.call("add", tenant=load.name, request=load.request, limit=load.limit)
                env = tenant_env(Tenant(log_level="debug" if logs else None), base, tmp / f"{tag}-{load.name}.ledger")
                env["VCUDA_SCHEDULER"] = str(reply["endpoint"])
                err = open(logs / f"{tag}-{load.name}.log", "w") if logs else subprocess.DEVNULL  # noqa: SIM115
                procs[load.name] = subprocess.Popen(
                    [sys.executable, str(GPU_TRAIN), "train", str(kernel[0]), str(kernel[1]), str(DEPTH)],
                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
            for name, proc in procs.items():
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != "ready":
                    raise SystemExit(f"--gpu: tenant {name}'s workload did not start (exit {proc.wait()})")
            t0 = time.monotonic_ns() + SECOND // 5
            end = t0 + int(seconds * SECOND)
            for load in loads:
                stdin = procs[load.name].stdin
                assert stdin is not None
                stdin.write(f"{t0 + int(load.start_s * SECOND)} {end}\n")
                stdin.flush()
            time.sleep(max(0.0, t0 / 1e9 - time.monotonic()))
            cpu0 = cpu_seconds(daemon.pid)
            with ChargeReader(admin.endpoint.removeprefix("ipc://")) as charges:
                marks = charged_marks(admin, end)
                time.sleep(max(0.0, end / 1e9 - time.monotonic()) + 0.1)
            cpu = cpu_seconds(daemon.pid) - cpu0
            reply = admin.call("stats")
            out = {name: proc.communicate(timeout=120)[0] for name, proc in procs.items()}
        finally:
            kill_all(procs.values())
    tenants = {}
    for load in loads:
        intervals = [(a, b) for a, b in json.loads(out[load.name].splitlines()[-1])["intervals"]]
        if logs:
            (logs / f"{tag}-{load.name}.intervals.json").write_text(json.dumps({"t0": t0, "intervals": intervals}))
        tenants[load.name] = figures(cumulative(intervals), t0 + int(load.start_s * SECOND), end - SECOND)
        add_held(tenants[load.name], charges.points(load.name), t0 + int(load.start_s * SECOND), end - SECOND)
    add_token(tenants, marks)
    grants = sum(s["grants"] + s["renewals"] for s in reply["tenants"].values())
    return Run(tenants, grants / seconds, 100 * cpu / seconds, float(reply["held_back_ms"]) / seconds / 10,
               stalls_ms=stalls_between(reply, t0, end))


def report_holds(logs: Path, name: str, loads: list[Load]) -> None:
    """How long each tenant held its leases past their end, per policy (the shim's debug log)."""
    for policy in POLICIES:
        for load in loads:
            past = sorted(x for f in sorted(logs.glob(f"{name}-{policy}-*-{load.name}.log"))
                          for x in holds_past_leases(f))
            if past:
                q = [past[min(len(past) - 1, int(p * len(past)))] for p in (0.1, 0.5, 0.9)]
                print(f"  holds past the lease, {policy:<4}{load.name}: {len(past)} leases, "
                      f"p10 {q[0]:.1f} / median {q[1]:.1f} / p90 {q[2]:.1f} / max {past[-1]:.1f} ms")


def span(pair: tuple[float, float]) -> str:
    return f"{pair[0]:5.1f}-{pair[1]:5.1f}"


def report(name: str, loads: list[Load], runs: dict[str, list[Run]], held_up: list[str],
           inside_leases: list[str]) -> list[str]:
    """The scenario's table, and the goals it missed under the new policy (a request missed
    only in intervals where the host held the bench up goes to `held_up`; one that the
    tenant's leases met, its GPU time short only inside them, to `inside_leases`)."""
    print(f"\n{name}: per tenant, old (--short-horizon off) | new (on); each figure: run 1 / run 2 ...")
    count = max(len(r) for r in runs.values())
    wide, narrow = max(30, 15 * count + 2), max(16, 7 * count + 2)  # "low-high / " a run, "last / "
    print(f"  {'tenant':<10}{'policy':<7}{'any 1 s: low-high':<{wide}}{'any 100 ms: low-high':<{wide}}"
          f"{'last 10 s':<{narrow}}per second, first 6 s (run 1)")
    missed = []
    for load in loads:
        for policy in POLICIES:
            figs = [r.tenants[load.name] for r in runs[policy]]
            print(f"  {load.name} {load.request}/{load.limit:<5}{policy:<7}"
                  f"{' / '.join(span(f.one_s) for f in figs):<{wide}}"
                  f"{' / '.join(span(f.tenth_s) for f in figs):<{wide}}"
                  f"{' / '.join(f'{f.last_10_s:.1f}' for f in figs):<{narrow}}"
                  f"{' '.join(f'{p:.0f}' for p in figs[0].per_second)}")
        for old, new in zip(runs["off"], runs["on"], strict=True):
            f, o = new.tenants[load.name], old.tenants[load.name]
            if f.one_s[1] > load.limit + 1 or f.tenth_s[1] > load.limit + 10:
                missed.append(f"{name} {load.name}: above its limit at a short horizon")
            if abs(f.last_10_s - o.last_10_s) > 1:
                missed.append(f"{name} {load.name}: 10 s share {f.last_10_s:.1f} vs {o.last_10_s:.1f} before")
            if load.request == load.limit and (f.one_s[0] < load.request - 2 or f.tenth_s[0] < load.request / 2):
                one, tenth = f.clear_lows or (f.one_s[0], f.tenth_s[0])
                leases = f.held_lows
                if one >= load.request - 2 and tenth >= load.request / 2:
                    held_up.append(f"{name} {load.name}: below its request only where the host held the bench "
                                   f"up (elsewhere {one:.1f} % over 1 s, {tenth:.1f} over 100 ms)")
                elif (leases is not None and leases[0] >= load.request - 2 + LEASE_MARGIN_PP
                      and leases[1] >= load.request / 2 + LEASE_MARGIN_PP):
                    inside_leases.append(
                        f"{name} {load.name}: GPU time {f.one_s[0]:.1f} % in its worst 1 s, {f.tenth_s[0]:.1f} in its "
                        f"worst 100 ms; its leases held {leases[0]:.1f} and {leases[1]:.1f} at the least")
                else:
                    missed.append(f"{name} {load.name}: below its request at a short horizon")
            if load.request == load.limit and any(abs(p - load.limit) > 2 for p in f.per_second[1:]):
                missed.append(f"{name} {load.name}: per-second share off its limit")
    for policy in POLICIES:
        token = []
        for load in loads:
            figs = [r.tenants[load.name] for r in runs[policy]]
            charged = [f.token_10_s for f in figs if f.token_10_s is not None]
            if len(charged) == len(figs):
                # Token time the tenant's leases did not turn into GPU work, in ms a lease (one
                # point of 10 s is 100 ms): each lease's wake-up, launch and release, and its
                # process's own gaps (its synchronizes). A lease is a grant: a renewal extends
                # one without a handoff (the window policy's elastic leases, renewed for
                # seconds, lose several ms each by this count).
                cost = [100 * (c - f.last_10_s) / max(1, f.leases_10_s) for c, f in zip(charged, figs, strict=True)]
                token.append(f"{load.name} {' / '.join(f'{c:.1f}' for c in charged)}"
                             f" ({' / '.join(f'{c:.2f}' for c in cost)} ms a lease)")
        if token:
            print(f"  token {policy:<4}    last 10 s, as the scheduler charged it (and what a lease lost of it "
                  f"on the GPU): {', '.join(token)}")
    for policy in POLICIES:
        lows = []
        for load in loads:
            held = [f.held_lows for r in runs[policy] if (f := r.tenants[load.name]).held_lows is not None]
            if len(held) == len(runs[policy]):
                lows.append(f"{load.name} {' / '.join(f'{a:.1f} {b:.1f}' for a, b in held)}")
        if lows:
            print(f"  leases {policy:<4}   lowest share of the token time the scheduler charged, any 1 s and any "
                  f"100 ms: {', '.join(lows)}")
    for policy in POLICIES:
        cpu = [f"{r.cpu_percent:.2f}" for r in runs[policy] if r.cpu_percent is not None]
        held_back = " / ".join(f"{r.held_back_percent:.1f}" for r in runs[policy])
        print(f"  scheduler {policy:<4} grants/s {' / '.join(f'{r.grants_per_s:.1f}' for r in runs[policy])}"
              + (f", CPU {' / '.join(cpu)} %" if cpu else "")
              + f", token free, all waiting held back {held_back} %"
              + f", samples dropped {' / '.join(str(r.samples_dropped) for r in runs[policy])}"
              + f", tenants interpolated {' / '.join(str(r.interpolated) for r in runs[policy])}"
              + ", scheduler stalls of 5 ms or more " + " / ".join(
                  f"{len(r.stalls_ms)}" + (f" (longest {max(r.stalls_ms):.0f} ms)" if r.stalls_ms else "")
                  for r in runs[policy])
              + ", host hold-ups of the bench " + " / ".join(
                  f"{len(r.held_up_ms)}" + (f" (longest {max(r.held_up_ms):.0f} ms)" if r.held_up_ms else "")
                  for r in runs[policy]))
    for old, new in zip(runs["off"], runs["on"], strict=True):
        if new.grants_per_s > 2 * old.grants_per_s:
            missed.append(f"{name}: grants/s {new.grants_per_s:.1f} > 2x {old.grants_per_s:.1f}")
        if new.cpu_percent is not None and old.cpu_percent is not None and new.cpu_percent > 2 * old.cpu_percent:
            missed.append(f"{name}: scheduler CPU {new.cpu_percent:.2f} % > 2x {old.cpu_percent:.2f} %")
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="runs of each scenario and policy (default 2)")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--fake-clock", action="store_true",
                        help="the policy alone on a fake clock (exact, in a second) instead of the simulator")
    parser.add_argument("--gpu", action="store_true",
                        help="on this machine's real GPU (CuPy), each tenant's GPU time from its kernels' CUDA "
                             "events, instead of the simulator; scenarios whose tenants all register at once")
    parser.add_argument("--shim-log", type=Path, metavar="DIR",
                        help="with --gpu: keep each tenant's libvcuda debug log and its kernels' times in DIR, "
                             "and print how long it held its leases past their end")
    parser.add_argument("--budget", metavar="DURATION",
                        help="the scheduler's in-flight budget (`vcuda scheduler --budget`, e.g. 10ms) for both "
                             "policies; default: the scheduler's own (4ms)")
    parser.add_argument("--record", type=Path, metavar="DIR",
                        help="keep each run's scheduler record in DIR (SCENARIO-POLICY-RUN.jsonl), to see "
                             "afterwards why a share fell short: python -m token_scheduler.replay FILE --free")
    args = parser.parse_args(argv)
    if args.shim_log and not args.gpu:
        parser.error("--shim-log needs --gpu")
    if args.record and args.fake_clock:
        parser.error("--record records a scheduler daemon: not with --fake-clock")
    if args.budget and args.fake_clock:
        parser.error("--budget is the scheduler daemon's: not with --fake-clock (no in-flight work there)")
    if args.budget:
        try:
            parse_duration(args.budget)
        except ValueError as exc:
            parser.error(f"--budget: {exc}")
    if args.record:
        args.record.mkdir(parents=True, exist_ok=True)
    names = args.only.split(",")
    if unknown := [n for n in names if n not in SCENARIOS]:
        parser.error(f"unknown scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    missed: list[str] = []
    held_up: list[str] = []
    inside_leases: list[str] = []
    with tempfile.TemporaryDirectory(prefix="vcuda-bench-") as d:
        tmp = Path(d)
        exe = None if args.fake_clock or args.gpu else build(tmp)
        kernel = calibrate_gpu() if args.gpu else None
        if kernel:
            print(f"GPU spin kernel: {kernel[0]} iterations, {kernel[1] / 1000:.0f} us")
            if args.shim_log:
                args.shim_log.mkdir(parents=True, exist_ok=True)
        for name in names:
            loads, seconds = SCENARIOS[name]
            runs = {}
            for policy in POLICIES:
                if kernel:
                    runs[policy] = [run_gpu_scenario(kernel, tmp, f"{name}-{policy}-{i}", loads, seconds, policy,
                                                     args.shim_log, args.record, args.budget)
                                    for i in range(args.runs)]
                elif exe is None:  # deterministic: one run
                    runs[policy] = [run_fake_clock(loads, seconds, policy)]
                else:
                    runs[policy] = [run_scenario(exe, tmp, f"{name}-{policy}-{i}", loads, seconds, policy,
                                                 args.record, args.budget) for i in range(args.runs)]
            missed += report(name, loads, runs, held_up, inside_leases)
            if args.shim_log:
                report_holds(args.shim_log, name, loads)
    print("\ngoals (new policy): " + ("all met" if not missed else "MISSED:\n  " + "\n  ".join(missed)))
    if held_up:
        print("not counted, the host's:\n  " + "\n  ".join(held_up))
    if inside_leases:
        print("not counted, the scheduler's leases met the request and the GPU time fell short inside them "
              "(their handoffs, the tenant's own synchronizes and wake-ups):\n  " + "\n  ".join(inside_leases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
