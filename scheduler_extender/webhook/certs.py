"""The webhook's TLS material, pure: from what a store holds (or nothing) and the time, what it must hold.

Four PEM entries (the Secret's keys, or files in ``--webhook-cert-dir``):

- ``ca.crt``  the CA bundle the API server trusts (the MutatingWebhookConfiguration's caBundle):
              the current CA first, then earlier CAs until they expire;
- ``ca.key``  the current CA's key, to sign the next serving certificate;
- ``tls.crt`` / ``tls.key`` the serving certificate (for the Service's DNS names) and its key.

Rules (`plan`): a CA lives `Lifetimes.ca` (10 years) and is replaced when less than
`Lifetimes.ca_renew` (1 year) is left; the replaced CA stays in the bundle until it expires, so a
serving certificate it signed stays trusted. The serving certificate lives `Lifetimes.cert` (1 year,
never past its CA) and is replaced when less than `Lifetimes.cert_renew` (30 days) is left, when it
lacks a DNS name, or when no CA in the bundle signed it. Keys are ECDSA P-256.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")
DAY = dt.timedelta(days=1)


@dataclass(frozen=True)
class Lifetimes:
    ca: dt.timedelta = 3650 * DAY
    ca_renew: dt.timedelta = 365 * DAY
    cert: dt.timedelta = 365 * DAY
    cert_renew: dt.timedelta = 30 * DAY


DEFAULT_LIFETIMES = Lifetimes()


@dataclass(frozen=True)
class Material:
    ca_bundle: bytes
    ca_key: bytes
    cert: bytes
    key: bytes

    def entries(self) -> dict[str, bytes]:
        return dict(zip(KEYS, (self.ca_bundle, self.ca_key, self.cert, self.key), strict=True))


@dataclass
class Plan:
    material: Material
    changes: list[str] = field(default_factory=list)   # what was made anew and why; empty: keep as stored


def hosts(service: str, namespace: str) -> tuple[str, ...]:
    """The DNS names the API server may use for ``<service>.<namespace>``."""
    return (service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local")


def plan(stored: dict[str, bytes], names: tuple[str, ...], now: dt.datetime,
         life: Lifetimes = DEFAULT_LIFETIMES) -> Plan:
    """What the store must hold at `now`: the stored material where it is still good, new parts where not."""
    changes: list[str] = []
    bundle = [c for c in _certs(stored.get("ca.crt", b"")) if c.not_valid_after_utc > now]
    ca_key = _key(stored.get("ca.key", b""))
    current = bundle[0] if bundle and ca_key is not None and _is_ca(bundle[0]) and \
        bundle[0].public_key() == ca_key.public_key() else None
    if current is None:
        changes.append("no usable CA (certificate and key)")
    elif current.not_valid_after_utc - now < life.ca_renew:
        changes.append(f"the CA expires {current.not_valid_after_utc:%Y-%m-%d}")
        current = None
    if current is None or ca_key is None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        current = _ca_cert(ca_key, now, life.ca)
        changes[-1] += ": made a new CA"
    bundle = _dedupe([current, *bundle])

    cert = next(iter(_certs(stored.get("tls.crt", b""))), None)
    key = _key(stored.get("tls.key", b""))
    why = _serving_problem(cert, key, bundle, names, now, life)
    if why:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _serving_cert(key, current, ca_key, names, now, life.cert)
        changes.append(f"{why}: made a new serving certificate")
    assert cert is not None and key is not None
    material = Material(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in bundle),
                        _pem_key(ca_key), cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))
    if not changes and material.entries() != {k: stored.get(k) for k in KEYS}:
        changes.append("dropped expired CAs from the bundle")
    return Plan(material, changes)


def expiry(pem: bytes) -> dt.datetime | None:
    """notAfter of the first certificate in `pem`."""
    certs = _certs(pem)
    return certs[0].not_valid_after_utc if certs else None


# ---- checks ---------------------------------------------------------------------------------------

def _serving_problem(cert: x509.Certificate | None, key: ec.EllipticCurvePrivateKey | None,
                     bundle: list[x509.Certificate], names: tuple[str, ...], now: dt.datetime,
                     life: Lifetimes) -> str:
    if cert is None or key is None:
        return "no serving certificate and key"
    if cert.public_key() != key.public_key():
        return "the serving key does not match its certificate"
    if cert.not_valid_before_utc > now:
        return "the serving certificate is not valid yet"
    if cert.not_valid_after_utc - now < life.cert_renew:
        return f"the serving certificate expires {cert.not_valid_after_utc:%Y-%m-%d}"
    try:
        sans = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                   .get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        sans = set()
    if missing := [n for n in names if n not in sans]:
        return f"the serving certificate lacks {', '.join(missing)}"
    if not any(_signed_by(cert, ca) for ca in bundle):
        return "no CA in the bundle signed the serving certificate"
    return ""


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


# ---- parsing and making ---------------------------------------------------------------------------

def _certs(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem) if pem else []
    except ValueError:
        return []


def _key(pem: bytes) -> ec.EllipticCurvePrivateKey | None:
    try:
        key = serialization.load_pem_private_key(pem, password=None) if pem else None
    except (ValueError, TypeError):
        return None
    return key if isinstance(key, ec.EllipticCurvePrivateKey) else None


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _dedupe(certs: list[x509.Certificate]) -> list[x509.Certificate]:
    seen: set[bytes] = set()
    out = []
    for c in certs:
        if (fp := c.fingerprint(hashes.SHA256())) not in seen:
            seen.add(fp)
            out.append(c)
    return out


def _builder(subject: str, public: ec.EllipticCurvePublicKey, issuer: x509.Name, now: dt.datetime,
             not_after: dt.datetime) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer).public_key(public).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))   # tolerate clocks a little behind ours
            .not_valid_after(not_after)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False))


def _ca_cert(key: ec.EllipticCurvePrivateKey, now: dt.datetime, lifetime: dt.timedelta) -> x509.Certificate:
    name = f"vcuda-webhook-ca-{now:%Y%m%d%H%M%S}"
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    return (_builder(name, key.public_key(), subject, now, now + lifetime)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))


def _serving_cert(key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
                  names: tuple[str, ...], now: dt.datetime, lifetime: dt.timedelta) -> x509.Certificate:
    not_after = min(now + lifetime, ca.not_valid_after_utc)
    return (_builder(names[0], key.public_key(), ca.subject, now, not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .sign(ca_key, hashes.SHA256()))
