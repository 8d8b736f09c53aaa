"""Keep container directories in step with the pods: apply quota annotation
changes live, and clean up after containers that are gone.

On every pod event of the node (device_plugin.pods.PodWatch) and at least
every `interval_s` (a pass costs one pod list and one pod-resources List):

- a container whose pod (by uid) is no longer on the node, or has finished (Succeeded, Failed:
  kube-scheduler, the extender and kubelet free its share at once), is gone;
- a container without a known pod (anonymous, pgpu, mps) is gone once none of
  its device IDs has appeared in kubelet's pod-resources List for `grace_s`;
- for a live vgpu container, ``vcuda.io/core-limit`` / ``vcuda.io/priority`` /
  ``vcuda.io/memory`` are read again: a change reaches the token scheduler
  (admin ``update``), the ledger (``set_limit``), the container's quota file
  and the record, without restarting the pod.

- a container whose identity is provisional or unknown takes the owner that
  pod-resources reports for its device IDs (see device_plugin.pods).

A gone container's tenant is removed from its scheduler and its directory deleted.

Only the device plugin's own containers (its modes' resources) are looked at: a
DRA driver's claims in the same state directory get their quota from the claim,
not from vgpu annotations, and go at unprepare, not when pod-resources (which
does not list them as devices) leaves them out.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping

from device_plugin import mps, pgpu
from device_plugin import pods as podlib
from device_plugin.quota import QuotaError, quota
from kube_contract import assignment
from kube_contract.names import Names
from kube_contract.podresources import DeviceKey, PodRef, PodResourcesError
from node_state.containers import ContainerStore
from node_state.layout import ContainerRecord
from node_state.schedulers import SchedulerError, TokenScheduler, remove_tenant

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(self, store: ContainerStore, schedulers: Mapping[str, TokenScheduler], pods: podlib.PodSource,
                 *, names: Names, node: str, in_use: Callable[[], dict[DeviceKey, PodRef]] | None, grace_s: float,
                 interval_s: float) -> None:
        self.store = store
        self.schedulers = schedulers
        self.pods = pods
        self.names = names
        self.node = node
        self.in_use = in_use
        self.grace_s = grace_s
        self.interval_s = interval_s
        self.resources = {names.core_resource, pgpu.RESOURCE, mps.RESOURCE}   # what its Allocate records
        self._missing_since: dict[str, float] = {}
        self.on_removed: Callable[[], None] | None = None   # after a container went (the MIG layouts wait on it)
        self._warned: dict[str, str] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def ours(self, record: ContainerRecord) -> bool:
        """Whether the device plugin's Allocate made this container: its modes' resources, and pgpu's
        MIG resources (mixed strategy: nvidia.com/mig-<profile>), whose containers keep a GPU busy
        for a MIG layout until they go."""
        return record.resource in self.resources or record.resource.startswith(pgpu.MIG_RESOURCE_PREFIX)

    def wake(self) -> None:
        """Run a pass now (a pod on the node changed), not at the next interval."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
            except Exception:   # one bad pass must not end reconciliation for good
                log.exception("reconcile pass failed")

    def run_once(self) -> None:
        try:
            by_uid: dict[str, podlib.Pod] | None = {
                podlib.meta(p).get("uid", ""): p for p in self.pods.list_pods(self.node)}
        except Exception as exc:
            log.debug("no pod list this pass: %s", exc)
            by_uid = None
        try:
            ids = self.in_use() if self.in_use else None
        except PodResourcesError as exc:
            log.debug("no pod-resources list this pass: %s", exc)
            ids = None
        now = time.time()
        with self.store.lock:
            for record in list(self.store.records()):
                if not self.ours(record):
                    continue   # another part's container (a DRA claim's): not ours to requota or remove
                if ids is not None and (record.extra.get("identity") == "provisional" or not record.pod):
                    record = self.confirm_identity(record, ids, by_uid or {})
                if record.pod_uid and by_uid is not None and record.extra.get("identity") != "provisional":
                    pod = by_uid.get(record.pod_uid)
                    if pod is None or podlib.finished(pod):
                        self.remove(record, "its pod is gone" if pod is None else "its pod has finished")
                    elif record.mode == "vgpu":
                        self.apply_quota(record, pod)
                elif ids is not None:
                    if any((record.resource, d) in ids for d in record.device_ids):
                        self._missing_since.pop(record.key, None)
                        continue
                    since = self._missing_since.setdefault(record.key, now)
                    if now - since >= self.grace_s and now - record.created >= self.grace_s:
                        self.remove(record, f"its devices are not in use for {self.grace_s:.0f} s")

    def confirm_identity(self, record: ContainerRecord, owners: dict[DeviceKey, PodRef],
                         by_uid: dict[str, podlib.Pod]) -> ContainerRecord:
        """Replace a provisional identity by the owner kubelet reports for the record's devices."""
        owner = next((owners[(record.resource, d)] for d in record.device_ids if (record.resource, d) in owners),
                     None)
        if owner is None:
            return record
        namespace, name, container = owner.namespace, owner.pod, owner.container
        uid = next((u for u, p in by_uid.items()
                    if (podlib.meta(p).get("namespace"), podlib.meta(p).get("name")) == (namespace, name)), "")
        if (namespace, name, container, uid) == (record.namespace, record.pod, record.container, record.pod_uid) \
                and "identity" not in record.extra:
            return record
        if (namespace, name, container) != (record.namespace, record.pod, record.container):
            log.info("container %s is %s/%s:%s (provisionally %s/%s:%s)", record.key, namespace, name, container,
                     record.namespace, record.pod, record.container)
        extra = {k: v for k, v in record.extra.items() if k != "identity"}
        confirmed = dataclasses.replace(record, namespace=namespace, pod=name, container=container,
                                        pod_uid=uid, extra=extra)
        self.store.layout.write_record(confirmed)
        return confirmed

    def remove(self, record: ContainerRecord, why: str) -> None:
        log.info("cleaning up container %s (%s/%s:%s): %s", record.key, record.namespace, record.pod,
                 record.container, why)
        remove_tenant(self.schedulers, record)
        self.store.remove(record.key)
        self._missing_since.pop(record.key, None)
        if self.on_removed is not None:
            self.on_removed()

    def apply_quota(self, record: ContainerRecord, pod: podlib.Pod) -> None:
        annotations = dict(podlib.meta(pod).get("annotations") or {})
        spec = podlib.container_spec(pod, record.container)
        try:
            q = quota(self.names, annotations, cores=record.core_request, share_memory=self._share_memory(
                annotations, record), memory_units=podlib.requested(spec, self.names.memory_resource),
                gpus=len(record.gpus))
        except QuotaError as exc:
            if self._warned.get(record.key) != str(exc):
                log.warning("pod %s/%s: %s; keeping the current quota", record.namespace, record.pod, exc)
                self._warned[record.key] = str(exc)
            return
        if (q.core_limit, q.priority, q.memory_limit) == (record.core_limit, record.priority, record.memory_limit):
            return
        if record.tenant and (q.core_limit, q.priority) != (record.core_limit, record.priority):
            scheduler = self.schedulers.get(record.gpus[0])
            if scheduler is None:
                return
            try:
                scheduler.update(record.tenant, record.core_request, q.core_limit, q.priority)
            except SchedulerError as exc:
                log.warning("live core-limit/priority update of %s: %s", record.key, exc)
                return
        updated = dataclasses.replace(record, core_limit=q.core_limit, priority=q.priority,
                                      memory_limit=q.memory_limit)
        self.store.set_quota(updated)
        self.store.layout.write_record(updated)
        log.info("quota of %s/%s:%s now cores %d/%d %s, memory %s", record.namespace, record.pod,
                 record.container, record.core_request, q.core_limit, q.priority, q.memory_limit)

    def _share_memory(self, annotations: dict[str, str], record: ContainerRecord) -> int | None:
        text = annotations.get(self.names.assignment)
        if text is None:
            return None
        try:
            entry = assignment.decode(text).container(record.container)
        except assignment.AssignmentError:
            return None
        return entry.gpus[0].memory if entry and entry.gpus else None

