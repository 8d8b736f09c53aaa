"""The node agent reconciles its vGPU containers' ledgers with NVML: a
container's lazily loaded module code shows in its ledger and as
vcuda_container_memory_unattributed_bytes; an unmappable GPU process is
counted in vcuda_reconciler_unmapped_pids_total; a process that runs without
the shim is caught (node_state.quota_guard)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client
from simcontainers import FakeProc
from simtool import Children, lines, mem

from device_plugin.pods import StaticPods
from kube_contract.apiclient import make_api_client
from kube_contract.events import EventRecorder
from kube_contract.testing import FakeApiServer
from node_state.metrics import NodeCollector
from node_state.metrics_snapshot import NodeReader
from py_vcuda.ledger import Ledger
from py_vcuda.sim import GiB, MiB, SimConfig, nvml_session

CORE = "tencent.com/vcuda-core"
OFFSET = 300_000  # the container's pid namespace: host pid = pid + OFFSET


def samples(collector: NodeCollector, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(s.labels.get(k, "") for k in ("tenant", "container", "reason")): s.value
            for m in collector.collect() for s in m.samples if s.name == name}


def test_agent_reconciles_container_ledgers(agent_factory, kubelet, dp, short_dir: Path,
                                             sim_tool: Path) -> None:
    sim = SimConfig(state_path=short_dir / "sim", devices=1, memory=4 * GiB, context_overhead=64 * MiB)
    proc_root = FakeProc(short_dir / "proc")
    kids = Children(sim_tool, sim.env())
    with nvml_session(sim) as nvml:
        pods = StaticPods([dp.pod("app", cores=30, annotations={"vcuda.io/memory": "1Gi"})])
        agent = agent_factory("vgpu", gpus=1, pods=pods, inv=dp.inventory(1, memory=4 * GiB), nvml=nvml,
                              memory_reconcile_s="0.1", host_proc=str(proc_root.root))
        uuid = dp.gpu(0).uuid
        resp = kubelet.allocate(CORE, [f"{uuid}::{i}" for i in range(30)]).container_responses[0]
        env = {k: v for k, v in dp.host_env(resp).items() if k != "VCUDA_SCHEDULER"}  # memory only here
        env["VCUDA_SIM_HOST_PID_OFFSET"] = str(OFFSET)
        try:
            app = kids.spawn("init", "primary", "0", "module", "vcudasim-module;kernel k code=200Mi",
                             "fn", "k", "run", "0", "mem", "ready", env=env)
            held = mem(lines(kids.ready(app), "mem")[0]).total
            proc_root.add(app.pid, app.pid + OFFSET)
            stranger = kids.spawn("init", "primary", "0", "ready",
                                  env={"VCUDA_SIM_HOST_PID_OFFSET": str(OFFSET + 1)})  # no /proc entry
            kids.ready(stranger)
            (record,) = agent.store.records()
            ledger = agent.layout.ledger_path(record.key)

            def device():  # type: ignore[no-untyped-def]
                with Ledger(ledger) as book:
                    return book.devices()[0]

            dp.wait_for(lambda: device().used >= held, timeout=10, what="the module code in the ledger")
            assert device().unattributed == 200 * MiB
            collector = NodeCollector(NodeReader(agent.layout, mode="vgpu", node=dp.NODE, nvml=nvml),
                                      agent.memory_reconciler)
            unattributed = samples(collector, "vcuda_container_memory_unattributed_bytes")
            assert unattributed == {(record.key, "main", ""): 200 * MiB}
            dp.wait_for(lambda: agent.memory_reconciler.unmapped_counts(), timeout=10, what="the stranger")
            unmapped = samples(collector, "vcuda_reconciler_unmapped_pids_total")
            assert unmapped == {("", "", "exited"): 1}
        finally:
            kids.close()


@pytest.mark.parametrize("on_escape", [None, "report"])   # None: the default, kill
def test_agent_catches_a_process_without_the_shim(agent_factory, kubelet, dp, short_dir: Path, sim_tool: Path,
                                                  on_escape: str | None) -> None:
    """A vgpu container's process started without libvcuda (LD_PRELOAD dropped, as a static binary
    would run): killed by default, left running with --on-escape=report; either way one
    GPUQuotaEscape Event on its pod and one vcuda_quota_escapes_total count."""
    sim = SimConfig(state_path=short_dir / "sim", devices=1, memory=4 * GiB, context_overhead=64 * MiB)
    proc_root = FakeProc(short_dir / "proc")
    kids = Children(sim_tool, sim.env())
    api = FakeApiServer()
    events = EventRecorder(client.CoreV1Api(make_api_client(str(api.kubeconfig(short_dir / "kubeconfig")))),
                           component="vcuda-device-plugin", host=dp.NODE)
    options = {"on_escape": on_escape} if on_escape else {}
    with nvml_session(sim) as nvml:
        pods = StaticPods([dp.pod("app", cores=30, annotations={"vcuda.io/memory": "1Gi"})])
        agent = agent_factory("vgpu", gpus=1, pods=pods, inv=dp.inventory(1, memory=4 * GiB), nvml=nvml,
                              memory_reconcile_s="0.1", host_proc=str(proc_root.root), events=events, **options)
        uuid = dp.gpu(0).uuid
        resp = kubelet.allocate(CORE, [f"{uuid}::{i}" for i in range(30)]).container_responses[0]
        env = {k: v for k, v in dp.host_env(resp).items() if k != "VCUDA_SCHEDULER"}  # memory only here
        cgroup = "0::/kubepods/burstable/poduid-app/0123\n"   # the pod's cgroup: maps a process without a slot
        try:
            app = kids.spawn("init", "primary", "0", "alloc", "50M", "ready",
                             env={**env, "VCUDA_SIM_HOST_PID_OFFSET": str(OFFSET)})
            kids.ready(app)
            proc_root.add(app.pid, app.pid + OFFSET, cgroup=cgroup)
            bare = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
            escape = kids.spawn("ready", "init", "primary", "0", "alloc", "100M", "ready",
                                env={**bare, "VCUDA_SIM_HOST_PID_OFFSET": "0"})  # host pid = pid: killable
            kids.ready(escape)
            proc_root.add(escape.pid, escape.pid, cgroup=cgroup)
            assert escape.stdin is not None
            escape.stdin.write("\n")   # on to its context and allocation
            escape.stdin.flush()
            guard = agent.quota_guard
            dp.wait_for(lambda: guard.escape_counts(), timeout=10, what="the escape found")
            if on_escape is None:
                dp.wait_for(lambda: escape.poll() is not None, timeout=10, what="the escape killed")
                assert escape.returncode == -9
            else:
                dp.wait_for(lambda: agent.memory_reconciler.passes >= max(guard.acted_in.values()) + 3, timeout=10,
                            what="three more passes")
                assert escape.poll() is None
            assert app.poll() is None
            (record,) = agent.store.records()
            collector = NodeCollector(NodeReader(agent.layout, mode="vgpu", node=dp.NODE, nvml=nvml),
                                      agent.memory_reconciler, agent.quota_guard)
            counted = {(s.labels["namespace"], s.labels["pod"], s.labels["container"], s.labels["tenant"],
                        s.labels["uuid"], s.labels["action"]): s.value
                       for m in collector.collect() for s in m.samples if s.name == "vcuda_quota_escapes_total"}
            action = "killed" if on_escape is None else "reported"
            assert counted == {("default", "app", "main", record.key, uuid, action): 1}

            def escape_events() -> list[dict]:  # type: ignore[type-arg]
                with api.lock:
                    return [e for e in api.objects["events"].values() if e["reason"] == "GPUQuotaEscape"]

            (event,) = dp.wait_for(escape_events, timeout=10, what="the Event")
            assert event["involvedObject"]["name"] == "app" and event["involvedObject"]["uid"] == "uid-app"
            assert f"host pid {escape.pid}" in event["message"]
        finally:
            kids.close()
            api.close()
