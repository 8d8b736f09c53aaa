"""Where the TLS material lives: a Kubernetes Secret (the default) or a local directory.

A store's `load` gives the entries (certs.KEYS -> PEM) and a version (None: nothing stored yet);
`save` writes them only if the store still holds that version, else raises `Conflict`, so two
replicas that rotate at once do not overwrite each other: the loser re-reads and adopts.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

from kubernetes.client.rest import ApiException

from kube_contract.apiclient import api_message, read_json

from .certs import KEYS


class Conflict(Exception):
    """The store changed since it was loaded (or was created meanwhile): load again."""


class StoreError(Exception):
    """The store cannot be read or written; the message says why."""


class Store(Protocol):
    where: str

    def load(self) -> tuple[dict[str, bytes], str | None]: ...

    def save(self, entries: dict[str, bytes], version: str | None) -> None: ...


class SecretStore:
    """The Secret ``namespace/name`` (type kubernetes.io/tls), through a kubernetes CoreV1Api."""

    def __init__(self, api: Any, namespace: str, name: str, timeout: float = 10.0) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.timeout = timeout
        self.where = f"Secret {namespace}/{name}"
        self._stored: dict[str, Any] | None = None

    def load(self) -> tuple[dict[str, bytes], str | None]:
        try:
            secret = read_json(self.api.read_namespaced_secret(self.name, self.namespace, _preload_content=False,
                                                               _request_timeout=self.timeout))
        except ApiException as exc:
            if exc.status == 404:
                self._stored = None
                return {}, None
            raise StoreError(f"reading {self.where}: {api_message(exc)}") from None
        except Exception as exc:   # the API server away: urllib3's several types
            raise StoreError(f"reading {self.where}: {exc!r}") from None
        self._stored = secret
        data = secret.get("data") or {}
        entries = {}
        for key in KEYS:
            try:
                entries[key] = base64.b64decode(data.get(key) or "", validate=True)
            except ValueError:
                entries[key] = b""
        return entries, str(secret["metadata"].get("resourceVersion") or "")

    def save(self, entries: dict[str, bytes], version: str | None) -> None:
        data = {k: base64.b64encode(v).decode() for k, v in entries.items()}
        try:
            if version is None:
                body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "data": data,
                        "metadata": {"name": self.name, "namespace": self.namespace,
                                     "labels": {"app.kubernetes.io/managed-by": "vcuda-extender"}}}
                self.api.create_namespaced_secret(self.namespace, body, _preload_content=False,
                                                  _request_timeout=self.timeout)
            else:
                # Replace what was loaded, keeping its type, labels and other keys; the resourceVersion
                # makes the API server refuse it (409) if another replica wrote first.
                body = dict(self._stored or {})
                body["metadata"] = dict(body.get("metadata") or {}, resourceVersion=version)
                body["metadata"].pop("managedFields", None)   # the API server keeps its own
                body["data"] = dict(body.get("data") or {}) | data
                self.api.replace_namespaced_secret(self.name, self.namespace, body, _preload_content=False,
                                                   _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(f"{self.where} changed meanwhile") from None
            raise StoreError(f"writing {self.where}: {api_message(exc)}") from None
        except Exception as exc:
            raise StoreError(f"writing {self.where}: {exc!r}") from None


class DirStore:
    """Files ``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key`` in a directory (outside Kubernetes).

    The version is the files' contents; a save replaces each file atomically (keys mode 0600).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.where = f"directory {self.path}"

    def load(self) -> tuple[dict[str, bytes], str | None]:
        entries = {}
        for key in KEYS:
            try:
                entries[key] = (self.path / key).read_bytes()
            except FileNotFoundError:
                entries[key] = b""
            except OSError as exc:
                raise StoreError(f"reading {self.path / key}: {exc}") from None
        if not any(entries.values()):
            return entries, None
        return entries, _digest(entries)

    def save(self, entries: dict[str, bytes], version: str | None) -> None:
        _, now = self.load()
        if now != version:
            raise Conflict(f"{self.where} changed meanwhile")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            for key, value in entries.items():
                fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{key}.")
                with os.fdopen(fd, "wb") as f:
                    f.write(value)   # mkstemp made it 0600
                if key.endswith(".crt"):
                    os.chmod(tmp, 0o644)
                os.replace(tmp, self.path / key)
        except OSError as exc:
            raise StoreError(f"writing {self.where}: {exc}") from None


def _digest(entries: dict[str, bytes]) -> str:
    return hashlib.sha256(b"\0".join(entries[k] for k in KEYS)).hexdigest()
