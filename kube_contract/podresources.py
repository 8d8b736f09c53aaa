"""Which pod and container hold a device, from the kubelet's pod-resources API (`List`).

The exporter and `vcuda top` label a container by namespace/pod/container.
Allocate does not always know them, so readers look the container's device IDs
up here. A lookup matches (resource name, device ID) exactly: vcuda-core and
vcuda-memory IDs share the `<uuid>::<i>` form, so an ID alone names nobody. The
mapping is cached and refreshed at most every `refresh_s`, sooner (rate-limited
to one `List` per `miss_refresh_s`) when a lookup misses: an ID not in it, or
IDs the cache gives to different containers (a record newer than the cache). The kubelet
re-creates its socket when it restarts: a failed call or a new socket inode
drops the channel, and the next refresh dials again, so a restart costs one
missed refresh, never a stuck client.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from kube_contract.api import podresources_v1_pb2 as pr
from kube_contract.api import podresources_v1_pb2_grpc as pr_grpc

log = logging.getLogger("vcuda.podresources")

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


@dataclass(frozen=True)
class PodRef:
    namespace: str
    pod: str
    container: str


DeviceKey = tuple[str, str]  # (resource name, device ID)


class PodResourcesError(RuntimeError):
    """The kubelet did not answer `List`."""


def index_pods(response: pr.ListPodResourcesResponse) -> dict[DeviceKey, PodRef]:
    """(resource, device ID) -> the container it is assigned to."""
    out: dict[DeviceKey, PodRef] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                for device_id in devices.device_ids:
                    out[(devices.resource_name, device_id)] = ref
    return out


class PodResourcesClient:
    """Cached `List` of the kubelet's pod-resources service on a unix socket."""

    def __init__(self, socket: Path | str = DEFAULT_SOCKET, *, timeout_s: float = 1.0,
                 refresh_s: float = 10.0, miss_refresh_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time) -> None:
        self.socket = Path(socket)
        self.timeout_s = timeout_s
        self.refresh_s = refresh_s
        self.miss_refresh_s = miss_refresh_s
        self.clock = clock
        self.wall_clock = wall_clock
        self._channel: grpc.Channel | None = None
        self._stub: pr_grpc.PodResourcesListerStub | None = None
        self._inode: int | None = None
        self._mapping: dict[DeviceKey, PodRef] = {}
        self._fetched_at: float | None = None   # last successful List
        self._fetched_wall = 0.0                # the same, wall clock (records carry wall-clock times)
        self._tried_at: float | None = None     # last attempt, successful or not
        self.last_error: str = ""

    def close(self) -> None:
        self._drop_channel()

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
        self._inode = None

    def _connect(self) -> pr_grpc.PodResourcesListerStub:
        try:
            inode = os.stat(self.socket).st_ino
        except OSError as exc:
            self._drop_channel()
            raise PodResourcesError(f"no kubelet pod-resources socket at {self.socket}: {exc}") from exc
        if self._stub is None or inode != self._inode:
            self._drop_channel()  # kubelet restarted: the old channel points at a dead socket
            self._channel = grpc.insecure_channel(f"unix://{self.socket}")
            self._stub = pr_grpc.PodResourcesListerStub(self._channel)
            self._inode = inode
        assert self._stub is not None
        return self._stub

    def list(self) -> dict[DeviceKey, PodRef]:
        """Ask the kubelet now; raises PodResourcesError when it does not answer."""
        self._tried_at = self.clock()
        try:
            response = self._connect().List(pr.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            self._drop_channel()
            self.last_error = f"pod-resources List on {self.socket}: {exc.code().name}"
            raise PodResourcesError(self.last_error) from exc
        except PodResourcesError as exc:
            self.last_error = str(exc)
            raise
        mapping = index_pods(response)
        self._mapping = mapping
        self._fetched_at = self.clock()
        self._fetched_wall = self.wall_clock()
        self.last_error = ""
        return mapping

    def _refresh_if(self, due: float) -> None:
        if self._tried_at is not None and self.clock() - self._tried_at < due:
            return
        try:
            self.list()
        except PodResourcesError as exc:
            log.debug("%s", exc)  # keep the last good mapping; assignments outlive kubelet restarts

    def lookup(self, resource: str, device_ids: Iterable[str], *, since: float = 0.0) -> PodRef | None:
        """The container holding `device_ids` of `resource`: every ID must be assigned, to one container.

        A miss (an ID not assigned, or the IDs split between containers) asks the kubelet again,
        rate-limited; None when the answer still does not name one container. `since` (wall clock,
        e.g. the record's creation): a mapping fetched before it may still name the IDs' previous
        holder, so it is refreshed first (rate-limited the same way).
        """
        ids = list(device_ids)
        if not ids or not resource:
            return None
        self._refresh_if(self.miss_refresh_s if since and self._fetched_wall < since else self.refresh_s)
        ref = self._find(resource, ids)
        if ref is None:
            self._refresh_if(self.miss_refresh_s)  # a container newer than the cache
            ref = self._find(resource, ids)
        return ref

    def _find(self, resource: str, ids: list[str]) -> PodRef | None:
        refs = {self._mapping.get((resource, device_id)) for device_id in ids}
        return refs.pop() if len(refs) == 1 else None
