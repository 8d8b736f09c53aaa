"""A test kubelet for the device plugin: a real gRPC `Registration` server.

`TestKubelet` serves ``kubelet.sock`` in a directory (keep it short: unix
socket paths are capped at 107 bytes). Like kubelet it records each
registration, dials the plugin's socket back inside `Register` (so a plugin
that registers before serving fails), reads its options and keeps a
ListAndWatch stream open; callers then drive the plugin over its real socket
with the messages kubelet sends. `restart()` does what a kubelet restart
does: plugin sockets are wiped and kubelet.sock is re-created.

`FakeKubeAPI` is just enough of the Kubernetes API server for the agent: list
and watch the pods of a node, patch a Node's annotations (merge patch).

Used by tests/device_plugin and bench/plugin_bench.py.
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import grpc

from device_plugin.api import deviceplugin_v1beta1_pb2 as pb
from device_plugin.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from device_plugin.api import podresources_v1_pb2 as prpb
from device_plugin.api import podresources_v1_pb2_grpc as prpb_grpc


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


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


class FakeKubeAPI:
    """A Kubernetes API server on 127.0.0.1 with `pods` and `nodes` (name -> object, raw JSON).

    Serves GET /api/v1/pods (list; ``watch=true`` holds the stream open without
    events for at most `max_watch_s`, as a quiet server does), GET and PATCH
    /api/v1/nodes/NAME (``application/merge-patch+json``, metadata annotations
    and labels). ``fail_requests`` answers that many requests with 503 first;
    ``requests`` records (method, path).
    """

    __test__ = False

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pods: list[dict[str, Any]] = []
        self.nodes: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.fail_requests = 0
        self.max_watch_s = 1.0
        self._closed = threading.Event()
        handler = type("Handler", (_KubeHandler,), {"api": self})
        self.httpd = _QuietServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), name="fake-kube-api", daemon=True).start()

    def add_node(self, name: str) -> None:
        with self.lock:
            self.nodes[name] = {"kind": "Node", "apiVersion": "v1",
                                "metadata": {"name": name, "annotations": {}, "labels": {}}}

    def annotations(self, node: str) -> dict[str, str]:
        with self.lock:
            return dict(self.nodes[node]["metadata"].get("annotations") or {})

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "test"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        return path

    def close(self) -> None:
        self._closed.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):   # a client that went away is no error here
            super().handle_error(request, client_address)


class _KubeHandler(BaseHTTPRequestHandler):
    api: FakeKubeAPI
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                          "reason": reason, "code": code})

    def _failing(self) -> bool:
        api = self.api
        with api.lock:
            api.requests.append((self.command, self.path))
            if api.fail_requests <= 0:
                return False
            api.fail_requests -= 1
        self._status(503, "ServiceUnavailable", "the fake API server is unavailable on purpose")
        return True

    def do_GET(self) -> None:  # noqa: N802
        if self._failing():
            return
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        api = self.api
        if url.path == "/api/v1/pods":
            if query.get("watch") == "true":
                self._quiet_watch(min(float(query.get("timeoutSeconds") or 1), api.max_watch_s))
                return
            node = query.get("fieldSelector", "").removeprefix("spec.nodeName=")
            with api.lock:
                items = [copy.deepcopy(p) for p in api.pods if not node or p["spec"].get("nodeName") == node]
            self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                             "items": items})
            return
        if len(parts) == 4 and parts[2] == "nodes":
            with api.lock:
                node = copy.deepcopy(api.nodes.get(parts[3]))
            if node is None:
                self._status(404, "NotFound", f'nodes "{parts[3]}" not found')
            else:
                self._send(200, node)
            return
        self._status(404, "NotFound", "no route")

    def _quiet_watch(self, seconds: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        self.api._closed.wait(seconds)
        with contextlib.suppress(OSError):   # the client may have gone already
            self.wfile.write(b"0\r\n\r\n")

    def do_PATCH(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self._failing():
            return
        parts = urlparse(self.path).path.strip("/").split("/")
        if self.headers["Content-Type"] != "application/merge-patch+json":
            self._status(415, "UnsupportedMediaType", str(self.headers["Content-Type"]))
            return
        if len(parts) != 4 or parts[2] != "nodes":
            self._status(404, "NotFound", "no route")
            return
        api = self.api
        with api.lock:
            node = api.nodes.get(parts[3])
            if node is not None:
                meta = body.get("metadata") or {}
                for section in ("annotations", "labels"):
                    node["metadata"].setdefault(section, {}).update(meta.get(section) or {})
                node = copy.deepcopy(node)
        if node is None:
            self._status(404, "NotFound", f'nodes "{parts[3]}" not found')
        else:
            self._send(200, node)
