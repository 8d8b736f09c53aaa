"""The `vcuda` command. Parses arguments and wires the parts; logic lives in modules."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from py_vcuda import __version__
from token_scheduler.policy import PRIORITIES


def _quantity(text: str) -> int:
    from py_vcuda.quantity import QuantityError, parse_quantity

    try:
        return parse_quantity(text)
    except QuantityError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _device_memory(text: str) -> tuple[int, int]:
    index, sep, value = text.partition("=")
    if not sep or not index.isdigit():
        raise argparse.ArgumentTypeError(f"expected INDEX=QUANTITY, got {text!r}")
    return int(index), _quantity(value)


def _percent(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise argparse.ArgumentTypeError(f"expected a whole percentage 1-100, got {text!r}")
    return int(text)


def cmd_run(args: argparse.Namespace) -> int:
    from py_vcuda import launch

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("vcuda run: no command given (usage: vcuda run [options] -- CMD ...)", file=sys.stderr)
        return 2
    if args.core_limit is not None and args.core is None:
        print("vcuda run: --core-limit needs --core (the guaranteed share)", file=sys.stderr)
        return 2
    if args.priority is not None and args.core is None:
        print("vcuda run: --priority needs --core (priority orders the GPU's token among compute quotas)",
              file=sys.stderr)
        return 2
    if args.core_limit is not None and args.core_limit < args.core:
        print(f"vcuda run: --core-limit {args.core_limit} is below --core {args.core}", file=sys.stderr)
        return 2
    gpu = args.gpu
    if args.core is not None:
        # One token scheduler per GPU: a compute quota is a share of one GPU's time.
        if gpu is not None and "," in gpu:
            print(f"vcuda run: --core is a share of one GPU's time; --gpu {gpu} names several "
                  "(run one `vcuda run` per GPU)", file=sys.stderr)
            return 2
        gpu = gpu or "0"
    tenant = launch.Tenant(memory=args.memory, memory_per_device=dict(args.device_memory or []),
                           gpu=gpu, ledger=args.ledger, log_level=args.log_level,
                           core_request=args.core, core_limit=args.core_limit,
                           priority=args.priority or "normal")
    base = None
    if args.simulate:
        from py_vcuda.sim import SimConfig

        sim = SimConfig(state_path=args.sim_state) if args.sim_state else SimConfig()
        base = {**os.environ, **sim.env()}
    try:
        return launch.run(command, tenant, base)
    except launch.SchedulerError as exc:
        print(f"vcuda run: {exc}", file=sys.stderr)
        return 1


def cmd_lib_path(args: argparse.Namespace) -> int:
    from py_vcuda import native

    try:
        print(native.lib_path(native.SHIM))
    except native.NativeLibraryMissing as exc:
        print(f"vcuda lib-path: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from py_vcuda.container_check import container_report, in_container
    from py_vcuda.doctor import report

    # Inside a vgpu container (its quota file, or VCUDA_LEDGER): are this container's quotas in force?
    lines, status = container_report() if in_container(os.environ) else report(simulate=args.simulate)
    print("\n".join(lines))
    return status


def cmd_demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from py_vcuda.demo import run_demo

    return run_demo(Console(), simulate=True if args.simulate else None)


def cmd_scheduler(args: argparse.Namespace) -> int:
    from token_scheduler import cli

    return cli.run(args)


def cmd_extender(args: argparse.Namespace) -> int:
    from scheduler_extender import cli

    return cli.run(args)


def cmd_device_plugin(args: argparse.Namespace) -> int:
    from device_plugin import cli

    return cli.run(args)


def cmd_dra_driver(args: argparse.Namespace) -> int:
    from dra_driver import cli

    return cli.run(args)


def cmd_top(args: argparse.Namespace) -> int:
    from py_vcuda import top

    return top.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vcuda", description="GPU sharing with enforced memory and compute quotas.")
    parser.add_argument("--version", action="version", version=f"vcuda {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)

    p = sub.add_parser("run", help="run a command under GPU quotas on this machine",
                       description="Run CMD with libvcuda preloaded and the given quotas. "
                                   "All processes CMD starts share the quota.")
    p.add_argument("--memory", type=_quantity, metavar="Q",
                   help="device memory limit per visible GPU (512Mi, 4Gi, 1.5Gi, 4G, bytes)")
    p.add_argument("--device-memory", type=_device_memory, action="append", metavar="I=Q",
                   help="memory limit for visible device I (repeatable)")
    p.add_argument("--core", type=_percent, metavar="N",
                   help="guaranteed share of one GPU's time in percent (starts or reuses that GPU's token "
                        "scheduler; the run sees only that GPU: --gpu, default 0)")
    p.add_argument("--core-limit", type=_percent, metavar="N",
                   help="cap on the share of GPU time in percent, at least --core (default: = --core)")
    p.add_argument("--priority", choices=PRIORITIES,
                   help="high: latency-sensitive, served within about a millisecond by revoking a normal "
                        "tenant's lease (buys latency, not GPU time: --core still bounds it); "
                        "default normal")
    p.add_argument("--gpu", metavar="I|UUID", help="run on this GPU only (sets CUDA_VISIBLE_DEVICES)")
    p.add_argument("--ledger", type=Path, metavar="FILE",
                   help="share a ledger file with other runs (default: one per run)")
    p.add_argument("--log-level", choices=["error", "warn", "info", "debug"],
                   help="libvcuda's log level (VCUDA_LOG_LEVEL)")
    p.add_argument("--simulate", action="store_true", help="run against the GPU simulator")
    p.add_argument("--sim-state", type=Path, metavar="FILE",
                   help="simulator state file (with --simulate; default per user)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("lib-path", help="print the path of libvcuda.so")
    p.set_defaults(func=cmd_lib_path)

    p = sub.add_parser("doctor", help="check the CUDA driver, runtimes and the shim; inside a vgpu container: "
                       "preload, ledger, scheduler and limits (one line each, non-zero exit on a failure)")
    p.add_argument("--simulate", action="store_true", help="check against the GPU simulator")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("demo", help="tenants with different quotas on one GPU (or the simulator)")
    p.add_argument("--simulate", action="store_true", help="use the simulator even with a GPU")
    p.set_defaults(func=cmd_demo)

    from device_plugin import cli as plugin_cli
    from dra_driver import cli as dra_cli
    from scheduler_extender import cli as extender_cli
    from token_scheduler import cli as scheduler_cli

    p = sub.add_parser("scheduler", help="one GPU's token scheduler")
    scheduler_cli.add_arguments(p)
    p.set_defaults(func=cmd_scheduler)

    p = sub.add_parser("extender", help="the kube-scheduler extender")
    extender_cli.add_arguments(p)
    p.set_defaults(func=cmd_extender)

    p = sub.add_parser("device-plugin", help="the node agent: kubelet device plugin, token schedulers, metrics",
                       description="kubelet device plugin (vgpu, pgpu or mps mode) with one token scheduler "
                                   "per GPU and the Prometheus exporter.")
    plugin_cli.add_arguments(p)
    p.set_defaults(func=cmd_device_plugin)

    p = sub.add_parser("dra-driver", help="the Kubernetes DRA driver gpu.vcuda.io: kubelet plugin, ResourceSlices, "
                       "token schedulers, metrics",
                       description="Kubernetes Dynamic Resource Allocation driver gpu.vcuda.io (Kubernetes 1.34+): "
                                   "publishes this node's GPUs with consumable capacity (cores, memory) and "
                                   "prepares claims with the same enforcement as vgpu mode, injected through CDI.")
    dra_cli.add_arguments(p)
    p.set_defaults(func=cmd_dra_driver)

    p = sub.add_parser("top", help="live view of every GPU and its tenants",
                       description="Every GPU on this machine with its tenants: quota, share, memory, wait.")
    p.add_argument("--state-dir", type=Path, metavar="DIR",
                   help="node agent state directory (default /var/lib/vcuda if it exists); "
                        "`vcuda run` tenants of this user are always shown")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="refresh period (default 1 s)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--simulate", action="store_true", help="read the GPU simulator instead of NVML")
    p.add_argument("--pod-resources-socket", type=Path, metavar="SOCK",
                   help="kubelet pod-resources socket, for pod names the records lack (default on a node: "
                        "/var/lib/kubelet/pod-resources/kubelet.sock if it exists)")
    p.add_argument("--mode", choices=("vgpu", "pgpu", "mps"),
                   help="sharing mode shown for GPUs without tenants (default: the records' most common mode)")
    p.set_defaults(func=cmd_top)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
