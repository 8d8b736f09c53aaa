"""A `high` priority inference tenant beside a saturating `normal` trainer, on
the GPU simulator (issue 15), measured side by side in one run.

Inference: requests of --kernels x --kernel-us (default 20 x 200 us, 4 ms of
GPU work), Poisson arrivals at half its peak rate (peak: one request per
request's GPU time), served one at a time; latency = arrival -> completion.
Trainer: --depth launches (default 1000) of --train-us kernels (default 1 ms)
between synchronizes, saturating. Under vcuda the inference asks for
--core-inference (60) and the trainer for the rest (40), limits 100.

Runs:
  alone     the inference process alone on the simulated GPU, no vcuda
  trainer   the trainer alone, no vcuda: its standalone throughput
  normal    both under vcuda, both `normal`
  high      both under vcuda, the inference `high`

Figures: inference latency p50/p99/p99.9 in each run; revocation latency
(request -> grant of the inference's grants that followed a revocation, from
the scheduler's stats) p50/p99; trainer throughput / (its standalone
throughput x the GPU time the inference leaves), over the inference's window;
each tenant's share error over that window: its share of GPU time against
what the policy promises (the inference: its load alone, below its request;
the trainer: what is left). GPU time over the window is what the simulator
served each process (bench/workload.py). Goals (simulator): added p99 <= 2 ms, revocation
p99 <= budget + 0.2 ms, trainer >= 0.95 of what is left, share error <= 1 pp.

Run: python bench/latency_bench.py (after `pip install .`, or with
VCUDA_LIB_DIR and PYTHONPATH pointing at a build and the checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workload import BusySampler, build  # noqa: E402

from py_vcuda import native  # noqa: E402
from py_vcuda.launch import Tenant, tenant_env  # noqa: E402
from py_vcuda.sim import SimConfig  # noqa: E402
from token_scheduler.admin_client import AdminClient  # noqa: E402
from token_scheduler.policy import percentile  # noqa: E402
from token_scheduler.testing import spawn_daemon  # noqa: E402

GOAL_ADDED_P99_MS = 2.0
GOAL_REVOKE_SLACK_MS = 0.2
GOAL_TRAINER = 0.95
GOAL_SHARE_PP = 1.0



@dataclass
class Setup:
    exe: Path
    tmp: Path
    args: argparse.Namespace

    def sim(self, name: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_") and k != "LD_PRELOAD"}
        return {**base, **SimConfig(state_path=self.tmp / f"sim-{name}").env()}

    def infer_cmd(self, seconds: float) -> list[str]:
        a = self.args
        peak = 1e6 / (a.kernels * a.kernel_us)
        return [str(self.exe), "infer", str(a.kernels), str(a.kernel_us), f"{peak / 2:.3f}", str(seconds), "15"]

    def train_cmd(self, seconds: float) -> list[str]:
        return [str(self.exe), "train", str(self.args.train_us), str(self.args.depth), str(seconds)]


def run(cmds: list[tuple[list[str], dict[str, str]]]) -> list[dict[str, Any]]:
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd, env in cmds]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"workload failed ({proc.returncode}): {err.strip()}")
        results.append(json.loads(out))
    return results


@dataclass
class Shared:
    inference: dict[str, Any]   # the workload's report
    stats: dict[str, Any]       # the scheduler's, at the end of the inference
    inference_gpu: float        # fraction of the inference's window the simulator served each
    trainer_gpu: float


def shared(setup: Setup, name: str, priority: str) -> Shared:
    """The trainer and the inference under vcuda, the inference `priority`."""
    a = setup.args
    directory = Path(tempfile.mkdtemp(prefix="vlb", dir="/tmp"))  # unix socket paths are short
    daemon = spawn_daemon(directory, "--window", "10s", "--short-horizon", a.short_horizon)
    admin = AdminClient(directory / "admin.sock")
    try:
        admin.wait_ready()
        base = setup.sim(name)
        envs = []
        for tenant, request, prio in (("infer", a.core_inference, priority),
                                      ("train", 100 - a.core_inference, "normal")):
            reply = admin.call("add", tenant=tenant, request=request, limit=100, priority=prio)
            if not reply.get("ok"):
                raise RuntimeError(f"scheduler refused {tenant}: {reply.get('error')}")
            env = tenant_env(Tenant(), base, setup.tmp / f"{name}-{tenant}.ledger")
            env["VCUDA_SCHEDULER"] = str(reply["endpoint"])
            envs.append(env)
        with BusySampler(Path(base["VCUDA_SIM_STATE"])) as sampler:
            trainer = subprocess.Popen(setup.train_cmd(a.seconds + 30), env=envs[1], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True)
            try:
                infer = subprocess.Popen(["sh", "-c", 'sleep 2; exec "$@"', "-", *setup.infer_cmd(a.seconds)],
                                         env=envs[0], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                out, err = infer.communicate(timeout=600)
                if infer.returncode != 0:
                    raise RuntimeError(f"inference failed: {err.strip()}")
                stats = admin.call("stats")
                time.sleep(0.2)  # a sample after the window's end
            finally:
                trainer.kill()
                trainer.wait()
        inference = json.loads(out)
        start, end = inference["start_ns"], inference["end_ns"]
        window = sampler.window(start, end)
        return Shared(inference, stats, sampler.busy_between(infer.pid, start, end) / window,
                      sampler.busy_between(trainer.pid, start, end) / window)
    finally:
        admin.close()
        daemon.kill()
        daemon.wait()
        shutil.rmtree(directory, ignore_errors=True)


def pcts(result: dict[str, Any]) -> tuple[float, float, float]:
    lat = sorted(result["latency_us"])
    return tuple(percentile(lat, f) / 1000 for f in (0.50, 0.99, 0.999))  # type: ignore[return-value]


def gpu_fraction(result: dict[str, Any]) -> float:
    """Of a process alone: its own kernels over its own run (it synchronises before it ends)."""
    return result["busy_us"] * 1000 / (result["end_ns"] - result["start_ns"])


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="inference window of each run")
    parser.add_argument("--kernels", type=int, default=20, help="kernels per inference request")
    parser.add_argument("--kernel-us", type=int, default=200, help="inference kernel length")
    parser.add_argument("--train-us", type=int, default=1000, help="trainer kernel length")
    parser.add_argument("--depth", type=int, default=1000, help="trainer launches between synchronizes")
    parser.add_argument("--core-inference", type=int, default=60, help="inference core request (trainer: the rest)")
    parser.add_argument("--short-horizon", choices=["on", "off"], default="on",
                        help="the scheduler's --short-horizon (default on, its default)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vcuda-bench-") as d:
        tmp = Path(d)
        setup = Setup(build(tmp), tmp, args)
        native.lib_path(native.SHIM)  # fail early without libraries
        alone, = run([(setup.infer_cmd(args.seconds), setup.sim("alone"))])
        solo_trainer, = run([(setup.train_cmd(min(args.seconds, 10.0)), setup.sim("trainer"))])
        runs = {prio: shared(setup, prio, prio) for prio in ("normal", "high")}

    solo_busy = solo_trainer["kernels"] * args.train_us * 1000 / (solo_trainer["end_ns"] - solo_trainer["start_ns"])
    alone_p = pcts(alone)
    load = gpu_fraction(alone)
    print(f"inference: {args.kernels} x {args.kernel_us} us requests, Poisson at half peak "
          f"({1e6 / (args.kernels * args.kernel_us) / 2:.1f}/s), GPU load alone {100 * load:.1f} %; "
          f"trainer: {args.depth} x {args.train_us} us between synchronizes, alone "
          f"{100 * solo_busy:.1f} % busy; {args.seconds:.0f} s windows")
    print(f"  {'run':<30}{'requests':>9}{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>10}")
    print(f"  {'alone':<30}{alone['requests']:>9}{alone_p[0]:>9.2f}{alone_p[1]:>9.2f}{alone_p[2]:>10.2f}")
    for prio, result in runs.items():
        p = pcts(result.inference)
        label = "beside trainer, no priority" if prio == "normal" else "beside trainer, high priority"
        print(f"  {label:<30}{result.inference['requests']:>9}{p[0]:>9.2f}{p[1]:>9.2f}{p[2]:>10.2f}")

    high = runs["high"]
    p = pcts(high.inference)
    tenants = high.stats["tenants"]
    budget_ms = tenants["train"]["budget_us"] / 1000
    revoke = tenants["infer"]["preempt_wait_us"]
    left = 1 - high.inference_gpu
    ratio = high.trainer_gpu / (solo_busy * left)
    added = p[1] - alone_p[1]
    inf_err = 100 * abs(high.inference_gpu - load)
    train_err = 100 * abs(high.trainer_gpu - (1 - load) * solo_busy)
    print("with priority (goals on the simulator):")
    print(f"  added p99 latency            {added:8.2f} ms    goal <= {GOAL_ADDED_P99_MS} ms: "
          f"{verdict(added <= GOAL_ADDED_P99_MS)}")
    print(f"  revocation p50 / p99         {revoke['p50'] / 1000:.2f} / {revoke['p99'] / 1000:.2f} ms "
          f"({revoke['samples']} revocations)    goal p99 <= budget {budget_ms:.2f} + {GOAL_REVOKE_SLACK_MS} ms: "
          f"{verdict(revoke['p99'] / 1000 <= budget_ms + GOAL_REVOKE_SLACK_MS)}")
    print(f"  trainer / what is left       {ratio:8.3f}       goal >= {GOAL_TRAINER}: {verdict(ratio >= GOAL_TRAINER)}"
          f"    (trainer {100 * high.trainer_gpu:.1f} % of the GPU; alone {100 * solo_busy:.1f} %; "
          f"the inference leaves {100 * left:.1f} %)")
    print(f"  share error, inference       {inf_err:8.2f} pp      goal <= {GOAL_SHARE_PP} pp: "
          f"{verdict(inf_err <= GOAL_SHARE_PP)}    ({100 * high.inference_gpu:.1f} % vs {100 * load:.1f} % alone)")
    print(f"  share error, trainer         {train_err:8.2f} pp      goal <= {GOAL_SHARE_PP} pp: "
          f"{verdict(train_err <= GOAL_SHARE_PP)}    ({100 * high.trainer_gpu:.1f} % vs "
          f"{100 * (1 - load) * solo_busy:.1f} % left by the inference's load)")
    print(f"  trainer budget waits {tenants['train']['budget_hits']}, revocations "
          f"{tenants['train']['revocations']} (reclaimed {tenants['train']['revoke_reclaims']}); "
          f"scheduler shares over its window: inference {100 * tenants['infer']['share']:.1f} %, "
          f"trainer {100 * tenants['train']['share']:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
