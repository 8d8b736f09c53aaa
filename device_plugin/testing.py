"""A test kubelet for the device plugin: a real gRPC `Registration` server.

`TestKubelet` serves ``kubelet.sock`` in a directory (keep it short: unix
socket paths are capped at 107 bytes). Like kubelet it records each
registration, dials the plugin's socket back inside `Register` (so a plugin
that registers before serving fails), reads its options and keeps a
ListAndWatch stream open; callers then drive the plugin over its real socket
with the messages kubelet sends. `restart()` does what a kubelet restart
does: plugin sockets are wiped and kubelet.sock is re-created.

Used by tests/device_plugin and bench/plugin_bench.py, with the fake Kubernetes
API server kube_contract.testing.FakeApiServer and the simulated GPUs of
node_state.testing.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from kube_contract.api import deviceplugin_v1beta1_pb2 as pb
from kube_contract.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from kube_contract.api import podresources_v1_pb2 as prpb
from kube_contract.api import podresources_v1_pb2_grpc as prpb_grpc
from node_state.testing import wait_for


@dataclass
class Registration:
    at: float
    request: pb.RegisterRequest
    options: pb.DevicePluginOptions | None = None
    lists: list[list[pb.Device]] = field(default_factory=list)


class TestKubelet(pb_grpc.RegistrationServicer):
    __test__ = False

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.socket = directory / "kubelet.sock"
        self.registrations: list[Registration] = []
        self.lock = threading.Lock()
        self.server: grpc.Server | None = None
        self.channels: list[grpc.Channel] = []

    # --- kubelet side ---------------------------------------------------------
    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        reg = Registration(time.monotonic(), request)
        channel = grpc.insecure_channel(f"unix://{self.dir / request.endpoint}")
        self.channels.append(channel)
        stub = pb_grpc.DevicePluginStub(channel)
        reg.options = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)   # fails if not served yet
        with self.lock:
            self.registrations.append(reg)
        threading.Thread(target=self._watch, args=(stub, reg), daemon=True).start()
        return pb.Empty()

    def _watch(self, stub: pb_grpc.DevicePluginStub, reg: Registration) -> None:
        try:
            for resp in stub.ListAndWatch(pb.Empty()):
                with self.lock:
                    reg.lists.append(list(resp.devices))
        except grpc.RpcError:
            pass

    def start(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=0).wait()
            self.server = None
        for ch in self.channels:
            ch.close()
        self.channels.clear()

    def restart(self) -> float:
        """Stop, wipe the plugins' sockets as kubelet does, start again; returns the restart time."""
        self.stop()
        for entry in self.dir.iterdir():
            if entry.is_socket():
                entry.unlink()
        at = time.monotonic()
        self.start()
        return at

    # --- test side ------------------------------------------------------------
    def registered(self, resource: str, after: float = 0.0) -> Registration | None:
        with self.lock:
            return next((r for r in reversed(self.registrations)
                         if r.request.resource_name == resource and r.at >= after), None)

    def wait_registered(self, resource: str, after: float = 0.0, timeout: float = 60) -> Registration:
        return wait_for(lambda: self.registered(resource, after), timeout, f"registration of {resource}")

    def latest_devices(self, resource: str) -> list[pb.Device]:
        reg = self.wait_registered(resource)
        wait_for(lambda: reg.lists, 30, f"ListAndWatch of {resource}")
        with self.lock:
            return reg.lists[-1]

    def stub(self, resource: str) -> pb_grpc.DevicePluginStub:
        reg = self.wait_registered(resource)
        channel = grpc.insecure_channel(f"unix://{self.dir / reg.request.endpoint}")
        self.channels.append(channel)
        return pb_grpc.DevicePluginStub(channel)

    def allocate(self, resource: str, *id_lists: list[str]) -> pb.AllocateResponse:
        req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)
                                                     for ids in id_lists])
        return self.stub(resource).Allocate(req, timeout=60)

    def preferred(self, resource: str, available: list[str], size: int,
                  must_include: list[str] | None = None) -> list[str]:
        req = pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must_include or [], allocation_size=size)])
        return list(self.stub(resource).GetPreferredAllocation(req, timeout=30).container_responses[0].deviceIDs)

    def admit(self, resource: str, pod: dict[str, Any], healthy: list[str], in_use: set[str],
              rng: random.Random) -> dict[str, tuple[list[str], pb.ContainerAllocateResponse]]:
        """Admit a pod as kubelet's device manager does: each container asking for `resource`, init
        containers first, gets devices from the pod's reuse pool first (those of finished regular
        init containers, taken in no particular order: `rng` picks), then GetPreferredAllocation for
        the rest from what is free, with the reused ones included; then Allocate. A sidecar
        (restartPolicy Always) and an app container keep what they took from the pool. `in_use`
        grows by every device the pod gets. Returns container -> (its devices, Allocate's answer).
        """
        spec = pod.get("spec", {})
        pool: set[str] = set()
        out: dict[str, tuple[list[str], pb.ContainerAllocateResponse]] = {}
        for c, init in [(c, True) for c in spec.get("initContainers") or []] + \
                [(c, False) for c in spec.get("containers") or []]:
            limits = c.get("resources", {}).get("limits", {})
            need = int(limits.get(resource, 0))
            if not need:
                continue
            reused = rng.sample(sorted(pool), min(need, len(pool)))
            devices = list(reused)
            if len(devices) < need:
                available = [d for d in healthy if d not in in_use]
                preferred = self.preferred(resource, sorted(set(available) | set(reused)), need, reused)
                devices += [d for d in preferred if d in available][:need - len(devices)]
                if len(devices) < need:
                    raise RuntimeError(f"kubelet: {need} {resource} for {c['name']}, {len(devices)} to give")
            in_use.update(devices)
            if init and c.get("restartPolicy") != "Always":
                pool.update(devices)
            else:
                pool.difference_update(devices)
            out[c["name"]] = (devices, self.allocate(resource, devices).container_responses[0])
        return out


class TestPodResources(prpb_grpc.PodResourcesListerServicer):
    """kubelet's pod-resources v1 `List` on a unix socket, answering what `owners` says:
    {(namespace, pod, container): {resource: [device IDs]}}."""

    __test__ = False

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.owners: dict[tuple[str, str, str], dict[str, list[str]]] = {}
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        prpb_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{socket}")

    def List(self, request: prpb.ListPodResourcesRequest, context: grpc.ServicerContext
             ) -> prpb.ListPodResourcesResponse:
        pods: dict[tuple[str, str], prpb.PodResources] = {}
        for (namespace, pod, container), devices in sorted(self.owners.items()):
            entry = pods.setdefault((namespace, pod), prpb.PodResources(name=pod, namespace=namespace))
            entry.containers.add(name=container, devices=[
                prpb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices.items()])
        return prpb.ListPodResourcesResponse(pod_resources=list(pods.values()))

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=0).wait()
