"""The webhook's TLS material: made once and reused (same Secret -> same certificate across restarts),
rotated near expiry (an injected clock), the CA rotated with the old one kept in the bundle, a create
race between two replicas, and the caBundle of the MutatingWebhookConfiguration kept in step."""

from __future__ import annotations

import base64
import datetime as dt
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes import client

from scheduler_extender.webhook import certs
from scheduler_extender.webhook.certs import Lifetimes, plan
from scheduler_extender.webhook.rotation import CaBundlePatcher, CertManager
from scheduler_extender.webhook.stores import Conflict, DirStore, SecretStore, StoreError

NAMES = certs.hosts("vcuda-webhook", "vcuda-system")
T0 = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
CONFIG = "vcuda-webhook"


def bundle(material: certs.Material) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(material.ca_bundle)


def serving(material: certs.Material) -> x509.Certificate:
    return x509.load_pem_x509_certificate(material.cert)


def test_the_certificate_names_the_service_and_is_signed_by_the_ca() -> None:
    material = plan({}, NAMES, T0).material
    cert = serving(material)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert sans == ["vcuda-webhook", "vcuda-webhook.vcuda-system", "vcuda-webhook.vcuda-system.svc",
                    "vcuda-webhook.vcuda-system.svc.cluster.local"]
    cert.verify_directly_issued_by(bundle(material)[0])
    assert cert.not_valid_after_utc == T0 + 365 * DAY
    assert bundle(material)[0].not_valid_after_utc == T0 + 3650 * DAY


def test_kept_while_valid_renewed_under_30_days() -> None:
    first = plan({}, NAMES, T0).material
    assert plan(first.entries(), NAMES, T0 + 334 * DAY).changes == []
    later = plan(first.entries(), NAMES, T0 + 336 * DAY)
    assert len(later.changes) == 1 and "serving certificate expires" in later.changes[0]
    assert later.material.ca_bundle == first.ca_bundle and later.material.ca_key == first.ca_key
    assert later.material.cert != first.cert and later.material.key != first.key


@pytest.mark.parametrize(("broken", "why"), [
    ({"tls.key": b""}, "no serving certificate"),
    ({"tls.crt": b"garbage"}, "no serving certificate"),
    ({"ca.key": b""}, "no usable CA"),
])
def test_broken_parts_are_made_anew(broken: dict[str, bytes], why: str) -> None:
    first = plan({}, NAMES, T0).material
    again = plan(first.entries() | broken, NAMES, T0)
    assert any(why in c for c in again.changes)
    if "ca.key" in broken:   # the old CA stays trusted, and the serving certificate it signed stays in use
        assert bundle(again.material)[1].public_bytes(certs.serialization.Encoding.PEM) == first.ca_bundle
        assert again.material.cert == first.cert


def test_a_new_service_name_gets_a_new_certificate() -> None:
    first = plan({}, NAMES, T0).material
    again = plan(first.entries(), certs.hosts("other", "vcuda-system"), T0)
    assert again.changes == ["the serving certificate lacks other, other.vcuda-system, other.vcuda-system.svc, "
                             "other.vcuda-system.svc.cluster.local: made a new serving certificate"]


def test_ca_rotation_keeps_the_old_ca_in_the_bundle_until_it_expires() -> None:
    life = Lifetimes(ca=100 * DAY, ca_renew=40 * DAY, cert=30 * DAY, cert_renew=5 * DAY)
    stored = plan({}, NAMES, T0, life).material.entries()
    ca0 = x509.load_pem_x509_certificates(stored["ca.crt"])

    def at(day: int) -> list[str]:
        nonlocal stored
        step = plan(stored, NAMES, T0 + day * DAY, life)
        stored = step.material.entries()
        return step.changes

    assert at(20) == []
    assert at(26) == ["the serving certificate expires 2027-01-31: made a new serving certificate"]
    assert at(52) == ["the serving certificate expires 2027-02-26: made a new serving certificate"]   # to day 82
    # Day 61: the CA has 39 days left: a new CA goes first in the bundle, the old one stays after it, and the
    # serving certificate the old CA signed (21 days left) stays in use: the API server still trusts it.
    cert = stored["tls.crt"]
    assert at(61) == ["the CA expires 2027-04-11: made a new CA"]
    ca1, kept = x509.load_pem_x509_certificates(stored["ca.crt"])
    assert [kept] == ca0 and ca1 != kept and stored["tls.crt"] == cert
    # Day 78: the next serving certificate is the new CA's.
    assert at(78) == ["the serving certificate expires 2027-03-24: made a new serving certificate"]
    x509.load_pem_x509_certificate(stored["tls.crt"]).verify_directly_issued_by(ca1)
    # Day 101: the old CA has expired and leaves the bundle.
    assert at(101) == ["dropped expired CAs from the bundle"]
    assert x509.load_pem_x509_certificates(stored["ca.crt"]) == [ca1]


def test_serving_certificate_never_outlives_its_ca() -> None:
    life = Lifetimes(ca=100 * DAY, ca_renew=10 * DAY, cert=365 * DAY, cert_renew=5 * DAY)
    material = plan({}, NAMES, T0, life).material
    assert serving(material).not_valid_after_utc == bundle(material)[0].not_valid_after_utc


# ---- stores and the manager, on the fake API server ------------------------------------------------

@pytest.fixture
def core(fake_api) -> client.CoreV1Api:
    return fake_api.core_v1()


def secret_data(fake_api, name: str = "webhook-tls") -> dict[str, bytes]:
    secret = fake_api.get("secrets", f"vcuda-system/{name}")
    assert secret is not None
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


class Clock:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


def manager(core: client.CoreV1Api, clock: Clock, **kw: Any) -> CertManager:
    return CertManager(SecretStore(core, "vcuda-system", "webhook-tls"), NAMES, clock=clock, **kw)


def test_made_once_and_reused_across_restarts(fake_api, core) -> None:
    clock = Clock(T0)
    loaded: list[certs.Material] = []
    first = manager(core, clock, on_material=loaded.append).check()
    stored = secret_data(fake_api)
    assert stored == first.entries() and loaded == [first]
    secret = fake_api.get("secrets", "vcuda-system/webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    writes = sum(r.method in ("POST", "PUT") for r in fake_api.requests)
    # a restart: a new manager, the same Secret -> the same certificate, nothing written
    clock.now = T0 + 100 * DAY
    assert manager(core, clock).check() == first
    assert sum(r.method in ("POST", "PUT") for r in fake_api.requests) == writes


def test_rotation_near_expiry_rewrites_the_secret_and_reloads(fake_api, core) -> None:
    clock = Clock(T0)
    loaded: list[certs.Material] = []
    m = manager(core, clock, on_material=loaded.append)
    first = m.check()
    version = fake_api.get("secrets", "vcuda-system/webhook-tls")["metadata"]["resourceVersion"]
    clock.now = T0 + 340 * DAY
    second = m.check()
    assert second.cert != first.cert and second.ca_bundle == first.ca_bundle
    assert secret_data(fake_api) == second.entries() and loaded == [first, second]
    assert fake_api.get("secrets", "vcuda-system/webhook-tls")["metadata"]["resourceVersion"] != version
    assert serving(second).not_valid_after_utc == clock.now + 365 * DAY


def test_a_secret_made_by_the_chart_keeps_its_type_and_labels(fake_api, core) -> None:
    fake_api.put("secrets", {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                             "metadata": {"name": "webhook-tls", "namespace": "vcuda-system",
                                          "labels": {"app": "vcuda"}}, "data": {"other": "eA=="}})
    material = manager(core, Clock(T0)).check()
    secret = fake_api.get("secrets", "vcuda-system/webhook-tls")
    assert secret["type"] == "Opaque" and secret["metadata"]["labels"] == {"app": "vcuda"}
    assert secret["data"]["other"] == "eA==" and secret_data(fake_api)["tls.crt"] == material.cert


def test_create_race_between_replicas_ends_with_one_certificate(fake_api, core) -> None:
    """Two replicas start at once on an empty namespace: both plan, one create wins (409 for the
    other), the loser reads again and adopts the winner's material."""
    barrier = threading.Barrier(2)

    class RacingStore(SecretStore):
        def load(self) -> tuple[dict[str, bytes], str | None]:
            found = super().load()
            if found[1] is None:
                barrier.wait(timeout=10)   # both have seen "absent" before either creates
            return found

    results: list[certs.Material] = []
    replicas = [CertManager(RacingStore(core, "vcuda-system", "webhook-tls"), NAMES, clock=Clock(T0),
                            on_material=results.append) for _ in range(2)]
    threads = [threading.Thread(target=r.check) for r in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 2 and results[0] == results[1] == CertManager.check(replicas[0])
    assert sum(r.method == "POST" and r.path.endswith("/secrets") for r in fake_api.requests) == 2
    assert secret_data(fake_api) == results[0].entries()


def test_a_stale_replace_is_refused_and_retried(fake_api, core) -> None:
    store = SecretStore(core, "vcuda-system", "webhook-tls")
    CertManager(store, NAMES, clock=Clock(T0)).check()
    entries, version = store.load()
    store.save(entries, version)   # another writer moves the version on
    with pytest.raises(Conflict):
        store.save(entries, version)


def test_store_errors_name_the_secret(fake_api, core) -> None:
    fake_api.fail_requests = 1
    with pytest.raises(StoreError, match="Secret vcuda-system/webhook-tls.*503"):
        manager(core, Clock(T0)).check()


def webhook_config(fake_api, ca_bundles: list[str | None]) -> None:
    hooks = []
    for i, ca in enumerate(ca_bundles):
        cfg: dict[str, Any] = {"service": {"name": "vcuda-webhook", "namespace": "vcuda-system",
                                           "path": "/mutate-pods"}}
        if ca is not None:
            cfg["caBundle"] = ca
        hooks.append({"name": f"pods{i}.vcuda.io", "clientConfig": cfg, "sideEffects": "NoneOnDryRun",
                      "admissionReviewVersions": ["v1"]})
    fake_api.put("mutatingwebhookconfigurations", {"apiVersion": "admissionregistration.k8s.io/v1",
                                                   "kind": "MutatingWebhookConfiguration",
                                                   "metadata": {"name": CONFIG}, "webhooks": hooks})


def ca_bundles(fake_api) -> list[str | None]:
    config = fake_api.get("mutatingwebhookconfigurations", CONFIG)
    return [w["clientConfig"].get("caBundle") for w in config["webhooks"]]


def test_ca_bundle_patched_when_it_differs_and_after_someone_blanks_it(fake_api, core) -> None:
    webhook_config(fake_api, [None, ""])
    patcher = CaBundlePatcher(client.AdmissionregistrationV1Api(core.api_client), CONFIG)
    m = manager(core, Clock(T0), patcher=patcher)
    material = m.check()
    want = base64.b64encode(material.ca_bundle).decode()
    assert ca_bundles(fake_api) == [want, want]
    patches = [r for r in fake_api.requests if r.method == "PATCH" and "mutatingwebhook" in r.path]
    assert len(patches) == 1 and patches[0].content_type == "application/json-patch+json"
    m.check()   # already right: no write
    assert len([r for r in fake_api.requests if r.method == "PATCH" and "mutatingwebhook" in r.path]) == 1
    webhook_config(fake_api, [want, ""])   # helm upgrade blanked one
    m.check()
    assert ca_bundles(fake_api) == [want, want]


def test_a_changed_webhook_configuration_is_not_overwritten(fake_api, core) -> None:
    """Between the read and the patch someone edits the object: the patch is refused, nothing is lost."""
    webhook_config(fake_api, [None])
    admission = client.AdmissionregistrationV1Api(core.api_client)
    real_read = admission.read_mutating_webhook_configuration

    def read_then_edit(*args: Any, **kw: Any) -> Any:
        resp = real_read(*args, **kw)
        webhook_config(fake_api, [None, None])   # a second webhook, a new resourceVersion
        return resp

    admission.read_mutating_webhook_configuration = read_then_edit
    with pytest.raises(StoreError, match="422"):
        manager(core, Clock(T0), patcher=CaBundlePatcher(admission, CONFIG)).check()
    assert ca_bundles(fake_api) == [None, None]


def test_ca_bundle_follows_a_ca_rotation(fake_api, core) -> None:
    webhook_config(fake_api, [None])
    clock = Clock(T0)
    patcher = CaBundlePatcher(client.AdmissionregistrationV1Api(core.api_client), CONFIG)
    m = manager(core, clock, patcher=patcher)
    first = m.check()
    clock.now = T0 + 3300 * DAY
    second = m.check()
    assert len(bundle(second)) == 2 and bundle(second)[1] == bundle(first)[0]
    assert base64.b64decode(ca_bundles(fake_api)[0]) == second.ca_bundle


def test_a_missing_webhook_configuration_still_serves_the_material(fake_api, core) -> None:
    loaded: list[certs.Material] = []
    patcher = CaBundlePatcher(client.AdmissionregistrationV1Api(core.api_client), "absent")
    m = manager(core, Clock(T0), patcher=patcher, on_material=loaded.append)
    with pytest.raises(StoreError, match="MutatingWebhookConfiguration absent: 404"):
        m.check()
    assert m.material is not None and loaded == [m.material]


def test_dir_store_made_once_and_reused(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "certs")
    first = CertManager(store, NAMES, clock=Clock(T0)).check()
    assert (tmp_path / "certs" / "tls.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "certs" / "ca.crt").read_bytes() == first.ca_bundle
    assert CertManager(DirStore(tmp_path / "certs"), NAMES, clock=Clock(T0 + DAY)).check() == first
    entries, version = store.load()
    (tmp_path / "certs" / "tls.crt").write_bytes(b"changed")
    with pytest.raises(Conflict):
        store.save(entries, version)


def test_a_replica_adopts_the_rotation_another_replica_wrote(fake_api, core) -> None:
    clock = Clock(T0)
    a_loaded: list[certs.Material] = []
    b_loaded: list[certs.Material] = []
    a = manager(core, clock, on_material=a_loaded.append)
    b = manager(core, clock, on_material=b_loaded.append)
    assert a.check() == b.check()
    clock.now = T0 + 340 * DAY
    rotated = a.check()
    writes = sum(r.method in ("POST", "PUT") for r in fake_api.requests)
    assert b.check() == rotated and b_loaded == a_loaded == [a_loaded[0], rotated]
    assert sum(r.method in ("POST", "PUT") for r in fake_api.requests) == writes   # b wrote nothing
