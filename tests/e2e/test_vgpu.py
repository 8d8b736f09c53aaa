"""Scenario 1, vgpu: two pods that ask for 30 cores/8 GiB and 50 cores/4 GiB and name no scheduler.

The webhook sends them to vcuda-scheduler, whose extender places both on one GPU; the real kubelet
calls the node agent's Allocate and containerd runs them with libvcuda and the simulated driver (the
chart's testing.simulator). Each sees its quota through cuMemGetInfo and NVML's memory query (the one
nvidia-smi makes), is refused past it, and the exporter measures their GPU-time shares at 0.30 and
0.50 within 2 percentage points over 20 s.
"""

from __future__ import annotations

import json
import time

import vcuda as vcuda_tool
from shimtest import parse

GiB = 1 << 30
MiB = 1 << 20
CHUNK = 256 * MiB
OUT_OF_MEMORY = 2                # CUDA_ERROR_OUT_OF_MEMORY
COMPUTE_S = 75                   # each pod's kernels run this long; the share is measured inside it
WINDOW_S = 20
PODS = {"share-30": (30, 8 * GiB), "share-50": (50, 4 * GiB)}


def _pod(name: str, namespace: str, cores: int, memory: int) -> dict:
    script = (f"vcuda-workload quota-fill {CHUNK}; echo quota-fill-done; "
              f"vcuda-workload compute 10000 {COMPUTE_S}; echo compute-done; sleep 3600")
    return vcuda_tool.vgpu_pod(name, namespace, cores, memory, ["sh", "-c", script])


def test_two_shares_on_one_gpu(vcuda, namespace):
    vcuda_tool.skip_unless_ready(vcuda, "scenario 1")
    started = time.monotonic()
    c = vcuda.cluster
    agent = vcuda.wait_ready(timeout=60)["device-plugin"]["metadata"]["name"]
    for name, (cores, memory) in PODS.items():
        vcuda_tool.create(c, _pod(name, namespace, cores, memory))

    def explain() -> str:
        return "\n".join(c.kubectl("describe", "pod", "-n", namespace, n, check=False).stdout[-2500:] for n in PODS)

    def logs(name: str) -> str:
        return c.kubectl("logs", "-n", namespace, name, check=False).stdout

    # Placed by vcuda-scheduler through the extender, on the same GPU, and running.
    pods = {}
    for name in PODS:
        pods[name] = vcuda_tool.wait_for(f"pod {name} Running", lambda n=name: (
            p := vcuda_tool.get(c, "pod", n, namespace))["status"].get("phase") == "Running" and p,
            timeout=120, explain=explain)
        assert pods[name]["spec"]["schedulerName"] == "vcuda-scheduler"
    gpus = {n: {g["uuid"] for ct in json.loads(p["metadata"]["annotations"]["vcuda.io/gpu-assignment"])["containers"]
                for g in ct["gpus"]} for n, p in pods.items()}
    assert all(len(g) == 1 for g in gpus.values()) and len(set.union(*gpus.values())) == 1, gpus

    # Each sees its own quota and is refused past it.
    outs = {}
    for name, (_, memory) in PODS.items():
        text = vcuda_tool.wait_for(f"{name}'s quota-fill", lambda n=name: "quota-fill-done" in (t := logs(n)) and t,
                                   timeout=60, explain=explain)
        out = {d["cmd"]: d for d in parse(text) if "rc" in d}
        outs[name] = out
        assert out["init"]["rc"] == "0" and out["ctx"]["rc"] == "0", text
        assert (out["info"]["rc"], int(out["info"]["total"])) == ("0", memory), text      # cuMemGetInfo
        assert (out["nvmem"]["rc"], int(out["nvmem"]["total"])) == ("0", memory), text    # nvidia-smi's query
        fill = out["fill"]
        assert int(fill["rc"]) == OUT_OF_MEMORY, text
        assert int(fill["bytes"]) <= memory and int(fill["bytes"]) + CHUNK > int(out["info"]["free"]), text

    # The shares, from the exporter's GPU-time counters over WINDOW_S while both run kernels.
    time.sleep(5)
    t0, m0 = time.monotonic(), vcuda_tool.exporter_metrics(c, agent)
    time.sleep(WINDOW_S)
    t1, m1 = time.monotonic(), vcuda_tool.exporter_metrics(c, agent)
    for name, (cores, _) in PODS.items():
        key = (name, "vcuda_container_gpu_time_seconds_total")
        assert key in m0 and key in m1, sorted(k for k in m1 if k[0] == name)
        share = (sum(m1[key].values()) - sum(m0[key].values())) / (t1 - t0)
        vcuda_tool.note(f"scenario 1: {name}'s GPU-time share over {t1 - t0:.0f} s", f"{share:.3f}")
        assert abs(share - cores / 100) <= 0.02, (name, share)
    for name in PODS:
        assert "compute-done" not in logs(name), "the kernels ended inside the measured window"
    vcuda_tool.record("scenario 1 (vgpu: two shares on one GPU)", time.monotonic() - started)
