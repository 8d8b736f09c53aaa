"""Random mixes of tenants on the policy's fake clock: limits, requests and the GPU's use at
every horizon, beyond issue 31's six scenarios.

    python3 bench/mix_bench.py [--seeds 11 12 13 14 15 16] [--mixes 150] [--high]

Each seed draws `--mixes` mixes (token_scheduler.simulate.random_mix: 2-5 tenants, requests
adding up to 100 or a little less, each limit its request, 100 or between, each busy or
idle; with --high, beside a `high` tenant's short bursts that revoke their leases:
token_scheduler.simulate.with_high_tenant) and runs each for two windows with the daemon's
defaults (window 10 s). Measured over the second window (the lows up to 200 ms before its
end, where the run cuts a lease):

- every tenant: its highest share over any 1 s (goal: limit + 1 pp);
- every busy tenant: its share over the window against its request (goal: within 0.5 pp);
- the GPU: the busy tenants' shares against what their limits allow (goal: within 1.5 pp);
- every busy tenant whose request is its limit (it asks no more than its request): its
  lowest share over any 1 s and any 100 ms (goals: request - 2 pp, half the request), and
  how many had nothing in some 100 ms.

Deterministic (no wall clock): a figure that moves is the policy's doing. The issue's own
scenarios, on the simulator and the fake clock, are bench/horizon_bench.py's.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from token_scheduler.policy import MS, SECOND, PolicyConfig  # noqa: E402
from token_scheduler.simulate import SimTenant, Simulation, mix_tenants, random_mix, with_high_tenant  # noqa: E402

CONFIG = PolicyConfig(short_horizon=True)
CUT_NS = 200 * MS  # the lows stop this long before the run's end: its last lease is cut there
# Shares are ratios of nanoseconds in floating point: 13.999999999999998 % is 14, not a miss.
ULP = 1e-9


@dataclass
class Tally:
    mixes: int = 0
    over_limit: int = 0
    request_misses: list[float] = field(default_factory=list)  # pp under the request, > 0.5
    shortfalls: list[float] = field(default_factory=list)       # pp under the request, every busy tenant
    gpu_worst: float = 0.0
    capped: int = 0
    second_misses: list[float] = field(default_factory=list)    # pp below R - 2
    short_misses: list[float] = field(default_factory=list)     # pp below R / 2
    nothing: int = 0

    def add_mix(self, quotas: list[tuple[int, int]], busy: list[bool], high: SimTenant | None = None) -> None:
        window = CONFIG.window_ns
        tenants = mix_tenants(quotas, busy, window)
        result = Simulation(CONFIG, tenants + ([high] if high else [])).run(2 * window)
        start, end = window, 2 * window
        self.mixes += 1
        # The high tenant's bursts are its own (not counted as a busy tenant), and on top of the limits.
        used = 100 * result.share(high.name, start, end) if high else 0.0
        allowed = min(100.0, sum(t.limit for t, b in zip(tenants, busy, strict=True) if b) + used)
        for tenant, b in zip(tenants, busy, strict=True):
            share = 100 * result.share(tenant.name, start, end)
            used += share
            if 100 * result.extreme_shares(tenant.name, SECOND, start, end)[1] > tenant.limit + 1 + ULP:
                self.over_limit += 1
            if not b:
                continue
            self.shortfalls.append(max(0.0, tenant.request - share))
            if share < tenant.request - 0.5 - ULP:
                self.request_misses.append(tenant.request - share)
            if tenant.request != tenant.limit:
                continue
            self.capped += 1
            second = 100 * result.extreme_shares(tenant.name, SECOND, start, end - CUT_NS)[0]
            short = 100 * result.extreme_shares(tenant.name, 100 * MS, start, end - CUT_NS)[0]
            if second < tenant.request - 2 - ULP:
                self.second_misses.append(tenant.request - 2 - second)
            if short < tenant.request / 2 - ULP:
                self.short_misses.append(tenant.request / 2 - short)
                self.nothing += short < ULP
        self.gpu_worst = max(self.gpu_worst, allowed - used)


def worst(values: list[float]) -> str:
    return f"{max(values):.2f} pp" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[11, 12, 13, 14, 15, 16],
                        help="random seeds, one batch of mixes each (default: 11-16)")
    parser.add_argument("--mixes", type=int, default=150, help="mixes a seed (default: 150)")
    parser.add_argument("--high", action="store_true",
                        help="each mix beside a `high` tenant's short bursts (requests scaled down to leave it room)")
    args = parser.parse_args()
    if args.mixes < 1:
        parser.error("--mixes must be at least 1")
    tally = Tally()
    began = time.monotonic()
    for seed in args.seeds:
        rng = random.Random(seed)
        for _ in range(args.mixes):
            quotas, busy = random_mix(rng)
            if args.high:
                quotas, high = with_high_tenant(rng, quotas)
                tally.add_mix(quotas, busy, high)
            else:
                tally.add_mix(quotas, busy)
    busy = len(tally.shortfalls)
    print(f"{tally.mixes} mixes (seeds {' '.join(map(str, args.seeds))}, {args.mixes} each; "
          f"{time.monotonic() - began:.0f} s){', each beside a high tenant' if args.high else ''}, the fake clock, "
          f"window {CONFIG.window_ns // SECOND} s")
    print(f"  limit:    tenants above L + 1 pp in some second: {tally.over_limit}")
    print(f"  request:  busy tenants more than 0.5 pp under it over the window: "
          f"{len(tally.request_misses)} of {busy} (worst {worst(tally.request_misses)}; "
          f"mean shortfall {sum(tally.shortfalls) / max(1, busy):.3f} pp)")
    print(f"  GPU:      the most under what the busy tenants' limits allow: {tally.gpu_worst:.2f} pp")
    print(f"  busy tenants whose request is their limit: {tally.capped}")
    print(f"    below R - 2 in some second:  {len(tally.second_misses)} (by up to {worst(tally.second_misses)})")
    print(f"    below R / 2 in some 100 ms:  {len(tally.short_misses)} (by up to {worst(tally.short_misses)}), "
          f"{tally.nothing} with nothing there")


if __name__ == "__main__":
    main()
