"""DRA driver figures: NodePrepareResources latency, slice republish time after a health change.

    python3 bench/dra_bench.py [--gpus 8] [--claims-per-gpu 50] [--toggles 20]

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

from dra_driver import config, testing  # noqa: E402
from dra_driver.agent import DriverAgent  # noqa: E402
from dra_driver.kube import KubeAPI  # noqa: E402
from dra_driver.names import DRIVER  # noqa: E402
from kube_contract.apiclient import make_api_client  # noqa: E402
from kube_contract.testing import FakeApiServer  # noqa: E402
from node_state.testing import inventory  # noqa: E402
from py_vcuda import native  # noqa: E402
from py_vcuda.sim import MiB  # noqa: E402

NODE = testing.NODE
GOAL_PREPARE_P99_MS = 20.0


percentile = plugin_bench.percentile


def summary(values: list[float]) -> str:
    return (f"p50 {percentile(values, 50):6.2f} ms   p99 {percentile(values, 99):6.2f} ms   "
            f"max {max(values):6.2f} ms   (n={len(values)})")


def driver_config(root: Path) -> config.DriverConfig:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    flags = {"plugin-dir": root / "pl", "registry-dir": root / "reg", "cdi-dir": root / "cdi",
             "state-dir": root / "st", "host-lib-dir": native.lib_dir(), "node-name": NODE, "metrics-port": 0}
    return config.from_args(parser.parse_args([f"--{k}={v}" for k, v in flags.items()]), env={})


class Rig:
    """The driver in process, a fake API server and a test kubelet."""

    def __init__(self, root: Path, gpus: int) -> None:
        self.api = FakeApiServer()
        self.api.put("nodes", {"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE, "uid": "node-uid"}})
        (root / "reg").mkdir()
        self.kubelet = testing.TestKubelet(root / "reg")
        self.kubelet.start()
        kube = KubeAPI(make_api_client(str(self.api.kubeconfig(root / "kubeconfig"))))
        self.agent = DriverAgent(driver_config(root), inventory=inventory(gpus), api=kube)
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
    prepare, unprepare = [], []
    for claim in claims:
        t0 = time.perf_counter()
        resp = rig.kubelet.prepare(claim)
        prepare.append((time.perf_counter() - t0) * 1000)
        error = resp.claims[claim["metadata"]["uid"]].error
        if error:
            raise SystemExit(f"prepare failed: {error}")
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--claims-per-gpu", type=int, default=50)
    parser.add_argument("--toggles", type=int, default=20)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
