"""Keeps the TLS material good: makes or adopts it, rotates it before expiry, publishes the caBundle.

`CertManager.check()` is one pass: load the store, `certs.plan` at the clock's time, save what
changed (on a `Conflict` with another replica: load again and adopt, a few times), make sure every
webhook of the MutatingWebhookConfiguration carries the bundle as its ``caBundle`` (re-patching it
if, say, ``helm upgrade`` blanked it), then hand the material to `on_material` (the HTTPS server
reloads its certificate). `run` repeats it every `interval` seconds until stopped; a failed pass is
logged and retried at the next one, the server keeps its last good certificate.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException

from kube_contract.apiclient import api_message, read_json

from .certs import DEFAULT_LIFETIMES, Lifetimes, Material, plan
from .stores import Conflict, Store, StoreError

log = logging.getLogger(__name__)

SAVE_TRIES = 5


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class CaBundlePatcher:
    """Sets ``clientConfig.caBundle`` on every webhook of one MutatingWebhookConfiguration.

    Read it, then one JSON patch that sets the caBundle of the webhooks where it differs, guarded by
    ``test`` operations on the resourceVersion and each webhook's name (the API server refuses a
    patch of a changed object; the next pass retries). Nothing else in the object is written, so
    whatever the chart or an operator set stays. RBAC: get and patch on mutatingwebhookconfigurations,
    that name.
    """

    def __init__(self, api: Any, name: str, timeout: float = 10.0) -> None:
        self.api = api   # kubernetes.client.AdmissionregistrationV1Api
        self.name = name
        self.timeout = timeout

    def ensure(self, bundle: bytes) -> int:
        """The number of webhooks patched (0: all were right); raises StoreError."""
        want = base64.b64encode(bundle).decode()
        what = f"MutatingWebhookConfiguration {self.name}"
        try:
            config = read_json(self.api.read_mutating_webhook_configuration(
                self.name, _preload_content=False, _request_timeout=self.timeout))
            ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                          "value": config["metadata"]["resourceVersion"]}]
            for i, webhook in enumerate(config.get("webhooks") or []):
                if (webhook.get("clientConfig") or {}).get("caBundle") != want:
                    ops += [{"op": "test", "path": f"/webhooks/{i}/name", "value": webhook.get("name")},
                            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": want}]
            if len(ops) == 1:
                return 0
            self.api.patch_mutating_webhook_configuration(self.name, ops, _content_type="application/json-patch+json",
                                                          _preload_content=False, _request_timeout=self.timeout)
        except ApiException as exc:
            raise StoreError(f"setting the caBundle of {what}: {api_message(exc)}") from None
        except Exception as exc:   # the API server away (urllib3's errors), an object of an odd shape
            raise StoreError(f"setting the caBundle of {what}: {exc!r}") from None
        return (len(ops) - 1) // 2


class CertManager:
    def __init__(self, store: Store, names: tuple[str, ...], *, patcher: CaBundlePatcher | None = None,
                 on_material: Callable[[Material], None] = lambda m: None,
                 clock: Callable[[], dt.datetime] = utcnow, lifetimes: Lifetimes = DEFAULT_LIFETIMES) -> None:
        self.store = store
        self.names = names
        self.patcher = patcher
        self.on_material = on_material
        self.clock = clock
        self.lifetimes = lifetimes
        self.material: Material | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> Material:
        """One pass (see the module docstring); raises StoreError when the store cannot be used."""
        for _ in range(SAVE_TRIES):
            stored, version = self.store.load()
            result = plan(stored, self.names, self.clock(), self.lifetimes)
            if not result.changes:
                break
            try:
                self.store.save(result.material.entries(), version)
            except Conflict as exc:
                log.info("webhook TLS: %s; reading it again", exc)
                continue
            log.info("webhook TLS: %s; saved to %s", "; ".join(result.changes), self.store.where)
            break
        else:
            raise StoreError(f"{self.store.where} kept changing under {SAVE_TRIES} tries")
        problem = None
        if self.patcher is not None:
            try:
                patched = self.patcher.ensure(result.material.ca_bundle)
            except StoreError as exc:   # still serve what the store holds: other replicas do too
                problem = exc
            else:
                if patched:
                    log.info("webhook TLS: set the caBundle of %d webhook(s) in %s", patched, self.patcher.name)
        if result.material != self.material:
            self.on_material(result.material)
            self.material = result.material
        if problem is not None:
            raise problem
        return result.material

    def start(self, interval: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(interval,), name="webhook-tls", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.check()
            except Exception as exc:   # StoreError, or the API server away: keep the last certificate
                log.warning("webhook TLS check failed: %s; retrying in %.0f s", exc, interval)
