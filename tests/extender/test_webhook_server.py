"""The webhook over real HTTPS: answers with the CA from its Secret, refuses bad requests clearly and
keeps serving, reloads a rotated certificate without a restart, and posts Events for pods it leaves
alone (none on a dry run). Last, `vcuda extender --webhook-listen ...` end to end against the fake API."""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_contract.events import EventRecorder
from scheduler_extender import cli
from scheduler_extender.webhook import certs
from scheduler_extender.webhook.mutate import API_VERSION, Notice, Rules
from scheduler_extender.webhook.notify import Notifier
from scheduler_extender.webhook.rotation import CertManager
from scheduler_extender.webhook.server import MAX_BODY, TlsContext, WebhookServer
from scheduler_extender.webhook.stores import SecretStore

REPO = Path(__file__).resolve().parents[2]
HOST = "vcuda-webhook.vcuda-system.svc"
NAMES = certs.hosts("vcuda-webhook", "vcuda-system")
RULES = Rules(frozenset({"tencent.com/vcuda-core", "tencent.com/vcuda-memory"}), "vcuda-scheduler")


def review(scheduler: str | None = None, dry_run: bool = False, name: str = "trainer") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x", "resources": {
        "limits": {"tencent.com/vcuda-core": "30"}}}]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "request": {
        "uid": "3f1c-uid", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "team", "operation": "CREATE",
        "dryRun": dry_run, "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}}}


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    return context


def connect(port: int, ca_pem: bytes) -> http.client.HTTPConnection:
    """An HTTPS connection to 127.0.0.1 that verifies the certificate for the Service's name."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.sock = client_context(ca_pem).wrap_socket(sock, server_hostname=HOST)
    return conn


def call(conn: http.client.HTTPConnection, body: Any, *, method: str = "POST", path: str = "/mutate-pods?timeout=10s",
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


class Server:
    def __init__(self, material: certs.Material, notify: Callable[[Notice], None] = lambda n: None) -> None:
        self.tls = TlsContext()
        self.tls.load(material)
        self.httpd = WebhookServer(("127.0.0.1", 0), self.tls, RULES, notify)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served(fake_api) -> Iterator[tuple[Server, certs.Material, list[Notice]]]:
    """The webhook's material made into the fake API's Secret, and a server on it."""
    material = CertManager(SecretStore(fake_api.core_v1(), "vcuda-system", "webhook-tls"), NAMES).check()
    notices: list[Notice] = []
    server = Server(material, notices.append)
    yield server, material, notices
    server.close()


def secret_ca(fake_api) -> bytes:
    return base64.b64decode(fake_api.get("secrets", "vcuda-system/webhook-tls")["data"]["ca.crt"])


def test_answers_an_admission_review_with_the_ca_from_the_secret(fake_api, served) -> None:
    server, _, notices = served
    conn = connect(server.port, secret_ca(fake_api))
    status, answer = call(conn, review())
    assert status == 200 and answer["apiVersion"] == API_VERSION and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "3f1c-uid" and response["allowed"] is True
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/spec/schedulerName", "value": "vcuda-scheduler"}]
    status, answer = call(conn, review("vcuda-scheduler"))   # the same kept-alive connection
    assert status == 200 and "patch" not in answer["response"] and notices == []


def test_another_scheduler_gets_a_warning_and_a_notice_but_not_on_a_dry_run(fake_api, served) -> None:
    server, material, notices = served
    conn = connect(server.port, material.ca_bundle)
    status, answer = call(conn, review("volcano", dry_run=True))
    assert status == 200 and answer["response"]["warnings"] and notices == []
    status, answer = call(conn, review("volcano"))
    assert status == 200 and "'volcano'" in answer["response"]["warnings"][0]
    assert [(n.namespace, n.name, n.scheduler) for n in notices] == [("team", "trainer", "volcano")]


BAD = [
    # (description, method, path, content type, body, status, said)
    ("not JSON", "POST", "/mutate-pods", "application/json", b"{oops", 400, "not JSON"),
    ("a v1beta1 review", "POST", "/mutate-pods", "application/json",
     json.dumps(review() | {"apiVersion": "admission.k8s.io/v1beta1"}).encode(), 400, "admissionReviewVersions"),
    ("no uid", "POST", "/mutate-pods", "application/json",
     json.dumps({"apiVersion": API_VERSION, "kind": "AdmissionReview", "request": {}}).encode(), 400, "no uid"),
    ("wrong path", "POST", "/validate", "application/json", b"{}", 404, "/mutate-pods"),
    ("GET", "GET", "/mutate-pods", "application/json", b"", 405, "POST an AdmissionReview"),
    ("text/plain", "POST", "/mutate-pods", "text/plain", b"{}", 415, "application/json"),
]


@pytest.mark.parametrize(("method", "path", "ctype", "body", "code", "said"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
def test_bad_requests_get_a_status_and_the_server_keeps_serving(served, method: str, path: str, ctype: str,
                                                                 body: bytes, code: int, said: str) -> None:
    server, material, _ = served
    conn = connect(server.port, material.ca_bundle)
    conn.request(method, path, body=body, headers={"Content-Type": ctype})
    resp = conn.getresponse()
    status = json.loads(resp.read())
    assert resp.status == code and status["kind"] == "Status" and status["code"] == code
    assert said in status["message"]
    assert call(connect(server.port, material.ca_bundle), review())[0] == 200


def raw_tls(port: int, material: certs.Material, head: bytes) -> bytes:
    sock = client_context(material.ca_bundle).wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                                           server_hostname=HOST)
    with sock:
        sock.sendall(head)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def test_oversized_and_unsized_bodies_are_refused_without_reading_them(served) -> None:
    server, material, _ = served
    big = raw_tls(server.port, material, b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1))
    assert big.startswith(b"HTTP/1.1 413") and b"over the limit" in big
    unsized = raw_tls(server.port, material, b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert unsized.startswith(b"HTTP/1.1 411")
    garbage = raw_tls(server.port, material, b"NONSENSE\r\n\r\n")   # http.server's own 400 page
    assert b"400 - Bad request syntax" in garbage
    assert call(connect(server.port, material.ca_bundle), review())[0] == 200


def test_plain_http_stalled_and_untrusting_clients_do_not_stop_it(served) -> None:
    server, material, _ = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as plain:
        plain.sendall(b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\n\r\n")
        plain.recv(100)   # the server ends the failed handshake
    stalled = socket.create_connection(("127.0.0.1", server.port), timeout=10)   # says nothing
    other = certs.plan({}, NAMES, certs.dt.datetime.now(certs.dt.UTC)).material
    with pytest.raises(ssl.SSLCertVerificationError):
        connect(server.port, other.ca_bundle)
    try:
        assert call(connect(server.port, material.ca_bundle), review())[0] == 200
    finally:
        stalled.close()


def test_a_rotated_certificate_is_served_without_a_restart(served) -> None:
    server, material, _ = served
    kept_alive = connect(server.port, material.ca_bundle)
    assert call(kept_alive, review())[0] == 200
    rotated = certs.plan({}, NAMES, certs.dt.datetime.now(certs.dt.UTC)).material   # a new CA too
    server.tls.load(rotated)
    assert call(connect(server.port, rotated.ca_bundle), review())[0] == 200
    with pytest.raises(ssl.SSLCertVerificationError):
        connect(server.port, material.ca_bundle)
    assert call(kept_alive, review())[0] == 200   # an open connection finishes on the old certificate


# ---- Events --------------------------------------------------------------------------------------

def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)
    return found


def events(fake_api) -> list[dict[str, Any]]:
    with fake_api.lock:
        return [dict(e) for e in fake_api.objects["events"].values()]


def notice(name: str = "", generate_name: str = "", owner: dict[str, Any] | None = None) -> Notice:
    return Notice("team", name, generate_name, owner, "volcano", "asks for tencent.com/vcuda-core but names ...")


@pytest.fixture
def notifier(fake_api) -> Iterator[Notifier]:
    core = fake_api.core_v1()
    n = Notifier(core, EventRecorder(core, component="vcuda-webhook", host="test"), tries=200, retry_s=0.02)
    yield n
    n.stop()


def test_event_on_a_named_pod_once_it_exists(fake_api, notifier) -> None:
    notifier.notify(notice(name="trainer"))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer", "namespace": "team", "uid": "pod-7"},
           "spec": {"schedulerName": "volcano", "containers": []}}
    fake_api.put("pods", pod)   # the API server stores the pod after admission
    [event] = wait_for(lambda: events(fake_api), "the Event")
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team", "name": "trainer",
                                       "uid": "pod-7"}
    assert event["reason"] == "NotVcudaScheduled" and event["type"] == "Warning"
    assert event["message"].startswith("The pod asks for tencent.com/vcuda-core")


def test_event_on_the_controller_once_per_controller(fake_api, notifier) -> None:
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f", "uid": "rs-1", "controller": True}
    notifier.notify(notice(generate_name="web-5d8f-", owner=owner))
    notifier.notify(notice(generate_name="web-5d8f-", owner=owner))
    notifier.notify(notice(name="marker"))   # queued after both: once its read-back is tried, they are done
    fake_api.put("pods", {"apiVersion": "v1", "kind": "Pod", "spec": {"schedulerName": "volcano"},
                          "metadata": {"name": "marker", "namespace": "team", "uid": "m"}})
    wait_for(lambda: len(events(fake_api)) == 2, "two Events")
    on_rs = [e for e in events(fake_api) if e["involvedObject"]["kind"] == "ReplicaSet"]
    assert len(on_rs) == 1
    assert on_rs[0]["involvedObject"] == {"apiVersion": "apps/v1", "kind": "ReplicaSet", "namespace": "team",
                                          "name": "web-5d8f", "uid": "rs-1"}
    assert on_rs[0]["message"].startswith("Its pod web-5d8f-* asks for")


def test_no_event_for_a_pod_that_never_appears_or_has_no_name(fake_api) -> None:
    core = fake_api.core_v1()
    n = Notifier(core, EventRecorder(core, component="vcuda-webhook", host="test"), tries=3, retry_s=0.01)
    n.notify(notice(generate_name="lonely-"))
    n.notify(notice(name="refused"))

    def reads() -> int:
        with fake_api.lock:
            return sum(r.method == "GET" and r.path.startswith("/api/v1/namespaces/team/pods/refused")
                       for r in fake_api.requests)

    wait_for(lambda: reads() == 3, "three tries")
    n.stop()   # posts whatever Event was queued
    assert events(fake_api) == [] and reads() == 3


# ---- the command -----------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_extender(fake_api, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    argv = [sys.executable, "-m", "scheduler_extender", "--listen", f"127.0.0.1:{free_port()}",
            "--kubeconfig", str(fake_api.kubeconfig(tmp_path / "config")), "--watch-timeout", "1",
            "--webhook-listen", f"127.0.0.1:{port}", "--webhook-service", "vcuda-webhook.vcuda-system",
            "--webhook-tls-secret", "vcuda-system/webhook-tls", "--webhook-configuration", "vcuda-webhook",
            "--scheduler-name", "vcuda-scheduler", *extra]
    proc = subprocess.Popen(argv, env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, port


def answer_from(port: int, ca: bytes, body: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return call(connect(port, ca), body)[1]
    except OSError:
        return None


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, proc.stdout.read().decode() if proc.stdout else ""


def test_the_command_serves_the_webhook_and_reuses_its_secret(fake_api, tmp_path: Path) -> None:
    fake_api.put("mutatingwebhookconfigurations", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "vcuda-webhook"},
        "webhooks": [{"name": "pods.vcuda.io", "clientConfig": {"service": {"name": "vcuda-webhook",
                                                                             "namespace": "vcuda-system"}}}]})
    proc, port = start_extender(fake_api, tmp_path, "--webhook-resources", "nvidia.com/gpu")
    try:
        wait_for(lambda: fake_api.get("secrets", "vcuda-system/webhook-tls") or proc.poll() is not None, "the Secret")
        ca = secret_ca(fake_api)
        gpu = review()
        gpu["request"]["object"]["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
        answer = wait_for(lambda: answer_from(port, ca, gpu) or proc.poll() is not None, "an answer")
        assert isinstance(answer, dict), proc.stdout.read().decode() if proc.stdout else ""
        assert "patch" in answer["response"]
        assert "patch" not in call(connect(port, ca), review())[1]["response"]   # vcuda-core is not listed here
        config = fake_api.get("mutatingwebhookconfigurations", "vcuda-webhook")
        assert base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"]) == ca
        stop(proc)
        cert = fake_api.get("secrets", "vcuda-system/webhook-tls")["data"]["tls.crt"]
        proc, port = start_extender(fake_api, tmp_path)   # a restart: the same Secret, the same certificate
        answer = wait_for(lambda: answer_from(port, ca, review()) or proc.poll() is not None, "an answer")
        assert isinstance(answer, dict) and "patch" in answer["response"]
        assert fake_api.get("secrets", "vcuda-system/webhook-tls")["data"]["tls.crt"] == cert
        stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("flags", "said"), [
    (["--webhook-service", "novice"], "<service>.<namespace>"),
    (["--webhook-tls-secret", "just-a-name"], "<namespace>/<name>"),
    (["--webhook-cert-dir", "/tmp/x"], "one of --webhook-tls-secret and --webhook-cert-dir"),
    (["--webhook-resources", "gpu"], "domain/name"),
    (["--webhook-listen", ":https"], "--webhook-listen"),
])
def test_bad_webhook_flags_exit_2(flags: list[str], said: str, capsys) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    base = {"--webhook-listen": ":9443", "--webhook-service": "svc.ns", "--webhook-tls-secret": "ns/tls"}
    base.update(dict(zip(flags[::2], flags[1::2], strict=True)))
    assert cli.run(parser.parse_args([x for kv in base.items() for x in kv])) == 2
    assert said in capsys.readouterr().err
