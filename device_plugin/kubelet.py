"""The kubelet side of a device plugin: serve v1beta1 on a unix socket, then
`Register`; keep doing so across kubelet restarts.

One `Endpoint` per resource (kubelet takes one resource per socket). The
`Registrar` thread watches ``kubelet.sock`` (a new inode means kubelet
restarted, and kubelet wipes the plugins' sockets when it does) and each
endpoint's own socket; either change means serve again, then register again.
Registration order matters: kubelet dials back our socket inside `Register`,
so the server must already be up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import grpc

from kube_contract.api import deviceplugin_v1beta1_pb2 as pb
from kube_contract.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from kube_contract.kubelet_socket import UnixGrpcServer, socket_identity
from node_state.tenancy import Injection

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


def mount(host: Path, container: Path, read_only: bool) -> pb.Mount:
    """One mount of an Allocate response (a node_state.containers path, usually)."""
    return pb.Mount(host_path=str(host), container_path=str(container), read_only=read_only)


def answer(edits: Injection) -> pb.ContainerAllocateResponse:
    """An Allocate answer carrying a container's env and mounts (node_state.tenancy.gpu_container)."""
    return pb.ContainerAllocateResponse(envs=edits.env, mounts=[mount(m.host, m.container, m.read_only)
                                                                for m in edits.mounts])


class AllocationError(Exception):
    """A request this plugin refuses; the message goes to the pod's events, so it says what to fix."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> None:
        super().__init__(message)
        self.code = code


class ResourcePlugin(Protocol):
    """What one resource answers; the mode modules implement it."""

    resource: str       # e.g. tencent.com/vcuda-core
    socket_name: str    # file name in the device-plugins directory

    def options(self) -> pb.DevicePluginOptions: ...
    def devices(self) -> list[pb.Device]: ...
    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]: ...
    def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse: ...
    def release(self, device_ids: Sequence[str]) -> None:
        """Undo `allocate(device_ids)`: a later container of the same request failed, so kubelet
        discards the whole answer and nothing of this one may stay behind."""
        ...


class DeviceBoard:
    """Change counter that ListAndWatch streams wait on: each change resends the full list."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version = 0
        self._closed = False

    def changed(self) -> None:
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> int | None:
        """The new version once it differs from `seen`; None when closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._version != seen, timeout)
            return None if self._closed else self._version

    @property
    def version(self) -> int:
        return self._version


class Servicer(pb_grpc.DevicePluginServicer):
    def __init__(self, plugin: ResourcePlugin, board: DeviceBoard) -> None:
        self.plugin = plugin
        self.board = board

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return self.plugin.options()

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext):  # type: ignore[no-untyped-def]
        seen = self.board.version
        yield pb.ListAndWatchResponse(devices=self.plugin.devices())
        while context.is_active():
            version = self.board.wait(seen, timeout=1.0)
            if version is None:
                return
            if version != seen:
                seen = version
                yield pb.ListAndWatchResponse(devices=self.plugin.devices())

    def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> pb.PreferredAllocationResponse:
        out = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            try:
                ids = self.plugin.preferred(list(req.available_deviceIDs), list(req.must_include_deviceIDs),
                                            req.allocation_size)
            except AllocationError as exc:
                context.abort(exc.code, f"{self.plugin.resource}: {exc}")
            out.container_responses.add(deviceIDs=ids)
        return out

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        out = pb.AllocateResponse()
        done: list[list[str]] = []
        for req in request.container_requests:
            ids = list(req.devices_ids)
            try:
                out.container_responses.append(self.plugin.allocate(ids))
                done.append(ids)
                continue
            except AllocationError as exc:
                log.warning("Allocate %s refused: %s", self.plugin.resource, exc)
                code, message = exc.code, f"{self.plugin.resource}: {exc}"
            except Exception as exc:  # the message reaches the pod's events; the trace our log
                log.exception("Allocate %s failed", self.plugin.resource)
                code, message = grpc.StatusCode.INTERNAL, f"{self.plugin.resource}: internal error: {exc}"
            self._roll_back(done)
            context.abort(code, message)
        return out

    def _roll_back(self, done: list[list[str]]) -> None:
        """kubelet gets an error for the whole request: the containers served before the failing one
        will never start, so their directories and scheduler tenants go now."""
        for ids in reversed(done):
            try:
                self.plugin.release(ids)
            except Exception:   # keep rolling back the others; the reconciler cleans up what is left
                log.exception("rolling back %s allocation of %d device(s)", self.plugin.resource, len(ids))

    def PreStartContainer(self, request: pb.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class Endpoint:
    """One resource's gRPC server on <dir>/<socket_name>."""

    def __init__(self, plugin: ResourcePlugin, directory: Path, board: DeviceBoard | None = None) -> None:
        self.plugin = plugin
        self.path = directory / plugin.socket_name
        self.board = board or DeviceBoard()
        self._server = UnixGrpcServer(self.path, lambda server: pb_grpc.add_DevicePluginServicer_to_server(
            Servicer(self.plugin, self.board), server), plugin.resource, thread_prefix="dp-grpc")

    def serve(self) -> None:
        self.stop()
        self._server.serve()

    def socket_intact(self) -> bool:
        return self._server.intact()

    def stop(self) -> None:
        if self._server.serving:
            self.board.close()   # ends the ListAndWatch streams, which would hold the server's stop
            self._server.stop()
            self.board = DeviceBoard()

    def register(self, kubelet_socket: Path, timeout: float = 5.0) -> None:
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            pb_grpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(version=API_VERSION, endpoint=self.plugin.socket_name,
                                   resource_name=self.plugin.resource, options=self.plugin.options()),
                timeout=timeout)
        log.info("registered %s with kubelet", self.plugin.resource)

    def changed(self) -> None:
        self.board.changed()


class Registrar:
    """Serve every endpoint, register each, and redo both whenever kubelet or a socket changes."""

    def __init__(self, endpoints: Sequence[Endpoint], directory: Path, *, poll_s: float = 0.1,
                 retry_s: float = 0.5) -> None:
        self.endpoints = list(endpoints)
        self.kubelet_socket = directory / KUBELET_SOCKET
        self.poll_s = poll_s
        self.retry_s = retry_s
        self.registrations = 0           # successful Register calls, for tests and logs
        self._unregistered = tuple(ep.plugin.resource for ep in self.endpoints)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        for ep in self.endpoints:
            ep.serve()
        self._thread = threading.Thread(target=self._loop, name="kubelet-registrar", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for ep in self.endpoints:
            ep.stop()

    def changed(self) -> None:
        for ep in self.endpoints:
            ep.changed()

    def unregistered(self) -> tuple[str, ...]:
        """The resources kubelet does not have from us right now (none: ready for Allocate).

        kubelet refuses a pod whose resource has no registered plugin (UnexpectedAdmissionError), so
        the agent is Ready only when this is empty: at start, and again after kubelet restarts."""
        return self._unregistered

    def _loop(self) -> None:
        pending = set(range(len(self.endpoints)))   # endpoints that still need Register
        kubelet = None
        next_try = 0.0
        while not self._stop.is_set():
            current = socket_identity(self.kubelet_socket)
            if current != kubelet:
                if current is not None and kubelet is not None:
                    log.info("kubelet.sock was re-created: kubelet restarted, registering again")
                kubelet = current
                pending = set(range(len(self.endpoints)))
                next_try = 0.0
            for i, ep in enumerate(self.endpoints):
                if not ep.socket_intact():
                    log.warning("socket %s disappeared: serving and registering again", ep.path)
                    ep.serve()
                    pending.add(i)
                    next_try = 0.0
            if pending and kubelet is not None and time.monotonic() >= next_try:
                for i in sorted(pending):
                    try:
                        self.endpoints[i].register(self.kubelet_socket)
                    except grpc.RpcError as exc:
                        log.warning("registering %s failed (%s); retrying", self.endpoints[i].plugin.resource,
                                    exc.details() if hasattr(exc, "details") else exc)
                        next_try = time.monotonic() + self.retry_s
                        continue
                    pending.discard(i)
                    self.registrations += 1
            self._unregistered = tuple(self.endpoints[i].plugin.resource for i in sorted(pending))
            self._stop.wait(self.poll_s)
