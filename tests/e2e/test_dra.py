"""Scenario 4, DRA: vcuda's DRA driver gpu.vcuda.io (the chart's dra.enabled, dra.mig=dynamic) on the real
API server, scheduler and kubelet.

- The ResourceSlices the driver publishes are taken by the real API server as written: the plain GPU's
  device (consumable capacity, allowMultipleAllocations) in the node's pool; the MIG-capable GPU in a pool
  of its own whose whole device is multi-allocatable AND consumes every counter of its counter set, beside
  its partitions; the counter set in the slice of the devices on 1.34, in a slice of its own from 1.35.
- Two pods from one ResourceClaimTemplate (30 cores, 8 GiB, class gpu-share.vcuda.io) share one GPU
  through the cluster's default kube-scheduler (the webhook leaves DRA pods alone): one device, two shares;
  each container sees its 8 GiB and is refused past it, and runs at its 30 % of the GPU's time; a third
  asking 50 cores of that GPU does not fit.
- A claim for a 1g.10gb partition: the driver makes the MIG instance at prepare (MIG mode turned on for
  it), the pod sees the instance's memory, and the instance is destroyed (MIG mode off again) once the
  pod is gone.
- The two questions our notes left open, asked of the real scheduler with a driver of the test's own
  (slices it publishes by hand, no kubelet plugin: pods are placed and their claims allocated, never
  started): is a multi-allocatable device that consumes counters charged once per device or once per
  share? See e2e/README.md "DRA on a real cluster" for the answers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import cluster as cluster_tool
import pytest
import vcuda as vcuda_tool
from kubernetes.utils import parse_quantity
from prometheus_client.parser import text_string_to_metric_families
from shimtest import parse

DRIVER = "gpu.vcuda.io"
GiB = 1 << 30
MiB = 1 << 20
CHUNK = 256 * MiB
OUT_OF_MEMORY = 2                  # CUDA_ERROR_OUT_OF_MEMORY
COMPUTE_S = 75
WINDOW_S = 20
NODE = cluster_tool.NODE
SIMULATED_GPU_MEMORY = 16 * GiB    # chart testing.simulatedNode.memory: GPU 0
VALUES = {"dra.mig": "dynamic"}    # GPU 1 is MIG-capable (h100-80gb), MIG mode off (testing.simulatedNode.mig)
PROBE = "e2e-probe.vcuda.io"       # the driver the scheduler questions use (slices written by the test)
# The simulator has no device nodes: a container sees every simulated GPU (node_state/gpu_driver.py), where
# NVIDIA's toolkit would give it only those NVIDIA_VISIBLE_DEVICES names. The workloads stand that in.
TOOLKIT = 'export CUDA_VISIBLE_DEVICES="$NVIDIA_VISIBLE_DEVICES"; '


def version(c) -> tuple[int, int]:
    major, minor = c.version.split(".")[:2]
    return int(major), int(minor)


@pytest.fixture(scope="module")
def dra(release):
    """The release as the DRA driver with MIG partitions made at prepare; the scenario's time at the end."""
    vcuda_tool.skip_unless_ready(release, "scenario 4")
    try:
        took = release.ensure("dra", VALUES)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    if took:
        vcuda_tool.record("helm reinstall as the DRA driver (dra.mig=dynamic)", took)
    started = time.monotonic()
    yield release
    vcuda_tool.record(f"scenario 4 (DRA), all its tests, Kubernetes {release.cluster.version}",
                      time.monotonic() - started)


# ---------------------------------------------------------------- helpers

def _items(c, kind: str, namespace: str | None = None) -> list[dict]:
    ns = ["-n", namespace] if namespace else []
    return json.loads(c.kubectl("get", kind, *ns, "-o", "json").stdout)["items"]


def _slices(c, driver: str = DRIVER) -> dict[str, dict]:
    return {s["metadata"]["name"]: s for s in _items(c, "resourceslices") if s["spec"]["driver"] == driver}


def _devices(slices: dict[str, dict]) -> dict[str, dict]:
    return {d["name"]: d for s in slices.values() for d in s["spec"].get("devices") or ()}


def _driver_pod(dra) -> str:
    return dra.wait_ready(timeout=60)["dra-driver"]["metadata"]["name"]


def _pod(namespace: str, name: str, claims: dict[str, dict], script: str) -> dict:
    """A pod of the workload image whose one container uses every claim in `claims` (name -> the pod's
    resourceClaims entry: {"resourceClaimTemplateName": ...} or {"resourceClaimName": ...})."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": {
        "hostPID": True,          # the simulator's driver shares its state by host pid (README testing.simulator)
        "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
        "resourceClaims": [{"name": k, **v} for k, v in claims.items()],
        "containers": [{"name": "main", "image": vcuda_tool.WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", script], "resources": {"claims": [{"name": k} for k in claims]}}]}}


def _request(cls: str, *, selector: str | None = None, capacity: dict[str, str] | None = None,
             name: str = "gpu") -> dict:
    exactly: dict = {"deviceClassName": cls}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": exactly}


def _template(namespace: str, name: str, request: dict) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"spec": {"devices": {"requests": [request]}}}}


def _claim(namespace: str, name: str, request: dict) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": {"requests": [request]}}}


def _claims_of(c, namespace: str, pod: dict) -> list[dict]:
    """The pod's ResourceClaims (those made from templates found through its status)."""
    names = [s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses", [])]
    names += [rc["resourceClaimName"] for rc in pod["spec"].get("resourceClaims", []) if "resourceClaimName" in rc]
    return [vcuda_tool.get(c, "resourceclaim", n, namespace) for n in names if n]


def _results(claim: dict) -> list[dict]:
    return ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])


def _placed(c, namespace: str, name: str) -> str | None:
    """"allocated" once the scheduler has placed the pod (its claims allocated), "unschedulable: <why>" once it
    said it cannot; None before either."""
    pod = vcuda_tool.get(c, "pod", name, namespace)
    if pod["spec"].get("nodeName"):
        return "allocated"
    for cond in pod["status"].get("conditions", []):
        if cond["type"] == "PodScheduled" and cond["status"] == "False" and cond.get("reason") == "Unschedulable":
            return f"unschedulable: {cond.get('message', '')}"
    return None


def _describe(c, namespace: str, *names: str):
    return lambda: "\n".join(c.kubectl("describe", "pod", "-n", namespace, n, check=False).stdout[-2500:]
                             for n in names)


def _running(c, namespace: str, name: str, timeout: float = 120) -> dict:
    return vcuda_tool.wait_for(f"pod {name} Running", lambda: (
        p := vcuda_tool.get(c, "pod", name, namespace))["status"].get("phase") == "Running" and p,
        timeout=timeout, explain=_describe(c, namespace, name))


def _logs(c, namespace: str, name: str) -> str:
    return c.kubectl("logs", "-n", namespace, name, check=False).stdout


def _nvml(dra, index: int) -> dict:
    """GPU `index` as NVML (the simulator's) says in the driver's container: MIG mode and instances."""
    code = ("import json, os; from py_vcuda.nvml import open_with_env; n = open_with_env(os.environ); "
            f"print(json.dumps({{'mode': n.mig_mode({index}), 'devices': [{{'uuid': d.uuid, 'profile': d.profile, "
            f"'start': d.placement.start, 'memory': d.memory_total}} for d in n.mig_devices({index})]}}))")
    out = dra.cluster.kubectl("exec", "-n", vcuda_tool.NAMESPACE, _driver_pod(dra), "-c", "dra-driver", "--",
                              "python3", "-c", code, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _metrics(dra, agent: str) -> dict[tuple[str, str], float]:
    """The driver's exporter through the API server's pod proxy: {(pod, metric): summed value}."""
    text = dra.cluster.kubectl(
        "get", "--raw", f"/api/v1/namespaces/{vcuda_tool.NAMESPACE}/pods/{agent}:9394/proxy/metrics").stdout
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "pod" in s.labels:
                out[(s.labels["pod"], s.name)] = out.get((s.labels["pod"], s.name), 0.0) + s.value
    return out


# ---------------------------------------------------------------- the driver's slices

def test_published_slices_accepted(dra):
    """The real API server holds the driver's pools as written (nothing dropped: a server without the
    gates drops allowMultipleAllocations, capacity and consumesCounters without a word)."""
    started = time.monotonic()
    c = dra.cluster
    own = f"{NODE}-{DRIVER}"
    mig = f"{own}-gpu-1"
    separate = version(c) >= (1, 35)
    expected = {own, mig, *([f"{mig}-counters"] if separate else [])}
    got = vcuda_tool.wait_for("the driver's ResourceSlices", lambda: (s := _slices(c)) and set(s) == expected and s,
                              timeout=90, explain=lambda: json.dumps(sorted(_slices(c)), indent=1))
    for s in got.values():
        assert s["spec"]["nodeName"] == NODE
        owners = s["metadata"].get("ownerReferences", [])
        assert [(o["kind"], o["name"]) for o in owners] == [("Node", NODE)], owners

    # The node's pool: GPU 0, shared through consumable capacity.
    spec = got[own]["spec"]
    assert spec["pool"]["name"] == NODE and spec["pool"]["resourceSliceCount"] == 1
    assert [d["name"] for d in spec["devices"]] == ["gpu-0"], spec
    gpu0 = spec["devices"][0]
    assert gpu0["allowMultipleAllocations"] is True
    assert gpu0["attributes"]["type"] == {"string": "gpu"} and gpu0["attributes"]["index"] == {"int": 0}
    assert gpu0["capacity"]["cores"] == {"value": "100", "requestPolicy": {
        "default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}}, gpu0["capacity"]
    memory = gpu0["capacity"]["memory"]   # quantities read back in canonical form ("16Gi")
    assert parse_quantity(memory["value"]) == SIMULATED_GPU_MEMORY, memory
    assert parse_quantity(memory["requestPolicy"]["validRange"]["step"]) == 256 * MiB, memory
    assert "consumesCounters" not in gpu0

    # GPU 1's pool: its counter set, its whole device (multi-allocatable AND consuming every counter),
    # one device per partition and placement.
    pool = [s for n, s in got.items() if n != own]
    assert {s["spec"]["pool"]["name"] for s in pool} == {f"{NODE}-gpu-1"}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in pool} == {len(pool)}
    assert len({s["spec"]["pool"]["generation"] for s in pool}) == 1, "one generation for the whole pool"
    holding = [s for s in pool if s["spec"].get("sharedCounters")]
    assert len(holding) == 1
    if separate:   # 1.35 on: the counter set in a slice of its own
        assert holding[0]["metadata"]["name"] == f"{mig}-counters" and not holding[0]["spec"].get("devices")
    else:          # 1.34: beside the devices that consume it
        assert holding[0]["metadata"]["name"] == mig and holding[0]["spec"]["devices"]
    (counter_set,) = holding[0]["spec"]["sharedCounters"]
    assert counter_set["name"] == "gpu-1-counters"
    counters = {k: int(v["value"]) for k, v in counter_set["counters"].items()}
    assert {f"memory-slice-{i}" for i in range(8)} <= set(counters) and counters["compute-slices"] == 7, counters

    devs = _devices({n: s for n, s in got.items() if n != own})
    whole = devs.pop("gpu-1")
    assert whole["allowMultipleAllocations"] is True and set(whole["capacity"]) == {"cores", "memory"}
    (consumes,) = whole["consumesCounters"]
    assert consumes["counterSet"] == "gpu-1-counters"
    assert {k: int(v["value"]) for k, v in consumes["counters"].items()} == counters, "the whole GPU takes them all"
    small = {n: d for n, d in devs.items() if d["attributes"].get("profile") == {"string": "1g.10gb"}}
    assert sorted(d["attributes"]["placementStart"]["int"] for d in small.values()) == list(range(7)), sorted(small)
    for name, d in devs.items():
        assert d["attributes"]["type"] == {"string": "mig"}, name
        assert not d.get("allowMultipleAllocations"), f"{name}: a partition is taken whole"
        assert d["consumesCounters"][0]["counterSet"] == "gpu-1-counters", name
    part = small["gpu-1-mig-1g-10gb-0"]["consumesCounters"][0]["counters"]
    memory_slices = {k for k in part if k.startswith("memory-slice-")}
    assert memory_slices == {"memory-slice-0"} and part["compute-slices"]["value"] == "1", part
    vcuda_tool.note(f"scenario 4: GPU 1's pool on {c.version} (slices, devices, counters)",
                    f"{len(pool)}, {len(devs) + 1}, {len(counters)}")
    vcuda_tool.record("scenario 4: the driver's slices read back", time.monotonic() - started)


# ---------------------------------------------------------------- two shares of one GPU

SHARE = {"cores": "30", "memory": "8Gi"}
# GPU 0 (pinned: 1.34's scheduler tries the node's pools in map order, so two claims could land on two GPUs)
ON_GPU0 = 'device.attributes["gpu.vcuda.io"].index == 0'


def test_two_shares_of_one_gpu(dra, namespace):
    started = time.monotonic()
    c = dra.cluster
    agent = _driver_pod(dra)
    vcuda_tool.create(c, _template(namespace, "share-30-8gi",
                                   _request("gpu-share.vcuda.io", selector=ON_GPU0, capacity=SHARE)))
    script = (f"{TOOLKIT}vcuda-workload quota-fill {CHUNK}; echo quota-fill-done; "
              f"vcuda-workload compute 10000 {COMPUTE_S}; echo compute-done; sleep 3600")
    names = ["share-a", "share-b"]
    for name in names:
        out = vcuda_tool.create(c, _pod(namespace, name, {"gpu": {"resourceClaimTemplateName": "share-30-8gi"}},
                                        script))
        assert "vcuda" not in out.stderr, out.stderr   # no admission warning: the webhook leaves DRA pods alone
    pods = {n: _running(c, namespace, n) for n in names}

    # Placed by the cluster's own kube-scheduler, both on GPU 0, each with a share of its own.
    results = {}
    for name, pod in pods.items():
        assert pod["spec"]["schedulerName"] == "default-scheduler", pod["spec"]["schedulerName"]
        (claim,) = _claims_of(c, namespace, pod)
        (result,) = _results(claim)
        assert (result["driver"], result["pool"], result["device"]) == (DRIVER, NODE, "gpu-0"), result
        assert result["consumedCapacity"] == {"cores": "30", "memory": "8Gi"}, result
        assert result.get("shareID"), result
        assert [r["name"] for r in claim["status"]["reservedFor"]] == [name]
        results[name] = result
    assert results["share-a"]["shareID"] != results["share-b"]["shareID"]

    # A third asking 50 cores of GPU 0 does not fit (60 of its 100 cores and all its memory are taken).
    vcuda_tool.create(c, _template(namespace, "share-50", _request(
        "gpu-share.vcuda.io", selector=ON_GPU0, capacity={"cores": "50", "memory": "1Gi"})))
    vcuda_tool.create(c, _pod(namespace, "share-c", {"gpu": {"resourceClaimTemplateName": "share-50"}}, "sleep 3600"))
    refused = vcuda_tool.wait_for("share-c refused by the scheduler", lambda: _placed(c, namespace, "share-c"),
                                  timeout=60)
    assert refused.startswith("unschedulable") and "cannot allocate all claims" in refused, refused

    # Each sees its own quota and is refused past it.
    for name in names:
        text = vcuda_tool.wait_for(f"{name}'s quota-fill", lambda n=name: "quota-fill-done" in (
            t := _logs(c, namespace, n)) and t, timeout=60, explain=_describe(c, namespace, name))
        out = {d["cmd"]: d for d in parse(text) if "rc" in d}
        assert out["init"]["rc"] == "0" and out["ctx"]["rc"] == "0", text
        assert (out["info"]["rc"], int(out["info"]["total"])) == ("0", 8 * GiB), text      # cuMemGetInfo
        assert (out["nvmem"]["rc"], int(out["nvmem"]["total"])) == ("0", 8 * GiB), text    # nvidia-smi's query
        fill = out["fill"]
        assert int(fill["rc"]) == OUT_OF_MEMORY, text
        assert int(fill["bytes"]) <= 8 * GiB and int(fill["bytes"]) + CHUNK > int(out["info"]["free"]), text

    # Their compute shares, from the driver's exporter, over WINDOW_S while both run kernels.
    time.sleep(5)
    t0, m0 = time.monotonic(), _metrics(dra, agent)
    time.sleep(WINDOW_S)
    t1, m1 = time.monotonic(), _metrics(dra, agent)
    for name in names:
        key = (name, "vcuda_container_gpu_time_seconds_total")
        assert key in m0 and key in m1, sorted(k for k in m1 if k[0] == name)
        share = (m1[key] - m0[key]) / (t1 - t0)
        vcuda_tool.note(f"scenario 4: {name}'s GPU-time share over {t1 - t0:.0f} s ({c.version})", f"{share:.3f}")
        assert abs(share - 0.30) <= 0.02, (name, share)
    for name in names:
        assert "compute-done" not in _logs(c, namespace, name), "the kernels ended inside the measured window"
    vcuda_tool.record("scenario 4: two shares of one GPU (20 s window)", time.monotonic() - started)


# ---------------------------------------------------------------- a MIG partition made at prepare

# GPU 1 with MIG mode on from the start, in a simulator state of its own (the simulator takes its settings when
# its state file is made, and the other scenarios want GPU 1 whole).
MIG_ON = {**VALUES, "testing.simulatedNode.mig": ";on", "testing.simulatedNode.stateDir": "/var/lib/vcuda-sim-e2e-dra"}


@pytest.mark.parametrize("mig_mode", ["off", "on"])
def test_mig_partition_made_at_prepare(dra, namespace, mig_mode):
    """MIG mode off: the driver turns it on for the partition and off again after (GPU 1 is offered whole
    when idle); on: it stays on, and GPU 1 is offered as partitions only."""
    if mig_mode == "on":
        try:
            took = dra.ensure("dra", MIG_ON)
        except RuntimeError as exc:
            pytest.fail(str(exc))
        vcuda_tool.record("helm reinstall as the DRA driver, GPU 1 in MIG mode", took)
    started = time.monotonic()
    c = dra.cluster
    before = _nvml(dra, 1)
    assert before["devices"] == [] and before["mode"][0] == (mig_mode == "on"), before
    vcuda_tool.create(c, _template(namespace, "mig-1g", _request(
        "mig.vcuda.io", selector='device.attributes["gpu.vcuda.io"].profile == "1g.10gb"')))
    vcuda_tool.create(c, _pod(namespace, "mig", {"gpu": {"resourceClaimTemplateName": "mig-1g"}},
                              f"{TOOLKIT}vcuda-workload quota; echo quota-done; sleep 3600"))
    pod = _running(c, namespace, "mig")
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    (claim,) = _claims_of(c, namespace, pod)
    (result,) = _results(claim)
    assert (result["driver"], result["pool"]) == (DRIVER, f"{NODE}-gpu-1"), result
    assert result["device"].startswith("gpu-1-mig-1g-10gb-"), result
    start = int(result["device"].rsplit("-", 1)[1])

    # Made at prepare, at the placement the scheduler chose, MIG mode on (turned on for it where it was off).
    now = _nvml(dra, 1)
    assert now["mode"][0], now
    (inst,) = now["devices"]
    assert (inst["profile"], inst["start"]) == ("1g.10gb", start), now
    spec = json.loads(Path(f"/var/run/cdi/{DRIVER}-claim_{claim['metadata']['uid']}.json").read_text())
    assert inst["uuid"] in json.dumps(spec), spec    # the container is handed that instance
    text = vcuda_tool.wait_for("mig's quota", lambda: "quota-done" in (t := _logs(c, namespace, "mig")) and t,
                               timeout=60, explain=_describe(c, namespace, "mig"))
    out = {d["cmd"]: d for d in parse(text) if "rc" in d}
    # cuMemGetInfo: the instance's memory (NVML's device 0 is the simulator's GPU 0 here: no toolkit narrows
    # NVML to the container's devices, and the instance has all of its memory, so no quota narrows it either).
    assert out["ctx"]["rc"] == "0" and out["info"]["rc"] == "0", text
    assert int(out["info"]["total"]) == inst["memory"], (text, inst)
    vcuda_tool.note(f"scenario 4: the 1g.10gb instance's memory ({c.version}, MIG mode {mig_mode})",
                    f"{inst['memory'] // MiB} MiB")
    # GPU 1 in MIG mode is not offered whole; its other partitions still are.
    offered = vcuda_tool.wait_for("GPU 1 no longer offered whole", lambda: "gpu-1" not in (d := _devices(_slices(c)))
                                  and d, timeout=30)
    assert any(n.startswith("gpu-1-mig-") for n in offered), sorted(offered)

    # Destroyed once the pod is gone, and MIG mode as it was before.
    gone = time.monotonic()
    c.kubectl("delete", "pod", "-n", namespace, "mig", "--wait=true", "--timeout=60s", timeout=90)
    vcuda_tool.wait_for("the partition destroyed", lambda: (n := _nvml(dra, 1))["devices"] == [] and n["mode"][0] ==
                        (mig_mode == "on"), timeout=60, every=1, explain=lambda: json.dumps(_nvml(dra, 1)))
    took = time.monotonic() - gone
    if mig_mode == "off":   # ... and GPU 1 offered whole again, consuming every counter of its pool
        whole = vcuda_tool.wait_for("GPU 1 offered whole again", lambda: _devices(_slices(c)).get("gpu-1"),
                                    timeout=30)
        assert whole.get("consumesCounters") and whole.get("allowMultipleAllocations"), whole
    else:                   # ... or as its partitions only (a GPU in MIG mode is never offered whole)
        def partitions() -> dict | None:
            d = _devices(_slices(c))
            small = [n for n, x in d.items() if x["attributes"].get("profile") == {"string": "1g.10gb"}]
            return d if len(small) == 7 else None
        devs = vcuda_tool.wait_for("GPU 1's seven 1g.10gb partitions offered", partitions, timeout=30)
        assert "gpu-1" not in devs, sorted(devs)
    vcuda_tool.record(f"scenario 4: pod deleted to its partition destroyed (MIG mode {mig_mode})", took)
    vcuda_tool.record(f"scenario 4: a 1g.10gb partition made and destroyed (MIG mode {mig_mode})",
                      time.monotonic() - started)


# ---------------------------------------------------------------- the scheduler's questions

def _probe_slices(c, separate: bool) -> list[dict]:
    """A pool shaped as the driver's MIG-capable GPU, small: a counter set of two memory slices; `whole`
    (multi-allocatable, cores 1-100) consumes both, `part-0` and `part-1` one each; and `plain`, as `whole`
    but consuming no counters (the control)."""
    def device(name: str, kind: str, counters: dict[str, int], shared: bool) -> dict:
        d: dict = {"name": name, "attributes": {"kind": {"string": kind}}}
        if counters:
            d["consumesCounters"] = [{"counterSet": "probe-counters",
                                      "counters": {k: {"value": str(v)} for k, v in counters.items()}}]
        if shared:
            d["allowMultipleAllocations"] = True
            d["capacity"] = {"cores": {"value": "100", "requestPolicy": {
                "default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}}}
        return d
    counters = {"sharedCounters": [{"name": "probe-counters",
                                    "counters": {"slice-0": {"value": "1"}, "slice-1": {"value": "1"}}}]}
    devices = {"devices": [device("whole", "whole", {"slice-0": 1, "slice-1": 1}, True),
                           device("part-0", "part", {"slice-0": 1}, False),
                           device("part-1", "part", {"slice-1": 1}, False),
                           device("plain", "plain", {}, True)]}
    parts = [counters, devices] if separate else [{**counters, **devices}]
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": f"{NODE}-{PROBE}-{i}"},
             "spec": {"driver": PROBE, "nodeName": NODE,
                      "pool": {"name": f"{NODE}-probe", "generation": 1, "resourceSliceCount": len(parts)}, **p}}
            for i, p in enumerate(parts)]


def test_scheduler_charges_counters(cluster, namespace):
    """Q1: does the API server take a multi-allocatable device that consumes counters (and in which layout)?
    Q2: does the scheduler charge a shared device's counters once per device or once per share?

    A pool like the driver's MIG-capable GPU: `whole` is multi-allocatable and consumes both counters (of
    value 1), as gpu-<i> does; `part-0` one of them, as a partition. Pods ask for shares of `whole` (20 of
    its 100 cores each) in turn (a pod each), two in one pod (one scheduling cycle), then for a partition:
      - charged per share: the second share does not fit (its counters are gone);
      - charged once per device: the second share fits, and `part-0` does not while `whole` is shared;
      - not charged once allocated: the second share fits, and so does `part-0`.
    No plugin serves the driver: the pods are placed and their claims allocated, never started."""
    started = time.monotonic()
    c = cluster
    separate = version(c) >= (1, 35)
    # Q1, both layouts: the one this server refuses is refused, with its reason.
    wrong = _probe_slices(c, not separate)
    out = c.kubectl("create", "-f", "-", input_=json.dumps({"apiVersion": "v1", "kind": "List", "items": wrong}),
                    check=False)
    assert out.returncode != 0, "the server took the other version's layout"
    reason = "only one of" if separate else "sharedCounters"
    assert reason in out.stderr, out.stderr
    print(f"[scenario 4] {c.version} refuses the {'1.34' if separate else '1.35+'} layout: {out.stderr.strip()}",
          flush=True)
    c.kubectl("delete", "resourceslice", *[s["metadata"]["name"] for s in wrong], "--ignore-not-found", check=False)
    made = _probe_slices(c, separate)
    klass = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": PROBE},
             "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{PROBE}"'}}]}}
    try:
        for obj in [*made, klass]:
            vcuda_tool.create(c, obj)
        back = _devices(_slices(c, PROBE))
        assert back["whole"]["allowMultipleAllocations"] is True and back["whole"]["consumesCounters"], back
        assert back["whole"]["capacity"]["cores"]["value"] == "100", back

        share = _request(PROBE, selector=f'device.attributes["{PROBE}"].kind == "whole"', capacity={"cores": "20"})
        part = _request(PROBE, selector=f'device.attributes["{PROBE}"].kind == "part"')
        plain = _request(PROBE, selector=f'device.attributes["{PROBE}"].kind == "plain"', capacity={"cores": "20"})
        for name in ("share-1", "share-2", "pair-1", "pair-2"):
            vcuda_tool.create(c, _claim(namespace, name, share))
        for name in ("plain-1", "plain-2"):
            vcuda_tool.create(c, _claim(namespace, name, plain))
        vcuda_tool.create(c, _claim(namespace, "part", part))
        outcome, why = {}, {}

        def place(pod: str, claims: list[str]) -> None:
            vcuda_tool.create(c, _pod(namespace, pod, {k: {"resourceClaimName": k} for k in claims}, "sleep 3600"))
            got = vcuda_tool.wait_for(f"pod {pod} placed or refused", lambda: _placed(c, namespace, pod),
                                      timeout=60, explain=_describe(c, namespace, pod))
            outcome[pod], _, why[pod] = got.partition(": ")
            print(f"[scenario 4] {c.version}: pod {pod} ({', '.join(claims)}): {got}", flush=True)
            if outcome[pod] == "allocated":
                for claim in _claims_of(c, namespace, vcuda_tool.get(c, "pod", pod, namespace)):
                    (r,) = _results(claim)
                    kind = claim["metadata"]["name"].split("-")[0]
                    if kind == "part":
                        assert r["device"].startswith("part-") and not r.get("shareID"), r
                    else:
                        assert r["device"] == ("plain" if kind == "plain" else "whole") and r.get("shareID"), r

        for pod, claims in (("one", ["share-1"]), ("two", ["share-2"]), ("pair", ["pair-1", "pair-2"]),
                            ("part", ["part"]), ("pair-plain", ["plain-1", "plain-2"])):
            place(pod, claims)
        vcuda_tool.note(f"scenario 4: scheduler {c.version}: share, second share, two shares in one pod, "
                        "partition while shared, two shares of a device without counters in one pod",
                        ", ".join(outcome[p] for p in ("one", "two", "pair", "part", "pair-plain")))
        assert outcome["one"] == "allocated", why
        assert outcome["two"] == "allocated", "the second share of `whole` did not fit: counters charged per share"
        assert outcome["part"] == "unschedulable", "a partition fit beside shares of the whole GPU"
        # Two shares in one pod: of a device without counters they fit on every version (the control) ...
        assert outcome["pair-plain"] == "allocated", why
        if separate:
            # ... and of `whole` on 1.36 too: charged once per device, held while any share is allocated.
            assert outcome["pair"] == "allocated", outcome
        else:
            # ... but not on 1.34: within one scheduling cycle each share of `whole` is charged again.
            assert outcome["pair"] == "unschedulable", outcome

        # The control: with every share gone (their claims deallocated), the partition fits: it was the shares'
        # counters that kept it out.
        c.kubectl("delete", "pod", "-n", namespace, "one", "two", "pair", "--grace-period=0", "--force",
                  timeout=90, check=False)
        vcuda_tool.wait_for("the shares' claims deallocated", lambda: not any(
            _results(vcuda_tool.get(c, "resourceclaim", n, namespace)) for n in ("share-1", "share-2")), timeout=60)
        vcuda_tool.wait_for("pod part placed once the shares are gone",
                            lambda: _placed(c, namespace, "part") == "allocated", timeout=90,
                            explain=_describe(c, namespace, "part"))
    finally:
        c.kubectl("delete", "pod", "-n", namespace, "--all", "--grace-period=0", "--force", check=False,
                  timeout=90)
        c.kubectl("delete", "resourceslice", *[s["metadata"]["name"] for s in made], "--ignore-not-found",
                  check=False)
        c.kubectl("delete", "deviceclass", PROBE, "--ignore-not-found", check=False)
    vcuda_tool.record("scenario 4: the scheduler's questions (probe driver)", time.monotonic() - started)

