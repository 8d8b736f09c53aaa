"""Each allocated container's host directory (node_state.layout) and what
goes in the container from it: the ledger, the quota file and ``ld.so.preload``
(the record stays outside). The device plugin and the DRA driver mount these
paths (node_state.tenancy); the container sees the same files whichever set it up.

Inside the container (**contract** with libvcuda):

    /run/vcuda-quota/             read-only: the directory's quota/ part
      quota.conf                  the quota (py_vcuda.quota_file): GPUs by UUID, memory per GPU,
                                  core request/limit, priority, scheduler endpoint, ledger path.
                                  libvcuda reads it first, at this fixed path, and then ignores the
                                  VCUDA_* quota variables of the environment (a pod's spec sets those)
    /run/vcuda/                   read-write: the directory's shared/ part
      ledger                      the ledger the quota file names
      sched/sched.sock            the scheduler endpoint the quota file names (the tenant's
                                  socket directory, mounted over)
    /usr/local/vcuda/lib/libvcuda.so   read-only
    /etc/ld.so.preload            read-only, names the path above (unless the operator let the
                                  container opt out)

The quota file is replaced atomically (a temporary file in quota/, then rename): the container
sees the directory, so a process reads the old file or the new, never half of one. Live quota
changes (annotations) rewrite it with the ledger.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from kube_contract.names import CORES_PER_GPU
from node_state.layout import LEDGER_FILE, RECORD_FILE, ContainerRecord, LayoutError, NodeLayout
from py_vcuda.files import write_atomic
from py_vcuda.ledger import Ledger
from py_vcuda.memory_reconciler import Account
from py_vcuda.quota_file import QUOTA_FILE, GPUQuota, QuotaFile

log = logging.getLogger(__name__)

CONTAINER_DIR = Path("/run/vcuda")
CONTAINER_LEDGER = CONTAINER_DIR / LEDGER_FILE
CONTAINER_SCHED_DIR = CONTAINER_DIR / "sched"
CONTAINER_SCHEDULER = f"ipc://{CONTAINER_SCHED_DIR}/sched.sock"
CONTAINER_LIB = Path("/usr/local/vcuda/lib/libvcuda.so")
PRELOAD_FILE = "ld.so.preload"


def shim_required(record: ContainerRecord) -> bool:
    """Whether every GPU process of the container must run under libvcuda (else it escapes its quota).

    A share of a GPU (fewer than 100 cores) does: its neighbours are protected by its quota only.
    A whole card has no neighbour to protect. A container whose preload was turned off (record extra
    ``preload`` "0": only in a namespace the operator's ``--allow-opt-out-namespaces`` lists, vgpu
    ``VCUDA_DISABLE=1`` or DRA ``preload: false``) runs without it on purpose.
    """
    opted_out = record.extra.get("preload") == "0"
    return record.mode == "vgpu" and record.core_request < CORES_PER_GPU and not opted_out


def quota_of(record: ContainerRecord) -> QuotaFile:
    """The quota file of a container (container paths): what libvcuda holds its processes to."""
    scheduler = CONTAINER_SCHEDULER if record.tenant else ""   # a tenant is a share of its one GPU
    return QuotaFile(ledger=str(CONTAINER_LEDGER), core_request=record.core_request, core_limit=record.core_limit,
                     priority=record.priority,
                     gpus=tuple(GPUQuota(uuid, record.memory_limit, scheduler) for uuid in record.gpus))


def new_key() -> str:
    """Container key, also its tenant name: short (socket paths are capped), unique, never reused."""
    return "c" + secrets.token_hex(6)


class ContainerStore:
    """Creates and removes container directories; knows which (pod uid, container) are served."""

    def __init__(self, layout: NodeLayout) -> None:
        self.layout = layout
        self.lock = threading.RLock()   # Allocate (gRPC threads) and the reconciler share it
        # key -> (identity of its container.json, parsed record). Allocate reads every record
        # (who is served already); parsing hundreds of files per call would cost more than the
        # call's own work, a stat each does not. Records are replaced by rename: a new inode.
        self._parsed: dict[str, tuple[tuple[int, int, int], ContainerRecord]] = {}
        self._cache_lock = threading.Lock()

    def records(self) -> Iterator[ContainerRecord]:
        """Every container's record, in key order (layout.records(), parsed once per version)."""
        try:
            entries = sorted((e for e in os.scandir(self.layout.containers) if e.is_dir()), key=lambda e: e.name)
        except FileNotFoundError:
            return
        for entry in entries:
            record = self._record(entry.name, entry.path)
            if record is not None:
                yield record
        with self._cache_lock:
            for gone in set(self._parsed) - {e.name for e in entries}:
                del self._parsed[gone]

    def _record(self, key: str, directory: str) -> ContainerRecord | None:
        try:
            st = os.stat(os.path.join(directory, RECORD_FILE))
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            with self._cache_lock:
                cached = self._parsed.get(key)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            record = self.layout.read_record(key)
        except (OSError, LayoutError) as exc:
            log.warning("ignoring %s: %s", directory, exc)
            return None
        with self._cache_lock:
            self._parsed[key] = (stamp, record)
        return record

    def allocated(self, records: Iterable[ContainerRecord] | None = None) -> set[tuple[str, str]]:
        """(pod uid, container) of every identified container (of `records`, else of all)."""
        return {(r.pod_uid, r.container) for r in (self.records() if records is None else records) if r.pod_uid}

    def tenants(self, uuid: str) -> list[tuple[str, int, int, str]]:
        """(tenant, request %, limit %, priority) of every record with a tenant on this GPU: what its
        scheduler must hold."""
        return [(r.tenant, r.core_request, r.core_limit, r.priority) for r in self.records()
                if r.tenant and r.gpus and r.gpus[0] == uuid]

    def memory_accounts(self) -> list[Account]:
        """Every shared-GPU (vgpu-mode) container's ledger, for the memory reconciler: containers
        that share GPUs must also be charged what NVML sees them hold and no hook did."""
        return [Account(key=r.key, ledger=self.layout.ledger_path(r.key), gpus=r.gpus, pod_uid=r.pod_uid,
                        shim=shim_required(r))
                for r in self.records() if r.mode == "vgpu"]

    def newest(self, device_ids: Sequence[str]) -> ContainerRecord | None:
        """The latest record for exactly these device IDs (an older one is a gone container not yet cleaned up)."""
        ids = tuple(device_ids)
        return max((r for r in self.records() if r.device_ids == ids), key=lambda r: r.created, default=None)

    def create(self, record: ContainerRecord, *, ledger: bool, preload: bool) -> Path:
        directory = self.layout.write_record(record)
        if ledger:
            path = self.layout.ledger_path(record.key)
            with Ledger(path, create=True) as book:
                for uuid in record.gpus:
                    book.set_limit(uuid, record.memory_limit)
            # Every process of the container maps the ledger read-write, whatever uid it runs as; our
            # umask cut libvcuda's 0666 at creation. The mount is the access control, as for the
            # tenant socket: only this container sees the file.
            os.chmod(path, 0o666)
            self.write_quota(record)
        if preload:
            (directory / PRELOAD_FILE).write_text(f"{CONTAINER_LIB}\n")
        return directory

    def write_quota(self, record: ContainerRecord) -> Path:
        """Write (or replace) the container's quota file atomically; readable by every uid, writable by none
        of the container's (the directory is mounted read-only)."""
        directory = self.layout.quota_dir(record.key)
        directory.mkdir(mode=0o755, exist_ok=True)
        path = directory / QUOTA_FILE
        write_atomic(path, quota_of(record).render().encode(), mode=0o644)
        os.chmod(path, 0o644)   # our umask may have cut the mode at creation
        return path

    def set_quota(self, record: ContainerRecord) -> None:
        """A live quota change: the ledger's pinned memory limits and the quota file follow the record."""
        path = self.layout.ledger_path(record.key)
        if not path.exists():
            return   # the container is going (or not set up by us): nothing to change
        with Ledger(path) as book:
            for uuid in record.gpus:
                book.set_limit(uuid, record.memory_limit)
        self.write_quota(record)

    def remove(self, key: str) -> None:
        shutil.rmtree(self.layout.container_dir(key), ignore_errors=True)
        log.info("container directory %s removed", key)

