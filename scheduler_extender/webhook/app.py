"""Wiring of the webhook from `vcuda extender`'s flags: store, rotation, notifier, HTTPS server."""

from __future__ import annotations

import argparse
import logging
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from kube_contract.events import EventRecorder
from kube_contract.names import Names

from .certs import hosts
from .mutate import Rules
from .notify import Notifier
from .rotation import CaBundlePatcher, CertManager
from .server import TlsContext, WebhookServer
from .stores import DirStore, SecretStore, Store, StoreError

log = logging.getLogger(__name__)

CHECK_INTERVAL = 60.0   # seconds between TLS checks (rotation, a blanked caBundle)


@dataclass(frozen=True)
class Settings:
    address: tuple[str, int]
    service: str
    namespace: str
    secret: tuple[str, str] | None   # (namespace, name); None with cert_dir
    cert_dir: Path | None
    configuration: str | None
    rules: Rules


def settings(args: argparse.Namespace, names: Names, address: tuple[str, int]) -> Settings:
    """The webhook's settings from the parsed flags; raises ValueError naming the flag."""
    service, dot, namespace = (args.webhook_service or "").partition(".")
    if not (service and dot and namespace) or "." in namespace:
        raise ValueError(f"--webhook-service {args.webhook_service!r}: give <service>.<namespace>")
    secret = None
    if args.webhook_tls_secret:
        ns, slash, name = args.webhook_tls_secret.partition("/")
        if not (ns and slash and name) or "/" in name:
            raise ValueError(f"--webhook-tls-secret {args.webhook_tls_secret!r}: give <namespace>/<name>")
        secret = (ns, name)
    if (secret is None) == (args.webhook_cert_dir is None):
        raise ValueError("give one of --webhook-tls-secret and --webhook-cert-dir")
    resources = args.webhook_resources
    if resources is None:
        resources = f"{names.core_resource},{names.memory_resource}"
    listed = frozenset(r.strip() for r in resources.split(",") if r.strip())
    if not listed or any("/" not in r for r in listed):
        raise ValueError(f"--webhook-resources {resources!r}: give a comma list of domain/name resources")
    if not args.scheduler_name:
        raise ValueError("--scheduler-name must not be empty")
    return Settings(address, service, namespace, secret,
                    Path(args.webhook_cert_dir) if args.webhook_cert_dir else None,
                    args.webhook_configuration or None, Rules(listed, args.scheduler_name))


class Webhook:
    """The running webhook: its certificate manager, notifier and HTTPS server (on a thread)."""

    def __init__(self, cfg: Settings, api_client: Any | None) -> None:
        core = client.CoreV1Api(api_client) if api_client is not None else None
        store: Store
        if cfg.secret is not None:
            assert core is not None
            store = SecretStore(core, *cfg.secret)
        else:
            assert cfg.cert_dir is not None
            store = DirStore(cfg.cert_dir)
        patcher = None
        if cfg.configuration and api_client is not None:
            patcher = CaBundlePatcher(client.AdmissionregistrationV1Api(api_client), cfg.configuration)
        self.tls = TlsContext()
        self.certs = CertManager(store, hosts(cfg.service, cfg.namespace), patcher=patcher, on_material=self.tls.load)
        self.notifier = None
        if core is not None:
            recorder = EventRecorder(core, component="vcuda-webhook", host=socket.gethostname())
            self.notifier = Notifier(core, recorder)
        self.server = WebhookServer(cfg.address, self.tls, cfg.rules,
                                    notify=self.notifier.notify if self.notifier else lambda n: None)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """First TLS pass (raises StoreError when the store cannot give a certificate), then serve."""
        try:
            self.certs.check()
        except StoreError as exc:
            if self.certs.material is None:
                raise
            log.warning("webhook TLS: %s; retrying every %.0f s", exc, CHECK_INTERVAL)
        self.certs.start(CHECK_INTERVAL)
        self._thread = threading.Thread(target=self.server.serve_forever, name="webhook-https", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.certs.stop()
        if self._thread is not None:
            self.server.shutdown()
        self.server.server_close()
        if self.notifier is not None:
            self.notifier.stop()
