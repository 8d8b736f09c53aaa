"""Exporter figures: scrape time and CPU per scrape for a node of 8 GPUs x 16 tenants (goal: <= 50 ms).

    python3 bench/exporter_bench.py [--gpus 8] [--tenants 16] [--scrapes 100]

Setup: 8 simulated GPUs, one real token scheduler daemon per GPU (own
process) with 16 tenants each, 128 container records with their ledgers (half
of them without pod names, resolved through a stand-in kubelet pod-resources
server), all in one node state directory. The exporter runs in this process.
The scrapes come from a separate client process (HTTP GET of /metrics, timed
end to end there), so none of the client's work is counted here:

- scrape time: p50 / p95 / max of the client's GET, one scrape after another;
- exporter CPU per scrape: this process's CPU time over the scrapes (HTTP
  server threads and all: request parsing, reading the node, rendering,
  writing the body), divided by the number of scrapes. It includes the
  stand-in kubelet's answers (one `List` per 10 s refresh, counted below);
  the schedulers' CPU for answering `stats` is their own processes';
- of that, reading + rendering: CPU time of the server thread inside the
  body function (`time.thread_time`), i.e. without the HTTP handling.

Each figure is taken twice in one run, side by side: plain scrapes, then
scrapes with `Accept-Encoding: gzip` as Prometheus sends it (body size on the
wire, scrape time, exporter CPU including the compression).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from concurrent import futures
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kube_contract.api import podresources_v1_pb2 as pr  # noqa: E402
from kube_contract.api import podresources_v1_pb2_grpc as pr_grpc  # noqa: E402
from node_state import metrics_text  # noqa: E402
from node_state.layout import ContainerRecord, NodeLayout, ledger_in  # noqa: E402
from node_state.metrics import start_exporter  # noqa: E402
from py_vcuda.ledger import Ledger  # noqa: E402
from py_vcuda.nvml import NVML  # noqa: E402
from py_vcuda.sim import GiB, SimConfig  # noqa: E402
from token_scheduler.testing import AdminClient, spawn_daemon  # noqa: E402

CORE = "tencent.com/vcuda-core"


# The scraping client, run as `python -c CLIENT PORT N GZIP`: says "ready", waits for a line, scrapes N times
# one after another (GZIP "1": accepting gzip, and unpacking it as a scraper must), prints the times (s) and the
# body size on the wire as JSON.
CLIENT = """
import gzip, json, sys, time, urllib.request
port, n, packed = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                             headers={"Accept-Encoding": "gzip"} if packed else {})
print("ready", flush=True)
sys.stdin.readline()
times, size = [], 0
for _ in range(n):
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read()
        assert (resp.headers.get("Content-Encoding") == "gzip") == packed
    if packed:
        gzip.decompress(body)
    size = len(body)
    times.append(time.perf_counter() - start)
print(json.dumps({"times": times, "size": size}), flush=True)
"""


class Lister(pr_grpc.PodResourcesListerServicer):
    def __init__(self, response: pr.ListPodResourcesResponse) -> None:
        self.response = response
        self.calls = 0

    def List(self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        self.calls += 1
        return self.response


class BodyCPU:
    """Wraps metrics_text.render (which pulls the collector, so it reads the node too) to record the server
    thread's CPU time per body."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._render = metrics_text.render

    def __call__(self, metrics: Iterable) -> bytes:  # type: ignore[type-arg]
        start = time.thread_time()
        body = self._render(metrics)
        self.samples.append(time.thread_time() - start)
        return body


def build_node(root: Path, uuids: list[str], tenants: int) -> tuple[NodeLayout, list, pr.ListPodResourcesResponse]:
    layout = NodeLayout(root / "n")
    daemons = []
    pods = []
    per_tenant = max(1, 100 // tenants)
    for g, uuid in enumerate(uuids):
        directory = layout.scheduler_dir(uuid)
        daemons.append(spawn_daemon(directory, "--window", "10s", gpu=uuid))
        admin = AdminClient(directory / "admin.sock")
        admin.wait_ready(60)
        for t in range(tenants):
            name = f"g{g}t{t}"
            assert admin.call("add", tenant=name, request=per_tenant, limit=100).get("ok")
            ids = tuple(f"{uuid}::{t * per_tenant + i}" for i in range(per_tenant))
            named = t % 2 == 0
            record = ContainerRecord(key=f"c-{name}", mode="vgpu", resource=CORE, device_ids=ids, gpus=(uuid,),
                                     core_request=per_tenant, core_limit=100, memory_limit=GiB, tenant=name,
                                     namespace="bench" if named else "", pod=f"pod-{name}" if named else "",
                                     container="main" if named else "")
            directory_c = layout.write_record(record)
            with Ledger(ledger_in(directory_c), create=True) as ledger:
                ledger.set_limit(uuid, GiB)
            if not named:
                pods.append(pr.PodResources(name=f"pod-{name}", namespace="bench", containers=[
                    pr.ContainerResources(name="main", devices=[pr.ContainerDevices(resource_name=CORE,
                                                                                    device_ids=ids)])]))
        admin.close()
    return layout, daemons, pr.ListPodResourcesResponse(pod_resources=pods)


def scrape(port: int) -> tuple[float, int]:
    start = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        body = resp.read()
    return time.perf_counter() - start, len(body)


def client_scrapes(port: int, n: int, packed: bool) -> tuple[list[float], int, float]:
    """n scrapes from another process: (their times, body size, this process's CPU seconds meanwhile)."""
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(port), str(n), "1" if packed else "0"],
                              stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert client.stdin is not None and client.stdout is not None
    try:
        assert client.stdout.readline().strip() == "ready"
        cpu0 = time.process_time()
        client.stdin.write("go\n")
        client.stdin.flush()
        result = json.loads(client.stdout.readline())
        cpu = time.process_time() - cpu0
    finally:
        client.stdin.close()
        client.wait(30)
    return result["times"], result["size"], cpu


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--tenants", type=int, default=16)
    parser.add_argument("--scrapes", type=int, default=100)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="vcb", dir="/tmp"))
    sim = SimConfig(state_path=root / "sim.state", devices=args.gpus, memory=16 * GiB)
    os.environ.update(sim.env())
    daemons = []
    server = None
    stop = None
    body_cpu = BodyCPU()
    metrics_text.render = body_cpu  # type: ignore[assignment]  (start_exporter's body calls it by module)
    try:
        nvml = NVML()
        uuids = [g.uuid for g in nvml.gpus()]
        layout, daemons, listing = build_node(root, uuids, args.tenants)
        lister = Lister(listing)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pr_grpc.add_PodResourcesListerServicer_to_server(lister, server)
        server.add_insecure_port(f"unix://{root / 'kubelet.sock'}")
        server.start()
        stop = start_exporter(port=0, addr="127.0.0.1", layout=layout, mode="vgpu", node="bench",
                              pod_resources_socket=root / "kubelet.sock", nvml=nvml)
        port = stop.port  # type: ignore[attr-defined]
        first, _ = scrape(port)  # opens ledgers and sockets, asks the kubelet
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        print(f"node: {args.gpus} GPUs x {args.tenants} tenants = {args.gpus * args.tenants} containers, "
              f"{series} series")
        print(f"first scrape (cold caches): {first * 1000:.1f} ms")
        sizes = {}
        for packed in (False, True):
            body_cpu.samples.clear()
            lists0 = lister.calls
            times, size, cpu = client_scrapes(port, args.scrapes, packed)
            sizes[packed] = size
            assert len(body_cpu.samples) == args.scrapes, len(body_cpu.samples)
            times.sort()
            body = sorted(body_cpu.samples)
            print(f"{'gzip (Accept-Encoding: gzip)' if packed else 'plain'}: {size / 1024:.0f} KiB per scrape")
            print(f"  scrape time over {args.scrapes} scrapes (client in another process): "
                  f"p50 {percentile(times, 0.5) * 1000:.1f} ms, p95 {percentile(times, 0.95) * 1000:.1f} ms, "
                  f"max {times[-1] * 1000:.1f} ms, mean {statistics.mean(times) * 1000:.1f} ms (goal <= 50 ms)")
            print(f"  exporter CPU per scrape (exporter process, HTTP server included, client excluded): "
                  f"{cpu / args.scrapes * 1000:.1f} ms; pod-resources List calls meanwhile: {lister.calls - lists0}")
            print(f"    of which reading + rendering (server thread, time.thread_time): p50 "
                  f"{percentile(body, 0.5) * 1000:.1f} ms, p95 {percentile(body, 0.95) * 1000:.1f} ms, "
                  f"max {body[-1] * 1000:.1f} ms")
        print(f"gzip body / plain body: {sizes[True] / sizes[False]:.3f}")
        nvml.close()
        return 0
    finally:
        metrics_text.render = body_cpu._render  # type: ignore[method-assign]
        if stop is not None:
            stop()
        if server is not None:
            server.stop(None)
        for d in daemons:
            d.kill()
            d.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
