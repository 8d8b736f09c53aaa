"""Command line of one GPU's scheduler: parse, configure, wire, serve.

`vcuda scheduler` calls add_arguments()/run(); `python -m token_scheduler` too.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from types import FrameType

from .daemon import Daemon
from .dirlock import DirectoryBusy
from .duration import parse_duration
from .policy import PolicyConfig
from .state import StateError

log = logging.getLogger("token_scheduler")
EXIT_BUSY = 3  # another scheduler already serves --dir


def _duration(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", required=True, help="GPU index or UUID this scheduler owns")
    parser.add_argument("--dir", required=True, type=Path,
                        help="state directory: admin.sock, tenants.json, tenants/<name>/sched.sock")
    parser.add_argument("--window", type=_duration, default="10s",
                        help="sliding window for usage (default 10s)")
    parser.add_argument("--quantum-min", type=_duration, default="1ms",
                        help="shortest lease (default 1ms)")
    parser.add_argument("--quantum-max", type=_duration, default="50ms",
                        help="longest lease (default 50ms)")
    parser.add_argument("--grace", type=_duration, default="10ms",
                        help="time past expiry before a silent lease is reclaimed (default 10ms)")
    parser.add_argument("--budget", type=_duration, default="4ms",
                        help="in-flight budget: GPU work a token holder may have launched and not "
                             "finished, at most a quarter of --quantum-max (default 4ms)")
    parser.add_argument("--budget-high", type=_duration, default="1ms",
                        help="in-flight budget while a `high` priority tenant is registered: how long "
                             "its revocations wait for the holder's work (default 1ms)")
    parser.add_argument("--revoke-grace", type=_duration, default="5ms",
                        help="time past the budget before a revoked lease is reclaimed (default 5ms)")
    parser.add_argument("--idle", type=_duration, default="1ms",
                        help="the longest a holder whose work completed waits for its next launch "
                             "before it gives the token back; libvcuda learns a shorter wait, down to "
                             "an eighth, from each process's pauses (default 1ms)")
    parser.add_argument("--idle-high", type=_duration, default="200us",
                        help="the same for `high` tenants: short, since others wait meanwhile and a "
                             "`high` tenant gets the token back within the budget (default 200us)")
    parser.add_argument("--short-horizon", choices=["on", "off"], default="on",
                        help="on: hold requests and limits over any 100 ms and any 1 s, not only over "
                             "--window: a tenant back from idle neither bursts past its limit nor "
                             "starves a neighbour within its request (on the simulator some busy tenants "
                             "still miss request - 2 pp in their worst second, by up to 2 pp); "
                             "off: the window alone (a tenant back from idle bursts past its limit for "
                             "most of a second, then waits for the burst to leave the window) "
                             "(default on)")
    parser.add_argument("--allowance", type=_duration, default="8ms",
                        help="with --short-horizon on, what a capped tenant may run over its limit in "
                             "any 100 ms or 1 s, and the credit idle time earns (default 8ms)")
    parser.add_argument("--record", type=Path, metavar="FILE",
                        help="write every call into the policy and every clock reading it takes to FILE, "
                             "which must not exist (JSON lines, about 20 KB a second for two busy "
                             "tenants), to replay its decisions later: python -m token_scheduler.replay FILE")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"], help="default info")


def config_from_args(args: argparse.Namespace) -> PolicyConfig:
    return PolicyConfig(window_ns=args.window, quantum_min_ns=args.quantum_min,
                        quantum_max_ns=args.quantum_max, grace_ns=args.grace,
                        budget_ns=args.budget, budget_high_ns=args.budget_high,
                        revoke_grace_ns=args.revoke_grace, idle_ns=args.idle,
                        idle_high_ns=args.idle_high, short_horizon=args.short_horizon == "on",
                        allowance_ns=args.allowance)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="token_scheduler: %(levelname)s %(message)s")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        log.error("bad configuration: %s", exc)
        return 2
    try:
        daemon = Daemon(args.dir, str(args.gpu), config, record=args.record)
    except OSError as exc:
        log.error("cannot record: %s", exc)
        return 2
    stopping = False

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        daemon.start()
    except DirectoryBusy as exc:  # lost a start-up race, or started twice: the other one serves
        log.info("not starting: %s", exc)
        daemon.close()
        return EXIT_BUSY
    except (StateError, OSError, ValueError) as exc:
        log.error("cannot start: %s", exc)
        daemon.close()
        return 2
    try:
        daemon.serve(lambda: stopping)
    finally:
        daemon.close()
    log.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m token_scheduler", description="per-GPU token scheduler (vcuda)",
        epilog=f"One scheduler per --dir: a second one exits with status {EXIT_BUSY}.")
    add_arguments(parser)
    return run(parser.parse_args(argv))
