"""The node agent: wires the mode's resources, their helper processes, health,
labels, metrics and reconciliation together, and takes them down in reverse.

Everything that touches hardware or the cluster comes in as an object (NVML,
the GPU inventory, the pod source, the health monitor factory), so tests run
the same wiring against the simulator and fakes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from device_plugin import mps, pgpu, vgpu
from device_plugin.config import PluginConfig
from device_plugin.kubelet import Endpoint, Registrar, ResourcePlugin
from device_plugin.labels import cuda_labels, feature_labels, write_feature_file
from device_plugin.mig_config import MigConfigManager, MigNode
from device_plugin.node_topology import NodePatch, NodePublisher, encode
from device_plugin.pods import PodSource
from device_plugin.reconcile import Reconciler
from kube_contract.events import EventRecorder
from kube_contract.names import Names
from kube_contract.podresources import PodResourcesClient
from node_state.containers import ContainerStore
from node_state.daemon import StartError
from node_state.gpu_driver import for_agent
from node_state.gpus import Health, Inventory
from node_state.health import HealthFactory
from node_state.layout import NodeLayout
from node_state.metrics import start_exporter
from node_state.mig import GPUChange, LayoutApplier, MigRecord
from node_state.quota_guard import QuotaGuard
from node_state.schedulers import TokenScheduler
from node_state.supervisor import Child, Supervisor
from py_vcuda import native
from py_vcuda.memory_reconciler import MemoryReconciler
from py_vcuda.nvml import NVML
from py_vcuda.procfs import ProcFS

log = logging.getLogger(__name__)

WatchFactory = Callable[[Callable[[], None]], Any]   # on_event -> object with start()/stop() (pods.PodWatch)


class Agent:
    def __init__(self, config: PluginConfig, *, inventory: Inventory, pods: PodSource,
                 nvml: NVML | None = None, health_factory: HealthFactory | None = None,
                 pod_watch: WatchFactory | None = None, patch_node: NodePatch | None = None,
                 events: EventRecorder | None = None, mig_node: MigNode | None = None) -> None:
        self.config = config
        self.inventory = inventory
        self.pods = pods
        self.nvml = nvml
        self.health = Health()
        self.layout = NodeLayout(config.state_dir)
        self.store = ContainerStore(self.layout)
        self.names = Names(config.resource_domain, config.annotation_prefix)
        self.schedulers: dict[str, TokenScheduler] = {}
        self.gpu_driver = for_agent(config.simulator, config.host_lib_dir)   # before the plugins: they hand it out
        children: list[Child] = []
        self.plugins = self._plugins(children)
        self.supervisor = Supervisor(children)
        self.registrar = Registrar([Endpoint(p, config.device_plugin_dir) for p in self.plugins],
                                   config.device_plugin_dir)
        self.health.subscribe(lambda: self.registrar.changed())   # the registrar is replaced after a MIG layout
        self.health_monitor = health_factory(inventory, self.health.set) if health_factory else None
        in_use = PodResourcesClient(config.pod_resources_socket, timeout_s=5.0).list \
            if config.pod_resources_socket else None
        self.reconciler = Reconciler(self.store, self.schedulers, pods, names=self.names, node=config.node_name,
                                     in_use=in_use, grace_s=config.cleanup_grace_s, interval_s=config.resync_s)
        self.pod_watch = pod_watch(self.reconciler.wake) if pod_watch else None
        # vGPU containers share GPUs: their ledgers must also hold what NVML sees and no hook charged,
        # and a process that runs without the shim, or a container over its limit, is acted on.
        self.events = events
        procfs = ProcFS(config.host_proc)
        self.quota_guard = QuotaGuard(self.store.records, procfs, on_escape=config.on_escape,
                                      on_over_limit=config.on_over_limit, events=events)
        self.memory_reconciler = MemoryReconciler(
            self.store.memory_accounts, nvml, procfs=procfs, interval_s=config.memory_reconcile_s,
            on_pass=self.quota_guard,
        ) if nvml is not None and config.mode == "vgpu" else None
        # The extender places vgpu requests only: the other modes have nothing to tell it.
        metadata: dict[str, dict[str, str]] = {}
        if config.mode == "vgpu":
            metadata["annotations"] = {self.names.topology: encode(self.shared_inventory())}
        if nvml is not None:
            metadata["labels"] = self._labels()
        self.node_publisher = NodePublisher(patch_node, metadata) \
            if patch_node is not None and metadata else None
        self.mig_manager = self._mig_manager(mig_node)
        if self.mig_manager is not None:
            self.reconciler.on_removed = self.mig_manager.retry_now   # a layout waiting for an idle GPU
        self._stop_exporter: Callable[[], None] | None = None

    def _plugins(self, children: list[Child]) -> list[ResourcePlugin]:
        cfg = self.config
        if not self.inventory.gpus:
            raise StartError("no GPUs found on this node; nothing to offer")
        if cfg.mode == "pgpu":
            return pgpu.plugins(cfg.mig_strategy, self.inventory, self.health, self.store,
                                device_list=cfg.device_list_strategy, gpu_driver=self.gpu_driver)
        inventory = self.shared_inventory()
        if self.inventory.mig.enabled:
            log.warning("GPU(s) %s are in MIG mode: never offered whole; each of their MIG instances is shared "
                        "as a GPU of its own", ", ".join(sorted(self.inventory.mig.enabled)))
        if not inventory.gpus:
            raise StartError(f"every GPU of this node is in MIG mode without instances: {cfg.mode} mode has "
                             "nothing to offer")
        for d in self.inventory.mig_devices():
            self.health.follow(d.uuid, d.parent_uuid)
        if cfg.mode == "vgpu":
            host_lib = cfg.host_lib_dir / native.SHIM
            if not host_lib.is_file():
                raise StartError(f"--host-lib-dir: {host_lib} does not exist; the DaemonSet's init step puts "
                                 "libvcuda.so there for containers to mount")
            for gpu in inventory.gpus:
                self.schedulers[gpu.uuid] = TokenScheduler(gpu.uuid, self.layout,
                                                           functools.partial(self.store.tenants, gpu.uuid))
            children.extend(self.schedulers.values())
            ctx = vgpu.VGPUContext(inventory, self.health, self.names, cfg.node_name, self.pods,
                                   self.store, self.schedulers, host_lib, device_list=cfg.device_list_strategy,
                                   opt_out_namespaces=cfg.allow_opt_out_namespaces, gpu_driver=self.gpu_driver)
            return [vgpu.CorePlugin(ctx), vgpu.MemoryPlugin(ctx)]
        daemons = {g.uuid: mps.MPSDaemon(g.uuid, self.layout, cfg.mps_control) for g in inventory.gpus}
        children.extend(daemons.values())
        return [mps.MPSPlugin(inventory, self.health, self.store, daemons, device_list=cfg.device_list_strategy,
                              gpu_driver=self.gpu_driver)]

    def shared_inventory(self) -> Inventory:
        """What vgpu and mps modes share: the GPUs without MIG mode and every MIG instance
        (node_state.gpus.Inventory.shareable; MPS runs on MIG instances, one control daemon each)."""
        return self.inventory.shareable()

    def _labels(self) -> dict[str, str]:
        assert self.nvml is not None
        return {**cuda_labels(self.nvml),
                **feature_labels(self.nvml, self.inventory, self.config.mode, self.config.mig_strategy)}

    def _mig_manager(self, mig_node: MigNode | None) -> MigConfigManager | None:
        cfg = self.config
        if cfg.mig_config is None:
            return None
        if self.nvml is None:
            raise StartError("--mig-config: MIG layouts need NVML")
        if mig_node is None:
            log.warning("--mig-config %s: no API server, so no node label to name a layout; layouts are not "
                        "applied", cfg.mig_config)
            return None
        applier = LayoutApplier(self.nvml, MigRecord(self.layout.root / "mig-layout.json"), busy=self._allocated_on)
        check = pgpu.check_single if cfg.mig_strategy == "single" else None
        return MigConfigManager(cfg.mig_config, applier, mig_node, on_applied=self._mig_changed, check=check,
                                retry_s=cfg.resync_s, lock=self.store.lock, retire=self._retire_plugins)

    def _retire_plugins(self) -> None:
        """A layout changed the node's MIG devices: the current resources refuse Allocate until replaced."""
        for plugin in self.plugins:
            if hasattr(plugin, "retired"):
                plugin.retired = True

    def _allocated_on(self, uuid: str) -> str | None:
        """The containers allocated on a GPU or MIG device, if any (a layout must not pull it from under them)."""
        owners = [r for r in self.store.records() if uuid in r.gpus]
        if not owners:
            return None
        names = ", ".join(f"{r.namespace}/{r.pod}/{r.container}" if r.pod else r.key for r in owners[:3])
        return f"{len(owners)} container(s) allocated on {uuid} ({names})"

    def _mig_changed(self, changes: list[GPUChange]) -> None:
        """After a layout: the node's MIG devices changed, so are its resources (new sockets, registered
        again with kubelet) and its labels."""
        assert self.nvml is not None
        self.inventory = Inventory.from_nvml(self.nvml)
        self.plugins = self._plugins([])
        old = self.registrar
        self.registrar = Registrar([Endpoint(p, self.config.device_plugin_dir) for p in self.plugins],
                                   self.config.device_plugin_dir)
        old.stop()
        for ep in old.endpoints:   # a resource the layout removed must not linger as a stale socket
            ep.path.unlink(missing_ok=True)
        self.registrar.start()
        if self.node_publisher is not None:
            self.node_publisher.update({**self.node_publisher.metadata, "labels": self._labels()})
        log.info("MIG layout changed GPU(s) %s; resources now %s", ", ".join(str(c.index) for c in changes),
                 ", ".join(p.resource for p in self.plugins))

    def start(self) -> None:
        self.config.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        self.layout.containers.mkdir(parents=True, exist_ok=True)
        self.supervisor.start()       # schedulers first: Allocate registers tenants with them
        self.registrar.start()
        if self.health_monitor is not None:
            self.health_monitor.start()
        self._write_labels()
        if self.node_publisher is not None:
            self.node_publisher.start()
        self._start_exporter()
        if self.mig_manager is not None:
            self.mig_manager.start()
        self.reconciler.start()
        if self.memory_reconciler is not None:
            self.memory_reconciler.start()
        if self.pod_watch is not None:
            self.pod_watch.start()
        log.info("%s agent running on node %s with %d GPU(s)", self.config.mode, self.config.node_name,
                 len(self.inventory.gpus))

    def stop(self) -> None:
        if self.pod_watch is not None:
            self.pod_watch.stop()
        if self.mig_manager is not None:
            self.mig_manager.stop()
        self.reconciler.stop()
        if self.memory_reconciler is not None:
            self.memory_reconciler.stop()
        if self.events is not None:
            self.events.stop()
        if self.node_publisher is not None:
            self.node_publisher.stop()
        if self._stop_exporter is not None:
            self._stop_exporter()
        if self.health_monitor is not None:
            self.health_monitor.stop()
        self.registrar.stop()
        self.supervisor.stop()

    def _write_labels(self) -> None:
        path: Path | None = self.config.features_file
        if path is None or self.nvml is None:
            return
        try:
            write_feature_file(path, self.nvml, self.config.mode, prefix=self.config.annotation_prefix)
        except OSError as exc:
            log.warning("node labels not written to %s: %s", path, exc)

    def _start_exporter(self) -> None:
        if not self.config.metrics_port:
            return
        self._stop_exporter = start_exporter(
            port=self.config.metrics_port, layout=self.layout, mode=self.config.mode, node=self.config.node_name,
            pod_resources_socket=self.config.pod_resources_socket, nvml=self.nvml,
            memory_reconciler=self.memory_reconciler,
            quota_guard=self.quota_guard if self.memory_reconciler is not None else None,
            unready=self._unready)

    def _unready(self) -> str | None:
        """Why the agent is not ready for pods (the DaemonSet's readiness probe, /readyz), or None."""
        missing = self.registrar.unregistered()   # the registrar of the current MIG layout
        return f"not registered with kubelet: {', '.join(missing)}" if missing else None
