"""Each allocated container's host directory (device_plugin.layout) and what
goes in the container from it: the record, the ledger, ``ld.so.preload``.

Inside the container (**contract** with libvcuda's env):

    /run/vcuda/                   the container directory
      ledger                      VCUDA_LEDGER
      sched/sched.sock            VCUDA_SCHEDULER (the tenant's socket directory, mounted over)
    /usr/local/vcuda/lib/libvcuda.so   read-only
    /etc/ld.so.preload            read-only, names the path above
"""

from __future__ import annotations

import logging
import secrets
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from device_plugin.api import deviceplugin_v1beta1_pb2 as pb
from device_plugin.layout import LEDGER_FILE, ContainerRecord, NodeLayout
from py_vcuda.ledger import Ledger

log = logging.getLogger(__name__)

CONTAINER_DIR = Path("/run/vcuda")
CONTAINER_LEDGER = CONTAINER_DIR / LEDGER_FILE
CONTAINER_SCHED_DIR = CONTAINER_DIR / "sched"
CONTAINER_SCHEDULER = f"ipc://{CONTAINER_SCHED_DIR}/sched.sock"
CONTAINER_LIB = Path("/usr/local/vcuda/lib/libvcuda.so")
PRELOAD_FILE = "ld.so.preload"


def new_key() -> str:
    """Container key, also its tenant name: short (socket paths are capped), unique, never reused."""
    return "c" + secrets.token_hex(6)


def mount(host: Path, container: Path, read_only: bool) -> pb.Mount:
    return pb.Mount(host_path=str(host), container_path=str(container), read_only=read_only)


class ContainerStore:
    """Creates and removes container directories; knows which (pod uid, container) are served."""

    def __init__(self, layout: NodeLayout) -> None:
        self.layout = layout
        self.lock = threading.RLock()   # Allocate (gRPC threads) and the reconciler share it

    def records(self) -> Iterator[ContainerRecord]:
        for record, directory, error in self.layout.records():
            if record is None:
                log.warning("ignoring %s: %s", directory, error)
            else:
                yield record

    def allocated(self) -> set[tuple[str, str]]:
        return {(r.pod_uid, r.container) for r in self.records() if r.pod_uid}

    def create(self, record: ContainerRecord, *, ledger: bool, preload: bool) -> Path:
        directory = self.layout.write_record(record)
        if ledger:
            with Ledger(directory / LEDGER_FILE, create=True) as book:
                for uuid in record.gpus:
                    book.set_limit(uuid, record.memory_limit)
        if preload:
            (directory / PRELOAD_FILE).write_text(f"{CONTAINER_LIB}\n")
        return directory

    def set_memory_limit(self, record: ContainerRecord) -> None:
        path = self.layout.container_dir(record.key) / LEDGER_FILE
        if path.exists():
            with Ledger(path) as book:
                for uuid in record.gpus:
                    book.set_limit(uuid, record.memory_limit)

    def remove(self, key: str) -> None:
        shutil.rmtree(self.layout.container_dir(key), ignore_errors=True)
        log.info("container directory %s removed", key)

