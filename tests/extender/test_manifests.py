"""The extender's objects, as the Helm chart renders them, agree with the code's names and verbs
(the scheduler configuration and webhook objects: tests/deploy/test_chart.py)."""

from __future__ import annotations

import argparse

from helm_chart import config_map_file, find, render

from kube_contract.names import Names
from scheduler_extender import cli


def test_scheduler_config_extender_entry() -> None:
    cfg = config_map_file(render(), "-scheduler-config", "config.yaml")
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    (ext,) = cfg["extenders"]
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == (
        "filter", "prioritize", "bind")
    assert ext["nodeCacheCapable"] is True
    names = Names()
    assert {r["name"] for r in ext["managedResources"]} == {names.core_resource,
                                                            names.memory_resource}


def test_rbac_allows_what_the_extender_calls() -> None:
    docs = render()
    rules = find(docs, "ClusterRole", "-extender")["rules"]
    granted = {(res, verb) for r in rules for res in r["resources"] for verb in r["verbs"]}
    for need in [("nodes", "list"), ("nodes", "watch"), ("pods", "list"), ("pods", "watch"),
                 ("pods", "get"), ("pods", "patch"), ("pods/binding", "create")]:
        assert need in granted
    deploy = find(docs, "Deployment", "-extender")
    spec = deploy["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == find(docs, "ServiceAccount", "-extender")["metadata"]["name"]
    assert spec["containers"][0]["command"][:2] == ["vcuda", "extender"]


def test_environment_and_listen_address_reach_the_extenders_parser(monkeypatch) -> None:
    (c,) = find(render("vgpu-only-renamed"), "Deployment", "-extender")["spec"]["template"]["spec"]["containers"]
    for e in c["env"]:
        monkeypatch.setenv(e["name"], e["value"])
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    known = {f for a in parser._actions for f in a.option_strings}
    args = parser.parse_args([a for a in c["args"] if a.split("=", 1)[0] in known])
    assert (args.listen, args.resource_domain, args.annotation_prefix, args.default_policy) == (
        ":8888", "example.com", "gpu.example.com", "binpack")
    (port,) = find(render(), "Service", "-extender")["spec"]["ports"]
    assert args.listen == f":{port['port']}"
