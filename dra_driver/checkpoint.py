"""The driver's checkpoint: which claims are prepared on this node and what they got.

One file per claim, ``<state-dir>/dra/claims/<claim-uid>.json``, written
atomically and durably. The driver writes it *after* the claim's container
directories and tenants exist and *before* its CDI spec, and marks it
``unpreparing`` before taking anything down, so every crash leaves a state the
next start can finish or undo (dra_driver.driver, `recover`):

- a container directory of a claim without a checkpoint: prepare did not get
  as far as the checkpoint; the directory and tenant go;
- a ``prepared`` checkpoint without its CDI spec: the spec is written again;
- an ``unpreparing`` checkpoint: unprepare is finished;
- a CDI spec without a checkpoint: removed.

The checkpoint also makes prepare and unprepare answer the kubelet's retries
without the API server: a prepared claim is answered from it, and a claim
unprepared after its deletion needs nothing else.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from node_state.layout import ContainerRecord, LayoutError
from py_vcuda.files import write_atomic

log = logging.getLogger(__name__)

FORMAT = 1
PREPARED = "prepared"
UNPREPARING = "unpreparing"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be trusted; the message names it."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device as the kubelet gets it back (NodePrepareResourceResponse.devices)."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True)
class PreparedShare:
    """One claim request's container (its whole record, so a lost directory can be made again) and
    the CDI device injecting it."""

    request: str
    record: ContainerRecord
    cdi_name: str


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    state: str
    shares: tuple[PreparedShare, ...]
    devices: tuple[PreparedDevice, ...]

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "uid": self.uid, "namespace": self.namespace, "name": self.name,
            "state": self.state,
            "shares": [{"request": s.request, "record": json.loads(s.record.to_json()), "cdi_name": s.cdi_name}
                       for s in self.shares],
            "devices": [{"requests": list(d.requests), "pool": d.pool, "device": d.device,
                         "cdi_ids": list(d.cdi_ids)} for d in self.devices],
        }, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str) -> PreparedClaim:
        try:
            doc = json.loads(text)
            if doc.get("format") != FORMAT:
                raise CheckpointError(f"{source}: unknown format {doc.get('format')!r}")
            if doc["state"] not in (PREPARED, UNPREPARING):
                raise CheckpointError(f"{source}: unknown state {doc['state']!r}")
            return cls(
                uid=str(doc["uid"]), namespace=str(doc["namespace"]), name=str(doc["name"]), state=doc["state"],
                shares=tuple(PreparedShare(str(s["request"]),
                                           ContainerRecord.from_json(json.dumps(s["record"]), source),
                                           str(s["cdi_name"])) for s in doc["shares"]),
                devices=tuple(PreparedDevice(tuple(map(str, d["requests"])), str(d["pool"]), str(d["device"]),
                                             tuple(map(str, d["cdi_ids"]))) for d in doc["devices"]))
        except CheckpointError:
            raise
        except LayoutError as exc:
            raise CheckpointError(str(exc)) from exc
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{source}: unreadable checkpoint: {exc}") from exc


class Checkpoint:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, uid: str) -> Path:
        if not uid or "/" in uid or uid.startswith("."):
            raise ValueError(f"bad claim UID {uid!r}")
        return self.directory / f"{uid}.json"

    def get(self, uid: str) -> PreparedClaim | None:
        path = self.path(uid)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        return PreparedClaim.from_json(text, str(path))

    def put(self, claim: PreparedClaim) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path(claim.uid), claim.to_json().encode(), 0o600)

    def remove(self, uid: str) -> None:
        self.path(uid).unlink(missing_ok=True)

    def uids(self) -> set[str]:
        """Every claim with a checkpoint file, readable or not."""
        try:
            return {n[:-len(".json")] for n in os.listdir(self.directory) if n.endswith(".json")}
        except FileNotFoundError:
            return set()

    def all(self) -> list[PreparedClaim]:
        """Every readable checkpoint; an unreadable one is logged and left in place for a person to look at."""
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if name.startswith(".") and name.endswith(".tmp"):
                (self.directory / name).unlink(missing_ok=True)   # a write the crash interrupted
                continue
            if not name.endswith(".json"):
                continue
            try:
                out.append(PreparedClaim.from_json((self.directory / name).read_text(), str(self.directory / name)))
            except (OSError, CheckpointError) as exc:
                log.error("ignoring checkpoint %s: %s", name, exc)
        return out
