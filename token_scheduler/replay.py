"""Replay a scheduler's record (`vcuda scheduler --record FILE`) and show, per second,
each tenant's charged share and how long the token sat free with every waiting
tenant held back; with --free, each such span and what held each tenant back.

Run: python -m token_scheduler.replay FILE [--from S] [--to S] [--free [MS]]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from .policy import SECOND, Policy
from .record import Replay, ReplayMismatch

MS = 1_000_000


def held_back_reasons(policy: Policy, now: int) -> list[str]:
    """What keeps each waiting tenant from the free token at `now`: its pace (credit at its
    limit's rate), its frame (its share of this frame spent) or a horizon's cap."""
    reasons = []
    for tenant in policy.tenants.values():
        if not tenant.waiting:
            continue
        short = tenant.short
        if short is None or tenant.limit >= 100:
            reasons.append(f"{tenant.name}: not held back")
            continue
        first = next(iter(tenant.waiting.values()))
        lease = policy._quantum(tenant, first.predicted_ns)
        wait, fit, _ = policy._capped_fit(tenant, short, now, lease, first.since, None)
        pace = short.pace.ns_until_even(now, first.since)
        frame = short.frame
        grid = "none" if frame.at is None else f"{(frame.at + frame.length - now) / MS:+.2f} ms"
        reasons.append(f"{tenant.name}: may run in {wait / MS:.2f} ms (pace {pace / MS:.2f}; next frame on "
                       f"the grid {grid}, this one's {frame.used / MS:.2f} ms used; lease {lease / MS:.2f}, "
                       f"fits {fit / MS:.2f}; owed {short.due.balance / MS:.2f} ms)")
    return reasons


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m token_scheduler.replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("record", type=Path, help="a file written by `vcuda scheduler --record`")
    parser.add_argument("--from", dest="start", type=float, default=0.0,
                        help="first second shown, counted from the record's start (default 0)")
    parser.add_argument("--to", dest="end", type=float, default=None, help="last second shown (default: the end)")
    parser.add_argument("--free", type=float, nargs="?", const=1.0, default=None, metavar="MS",
                        help="also list each span of at least MS milliseconds (default 1) the token sat "
                             "free with every waiting tenant held back, and why each waited")
    args = parser.parse_args(argv)

    charged: dict[tuple[int, str], int] = defaultdict(int)
    held_back: dict[int, int] = defaultdict(int)
    origin: list[int] = []
    spans: list[tuple[int, int, tuple[str, ...], list[str]]] = []

    def in_range(t: int) -> bool:
        second = (t - origin[0]) / SECOND
        return second >= args.start and (args.end is None or second < args.end)

    def on_charge(name: str, start: int, end: int, _filler: bool) -> None:
        while start < end:  # split at the seconds of the record
            cut = min(end, origin[0] + ((start - origin[0]) // SECOND + 1) * SECOND)
            charged[((start - origin[0]) // SECOND, name)] += cut - start
            start = cut

    def on_held_back(since: int, until: int, names: tuple[str, ...]) -> None:
        held_back[(since - origin[0]) // SECOND] += until - since
        if args.free is not None and until - since >= args.free * MS and in_range(since):
            spans.append((since, until, names, reasons.get(since, [])))

    reasons: dict[int, list[str]] = {}  # the reasons seen when each free span began
    try:
        replay = Replay(args.record, on_charge, on_held_back)
    except (OSError, ValueError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    policy = replay.policy
    quotas: dict[str, str] = {}
    try:
        while (step := replay.step()) is not None:
            if not origin and step.clocks:
                origin.append(step.clocks[0])
            if step.method in ("add_tenant", "update_tenant") and step.args:
                tenant = policy.tenants[step.args[0]]
                quotas[tenant.name] = f"{tenant.request}/{tenant.limit}"
            if (args.free is not None and step.method == "dispatch" and policy.lease is None
                    and policy._held_back_since == replay.now and origin):
                reasons[replay.now] = held_back_reasons(policy, replay.now)
    except ReplayMismatch as exc:
        print(f"replay: {exc}: this record is not this policy's (another version of vcuda?)", file=sys.stderr)
        return 1
    if not origin:
        print("replay: the record holds no step", file=sys.stderr)
        return 1
    names = sorted(quotas)
    seconds = sorted({s for s, _ in charged} | set(held_back))
    print("second  " + "  ".join(f"{n} {quotas[n]:>7}" for n in names) + "   held back (ms)")
    for second in seconds:
        if not in_range(origin[0] + second * SECOND):
            continue
        shares = "  ".join(f"{100 * charged[(second, n)] / SECOND:{len(n) + 8}.1f}" for n in names)
        print(f"{second:6d}  {shares}   {held_back[second] / MS:8.1f}")
    for since, until, waiting, why in spans:
        print(f"\n{(since - origin[0]) / SECOND:.4f} s: free {(until - since) / MS:.2f} ms, waiting "
              + ", ".join(waiting))
        for line in why:
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
