"""The DRA driver's node agent: wires the kubelet plugin, the claim driver, the token
schedulers, health, the ResourceSlice publisher, the memory reconciler and the exporter,
and takes them down in reverse.

The node-side pieces are node_state's, as the device plugin's are (layout,
containers, tenancy, schedulers, supervisor, gpus, health, metrics): a node runs
either the device plugin or the DRA driver on a state directory, and its
containers look the same to the exporter and `vcuda top` either way. Hardware and cluster come in as objects
(inventory, NVML, the API, the health monitor factory) so tests run the same
wiring on the simulator and fakes.
"""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import Callable
from typing import Any, Protocol

from dra_driver import slices
from dra_driver.cdi import SpecDir
from dra_driver.checkpoint import Checkpoint
from dra_driver.config import DYNAMIC, DriverConfig
from dra_driver.driver import MODE, ClaimSource, Driver
from dra_driver.partitions import Partitioner
from dra_driver.plugin import KubeletPlugin
from kube_contract.events import EventRecorder
from node_state.containers import ContainerStore
from node_state.daemon import StartError
from node_state.gpu_driver import for_agent
from node_state.gpus import Health, Inventory
from node_state.health import HealthFactory
from node_state.layout import NodeLayout
from node_state.metrics import start_exporter
from node_state.mig import MigBackend, MigRecord
from node_state.quota_guard import QuotaGuard
from node_state.schedulers import TokenScheduler
from node_state.supervisor import Supervisor
from py_vcuda import native
from py_vcuda.memory_reconciler import MemoryReconciler
from py_vcuda.nvml import NVML
from py_vcuda.procfs import ProcFS

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "dra/claims"   # under the state directory
MIG_RECORD = "dra/mig.json"     # the MIG partitions the driver made (dra_driver.partitions)


class ClusterAPI(ClaimSource, slices.SliceAPI, Protocol):
    """Everything the driver asks the API server (dra_driver.kube.KubeAPI)."""


class DriverAgent:
    def __init__(self, config: DriverConfig, *, inventory: Inventory, api: ClusterAPI, nvml: NVML | None = None,
                 health_factory: HealthFactory | None = None,
                 versions: slices.DriverVersions | None = None, events: EventRecorder | None = None,
                 mig_backend: MigBackend | None = None) -> None:
        if not inventory.gpus:
            raise StartError("no GPUs found on this node; nothing to offer")
        host_lib = config.host_lib_dir / native.SHIM
        if not host_lib.is_file():
            raise StartError(f"--host-lib-dir: {host_lib} does not exist; the DaemonSet's init step puts "
                             "libvcuda.so there for containers to mount")
        gpu_driver = for_agent(config.simulator, config.host_lib_dir)
        self.config = config
        self.inventory = inventory
        self.nvml = nvml
        self.layout = NodeLayout(config.state_dir)
        self.store = ContainerStore(self.layout)
        self.health = Health()
        for d in inventory.mig_devices():   # an instance is as healthy as its GPU (XIDs are the GPU's)
            self.health.follow(d.uuid, d.parent_uuid)
        self.partitioner = self._partitioner(config, inventory, mig_backend or nvml)
        offered = inventory
        shared = {g.uuid for g in inventory.shareable().gpus}
        if self.partitioner is not None:
            offered = self.partitioner.static_inventory(self.partitioner.view())
            shared = {g.uuid for g in offered.shareable().gpus} | {
                g.uuid for g in inventory.gpus if inventory.mig.capable(g.index)}   # may be shared whole again
        # One token scheduler per GPU shared whole and per MIG instance (each has its own timeline).
        self.schedulers = {u: TokenScheduler(u, self.layout, functools.partial(self.store.tenants, u))
                           for u in sorted(shared)}
        self.supervisor = Supervisor(list(self.schedulers.values()))
        self.driver = Driver(node=config.node_name, inventory=offered, health=self.health, store=self.store,
                             schedulers=self.schedulers, host_lib=host_lib, specs=SpecDir(config.cdi_dir),
                             checkpoint=Checkpoint(config.state_dir / CHECKPOINT_DIR), api=api,
                             opt_out_namespaces=config.allow_opt_out_namespaces, partitioner=self.partitioner,
                             on_change=lambda: self.publisher.changed(), busy=lambda: self.publisher.busy(),
                             gpu_driver=gpu_driver)
        self.plugin = KubeletPlugin(self.driver, plugin_dir=config.plugin_dir, registry_dir=config.registry_dir)
        known = versions or slices.DriverVersions()
        self.publisher = slices.SlicePublisher(api, config.node_name, functools.partial(self._pool, known),
                                               resync_s=config.resync_s)
        if self.partitioner is not None:
            self.partitioner.on_change = self.publisher.changed
        self.health.subscribe(self.publisher.changed)
        self.health_monitor = health_factory(inventory, self.health.set) if health_factory else None
        # Claims share GPUs: their ledgers must also hold what NVML sees and no hook charged, and a
        # process that runs without the shim, or a claim over its limit, is acted on.
        self.events = events
        procfs = ProcFS(config.host_proc)
        self.quota_guard = QuotaGuard(self.store.records, procfs, on_escape=config.on_escape,
                                      on_over_limit=config.on_over_limit, events=events)
        self.memory_reconciler = MemoryReconciler(
            self.store.memory_accounts, nvml, procfs=procfs, interval_s=config.memory_reconcile_s,
            on_pass=self.quota_guard,
        ) if nvml is not None else None
        self._stop_exporter: Callable[[], None] | None = None

    def _partitioner(self, config: DriverConfig, inventory: Inventory, backend: MigBackend | None
                     ) -> Partitioner | None:
        if config.mig != DYNAMIC:
            return None
        if backend is None:
            raise StartError("--mig=dynamic makes MIG partitions through NVML, which is not available")
        return Partitioner(config.node_name, backend, MigRecord(config.state_dir / MIG_RECORD), inventory,
                           busy=lambda uuid: self.driver.claims_on(uuid))

    def _pool(self, versions: slices.DriverVersions) -> list[dict[str, Any]] | slices.Pools:
        """The node's slices: its devices (dra_driver.slices), and with --mig=dynamic its partitions."""
        if self.partitioner is None:
            return slices.devices(self.inventory, self.health.healthy, versions)
        view = self.partitioner.view()
        # MIG instances an operator makes after the start are not offered (the driver's devices and token
        # schedulers are set at start): a restart takes them in.
        static = [d for d in slices.devices(self.partitioner.static_inventory(view), self.health.healthy, versions)
                  if d["attributes"]["type"] != {"string": "mig"} or self.driver.offers(d["name"])]
        return self.partitioner.pool(static, self.health.healthy, view)

    def start(self) -> None:
        self.layout.containers.mkdir(parents=True, exist_ok=True)
        if self.partitioner is not None:
            self.partitioner.discover()   # the MIG-capable GPUs' profiles, before recovery and the slices
        self.supervisor.start()       # schedulers first: recovery and prepare talk to them
        self.driver.recover()         # before the kubelet can call: finish what the last run left half done
        self.plugin.start()
        if self.health_monitor is not None:
            self.health_monitor.start()
        self.publisher.start()
        if self.memory_reconciler is not None:
            self.memory_reconciler.start()
        if self.config.metrics_port:
            self._stop_exporter = start_exporter(port=self.config.metrics_port, layout=self.layout, mode=MODE,
                                                 node=self.config.node_name, pod_resources_socket=None, nvml=self.nvml,
                                                 memory_reconciler=self.memory_reconciler,
                                                 quota_guard=self.quota_guard if self.memory_reconciler else None)
        # What the start made and imported (the kubernetes client's modules and models, NVML's tables) lives as
        # long as the process: out of the cyclic collector's sight, or each full collection walks it all, a
        # ~100 ms pause of every thread, a kubelet call's included (issue 26).
        gc.freeze()
        log.info("DRA driver running on node %s with %d GPU(s)", self.config.node_name, len(self.inventory.gpus))

    def stop(self) -> None:
        if self._stop_exporter is not None:
            self._stop_exporter()
        if self.memory_reconciler is not None:
            self.memory_reconciler.stop()
        if self.events is not None:
            self.events.stop()
        self.publisher.stop()
        if self.health_monitor is not None:
            self.health_monitor.stop()
        self.plugin.stop()
        self.supervisor.stop()
