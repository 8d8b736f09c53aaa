"""CDI specs (Container Device Interface, cncf-tags/container-device-interface SPEC.md):
how a prepared claim reaches its containers.

One spec file per prepared claim, ``<cdi-dir>/gpu.vcuda.io-claim_<claim-uid>.json``,
kind ``gpu.vcuda.io/claim``, one device per claim request, named
``<claim-uid>-<request>``; the kubelet hands the runtime the qualified names
(``gpu.vcuda.io/claim=<name>``) and the runtime applies the device's edits: the
environment and bind mounts vgpu Allocate returns.

Specs are written atomically (a temporary name the runtime does not read, then
rename), so a runtime never reads half a spec. ``cdiVersion`` is 0.5.0, the
first to allow device names that start with a digit (claim UIDs may), and old
enough for containerd 1.7's CDI library.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_driver.names import CDI_CLASS, CDI_KIND, CDI_VENDOR, DEFAULT_CDI_DIR
from node_state.tenancy import Injection
from py_vcuda.files import write_atomic

CDI_VERSION = "0.5.0"
_PREFIX = f"{CDI_VENDOR}-{CDI_CLASS}_"
_SUFFIX = ".json"


@dataclass(frozen=True)
class Device:
    """One CDI device: a name unique in its spec and what it puts into a container."""

    name: str
    edits: Injection


def device_name(claim_uid: str, request: str) -> str:
    # CDI names take letters, digits, '-', '_', '.'; a subrequest ("gpu/small") has a '/'.
    return f"{claim_uid}-{request.replace('/', '_')}"


def qualified(name: str) -> str:
    """The fully qualified CDI device name the runtime resolves (vendor/class=name)."""
    return f"{CDI_KIND}={name}"


def spec(devices: Sequence[Device]) -> dict[str, object]:
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": d.name, "containerEdits": {
            "env": [f"{k}={v}" for k, v in sorted(d.edits.env.items())],
            "mounts": [{"hostPath": str(m.host), "containerPath": str(m.container),
                        "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"]}
                       for m in d.edits.mounts],
        }} for d in devices],
    }


class SpecDir:
    """The claims' spec files in one CDI directory."""

    def __init__(self, directory: Path = DEFAULT_CDI_DIR) -> None:
        self.directory = directory

    def path(self, claim_uid: str) -> Path:
        if not claim_uid or "/" in claim_uid or claim_uid.startswith("."):
            raise ValueError(f"bad claim UID {claim_uid!r}")
        return self.directory / f"{_PREFIX}{claim_uid}{_SUFFIX}"

    def write(self, claim_uid: str, devices: Sequence[Device]) -> Path:
        """Write (or replace) the claim's spec atomically and durably; returns its path."""
        path = self.path(claim_uid)
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(spec(devices), indent=2).encode() + b"\n")
        return path

    def exists(self, claim_uid: str) -> bool:
        return self.path(claim_uid).is_file()

    def remove(self, claim_uid: str) -> None:
        self.path(claim_uid).unlink(missing_ok=True)

    def claims(self) -> set[str]:
        """UIDs of the claims that have a spec here."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return set()
        return {n[len(_PREFIX):-len(_SUFFIX)] for n in names if n.startswith(_PREFIX) and n.endswith(_SUFFIX)}

    def read(self, claim_uid: str) -> dict[str, object]:
        return json.loads(self.path(claim_uid).read_text())

