"""Discrete-event simulation of tenants driving the policy on a fake clock.

Used by the property tests and by bench/scheduler_bench.py's share table:
each simulated process behaves like the libvcuda token client (request,
hold for its burst or its quantum, release with held time, re-request; on a
revocation, release after draining at most `drain_ns` of its work, asking
again if it has more). Handoffs cost `handoff_ns` of idle GPU time (0 = ideal).
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

from .errors import PolicyError
from .policy import MS, Grant, Policy, PolicyConfig
from .shares import cumulative, extreme_shares


class FakeClock:
    """Monotonic nanoseconds that only move when told to."""

    def __init__(self, start: int = 0) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        if ns < 0:
            raise ValueError("time runs forward")
        self.now += ns

    def set(self, t: int) -> None:
        self.now = max(self.now, t)


@dataclass
class SimTenant:
    """A tenant's load: `burst_ns` None means always busy (saturating)."""

    name: str
    request: int
    limit: int
    burst_ns: int | None = None
    idle_ns: int = 0
    processes: int = 1
    active_from: int = 0
    active_until: int | None = None
    overrun_ns: int = 0  # extra GPU time after each cut-short quantum
    priority: str = "normal"
    drain_ns: int = 0  # in-flight work left when its lease is revoked


@dataclass
class _Proc:
    tenant: SimTenant
    client: bytes
    remaining: int = 0  # work left in the current burst


@dataclass
class SimResult:
    duration_ns: int
    hold: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    max_wait_ns: dict[str, int] = field(default_factory=dict)
    grants: list[Grant] = field(default_factory=list)

    def share(self, name: str, start: int, end: int) -> float:
        """Fraction of [start, end) the tenant held the GPU."""
        busy = sum(
            max(0, min(e, end) - max(s, start)) for s, e in self.hold.get(name, [])
        )
        return busy / (end - start)

    def extreme_shares(self, name: str, horizon: int, start: int, end: int) -> tuple[float, float]:
        """(lowest, highest) fraction the tenant held the GPU over any `horizon` in [start, end]."""
        return extreme_shares(cumulative(self.hold.get(name, [])), horizon, start, end)


class Simulation:
    """Runs tenants against a Policy; `run(until)` may be called repeatedly."""

    def __init__(
        self,
        config: PolicyConfig,
        tenants: list[SimTenant],
        handoff_ns: int = 0,
        keep_grants: bool = False,
    ) -> None:
        self.clock = FakeClock()
        self.policy = Policy(config, self.clock)
        self.handoff_ns = handoff_ns
        self.keep_grants = keep_grants
        self.result = SimResult(0)
        # (at, seq, kind, process, lease id the event ends; 0 for a wake)
        self._events: list[tuple[int, int, str, _Proc, int]] = []
        self._seq = 0
        self._waiting_since: dict[bytes, int] = {}
        self._holders: dict[bytes, Grant] = {}
        self._procs: dict[bytes, _Proc] = {}
        for spec in tenants:
            self.add_tenant(spec)

    def add_tenant(self, spec: SimTenant) -> None:
        """Register a tenant now (its processes start at `active_from`, or now if later)."""
        self.policy.add_tenant(spec.name, spec.request, spec.limit, spec.priority)
        self.result.hold[spec.name] = []
        self.result.max_wait_ns[spec.name] = 0
        for index in range(spec.processes):
            proc = _Proc(spec, f"{spec.name}/{index}".encode())
            self._procs[proc.client] = proc
            self._push(max(spec.active_from, self.clock.now), "wake", proc)

    def _push(self, at: int, kind: str, proc: _Proc, lease_id: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, kind, proc, lease_id))

    def _wake(self, proc: _Proc) -> None:
        spec = proc.tenant
        if spec.active_until is not None and self.clock.now >= spec.active_until:
            return
        if spec.name not in self.policy.tenants:
            return
        proc.remaining = spec.burst_ns if spec.burst_ns is not None else 1 << 62
        self.policy.request(spec.name, proc.client, 0)
        self._waiting_since[proc.client] = self.clock.now

    def _finish(self, proc: _Proc, grant: Grant) -> None:
        """The holder stops: burst done, or quantum used (then it wants more)."""
        spec = proc.tenant
        held = self.clock.now - grant.granted_at
        proc.remaining -= held
        more = proc.remaining > 0
        if more and spec.active_until is not None and self.clock.now >= spec.active_until:
            more = False
        self.result.hold[spec.name].append((grant.granted_at, self.clock.now))
        del self._holders[proc.client]
        try:
            self.policy.release(spec.name, proc.client, grant.lease_id, held, more)
        except PolicyError:
            return  # tenant removed meanwhile
        if more:
            self._waiting_since[proc.client] = self.clock.now
        elif spec.burst_ns is not None:
            self._push(self.clock.now + spec.idle_ns, "wake", proc)

    def _start(self, grant: Grant) -> None:
        proc = self._procs[grant.client]
        since = self._waiting_since.pop(grant.client, grant.granted_at)
        name = grant.tenant
        self.result.max_wait_ns[name] = max(self.result.max_wait_ns[name], grant.granted_at - since)
        if self.keep_grants:
            self.result.grants.append(grant)
        self._holders[proc.client] = grant
        work = min(proc.remaining, grant.quantum_ns)
        if proc.remaining > grant.quantum_ns:
            work += proc.tenant.overrun_ns  # its last kernel runs past the quantum
        self._push(self.clock.now + work, "done", proc, grant.lease_id)

    def run(self, until: int) -> SimResult:
        """Advance the simulation to `until` (ns of fake time)."""
        while True:
            grant = self.policy.dispatch()
            if grant is not None:
                self._start(grant)
                continue
            revoke = self.policy.preempt()
            if revoke is not None:  # the holder stops launching and releases once drained
                proc = self._procs[revoke.client]
                work_left = min(proc.remaining - (self.clock.now - self._holders[proc.client].granted_at),
                                proc.tenant.drain_ns)
                self._push(self.clock.now + max(0, work_left), "done", proc, revoke.lease_id)
            at = self._events[0][0] if self._events else None
            deadline = self.policy.next_deadline()
            if deadline is not None and (at is None or deadline < at):
                at = deadline
            if at is None or at > until:
                self.clock.set(until)
                self.result.duration_ns = until
                return self.result
            self.clock.set(at)
            while self._events and self._events[0][0] <= self.clock.now:
                _, _, kind, proc, lease_id = heapq.heappop(self._events)
                if kind == "wake":
                    self._wake(proc)
                elif proc.client in self._holders and self._holders[proc.client].lease_id == lease_id:
                    self._finish(proc, self._holders[proc.client])
                    if self.handoff_ns:
                        self.clock.advance(self.handoff_ns)


class ScriptedOverruns(Simulation):
    """Each tenant's holds end past (or, negative, short of) its leases by its own script of
    overruns (`scripts[name]`, ns, in turn): a process whose work drains past its lease's end
    or that pauses before it. A hold lasts at least 1 ms."""

    def __init__(self, config: PolicyConfig, tenants: list[SimTenant], scripts: dict[str, list[int]],
                 handoff_ns: int = 0, keep_grants: bool = False) -> None:
        self._turns = {name: itertools.cycle(script) for name, script in scripts.items()}
        super().__init__(config, tenants, handoff_ns, keep_grants)

    def _start(self, grant: Grant) -> None:
        quantum = grant.quantum_ns
        self._procs[grant.client].tenant.overrun_ns = max(MS, quantum + next(self._turns[grant.tenant])) - quantum
        super()._start(grant)

def random_mix(rng: random.Random) -> tuple[list[tuple[int, int]], list[bool]]:
    """2..5 tenants, requests adding up to 100 or a little less, each limit its request,
    100 or between; the first busy, the others busy or idle."""
    n = rng.randint(2, 5)
    cuts = sorted(rng.sample(range(1, 100), n - 1))
    requests = [b - a for a, b in zip([0, *cuts], [*cuts, 100], strict=True)]
    spare = rng.randint(0, n - 1)
    requests = [max(1, r - 1) if i < spare else r for i, r in enumerate(requests)]
    limits = [rng.choice([r, 100, rng.randint(r, 100)]) for r in requests]
    return list(zip(requests, limits, strict=True)), [True] + [rng.random() < 0.5 for _ in requests[1:]]


def mix_tenants(quotas: list[tuple[int, int]], busy: list[bool], window_ns: int) -> list[SimTenant]:
    """`random_mix`'s tenants t0, t1, ...: a busy one always has work, an idle one runs a
    1 ms burst at the start and idles for ten windows."""
    return [SimTenant(f"t{i}", r, lim, burst_ns=None if b else MS, idle_ns=10 * window_ns)
            for i, ((r, lim), b) in enumerate(zip(quotas, busy, strict=True))]


def with_high_tenant(rng: random.Random, quotas: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], SimTenant]:
    """A `high` inference-like tenant "h" beside `random_mix`'s quotas: request 3-20, limit
    100, bursts of 1-5 ms with idle between that keep its use within its request; the
    others' requests scaled down to leave room for it (a limit equal to its request stays so)."""
    request = rng.randint(3, 20)
    burst = rng.randint(1, 5) * MS
    idle = -(-burst * (100 - request) // request) + rng.randint(0, 20) * MS  # rounded up: within its request
    scaled = [max(1, r * (100 - request) // 100) for r, _ in quotas]
    quotas = [(s, s if lim == r else max(s, lim)) for s, (r, lim) in zip(scaled, quotas, strict=True)]
    return quotas, SimTenant("h", request, 100, burst_ns=burst, idle_ns=idle, priority="high")

