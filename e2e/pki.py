"""Certificates of the e2e cluster, made by us (Python `cryptography`): one CA, the API server's
serving certificate, client certificates per component, the kubelet's serving certificate and the
service-account signing key. Kept across `up`s of one version (made once, reused)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID = datetime.timedelta(days=3650)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                      *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs)])


class PKI:
    def __init__(self, directory: Path):
        self.dir = directory

    def path(self, name: str, ext: str = "crt") -> Path:
        return self.dir / f"{name}.{ext}"

    def _load_ca(self):
        cert = x509.load_pem_x509_certificate(self.path("ca").read_bytes())
        key = serialization.load_pem_private_key(self.path("ca", "key").read_bytes(), None)
        return cert, key

    def ensure(self, node: str, node_ip: str, api_service_ip: str) -> None:
        """Every certificate the cluster needs; those already made are kept."""
        self.dir.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
        if not self.path("ca").exists():
            key = ec.generate_private_key(ec.SECP256R1())
            cert = (x509.CertificateBuilder().subject_name(_name("vcuda-e2e-ca")).issuer_name(_name("vcuda-e2e-ca"))
                    .public_key(key.public_key()).serial_number(x509.random_serial_number())
                    .not_valid_before(now).not_valid_after(now + VALID)
                    .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                    .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                 content_commitment=False, key_encipherment=False,
                                                 data_encipherment=False, key_agreement=False,
                                                 encipher_only=False, decipher_only=False), critical=True)
                    .sign(key, hashes.SHA256()))
            self.path("ca", "key").write_bytes(_key_pem(key))
            self.path("ca").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        ca_cert, ca_key = self._load_ca()
        api_sans = ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local", "localhost", node_ip, "127.0.0.1", api_service_ip]
        leaves = {
            # name: (CN, O, SANs, server?, client?)
            "apiserver": ("kube-apiserver", (), api_sans, True, False),
            "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", ("system:masters",), [], False, True),
            "admin": ("kubernetes-admin", ("system:masters",), [], False, True),
            "controller-manager": ("system:kube-controller-manager", (), [], False, True),
            "scheduler": ("system:kube-scheduler", (), [], False, True),
            "kube-proxy": ("system:kube-proxy", (), [], False, True),
            "kubelet-client": (f"system:node:{node}", ("system:nodes",), [], False, True),
            "kubelet": (node, (), [node, "localhost", node_ip, "127.0.0.1"], True, False),
        }
        for name, (cn, orgs, sans, server, client) in leaves.items():
            if self.path(name).exists():
                continue
            key = ec.generate_private_key(ec.SECP256R1())
            usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + \
                ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
            builder = (x509.CertificateBuilder().subject_name(_name(cn, orgs)).issuer_name(ca_cert.subject)
                       .public_key(key.public_key()).serial_number(x509.random_serial_number())
                       .not_valid_before(now).not_valid_after(now + VALID)
                       .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                       .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
            if sans:
                alt = []
                for s in sans:
                    try:
                        alt.append(x509.IPAddress(ipaddress.ip_address(s)))
                    except ValueError:
                        alt.append(x509.DNSName(s))
                builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
            cert = builder.sign(ca_key, hashes.SHA256())
            self.path(name, "key").write_bytes(_key_pem(key))
            self.path(name).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        if not self.path("sa", "key").exists():
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            self.path("sa", "key").write_bytes(_key_pem(key))
            self.path("sa", "pub").write_bytes(key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        for f in self.dir.glob("*.key"):
            f.chmod(0o600)
