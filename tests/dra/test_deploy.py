"""The DRA driver's objects, as the Helm chart renders them (dra.enabled=true; tests/deploy validates
them against the API schemas), and the examples under deploy/examples/dra agree with the code: the
driver's flags and defaults, host paths, driver and capacity names, the opaque config, and RBAC,
which must grant exactly the calls the driver makes (read from its code, and seen at a fake API
server)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import yaml
from helm_chart import find, render, render_args
from k8s_schema import schema_problem

from dra_driver import config, names
from dra_driver.claims import parse_claim, plan
from dra_driver.testing import NODE

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples" / "dra"
FLAGS = {"--" + o.name.replace("_", "-") for o in config.OPTIONS}


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def chart_objects() -> list[dict[str, Any]]:
    """The chart's objects for the driver (template dra-driver.yaml, dra-deviceclasses.yaml)."""
    return [d for d in render("full") if "dra-driver" in d["metadata"]["name"] or d["kind"] == "DeviceClass"]


def manifests() -> list[tuple[Path | str, dict[str, Any]]]:
    return [*(("chart", d) for d in chart_objects()), *((f, d) for f in sorted(EXAMPLES.glob("*.yaml"))
                                                        for d in load(f))]


def only(kind: str, path: Path) -> dict[str, Any]:
    (doc,) = [d for d in load(path) if d["kind"] == kind]
    return doc


def daemonset(combination: str = "full") -> dict[str, Any]:
    return find(render(combination), "DaemonSet", "-dra-driver")


def driver_container(ds: dict[str, Any]) -> dict[str, Any]:
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    return c


def test_every_manifest_fits_the_kubernetes_schema() -> None:
    docs = manifests()
    assert {d["kind"] for _, d in docs} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet",
                                            "DeviceClass", "ResourceClaimTemplate", "Pod"}
    for f, doc in docs:
        assert doc["metadata"]["name"], f
        assert schema_problem(doc) is None, f"{f}: {schema_problem(doc)}"


def test_daemonset_args_pass_the_drivers_parser_with_its_defaults() -> None:
    c = driver_container(daemonset())
    assert c["command"] == ["vcuda", "dra-driver"]
    assert all("=" in a for a in c["args"]), "write flags as --flag=value"
    assert {a.split("=", 1)[0] for a in c["args"]} <= FLAGS
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    cfg = config.from_args(parser.parse_args([a.replace("$(NODE_NAME)", "node-1") for a in c["args"]]), env={})
    defaults = {o.name: o.default for o in config.OPTIONS}
    for name in ("plugin_dir", "registry_dir", "cdi_dir", "state_dir", "host_lib_dir", "metrics_port", "mig"):
        assert getattr(cfg, name) == defaults[name], name   # the chart spells out the defaults
    assert cfg.node_name == "node-1"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    ann = daemonset()["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/port"] == str(cfg.metrics_port)
    assert {"name": "metrics", "containerPort": cfg.metrics_port} in c["ports"]


def test_chart_values_reach_the_drivers_config() -> None:
    """dra.mig and allowOptOutNamespaces, as the driver parses them."""
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    (c,) = daemonset("dra-only-dynamic-mig")["spec"]["template"]["spec"]["containers"]
    cfg = config.from_args(parser.parse_args([a.replace("$(NODE_NAME)", "node-1") for a in c["args"]]), env={})
    assert cfg.mig == config.DYNAMIC
    args = ("--set", "dra.enabled=true,allowOptOutNamespaces={ml-dev}")
    (c,) = find(render_args(*args), "DaemonSet", "-dra-driver")["spec"]["template"]["spec"]["containers"]
    cfg = config.from_args(parser.parse_args([a.replace("$(NODE_NAME)", "node-1") for a in c["args"]]), env={})
    assert cfg.allow_opt_out_namespaces == frozenset({"ml-dev"})


def test_host_paths_are_mounted_where_the_flags_point() -> None:
    ds = daemonset()
    c = driver_container(ds)
    volumes = {v["name"]: v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    for name, path in mounts.items():   # same path inside and out: the CDI specs and the kubelet use them
        assert volumes[name] == path, name
    for arg in c["args"]:
        flag, _, value = arg.partition("=")
        if flag.endswith("-dir"):
            assert value in mounts.values(), f"{flag}: {value} is not mounted"


def test_same_privileges_pid_namespace_and_init_step_as_the_vgpu_device_plugin() -> None:
    ds = daemonset()
    vgpu = find(render("full"), "DaemonSet", "-device-plugin-vgpu")
    assert ds["spec"]["template"]["spec"]["initContainers"] == vgpu["spec"]["template"]["spec"]["initContainers"]
    assert ds["spec"]["template"]["spec"]["hostPID"] is vgpu["spec"]["template"]["spec"]["hostPID"] is True
    sc = driver_container(ds)["securityContext"]
    assert not sc.get("privileged") and sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == \
        ["ALL"]
    assert sc["capabilities"]["add"] == ["KILL", "SYS_PTRACE"]   # the quota guard, as the vgpu agent's


def test_device_classes_select_the_driver() -> None:
    classes = {d["metadata"]["name"]: d for d in chart_objects() if d["kind"] == "DeviceClass"}
    assert set(classes) == {"gpu-share.vcuda.io", "gpu.vcuda.io", "mig.vcuda.io"}
    for name, cls in classes.items():
        (selector,) = cls["spec"]["selectors"]
        kind = "mig" if name == "mig.vcuda.io" else "gpu"   # the `type` attribute of dra_driver.slices
        assert selector["cel"]["expression"] == (f'device.driver == "{names.DRIVER}" && '
                                                 f'device.attributes["{names.DRIVER}"].type == "{kind}"')
    (cfg,) = classes["gpu-share.vcuda.io"]["spec"]["config"]
    from dra_driver.claims import share_config_fields

    assert cfg["opaque"]["driver"] == names.DRIVER
    share_config_fields(cfg["opaque"]["parameters"], "class config")   # the driver accepts it


def allocated(template: dict[str, Any], cores: str | None, memory: str | None) -> dict[str, Any]:
    """The claim the scheduler would make from `template` on node-1's gpu-0, with this consumed capacity."""
    spec = template["spec"]["spec"]["devices"]
    result: dict[str, Any] = {"request": spec["requests"][0]["name"], "driver": names.DRIVER, "pool": NODE,
                              "device": "gpu-0"}
    if cores is not None:
        result["consumedCapacity"] = {names.CORES: cores, names.MEMORY: memory}
    configs = [{"source": "FromClaim", **c} for c in spec.get("config", [])]
    return {"metadata": {"namespace": "default", "name": "x", "uid": "u"},
            "status": {"allocation": {"devices": {"results": [result], "config": configs}}}}


def test_example_templates_ask_for_what_their_comments_say() -> None:
    from node_state.testing import gpu
    from py_vcuda.sim import GiB

    card = gpu(0, memory=80 * GiB)
    share = only("ResourceClaimTemplate", EXAMPLES / "share-30-cores-8gi.yaml")
    (request,) = share["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu-share.vcuda.io"
    assert request["exactly"]["capacity"]["requests"] == {names.CORES: "30", names.MEMORY: "8Gi"}
    (s,) = plan(parse_claim(allocated(share, "30", "8Gi")), lambda r: card)
    assert (s.core_request, s.core_limit, s.memory_limit) == (30, 60, 8 * GiB)
    whole = only("ResourceClaimTemplate", EXAMPLES / "whole-gpu.yaml")
    (request,) = whole["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.vcuda.io" and "capacity" not in request["exactly"]
    (w,) = plan(parse_claim(allocated(whole, "100", str(80 * GiB))), lambda r: card)
    assert (w.core_request, w.memory_limit, w.fractional) == (100, None, False)
    mig = only("ResourceClaimTemplate", EXAMPLES / "mig-1g-10gb.yaml")
    (request,) = mig["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "mig.vcuda.io" and "capacity" not in request["exactly"]
    (selector,) = request["exactly"]["selectors"]
    assert selector["cel"]["expression"] == f'device.attributes["{names.DRIVER}"].profile == "1g.10gb"'
    for f in EXAMPLES.glob("*.yaml"):
        pod = only("Pod", f)
        template = only("ResourceClaimTemplate", f)
        (claim,) = pod["spec"]["resourceClaims"]
        assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
        assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": claim["name"]}]


# ---- RBAC -----------------------------------------------------------------------------------------

# `api.<verb>_<kind>(...)`: the kubernetes client calls in dra_driver/ and the Events it records.
API_CALL = re.compile(r"(?<![\w.])api\.(list|read|patch|create|delete|replace)_(\w+?)\(([^()]*)", re.S)
KINDS = {"namespaced_resource_claim": ("resource.k8s.io", "resourceclaims"),
         "resource_slice": ("resource.k8s.io", "resourceslices"),
         "node": ("", "nodes"), "namespaced_pod": ("", "pods"), "namespaced_event": ("", "events")}
VERBS = {"read": "get", "replace": "update"}


def granted() -> set[tuple[str, str, str]]:
    role = find(chart_objects(), "ClusterRole", "-dra-driver")
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def driver_api_calls() -> set[tuple[str, str, str]]:
    used = set()
    for path in [*sorted((REPO / "dra_driver").glob("*.py")), REPO / "kube_contract" / "events.py"]:
        for verb, kind, args in API_CALL.findall(path.read_text()):
            group, resource = KINDS[kind]
            used.add((group, resource, VERBS.get(verb, verb)))
            if verb == "list" and "watch=True" in args:
                used.add((group, resource, "watch"))
    return used


def test_rbac_grants_exactly_what_the_driver_calls() -> None:
    used = driver_api_calls()
    # the calls this test must find, so that a change in how the code is written cannot make it vacuous
    assert {("resource.k8s.io", "resourceclaims", "get"), ("resource.k8s.io", "resourceslices", "create")} <= used
    assert granted() == used, f"granted, not called: {granted() - used}; called, not granted: {used - granted()}"
    docs = {d["kind"]: d for d in chart_objects() if d["kind"] in ("ServiceAccount", "ClusterRoleBinding")}
    sa = docs["ServiceAccount"]["metadata"]
    (subject,) = docs["ClusterRoleBinding"]["subjects"]
    assert (subject["name"], subject["namespace"]) == (sa["name"], sa["namespace"])
    ds = daemonset()
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == sa["name"]
    assert ds["metadata"]["namespace"] == sa["namespace"]


def _request_rbac(method: str, path: str) -> tuple[str, str, str]:
    parts = path.split("?")[0].strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if rest[0] == "namespaces":
        rest = rest[2:]
    resource, named = rest[0], len(rest) > 1
    verb = {"GET": "get" if named else "list", "POST": "create", "PUT": "update", "DELETE": "delete",
            "PATCH": "patch"}[method]
    return group, resource, verb


def test_every_request_the_driver_sends_is_granted(agent_factory, kubelet, api):
    """What the driver actually sends a (fake) API server through a prepare, a health change, a
    stale slice and an unprepare: all of it within the ClusterRole."""
    from dra_driver import testing as t
    from node_state.testing import gpu, wait_for

    agent = agent_factory()
    wait_for(agent.publisher.published.is_set, 10, "the ResourceSlice")
    stale = {**api.get("resourceslices", f"{NODE}-{names.DRIVER}"), "metadata": {"name": "stale"}}
    api.put("resourceslices", stale)
    api.put("pods", {"metadata": {"name": "p", "namespace": "default", "uid": "uid-p"}, "spec": {}})
    claim = api.put("resourceclaims", t.claim("c", NODE, [t.share(NODE, 0, 30, "1Gi")], pod="p"))
    assert kubelet.prepare(claim).claims[claim["metadata"]["uid"]].error == ""
    agent.health.set(gpu(1).uuid, False, "test")
    wait_for(lambda: api.get("resourceslices", "stale") is None and
             len(api.get("resourceslices", f"{NODE}-{names.DRIVER}")["spec"]["devices"]) == 1, 10, "republish")
    kubelet.unprepare(claim)
    # A non-resource URL the default ClusterRole system:public-info-viewer grants every client.
    public = {(r.method, r.path.split("?")[0].rstrip("/")) for r in api.requests if not r.path.startswith("/api")}
    assert public == {("GET", "/version")}, public
    sent = {_request_rbac(r.method, r.path) for r in api.requests if r.path.startswith("/api")}
    assert sent <= granted(), sent - granted()
    assert {("resource.k8s.io", "resourceclaims", "get"), ("", "pods", "get"), ("", "nodes", "get"),
            ("resource.k8s.io", "resourceslices", "delete")} <= sent
