"""deploy/extender manifests parse and agree with the code's names and verbs."""

from __future__ import annotations

from pathlib import Path

import yaml

from kube_contract.names import Names

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "extender"


def load(name: str) -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / name).read_text()))


def test_scheduler_config_extender_entry() -> None:
    (cfg,) = load("scheduler-config.yaml")
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    (ext,) = cfg["extenders"]
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == (
        "filter", "prioritize", "bind")
    assert ext["nodeCacheCapable"] is True
    names = Names()
    assert {r["name"] for r in ext["managedResources"]} == {names.core_resource,
                                                            names.memory_resource}


def test_rbac_allows_what_the_extender_calls() -> None:
    docs = {d["kind"]: d for d in load("rbac.yaml")}
    rules = docs["ClusterRole"]["rules"]
    granted = {(res, verb) for r in rules for res in r["resources"] for verb in r["verbs"]}
    for need in [("nodes", "list"), ("nodes", "watch"), ("pods", "list"), ("pods", "watch"),
                 ("pods", "get"), ("pods", "patch"), ("pods/binding", "create")]:
        assert need in granted
    deploy = next(d for d in load("deployment.yaml") if d["kind"] == "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    assert spec["containers"][0]["command"][:2] == ["vcuda", "extender"]
