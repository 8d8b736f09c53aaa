"""The e2e tier's tools without a cluster: the wrapper module's inputs, the OCI archives, the PKI."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "e2e"))

import gotools  # noqa: E402
import images  # noqa: E402

KUBERNETES_GOMOD = """module k8s.io/kubernetes

go 1.26.0

require (
\tk8s.io/api v0.0.0
\tgithub.com/foo/bar v1.2.3
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tgithub.com/pinned/fork v1.0.0 => github.com/other/fork v1.0.1
)
"""

ETCD_GOMOD = """module go.etcd.io/etcd/server/v3

replace (
\tgo.etcd.io/etcd/api/v3 => ../api
\tgo.etcd.io/etcd/client/pkg/v3 => ../client/pkg
)

replace go.etcd.io/etcd => ./FORBIDDEN_DEPENDENCY
"""


def test_local_replaces_are_the_siblings_only():
    assert gotools._local_replaces(KUBERNETES_GOMOD) == ["k8s.io/api", "k8s.io/client-go"]
    assert gotools._local_replaces(ETCD_GOMOD) == ["go.etcd.io/etcd/api/v3", "go.etcd.io/etcd/client/pkg/v3",
                                                   "go.etcd.io/etcd"]


def test_sibling_versions():
    assert gotools.kubernetes("1.36.3").sibling_version("k8s.io/api") == "v0.36.3"
    assert gotools.kubernetes("v1.34.4").sibling_version("k8s.io/kubelet") == "v0.34.4"
    assert gotools.etcd("3.6.16").sibling_version("go.etcd.io/etcd/api/v3") == "v3.6.16"


def test_kubernetes_version_ldflags():
    flags = gotools.kubernetes("1.36.3").ldflags
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {pkg}.gitVersion=v1.36.3" in flags
        assert f"-X {pkg}.gitMinor=36" in flags


def test_dispatcher_knows_every_program():
    src = gotools._dispatcher(gotools.kubernetes("1.36.3"))
    for prog in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"):
        assert f'case "{prog}":\n\t\t{gotools._main_name(prog)}()' in src


def test_tools_are_cached_by_name_and_version(monkeypatch, tmp_path):
    monkeypatch.setattr(gotools, "CACHE", tmp_path)
    assert gotools.kubernetes("1.36.3").program("kubelet") == tmp_path / "kubernetes-v1.36.3" / "bin" / "kubelet"
    assert gotools.CONTAINERD.program("ctr") == tmp_path / f"containerd-{gotools.CONTAINERD.version}" / "bin" / "ctr"


def test_oci_archive_is_a_valid_layout(tmp_path):
    layer = images.Layer(files={"bin/hello": (b"#!/bin/sh\necho hi\n", 0o755)}, symlinks={"bin/hi": "hello"})
    out = images.write_archive(tmp_path / "x.tar", "vcuda.local/x:1.0", [layer], cmd=["/bin/hello"])
    with tarfile.open(out) as tar:
        names = tar.getnames()
        read = {n: tar.extractfile(n).read() for n in names}
    assert json.loads(read["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in read.items():       # every blob is named by its digest
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(read["index.json"])
    desc = index["manifests"][0]
    assert desc["annotations"]["io.containerd.image.name"] == "vcuda.local/x:1.0"
    manifest = json.loads(read["blobs/sha256/" + desc["digest"].split(":")[1]])
    config = json.loads(read["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]
    assert config["config"]["Cmd"] == ["/bin/hello"]
    layer_tar = read["blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1]]
    with tarfile.open(fileobj=io.BytesIO(layer_tar)) as lt:
        assert lt.getmember("bin/hello").mode == 0o755
        assert lt.getmember("bin/hi").linkname == "hello"
        assert lt.getmember("bin").isdir()
    # The same inputs give the same archive (digests stable across runs).
    again = images.write_archive(tmp_path / "y.tar", "vcuda.local/x:1.0", [layer], cmd=["/bin/hello"])
    assert again.read_bytes() == out.read_bytes()


def test_pki_makes_a_chain_the_cluster_accepts(tmp_path):
    pytest.importorskip("cryptography")
    from cryptography import x509
    from pki import PKI

    pki = PKI(tmp_path)
    pki.ensure("node-a", "10.250.0.1", "10.96.0.1")
    ca = x509.load_pem_x509_certificate(pki.path("ca").read_bytes())
    api = x509.load_pem_x509_certificate(pki.path("apiserver").read_bytes())
    api.verify_directly_issued_by(ca)
    sans = api.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} >= {"10.250.0.1", "10.96.0.1"}
    node = x509.load_pem_x509_certificate(pki.path("kubelet-client").read_bytes())
    assert node.subject.rfc4514_string() == "O=system:nodes,CN=system:node:node-a"
    before = pki.path("ca").read_bytes()
    pki.ensure("node-a", "10.250.0.1", "10.96.0.1")        # made once, reused
    assert pki.path("ca").read_bytes() == before
    assert oct(pki.path("ca", "key").stat().st_mode & 0o777) == "0o600"
