"""Kubernetes Events (core/v1 ``create_namespaced_event``) on pods and Nodes, as ``kubectl describe``
shows them: one body for every Event the node daemons write.

The node daemons record what they did to a pod's processes (node_state.quota_guard) and a MIG
layout that failed on their Node (device_plugin.mig_config); the extender's admission webhook, a
pod it leaves alone (on the pod, or its controller: scheduler_extender.webhook.notify).
A post goes out on the recorder's own thread: a slow or absent API server must not
hold up the caller (the memory reconciler's pass), and an Event that cannot be
posted is logged, not retried: the log line and the metric already say it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException

from kube_contract.apiclient import api_message

log = logging.getLogger(__name__)

WARNING = "Warning"
QUEUE_LIMIT = 256   # Events waiting to be posted; more are dropped (logged): the API server is not keeping up


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    def involved(self) -> dict[str, str]:
        return {"apiVersion": "v1", "kind": "Pod", "namespace": self.namespace, "name": self.name, "uid": self.uid}


@dataclass(frozen=True)
class NodeRef:
    name: str
    uid: str = ""
    namespace: str = "default"   # Events on a cluster-scoped object live in the default namespace

    def involved(self) -> dict[str, str]:
        return {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self.uid or self.name}


@dataclass(frozen=True)
class ObjectRef:
    """Any namespaced object, e.g. a pod's controller from its ownerReferences (which carry the uid)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str

    def involved(self) -> dict[str, str]:
        return {"apiVersion": self.api_version, "kind": self.kind, "namespace": self.namespace, "name": self.name,
                "uid": self.uid}


Ref = PodRef | NodeRef | ObjectRef
MESSAGE_LIMIT = 1024   # the API server refuses longer Event messages


def event_body(obj: Ref, reason: str, message: str, *, component: str, host: str,
               kind: str = WARNING) -> dict[str, Any]:
    """A core/v1 Event about `obj`; its name is unique (object name and a time in ns, as kubectl's are)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{obj.name}.{time.time_ns():x}", "namespace": obj.namespace},
        "involvedObject": obj.involved(),
        "reason": reason, "message": message[:MESSAGE_LIMIT], "type": kind,
        "source": {"component": component, "host": host},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "reportingComponent": component, "reportingInstance": host,
    }


class EventRecorder:
    """Posts Events through a kubernetes.client.CoreV1Api, one at a time on a thread of its own."""

    def __init__(self, api: Any, *, component: str, host: str, timeout: float = 5.0) -> None:
        self.api = api
        self.component = component
        self.host = host
        self.timeout = timeout
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_LIMIT)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def warn(self, pod: Ref, reason: str, message: str) -> None:
        """Queue a Warning Event on the pod (or another object); returns at once."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="event-recorder", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(event_body(pod, reason, message, component=self.component, host=self.host))
        except queue.Full:
            log.warning("Event %s on %s %s/%s dropped: %d Events are waiting for the API server", reason,
                        pod.involved()["kind"], pod.namespace, pod.name, QUEUE_LIMIT)

    def stop(self) -> None:
        """Post what is queued (each within its timeout), then end the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(self.timeout * 2)

    def _run(self) -> None:
        while (body := self._queue.get()) is not None:
            self._post(body)

    def _post(self, body: dict[str, Any]) -> None:
        namespace = body["metadata"]["namespace"]
        api = self.api
        try:
            api.create_namespaced_event(namespace, body, _preload_content=False, _request_timeout=self.timeout)
        except Exception as exc:   # ApiException, or urllib3's several types when the server is away
            why = api_message(exc) if isinstance(exc, ApiException) else str(exc)
            log.warning("Event %s on %s %s/%s not recorded: %s", body["reason"], body["involvedObject"]["kind"],
                        namespace, body["involvedObject"]["name"], why)
