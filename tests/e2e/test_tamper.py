"""Scenario 2, tamper rows as real pod specs: vgpu pods (30 cores, 4 GiB each, as scenario 1) whose own
specs try to loosen their quota, and a process started with an empty environment.

    disable          env VCUDA_DISABLE=1             (libvcuda's pass-through switch)
    no-scheduler     env VCUDA_SCHEDULER=""          (no compute limiting without an endpoint)
    cuda-visible     env CUDA_VISIBLE_DEVICES=0,1    (both GPUs)
    nvidia-visible   env NVIDIA_VISIBLE_DEVICES=all  (what the NVIDIA runtime would hand it)
    clean-env        `kubectl exec ... env -i cuprobe` in a pod with no such env

kubelet puts a pod's own env after the device plugin's, so each variable reaches the processes. Each
is held to its quota (cuMemGetInfo's and NVML's total are the quota; allocations are refused past it)
and to its GPU: of the devices the process sees (cuprobe `devs`, by UUID), the one in the pod's
vcuda.io/gpu-assignment annotation is usable and every other is refused (CUDA_ERROR_INVALID_DEVICE).
The disable and no-scheduler pods also run kernels flat out: the exporter measures each at its 30 %
within 2 percentage points over 20 s.

On the simulator a container sees both simulated GPUs whatever it asks (it has no device nodes:
node_state/gpu_driver.py), so "its GPU" is the one libvcuda lets it use, as on a real node where the
NVIDIA runtime honours a pod's NVIDIA_VISIBLE_DEVICES=all (device_plugin/device_list.py). The clean
environment keeps only the simulator's settings (VCUDA_REAL_LIB*, VCUDA_SIM_*): on a real node the
driver is found by the linker, here it is named by them, and none of them is part of the quota.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import vcuda as vcuda_tool
from shimtest import parse

GiB = 1 << 30
MiB = 1 << 20
CHUNK = 256 * MiB
CORES, MEMORY = 30, 4 * GiB
OUT_OF_MEMORY = 2                # CUDA_ERROR_OUT_OF_MEMORY
INVALID_DEVICE = 101             # CUDA_ERROR_INVALID_DEVICE
COMPUTE_S = 40
WINDOW_S = 20
ROWS: dict[str, dict[str, str]] = {
    "disable": {"VCUDA_DISABLE": "1"},
    "no-scheduler": {"VCUDA_SCHEDULER": ""},
    "cuda-visible": {"CUDA_VISIBLE_DEVICES": "0,1"},
    "nvidia-visible": {"NVIDIA_VISIBLE_DEVICES": "all"},
    "clean-env": {},
}
COMPUTE_ROWS = ("disable", "no-scheduler")
PROBE = "/usr/local/bin/cuprobe"


def test_tamper_rows_are_held_to_quota_and_gpu(vcuda, namespace):
    vcuda_tool.skip_unless_ready(vcuda, "scenario 2")
    started = time.monotonic()
    c = vcuda.cluster
    agent = vcuda.wait_ready(timeout=60)["device-plugin"]["metadata"]["name"]
    # All at once: five pods of one size, created within a second or two, that kubelet admits in the
    # order they were bound; each must get the GPU the extender gave it (e2e/README: "What the real
    # cluster showed").
    for name, env in ROWS.items():
        vcuda_tool.create(c, vcuda_tool.vgpu_pod(name, namespace, CORES, MEMORY, ["sleep", "3600"], env))

    def explain() -> str:
        return "\n".join(c.kubectl("describe", "pod", "-n", namespace, n, check=False).stdout[-2500:] for n in ROWS)

    pods = {name: vcuda_tool.wait_for(f"pod {name} Running", lambda n=name: (
        p := vcuda_tool.get(c, "pod", n, namespace))["status"].get("phase") == "Running" and p,
        timeout=120, explain=explain) for name in ROWS}
    assigned = {}
    for name, p in pods.items():
        gpus = {g["uuid"] for ct in json.loads(p["metadata"]["annotations"]["vcuda.io/gpu-assignment"])["containers"]
                for g in ct["gpus"]}
        assert len(gpus) == 1, (name, gpus)
        assigned[name] = gpus.pop()
    vcuda_tool.note("scenario 2: GPUs the five pods were given", str(len(set(assigned.values()))))

    # The clean environment: only the simulator's settings, taken from the container (none is a quota).
    env_out = c.kubectl("exec", "-n", namespace, "clean-env", "--", "env").stdout
    sim_env = sorted(line for line in env_out.splitlines()
                     if line.startswith(("VCUDA_REAL_LIB", "VCUDA_SIM_")))
    assert any(line.startswith("VCUDA_SIM_STATE=") for line in sim_env), env_out

    def probe(name: str, *steps: str, timeout: float = 60) -> dict[str, list[dict[str, str]]]:
        cmd = ["env", "-i", *sim_env, PROBE] if name == "clean-env" else [PROBE]
        out = c.kubectl("exec", "-n", namespace, name, "--", *cmd, "--via=proc", "init", *steps, timeout=timeout,
                        check=False)
        assert out.returncode == 0, (name, out.stdout, out.stderr)
        steps_out: dict[str, list[dict[str, str]]] = {}
        for d in parse(out.stdout):
            if "rc" in d:
                steps_out.setdefault(d["cmd"], []).append(d)
        steps_out["_text"] = [{"stdout": out.stdout, "stderr": out.stderr}]
        return steps_out

    ordinal = {}
    for name, env in ROWS.items():
        # The spec's variable reached the container's processes (kubelet puts it after the plugin's) ...
        seen_env = set(c.kubectl("exec", "-n", namespace, name, "--", "env").stdout.splitlines())
        assert {f"{k}={v}" for k, v in env.items()} <= seen_env, (name, sorted(seen_env))
        out = probe(name, "devs")
        devs = out["devs"][0]
        assert devs["rc"] == "0", out["_text"]
        seen = [devs[f"uuid{i}"] for i in range(int(devs["count"]))]
        assert assigned[name] in seen, (name, assigned[name], seen)
        ordinal[name] = seen.index(assigned[name])
        others = [i for i in range(len(seen)) if i != ordinal[name]]
        mine = ordinal[name]
        # Every other GPU refused; its own usable, with its quota, and refused past it.
        out = probe(name, *(f"ctx:{i}" for i in others), f"ctx:{mine}", "info", f"nvmem:{mine}", f"fill:{CHUNK}")
        text = out["_text"]
        # ... and libvcuda said it ignores the ones of its own (the quota file rules)
        assert all(f"ignoring {k}" in text[0]["stderr"] for k in env if k.startswith("VCUDA_")), (name, text)
        assert [int(d["rc"]) for d in out["ctx"]] == [INVALID_DEVICE] * len(others) + [0], (name, text)
        info, nvmem, fill = out["info"][0], out["nvmem"][0], out["fill"][0]
        assert (info["rc"], int(info["total"])) == ("0", MEMORY), (name, text)       # cuMemGetInfo
        assert (nvmem["rc"], int(nvmem["total"])) == ("0", MEMORY), (name, text)     # nvidia-smi's query
        assert int(fill["rc"]) == OUT_OF_MEMORY, (name, text)
        assert int(fill["bytes"]) <= MEMORY and int(fill["bytes"]) + CHUNK > int(info["free"]), (name, text)
        vcuda_tool.note(f"scenario 2: {name} sees", f"{len(seen)} GPU(s)")

    # Compute: the rows that would switch limiting off run kernels; each is measured at its share.
    def spin(name: str):
        return probe(name, f"ctx:{ordinal[name]}", f"spin:10000:{COMPUTE_S * 1000}", timeout=COMPUTE_S + 60)

    with ThreadPoolExecutor(len(COMPUTE_ROWS)) as pool:
        running = {name: pool.submit(spin, name) for name in COMPUTE_ROWS}
        time.sleep(8)
        t0, m0 = time.monotonic(), vcuda_tool.exporter_metrics(c, agent)
        time.sleep(WINDOW_S)
        t1, m1 = time.monotonic(), vcuda_tool.exporter_metrics(c, agent)
        results = {name: f.result() for name, f in running.items()}
    for name in COMPUTE_ROWS:
        key = (name, "vcuda_container_gpu_time_seconds_total")
        assert key in m0 and key in m1, sorted(k for k in m1 if k[0] == name)
        share = (sum(m1[key].values()) - sum(m0[key].values())) / (t1 - t0)
        vcuda_tool.note(f"scenario 2: {name}'s GPU-time share over {t1 - t0:.0f} s", f"{share:.3f}")
        assert abs(share - CORES / 100) <= 0.02, (name, share, results[name]["_text"])
        assert results[name]["spin"][0]["rc"] == "0", results[name]["_text"]
    vcuda_tool.record("scenario 2 (tamper rows held to quota and GPU)", time.monotonic() - started)
