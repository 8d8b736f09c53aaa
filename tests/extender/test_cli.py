"""`python -m scheduler_extender`: flags, and a real start/serve/stop against the fake API."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kube_contract.testing import node_json, topology
from scheduler_extender import cli

REPO = Path(__file__).resolve().parents[2]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_and_env(monkeypatch) -> None:
    args = parse()
    assert args.listen == ":8888" and args.default_policy == "binpack"
    assert args.resource_domain == "tencent.com" and args.annotation_prefix == "vcuda.io"
    monkeypatch.setenv("VCUDA_RESOURCE_DOMAIN", "example.com")
    monkeypatch.setenv("VCUDA_DEFAULT_POLICY", "spread")
    args = parse("--resource-domain", "flag.example")  # flag beats env
    assert args.resource_domain == "flag.example" and args.default_policy == "spread"


def test_bad_config_exits_2(capsys) -> None:
    assert cli.run(parse("--listen", ":x")) == 2
    assert "port 'x' is not a number" in capsys.readouterr().err
    assert cli.run(parse("--annotation-prefix", "a/b")) == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serves_and_stops_on_sigterm(fake_api, tmp_path: Path) -> None:
    fake_api.put("nodes", node_json("gpu-a", topology("gpu-a", 1)))
    kubeconfig = fake_api.kubeconfig(tmp_path / "config")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "scheduler_extender", "--listen",
                             f"127.0.0.1:{port}", "--kubeconfig", str(kubeconfig),
                             "--watch-timeout", "1"], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "extender never became ready"
            time.sleep(0.05)
        body = json.dumps({"Pod": {"metadata": {"name": "p", "namespace": "d", "uid": "u"},
                                   "spec": {"containers": [{"name": "c", "resources": {
                                       "limits": {"tencent.com/vcuda-core": "50"}}}]}},
                           "NodeNames": ["gpu-a"]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/filter", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.loads(r.read())["NodeNames"] == ["gpu-a"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
