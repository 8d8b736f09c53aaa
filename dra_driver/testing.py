"""Test doubles for the DRA driver's tests and bench/dra_bench.py, importable outside pytest.

`TestKubelet` does what the kubelet's plugin watcher and DRA manager do with a
driver: it watches a registry directory for registration sockets, asks each
`GetInfo`, picks the first of the plugin's versions it supports, answers
`NotifyRegistrationStatus`, then calls `NodePrepareResources` /
`NodeUnprepareResources` on the plugin's endpoint with the stub of that version.
A socket re-created under the same name is registered again, as the kubelet does.

`claim` builds a ResourceClaim (raw API JSON) allocated on a node, for the fake
API server (kube_contract / scheduler_extender testing.FakeApiServer).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dra_driver.names import CONFIG_API_VERSION, CONFIG_KIND, CORES, DRIVER, MEMORY, PLUGIN_TYPE
from kube_contract.api import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from kube_contract.api import pluginregistration_v1_pb2 as reg
from kube_contract.api import pluginregistration_v1_pb2_grpc as reg_grpc
from kube_contract.kubelet_socket import socket_identity
from node_state.testing import wait_for

NODE = "node-1"   # the tests' node
STUBS = {"v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc), "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}
_uids = itertools.count(1)


@dataclass
class Registration:
    at: float
    socket: Path
    info: reg.PluginInfo
    version: str                       # the service version chosen ("" when none was supported)
    channel: grpc.Channel | None = field(default=None, repr=False)


class TestKubelet:
    __test__ = False

    def __init__(self, registry_dir: Path, versions: Sequence[str] = tuple(STUBS), poll_s: float = 0.05) -> None:
        self.registry_dir = registry_dir
        self.versions = tuple(versions)     # what this kubelet supports (1.34: both; 1.32-1.33: v1beta1)
        self.poll_s = poll_s
        self.registrations: list[Registration] = []
        self.lock = threading.Lock()
        self._seen: dict[Path, tuple[int, int, int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="test-kubelet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self.lock:
            for r in self.registrations:
                if r.channel is not None:
                    r.channel.close()

    def restart(self) -> float:
        """A kubelet restart: forget every plugin, then find the sockets again. Returns the restart time."""
        self.stop()
        self._seen.clear()
        at = time.monotonic()
        self.start()
        return at

    def _watch(self) -> None:
        while not self._stop.is_set():
            for path in sorted(self.registry_dir.glob("*.sock")):
                identity = socket_identity(path)
                if identity is not None and self._seen.get(path) != identity:
                    try:
                        self._register(path)
                    except grpc.RpcError:
                        continue   # not answering yet: try again on the next pass
                    self._seen[path] = identity
            self._stop.wait(self.poll_s)

    def _register(self, path: Path) -> None:
        with grpc.insecure_channel(f"unix://{path}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = stub.GetInfo(reg.InfoRequest(), timeout=5)
            version = next((v for v in info.supported_versions if v in self.versions), "")
            error = ""
            if info.type != PLUGIN_TYPE:
                error = f"plugin type {info.type!r} is not {PLUGIN_TYPE}"
            elif not version:
                error = f"none of the versions {list(info.supported_versions)} is supported ({list(self.versions)})"
            stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=not error, error=error),
                                          timeout=5)
        registration = Registration(time.monotonic(), path, info, version if not error else "")
        if not error:
            registration.channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        with self.lock:
            self.registrations.append(registration)

    # --- test side ------------------------------------------------------------
    def registered(self, name: str = DRIVER, after: float = 0.0) -> Registration | None:
        with self.lock:
            return next((r for r in reversed(self.registrations)
                         if r.info.name == name and r.at >= after and r.version), None)

    def wait_registered(self, name: str = DRIVER, after: float = 0.0, timeout: float = 30) -> Registration:
        return wait_for(lambda: self.registered(name, after), timeout, f"registration of {name}")

    def _call(self, method: str, claims: Sequence[dict[str, Any]], timeout: float) -> Any:
        r = self.wait_registered()
        pb, pb_grpc = STUBS[r.version]
        request_type = pb.NodePrepareResourcesRequest if method == "NodePrepareResources" \
            else pb.NodeUnprepareResourcesRequest
        request = request_type(claims=[pb.Claim(namespace=c["metadata"]["namespace"], uid=c["metadata"]["uid"],
                                                name=c["metadata"]["name"]) for c in claims])
        return getattr(pb_grpc.DRAPluginStub(r.channel), method)(request, timeout=timeout)

    def prepare(self, *claims: dict[str, Any], timeout: float = 60) -> Any:
        """NodePrepareResources for these claims (raw API JSON: only their metadata is sent)."""
        return self._call("NodePrepareResources", claims, timeout)

    def unprepare(self, *claims: dict[str, Any], timeout: float = 60) -> Any:
        return self._call("NodeUnprepareResources", claims, timeout)


def claim(name: str, node: str, devices: Sequence[dict[str, Any]], *, namespace: str = "default",
          uid: str | None = None, config: Sequence[dict[str, Any]] = (), pod: str | None = None,
          pod_uid: str = "") -> dict[str, Any]:
    """An allocated ResourceClaim; `devices` from `share` / `whole` / `foreign`, `config` from `share_config`."""
    status: dict[str, Any] = {"allocation": {"devices": {"results": list(devices), "config": list(config)}}}
    if pod:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": pod_uid or f"uid-{pod}"}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace,
                         "uid": uid or f"4f1c2a9e-{next(_uids):04d}-4c3b-9d21-8e7f6a5b4c3d"},
            "spec": {"devices": {"requests": [{"name": r} for r in dict.fromkeys(d["request"] for d in devices)]}},
            "status": status}


def share(node: str, index: int, cores: int, memory: int | str, *, request: str = "gpu",
          share_id: str | None = None) -> dict[str, Any]:
    """A device result that consumes part of GPU `index` (consumable capacity)."""
    return {"request": request, "driver": DRIVER, "pool": node, "device": f"gpu-{index}",
            "shareID": share_id or f"9a8b7c6d-{next(_uids):04d}-4e5f-8a9b-0c1d2e3f4a5b",
            "consumedCapacity": {CORES: str(cores), MEMORY: str(memory)}}


def whole(node: str, index: int, *, request: str = "gpu") -> dict[str, Any]:
    """A device result for all of GPU `index` (allocated without consumable capacity)."""
    return {"request": request, "driver": DRIVER, "pool": node, "device": f"gpu-{index}"}


def foreign(node: str, *, request: str = "nic", driver: str = "net.example.com") -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": node, "device": "eth1"}


def share_config(*, source: str = "FromClaim", requests: Sequence[str] = (), **fields: Any) -> dict[str, Any]:
    return {"source": source, "requests": list(requests), "opaque": {
        "driver": DRIVER, "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, **fields}}}
