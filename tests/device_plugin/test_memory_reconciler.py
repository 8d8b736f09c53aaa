"""The node agent reconciles its vGPU containers' ledgers with NVML: a
container's lazily loaded module code shows in its ledger and as
vcuda_container_memory_unattributed_bytes; an unmappable GPU process is
counted in vcuda_reconciler_unmapped_pids_total."""

from __future__ import annotations

from pathlib import Path

from simcontainers import FakeProc
from simtool import Children, lines, mem

from device_plugin.pods import StaticPods
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
