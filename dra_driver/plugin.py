"""The kubelet side of the DRA driver: the plugin-registration socket and the DRA service.

    <plugin-dir>/gpu.vcuda.io/dra.sock         DRA service, v1 and v1beta1 (NodePrepareResources, ...)
    <registry-dir>/gpu.vcuda.io-reg.sock       pluginregistration.Registration (GetInfo, NotifyRegistrationStatus)

The kubelet's plugin watcher finds the registration socket, asks `GetInfo` (type
``DRAPlugin``, the driver name, the service socket, the versions ``v1.DRAPlugin``
and ``v1beta1.DRAPlugin``: it takes the first it supports), then reports with
`NotifyRegistrationStatus` and calls the DRA service. The service is served
before the registration socket appears, so the kubelet never dials a socket
that is not there yet. A socket file that disappears (someone cleaned the
directory) is served again, which the plugin watcher sees as a new plugin.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import grpc

from dra_driver.driver import ClaimRef, Prepared
from dra_driver.names import (
    DEFAULT_PLUGIN_DIR,
    DEFAULT_REGISTRY_DIR,
    DRIVER,
    PLUGIN_TYPE,
    REGISTRATION_SOCKET,
    SERVICE_SOCKET,
    SUPPORTED_VERSIONS,
)
from kube_contract.api import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from kube_contract.api import pluginregistration_v1_pb2 as reg
from kube_contract.api import pluginregistration_v1_pb2_grpc as reg_grpc
from kube_contract.kubelet_socket import UnixGrpcServer

log = logging.getLogger(__name__)


class ClaimHandler(Protocol):
    """What the service calls (dra_driver.driver.Driver)."""

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Prepared]: ...
    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]: ...


def _servicer(pb: ModuleType, pb_grpc: ModuleType, handler: ClaimHandler) -> Any:
    """The DRAPlugin service of one API version (v1 and v1beta1 carry the same messages)."""

    def refs(request: Any) -> list[ClaimRef]:
        return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in request.claims]

    class Servicer(pb_grpc.DRAPluginServicer):  # type: ignore[name-defined,misc]
        def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            out = pb.NodePrepareResourcesResponse()
            for uid, result in handler.prepare(refs(request)).items():
                entry = out.claims[uid]   # every claim gets an entry: a missing one is retried as unprepared
                entry.error = result.error
                for d in result.devices:
                    entry.devices.add(request_names=d.requests, pool_name=d.pool, device_name=d.device,
                                      cdi_device_ids=d.cdi_ids)
            return out

        def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            out = pb.NodeUnprepareResourcesResponse()
            for uid, error in handler.unprepare(refs(request)).items():
                out.claims[uid].error = error
            return out

    return Servicer()


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: Path, registered: threading.Event) -> None:
        self.endpoint = endpoint
        self.registered = registered
        self.statuses: list[reg.RegistrationStatus] = []

    def GetInfo(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:
        return reg.PluginInfo(type=PLUGIN_TYPE, name=DRIVER, endpoint=str(self.endpoint),
                              supported_versions=list(SUPPORTED_VERSIONS))

    def NotifyRegistrationStatus(self, request: reg.RegistrationStatus,
                                 context: grpc.ServicerContext) -> reg.RegistrationStatusResponse:
        self.statuses.append(request)
        if request.plugin_registered:
            log.info("registered with the kubelet as DRA driver %s", DRIVER)
            self.registered.set()
        else:
            log.error("the kubelet refused the registration: %s", request.error)
            self.registered.clear()
        return reg.RegistrationStatusResponse()


class KubeletPlugin:
    def __init__(self, handler: ClaimHandler, *, plugin_dir: Path = DEFAULT_PLUGIN_DIR,
                 registry_dir: Path = DEFAULT_REGISTRY_DIR, poll_s: float = 0.2) -> None:
        self.endpoint = plugin_dir / DRIVER / SERVICE_SOCKET
        self.registration_socket = registry_dir / REGISTRATION_SOCKET
        self.registered = threading.Event()
        self.registration = _Registration(self.endpoint, self.registered)
        self.poll_s = poll_s

        def add_service(server: grpc.Server) -> None:
            dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_servicer(dra_v1_pb2, dra_v1_pb2_grpc, handler), server)
            dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
                _servicer(dra_v1beta1_pb2, dra_v1beta1_pb2_grpc, handler), server)

        self._service = UnixGrpcServer(self.endpoint, add_service, "the DRA service", thread_prefix="dra-grpc")
        self._registration = UnixGrpcServer(
            self.registration_socket, lambda s: reg_grpc.add_RegistrationServicer_to_server(self.registration, s),
            "plugin registration", thread_prefix="dra-reg")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._service.serve()          # first: the kubelet dials it as soon as it sees the registration socket
        self._registration.serve()
        self._thread = threading.Thread(target=self._watch, name="dra-sockets", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if not self._service.intact():
                log.warning("%s disappeared: serving it again", self.endpoint)
                self._service.serve()
                self._registration.serve()   # a new registration makes the kubelet dial the new socket
            elif not self._registration.intact():
                log.warning("%s disappeared: serving it again", self.registration_socket)
                self.registered.clear()
                self._registration.serve()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._registration.stop()
        self._service.stop()
