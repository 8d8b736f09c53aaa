"""Events for pods the webhook leaves alone because they name another scheduler (mutate.Notice).

At admission the pod does not exist yet: it may have no name (only ``generateName``) and has no
uid, and ``kubectl describe`` shows only Events whose involvedObject carries the object's uid. So:

- a pod with a controller (its ownerReference carries the uid): the Event goes on the controller
  (the ReplicaSet, Job, StatefulSet, ...), once per controller while this process runs, where
  ``kubectl describe`` of the workload shows it;
- a named pod without a controller (``kubectl run``, a bare manifest): the Event goes on the pod,
  once it exists: the pod is read back (a few tries, `retry_s` apart) for its uid;
- a pod with neither: no Event (nothing to attach it to); the admission warning, which kubectl
  prints to whoever created the pod, and the log line say it.

Work happens on a thread of its own; more than `QUEUE_LIMIT` waiting notices are dropped (logged).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException

from kube_contract.apiclient import read_json
from kube_contract.events import EventRecorder, ObjectRef, PodRef

from .mutate import Notice

log = logging.getLogger(__name__)

REASON = "NotVcudaScheduled"
QUEUE_LIMIT = 256
OWNERS_REMEMBERED = 4096


class Notifier:
    def __init__(self, api: Any, recorder: EventRecorder, *, tries: int = 5, retry_s: float = 1.0,
                 timeout: float = 5.0) -> None:
        self.api = api   # kubernetes.client.CoreV1Api: reads the pod back
        self.recorder = recorder
        self.tries = tries
        self.retry_s = retry_s
        self.timeout = timeout
        self._queue: queue.Queue[Notice | None] = queue.Queue(QUEUE_LIMIT)
        self._owners: OrderedDict[str, None] = OrderedDict()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def notify(self, notice: Notice) -> None:
        """Queue the notice; returns at once."""
        log.info("pod %s/%s names the scheduler %r: left alone", notice.namespace,
                 notice.name or notice.generate_name + "*", notice.scheduler)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="webhook-notifier", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(notice)
        except queue.Full:
            log.warning("no Event for pod %s/%s: %d notices are waiting", notice.namespace,
                        notice.name or notice.generate_name + "*", QUEUE_LIMIT)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(self.timeout * 2)
        self.recorder.stop()

    def _run(self) -> None:
        while (notice := self._queue.get()) is not None:
            try:
                self._handle(notice)
            except Exception:   # never let one notice end the thread
                log.exception("Event for pod %s/%s failed", notice.namespace, notice.name)

    def _handle(self, notice: Notice) -> None:
        owner = notice.owner
        if owner and owner.get("uid") and owner.get("name") and owner.get("kind"):
            uid = str(owner["uid"])
            if uid in self._owners:
                return
            self._owners[uid] = None
            while len(self._owners) > OWNERS_REMEMBERED:
                self._owners.popitem(last=False)
            ref = ObjectRef(str(owner.get("apiVersion") or ""), str(owner["kind"]), notice.namespace,
                            str(owner["name"]), uid)
            self.recorder.warn(ref, REASON, f"Its pod {notice.generate_name or notice.name}* {notice.message}")
            return
        if not notice.name:
            return
        uid = self._pod_uid(notice, self._stop.wait)
        if uid:
            self.recorder.warn(PodRef(notice.namespace, notice.name, uid), REASON, f"The pod {notice.message}")

    def _pod_uid(self, notice: Notice, wait: Callable[[float], bool]) -> str:
        for _ in range(self.tries):
            if wait(self.retry_s):   # the API server stores the pod after every webhook answered
                return ""
            try:
                pod = read_json(self.api.read_namespaced_pod(notice.name, notice.namespace, _preload_content=False,
                                                             _request_timeout=self.timeout))
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("reading pod %s/%s for its Event: %s", notice.namespace, notice.name, exc.reason)
                continue
            if (pod.get("spec") or {}).get("schedulerName") == notice.scheduler:
                return str(pod["metadata"].get("uid") or "")
            return ""
        log.info("pod %s/%s never appeared (refused after admission?): no Event", notice.namespace, notice.name)
        return ""
