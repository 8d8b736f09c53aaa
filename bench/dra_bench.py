"""DRA driver figures: NodePrepareResources latency, slice republish time after a health change.

    python3 bench/dra_bench.py [--gpus 8] [--claims-per-gpu 50] [--toggles 20] [--mig-gpus 4] [--mig-rounds 5]

1. Prepare latency (goal p99 <= 20 ms, as for the device plugin's Allocate): 8
   simulated GPUs x 50 share claims (2 cores and 256 MiB each, so 50 fit one
   GPU), one claim per NodePrepareResources call, measured at the test kubelet:
   the gRPC round trip, reading the claim and its pod from a fake API server
   (HTTP on loopback), the container directory and ledger, the tenant's
   registration with the GPU's token scheduler (8 real scheduler processes),
   the checkpoint and the CDI spec (both fsynced). Unprepare latency beside it.
   In the same run, vgpu Allocate of the same containers (bench/plugin_bench.py's
   measurement), which shares the directory and tenant set-up: the ratio of the
   two p99s holds when the machine is busy and the absolute figures do not.
2. Slice republish time: a GPU turns unhealthy (the health monitor's callback)
   until the API server holds the node's slice without it (a new pool
   generation); then healthy again until it is back. `--toggles` of each.

3. MIG partitions made at prepare (``--mig=dynamic``, goal p99 <= 50 ms), on the
   simulator's NVML through py_vcuda.nvml (the driver's real calls): `--mig-gpus`
   MIG-capable GPUs with MIG mode off; each round fills every GPU with seven
   1g.10gb partitions (one claim per NodePrepareResources call: the intent
   recorded, MIG mode turned on for a GPU's first, the GPU and compute instance
   created, the checkpoint and CDI spec), then unprepares them all (instances
   destroyed, MIG mode off after a GPU's last). The simulator's instance creation
   costs next to nothing (a state-file update under its lock), so the figure is
   the driver's own cost plus NVML's call overhead, not a real GPU's (NVIDIA
   documents seconds for a MIG mode change with a GPU reset on real hardware).
   Then the slice republish time after a GPU's first partition is made (its whole
   device leaves the pool) and after its last is destroyed (it comes back),
   measured from the kubelet's answer. The slice publisher runs as in production:
   its thread builds and writes the slices in the driver's process while claims are
   prepared, holding back while a kubelet call is in flight (at most 200 ms,
   dra_driver.slices), so the republish figures include that wait. The fake API
   server and the test kubelet run in this process too (a real API server does
   not): their request handling takes the GIL from the driver's threads, which
   makes these figures somewhat worse than the driver's alone, never better.

State and CDI directories go under $TMPDIR (fsync costs what that file system
charges). The repository root goes first on sys.path, as in the other benches:
the figures are for the code in this checkout.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "bench"))

import plugin_bench  # noqa: E402

from dra_driver import config, partitions, testing  # noqa: E402
from dra_driver.agent import DriverAgent  # noqa: E402
from dra_driver.kube import KubeAPI  # noqa: E402
from dra_driver.names import DRIVER  # noqa: E402
from kube_contract.apiclient import make_api_client  # noqa: E402
from kube_contract.testing import FakeApiServer  # noqa: E402
from node_state.gpus import Inventory  # noqa: E402
from node_state.testing import inventory  # noqa: E402
from py_vcuda import native  # noqa: E402
from py_vcuda.nvml import NVML  # noqa: E402
from py_vcuda.sim import MiB  # noqa: E402

NODE = testing.NODE
GOAL_PREPARE_P99_MS = 20.0
GOAL_PARTITION_P99_MS = 50.0


percentile = plugin_bench.percentile


def summary(values: list[float]) -> str:
    return (f"p50 {percentile(values, 50):6.2f} ms   p99 {percentile(values, 99):6.2f} ms   "
            f"max {max(values):6.2f} ms   (n={len(values)})")


def driver_config(root: Path, **extra: str) -> config.DriverConfig:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    flags = {"plugin-dir": root / "pl", "registry-dir": root / "reg", "cdi-dir": root / "cdi",
             "state-dir": root / "st", "host-lib-dir": native.lib_dir(), "node-name": NODE, "metrics-port": 0,
             **extra}
    return config.from_args(parser.parse_args([f"--{k}={v}" for k, v in flags.items()]), env={})


class Rig:
    """The driver in process, a fake API server and a test kubelet."""

    def __init__(self, root: Path, gpus: int, inv: Inventory | None = None, nvml: NVML | None = None,
                 **flags: str) -> None:
        self.api = FakeApiServer()
        self.api.put("nodes", {"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE, "uid": "node-uid"}})
        (root / "reg").mkdir()
        self.kubelet = testing.TestKubelet(root / "reg")
        self.kubelet.start()
        kube = KubeAPI(make_api_client(str(self.api.kubeconfig(root / "kubeconfig"))))
        self.agent = DriverAgent(driver_config(root, **flags), inventory=inv or inventory(gpus), api=kube, nvml=nvml)
        self.agent.start()
        self.kubelet.wait_registered()

    def close(self) -> None:
        self.agent.stop()
        self.kubelet.stop()
        self.api.close()


def prepare_latency(rig: Rig, gpus: int, per_gpu: int) -> tuple[list[float], list[float]]:
    cores = max(1, 100 // per_gpu)
    claims = []
    for k in range(per_gpu):
        for g in range(gpus):
            name = f"c{g}-{k}"
            rig.api.put("pods", {"metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}"},
                                 "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                                          "containers": [{"name": "main",
                                                          "resources": {"claims": [{"name": "gpu"}]}}]}})
            claims.append(rig.api.put("resourceclaims", testing.claim(
                name, NODE, [testing.share(NODE, g, cores, 256 * MiB)], namespace="bench", pod=name)))
    return timed_prepare_unprepare(rig, claims)


def timed_prepare_unprepare(rig: Rig, claims: list[dict], what: str = "prepare"  # type: ignore[type-arg]
                            ) -> tuple[list[float], list[float]]:
    """ms of each claim's NodePrepareResources at the kubelet, then of each one's NodeUnprepareResources."""
    prepare, unprepare = [], []
    for claim in claims:
        t0 = time.perf_counter()
        resp = rig.kubelet.prepare(claim)
        prepare.append((time.perf_counter() - t0) * 1000)
        error = resp.claims[claim["metadata"]["uid"]].error
        if error:
            raise SystemExit(f"{what} failed: {error}")
    for claim in claims:
        t0 = time.perf_counter()
        rig.kubelet.unprepare(claim)
        unprepare.append((time.perf_counter() - t0) * 1000)
    return prepare, unprepare


def republish_time(rig: Rig, toggles: int) -> tuple[list[float], list[float]]:
    """ms from a health change to the API server holding the slice that reflects it."""
    name = f"{NODE}-{DRIVER}"
    uuid = rig.agent.inventory.gpus[0].uuid
    count = len(rig.agent.inventory.gpus)

    def devices() -> int | None:
        s = rig.api.objects["resourceslices"].get(name)
        return None if s is None else len(s["spec"]["devices"])

    def wait(want: int) -> float:
        t0 = time.perf_counter()
        with rig.api.lock:   # every write notifies the server's condition: no polling interval in the figure
            if not rig.api.lock.wait_for(lambda: devices() == want, timeout=30):
                raise SystemExit(f"the slice never showed {want} devices")
        return (time.perf_counter() - t0) * 1000

    wait(count)
    down, up = [], []
    for _ in range(toggles):
        t0 = time.perf_counter()
        rig.agent.health.set(uuid, False, "bench: critical XID")
        down.append((time.perf_counter() - t0) * 1000 + wait(count - 1))
        t0 = time.perf_counter()
        rig.agent.health.set(uuid, True)
        up.append((time.perf_counter() - t0) * 1000 + wait(count))
    return down, up


def partition_latency(rig: Rig, gpus: int, rounds: int) -> tuple[list[float], list[float]]:
    """Prepare and unprepare latency of claims for 1g.10gb partitions, seven per GPU, `rounds` times."""
    prepare, unprepare = [], []
    for r in range(rounds):
        claims = [rig.api.put("resourceclaims", testing.claim(f"p{r}-{g}-{s}", NODE, [{
            "request": "gpu", "driver": DRIVER, "pool": partitions.pool_name(NODE, g),
            "device": partitions.partition_name(g, "1g.10gb", s)}], namespace="bench"))
            for g in range(gpus) for s in range(7)]
        made, gone = timed_prepare_unprepare(rig, claims, "prepare of a partition")
        prepare += made
        unprepare += gone
    return prepare, unprepare


def partition_republish(rig: Rig, toggles: int) -> tuple[list[float], list[float]]:
    """ms from the kubelet's answer to the slice without GPU 0's whole device (its first partition made),
    and back (its last partition destroyed)."""
    name = f"{NODE}-{DRIVER}-gpu-0"

    def whole_offered() -> bool | None:
        s = rig.api.objects["resourceslices"].get(name)
        return None if s is None else any(d["name"] == "gpu-0" for d in s["spec"]["devices"])

    def wait(want: bool) -> float:
        t0 = time.perf_counter()
        with rig.api.lock:
            if not rig.api.lock.wait_for(lambda: whole_offered() is want, timeout=30):
                raise SystemExit(f"GPU 0's slice never showed its whole device {'in' if want else 'out'}")
        return (time.perf_counter() - t0) * 1000

    wait(True)
    made, destroyed = [], []
    for k in range(toggles):
        claim = rig.api.put("resourceclaims", testing.claim(f"t{k}", NODE, [{
            "request": "gpu", "driver": DRIVER, "pool": partitions.pool_name(NODE, 0),
            "device": partitions.partition_name(0, "3g.40gb", 4)}], namespace="bench"))
        rig.kubelet.prepare(claim)
        made.append(wait(False))
        rig.kubelet.unprepare(claim)
        destroyed.append(wait(True))
    return made, destroyed


def mig_figures(gpus: int, rounds: int, toggles: int) -> tuple[list[float], ...]:
    from py_vcuda.sim import GiB, SimConfig, nvml_session

    root = Path(tempfile.mkdtemp(prefix="vcmig", dir="/tmp"))
    sim = SimConfig(state_path=root / "sim", devices=gpus, memory=80 * GiB, mig=["off"] * gpus)
    try:
        with nvml_session(sim) as nvml:
            rig = Rig(root, gpus, inv=Inventory.from_nvml(nvml), nvml=nvml, mig="dynamic")
            try:
                prepare, unprepare = partition_latency(rig, gpus, rounds)
                made, destroyed = partition_republish(rig, toggles)
            finally:
                rig.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return prepare, unprepare, made, destroyed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--claims-per-gpu", type=int, default=50)
    parser.add_argument("--toggles", type=int, default=20)
    parser.add_argument("--mig-gpus", type=int, default=4)
    parser.add_argument("--mig-rounds", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    root = Path(tempfile.mkdtemp(prefix="vcdra", dir="/tmp"))   # short: unix socket paths
    rig = Rig(root, args.gpus)
    try:
        prepare, unprepare = prepare_latency(rig, args.gpus, args.claims_per_gpu)
        down, up = republish_time(rig, args.toggles)
    finally:
        rig.close()
        shutil.rmtree(root, ignore_errors=True)
    allocate: list[float] = []
    if args.gpus == plugin_bench.GPUS:
        root = Path(tempfile.mkdtemp(prefix="vcdp", dir="/tmp"))
        try:
            allocate = plugin_bench.allocate_latency(root, args.gpus * args.claims_per_gpu)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    p99 = percentile(prepare, 99)
    print(f"DRA driver, {args.gpus} simulated GPUs x {args.claims_per_gpu} share claims, state in {root.parent}")
    print(f"  NodePrepareResources    {summary(prepare)}   goal p99 <= {GOAL_PREPARE_P99_MS:.0f} ms: "
          f"{'met' if p99 <= GOAL_PREPARE_P99_MS else 'MISSED'}")
    print(f"  NodeUnprepareResources  {summary(unprepare)}")
    if allocate:
        print(f"  vgpu Allocate, same run {summary(allocate)}   prepare p99 / Allocate p99: "
              f"{p99 / percentile(allocate, 99):.2f}")
    print(f"  slice without a GPU that turned unhealthy   {summary(down)}")
    print(f"  slice with the GPU back after recovery      {summary(up)}")
    if args.mig_gpus:
        made_p, gone_p, made_s, gone_s = mig_figures(args.mig_gpus, args.mig_rounds, args.toggles)
        p99 = percentile(made_p, 99)
        print(f"MIG partitions (--mig=dynamic), {args.mig_gpus} simulated H100s x 7 1g.10gb, {args.mig_rounds} rounds; "
              "simulated instance creation costs ~0")
        print(f"  prepare, instance made  {summary(made_p)}   goal p99 <= {GOAL_PARTITION_P99_MS:.0f} ms: "
              f"{'met' if p99 <= GOAL_PARTITION_P99_MS else 'MISSED'}")
        print(f"  unprepare, destroyed    {summary(gone_p)}")
        print(f"  slice after a GPU's first partition is made   {summary(made_s)}")
        print(f"  slice after a GPU's last partition is gone    {summary(gone_s)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
