"""A 50/50 and a 13/13 tenant on the policy's fake clock whose holds end past or short of their
leases by random scripts: how often the 13 % tenant falls below half its request in some
100 ms, and what that costs the 50 % one.

    python3 bench/overrun_bench.py [--scripts 200] [--seed 2] [--pauses]

Each script gives each tenant 2-5 (the 13/13 one: 2-4) overruns in turn (token_scheduler.
simulate.ScriptedOverruns): the 50/50 one's 0-5 ms past its lease, the 13/13 one's up to 3 ms
past or short of it, what the simulator's and the H100's traces show of processes draining
their in-flight work. With --pauses the 50/50 one's also draw 10, 20 and 25 ms short: its
process paused, and the rest of its frame comes as a second lease. Each runs 5 s (handoffs
0.2 ms), measured from 1 s to 200 ms before the end. Printed: the scripts that leave the 13/13
one below half its request in some 100 ms (the goal of issue 31) and below 8 ms, its lowest
100 ms; the scripts that leave the 50/50 one below its request - 2 pp in some second, its
lowest second and its mean share.

Deterministic (no wall clock): a figure that moves is the policy's doing. Run it at two
commits to compare them.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from token_scheduler.policy import MS, SECOND, PolicyConfig  # noqa: E402
from token_scheduler.simulate import ScriptedOverruns, SimTenant  # noqa: E402

CONFIG = PolicyConfig(short_horizon=True)
RUN_NS = 5 * SECOND
CUT_NS = 200 * MS  # the lows stop this long before the run's end: its last lease is cut there
ULP = 1e-9  # shares are ratios of nanoseconds in floating point
A_OVERRUNS_MS = (0, 0.5, 1, 1.5, 2, 3, 4, 5)
A_PAUSES_MS = (-10, -20, -25)
B_OVERRUNS_MS = (-3, -2, -1, 0, 1, 2, 3)


def draw(rng: random.Random, pauses: bool) -> dict[str, list[int]]:
    a_choices = A_OVERRUNS_MS + (A_PAUSES_MS if pauses else ())
    a = [int(rng.choice(a_choices) * MS) for _ in range(rng.randint(2, 5))]
    b = [int(rng.choice(B_OVERRUNS_MS) * MS) for _ in range(rng.randint(2, 4))]
    return {"A": a, "B": b}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", type=int, default=200, help="random scripts to run (default: 200)")
    parser.add_argument("--seed", type=int, default=2, help="random seed (default: 2)")
    parser.add_argument("--pauses", action="store_true",
                        help="the 50/50 tenant's holds also end 10-25 ms short (its process paused)")
    args = parser.parse_args()
    if args.scripts < 1:
        parser.error("--scripts must be at least 1")
    rng = random.Random(args.seed)
    began = time.monotonic()
    b_lows: list[float] = []
    a_lows: list[float] = []
    a_means: list[float] = []
    start, end = SECOND, RUN_NS - CUT_NS
    for _ in range(args.scripts):
        tenants = [SimTenant("A", 50, 50), SimTenant("B", 13, 13)]
        result = ScriptedOverruns(CONFIG, tenants, draw(rng, args.pauses), handoff_ns=200_000).run(RUN_NS)
        b_lows.append(100 * result.extreme_shares("B", 100 * MS, start, end)[0])
        a_lows.append(100 * result.extreme_shares("A", SECOND, start, end)[0])
        a_means.append(100 * result.share("A", start, end))
    n = args.scripts
    print(f"{n} scripts (seed {args.seed}{', with pauses' if args.pauses else ''}; "
          f"{time.monotonic() - began:.0f} s), a 50/50 and a 13/13 tenant, the fake clock")
    print(f"  13/13: below 6.5 % (half its request) in some 100 ms: {sum(v < 6.5 - ULP for v in b_lows)}, "
          f"below 8 %: {sum(v < 8 - ULP for v in b_lows)}; lowest {min(b_lows):.2f} %")
    print(f"  50/50: below 48 % (request - 2) in some second: {sum(v < 48 - ULP for v in a_lows)}; "
          f"lowest {min(a_lows):.2f} %, mean share {sum(a_means) / n:.2f} %")


if __name__ == "__main__":
    main()
