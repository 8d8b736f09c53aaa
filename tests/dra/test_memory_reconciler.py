"""The DRA driver reconciles its claims' ledgers with NVML as the device plugin does (issue 12's
reconciler on node_state's records): a claim's lazily loaded module code, which no hook charges,
shows in its ledger; a claim's process without the shim is caught (node_state.quota_guard)."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client
from shimtest import cdi_container, container_env_on_host
from simcontainers import FakeProc
from simtool import Children, lines, mem

from dra_driver import testing as t
from kube_contract.apiclient import make_api_client
from kube_contract.events import EventRecorder
from node_state.testing import inventory, wait_for
from py_vcuda.ledger import Ledger
from py_vcuda.sim import GiB, MiB, SimConfig, nvml_session

NODE = t.NODE
OFFSET = 300_000  # the container's pid namespace: host pid = pid + OFFSET


def test_driver_reconciles_claim_ledgers(agent_factory, kubelet, api, short_dir: Path, sim_tool: Path) -> None:
    sim = SimConfig(state_path=short_dir / "sim", devices=1, memory=4 * GiB, context_overhead=64 * MiB)
    proc_root = FakeProc(short_dir / "proc")
    kids = Children(sim_tool, sim.env())
    with nvml_session(sim) as nvml:
        agent = agent_factory(inv=inventory(1, memory=4 * GiB), nvml=nvml,
                              config={"memory_reconcile_s": 0.1, "host_proc": proc_root.root})
        claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, GiB)]))
        assert kubelet.prepare(claim).claims[claim["metadata"]["uid"]].error == ""
        spec = agent.driver.specs.read(claim["metadata"]["uid"])
        edits = spec["devices"][0]["containerEdits"]
        env = container_env_on_host(*cdi_container(edits))
        env = {k: v for k, v in env.items() if k != "VCUDA_SCHEDULER"}   # memory only here
        env["VCUDA_SIM_HOST_PID_OFFSET"] = str(OFFSET)
        try:
            app = kids.spawn("init", "primary", "0", "module", "vcudasim-module;kernel k code=200Mi",
                             "fn", "k", "run", "0", "mem", "ready", env=env)
            held = mem(lines(kids.ready(app), "mem")[0]).total
            proc_root.add(app.pid, app.pid + OFFSET)
            (record,) = agent.store.records()

            def device():  # type: ignore[no-untyped-def]
                with Ledger(agent.layout.ledger_path(record.key)) as book:
                    return book.devices()[0]

            wait_for(lambda: device().used >= held, timeout=10, what="the module code in the ledger")
            assert device().unattributed == 200 * MiB
        finally:
            kids.close()


def test_driver_kills_a_claim_process_without_the_shim(agent_factory, kubelet, api, short_dir: Path,
                                                       sim_tool: Path) -> None:
    """The same guard as the device plugin's: a claim's process without libvcuda is killed and
    reported on its pod (GPUQuotaEscape Event, through the driver's own API access)."""
    sim = SimConfig(state_path=short_dir / "sim", devices=1, memory=4 * GiB, context_overhead=64 * MiB)
    proc_root = FakeProc(short_dir / "proc")
    kids = Children(sim_tool, sim.env())
    events = EventRecorder(client.CoreV1Api(make_api_client(str(api.kubeconfig(short_dir / "kubeconfig")))),
                           component="vcuda-dra-driver", host=NODE)
    with nvml_session(sim) as nvml:
        agent = agent_factory(inv=inventory(1, memory=4 * GiB), nvml=nvml, events=events,
                              config={"memory_reconcile_s": 0.1, "host_proc": proc_root.root})
        api.put("pods", {"metadata": {"name": "p", "namespace": "default", "uid": "uid-p"}, "spec": {}})
        claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, GiB)], pod="p"))
        assert kubelet.prepare(claim).claims[claim["metadata"]["uid"]].error == ""
        spec = agent.driver.specs.read(claim["metadata"]["uid"])
        edits = spec["devices"][0]["containerEdits"]
        env = container_env_on_host(*cdi_container(edits))
        bare = {k: v for k, v in env.items() if k not in ("VCUDA_SCHEDULER", "LD_PRELOAD")}
        try:
            escape = kids.spawn("ready", "init", "primary", "0", "alloc", "100M", "ready", env=bare)
            kids.ready(escape)
            proc_root.add(escape.pid, escape.pid, cgroup="0::/kubepods/besteffort/poduid-p/0123\n")
            assert escape.stdin is not None
            escape.stdin.write("\n")   # on to its context and allocation
            escape.stdin.flush()
            wait_for(lambda: escape.poll() is not None, timeout=10, what="the escape killed")
            assert escape.returncode == -9
            wait_for(lambda: api.get("events", next(iter(api.objects["events"]), "")), timeout=10, what="the Event")
            (event,) = api.objects["events"].values()
            assert (event["reason"], event["involvedObject"]["name"], event["involvedObject"]["uid"]) == \
                ("GPUQuotaEscape", "p", "uid-p")
        finally:
            kids.close()
