"""The node agent's state directory: where each GPU's token scheduler and each
container's files live, and the record that describes a container.

The device plugin writes it (Allocate), the DRA driver too (prepare; its claim
checkpoint goes in dra/), as `vcuda run` does under its runtime directory; the
metrics exporter and `vcuda top` read it. One module, so writers and readers
cannot drift apart.

    <state-dir>/                        --state-dir, default /var/lib/vcuda
      sched/<gpu-key>/                  one token scheduler per GPU (its --dir)
        admin.sock  tenants.json  tenants/<tenant>/sched.sock
      containers/<container-key>/       one per allocated container (the agent's)
        container.json                  ContainerRecord (below)
        ld.so.preload                   mounted read-only over the container's /etc/ld.so.preload
        quota/                          mounted read-only into the container (/run/vcuda-quota)
          quota.conf                    the container's quota, libvcuda's only source (py_vcuda.quota_file)
        shared/                         mounted read-write into the container (/run/vcuda)
          ledger                        the container's ledger (the quota file names it)

Only shared/ is writable from the container: the record, which the agent
trusts when it reconciles quotas and removes tenants, and the quota file, which
libvcuda trusts over the environment, stay out of its reach.

Unix socket paths must stay within 107 bytes, so keys are short: a GPU key is
10 hex digits of a hash of its UUID, a tenant name at most 24 characters.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_STATE_DIR = Path("/var/lib/vcuda")
RECORD_FILE = "container.json"
LEDGER_FILE = "ledger"
SHARED_DIR = "shared"
QUOTA_DIR = "quota"
RECORD_FORMAT = 1
MODES = ("vgpu", "pgpu", "mps")
# ContainerRecord.extra key: the run's scheduler directory, which is not under the layout's sched/
SCHEDULER_DIR_KEY = "scheduler_dir"


class LayoutError(ValueError):
    """A container record that cannot be trusted; the message names the file."""


def gpu_key(uuid: str) -> str:
    """Short, stable directory name for a GPU: 10 hex digits of a hash of its UUID.

    A hash, not a prefix: UUIDs of one board (and the simulator's) share prefixes.
    """
    if not uuid.startswith(("GPU-", "MIG-")) or len(uuid) < 12:
        raise ValueError(f"not a GPU UUID: {uuid!r}")
    return hashlib.blake2s(uuid.encode(), digest_size=5).hexdigest()


@dataclass(frozen=True)
class ContainerRecord:
    """What Allocate decided for one container (format 1, JSON in container.json).

    `device_ids` are the kubelet device IDs Allocate got; readers join them
    with pod-resources `List` to learn namespace/pod/container when those were
    not known at Allocate time (then they are empty strings here).
    """

    key: str                        # the directory name under containers/
    mode: str                       # vgpu | pgpu | mps
    resource: str                   # e.g. tencent.com/vcuda-core
    device_ids: tuple[str, ...]
    gpus: tuple[str, ...]           # UUIDs of the GPUs the container sees
    core_request: int               # percent of one GPU; 100 per whole card
    core_limit: int
    memory_limit: int | None        # bytes per GPU; None: unlimited
    tenant: str | None = None       # token-scheduler tenant name; None: unthrottled
    priority: str = "normal"        # the tenant's class: high | normal
    namespace: str = ""
    pod: str = ""
    pod_uid: str = ""
    container: str = ""
    created: float = 0.0            # time.time() at Allocate
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        doc = {"format": RECORD_FORMAT, **asdict(self)}
        doc["device_ids"] = list(self.device_ids)
        doc["gpus"] = list(self.gpus)
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "container.json") -> ContainerRecord:
        try:
            doc = json.loads(text)
            if doc.get("format") != RECORD_FORMAT:
                raise LayoutError(f"{source}: unknown format {doc.get('format')!r}")
            if doc["mode"] not in MODES:
                raise LayoutError(f"{source}: unknown mode {doc['mode']!r}")
            return cls(
                key=str(doc["key"]), mode=str(doc["mode"]), resource=str(doc["resource"]),
                device_ids=tuple(str(d) for d in doc["device_ids"]), gpus=tuple(str(g) for g in doc["gpus"]),
                core_request=int(doc["core_request"]), core_limit=int(doc["core_limit"]),
                memory_limit=None if doc["memory_limit"] is None else int(doc["memory_limit"]),
                tenant=None if doc.get("tenant") is None else str(doc["tenant"]),
                priority=str(doc.get("priority", "normal")),  # came later within format 1
                namespace=str(doc.get("namespace", "")), pod=str(doc.get("pod", "")),
                pod_uid=str(doc.get("pod_uid", "")), container=str(doc.get("container", "")),
                created=float(doc.get("created", 0.0)),
                extra={str(k): str(v) for k, v in dict(doc.get("extra", {})).items()},
            )
        except LayoutError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LayoutError(f"{source}: unreadable container record: {exc}") from exc


def ledger_in(container_dir: Path) -> Path:
    """The ledger of the container whose directory this is."""
    return container_dir / SHARED_DIR / LEDGER_FILE


@dataclass(frozen=True)
class NodeLayout:
    root: Path = DEFAULT_STATE_DIR

    @property
    def schedulers(self) -> Path:
        return self.root / "sched"

    def scheduler_dir(self, uuid: str) -> Path:
        return self.schedulers / gpu_key(uuid)

    @property
    def containers(self) -> Path:
        return self.root / "containers"

    def container_dir(self, key: str) -> Path:
        if not key or "/" in key or key in (".", ".."):
            raise ValueError(f"bad container key {key!r}")
        return self.containers / key

    def shared_dir(self, key: str) -> Path:
        """The part of a container's directory mounted into the container."""
        return ledger_in(self.container_dir(key)).parent

    def ledger_path(self, key: str) -> Path:
        return ledger_in(self.container_dir(key))

    def quota_dir(self, key: str) -> Path:
        """The part of a container's directory mounted read-only into the container: its quota file."""
        return self.container_dir(key) / QUOTA_DIR

    def write_record(self, record: ContainerRecord) -> Path:
        """Create the container's directory (with its shared/ part) and write its record atomically."""
        directory = self.container_dir(record.key)
        ledger_in(directory).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = directory / f".{RECORD_FILE}.{os.getpid()}.tmp"
        tmp.write_text(record.to_json())
        os.replace(tmp, directory / RECORD_FILE)
        return directory

    def read_record(self, key: str) -> ContainerRecord:
        path = self.container_dir(key) / RECORD_FILE
        return ContainerRecord.from_json(path.read_text(), str(path))

    def records(self) -> Iterator[tuple[ContainerRecord | None, Path, str]]:
        """Every container directory: (record or None, directory, error message or '')."""
        try:
            entries = sorted(self.containers.iterdir())
        except FileNotFoundError:
            return
        for directory in entries:
            if not directory.is_dir():
                continue
            try:
                yield self.read_record(directory.name), directory, ""
            except (OSError, LayoutError) as exc:
                yield None, directory, str(exc)
