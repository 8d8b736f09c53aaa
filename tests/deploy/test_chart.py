"""The Helm chart deploy/helm/vcuda, the one source of every object vcuda installs: `helm lint` and
`helm template` for each documented values combination, every rendered object strictly valid for
Kubernetes 1.34 and 1.36, and what the chart promises across components (names that must agree,
files carried in whole, the scheduler, the webhook objects and their RBAC). The objects of each
component are checked against its code in tests/device_plugin, tests/dra and tests/extender."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helm_chart import (
    CHART,
    COMBINATIONS,
    KUBE_VERSIONS,
    NAMESPACE,
    PROMETHEUS_OPERATOR,
    config_map_file,
    find,
    render,
    render_args,
    run_helm,
)

from kube_contract.names import Names

# Kinds from CRDs (the Prometheus operator's): no schema in kubernetes-validate, checked by hand below.
CRD_KINDS = {"ServiceMonitor": PROMETHEUS_OPERATOR, "PrometheusRule": PROMETHEUS_OPERATOR}


def documented_combinations() -> dict[str, str]:
    """The combinations table of the chart's README: name -> the helm arguments, as written."""
    section = (CHART / "README.md").read_text().split("## Documented combinations", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w-]+)` \| `([^|`]*)` \|", section, re.M)
    return {name: args.strip() for name, args in rows}


def test_readme_documents_every_combination_the_tests_render() -> None:
    assert documented_combinations() == {name: " ".join(args) for name, args in COMBINATIONS.items()}


@pytest.mark.parametrize("combination", COMBINATIONS)
def test_helm_lint(combination: str) -> None:
    given = COMBINATIONS[combination]   # lint takes --set, not --api-versions
    args = [x for i, flag in enumerate(given) if flag == "--set" for x in (flag, given[i + 1])]
    for kube in KUBE_VERSIONS:
        out = run_helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, "--kube-version", kube, *args)
        assert out.returncode == 0, out.stdout + out.stderr


def crd_problem(doc: dict[str, Any]) -> str | None:
    """The minimal check of a Prometheus-operator object (no schema shipped for it)."""
    if doc["apiVersion"] != CRD_KINDS[doc["kind"]]:
        return f"{doc['kind']}: apiVersion {doc['apiVersion']}"
    if not doc["metadata"].get("name") or not doc["metadata"].get("namespace"):
        return f"{doc['kind']}: unnamed"
    spec = doc["spec"]
    if doc["kind"] == "ServiceMonitor":
        ok = spec["selector"]["matchLabels"] and all(e["port"] and e["honorLabels"] is True for e in spec["endpoints"])
        return None if ok else "ServiceMonitor: selector or endpoints"
    ok = all(g["name"] and all(r["alert"] and r["expr"] for r in g["rules"]) for g in spec["groups"])
    return None if ok else "PrometheusRule: groups"


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("combination", COMBINATIONS)
def test_every_rendered_object_fits_the_kubernetes_schema_strictly(combination: str, kube: str) -> None:
    docs = render(combination, kube)
    assert docs
    operator = PROMETHEUS_OPERATOR in COMBINATIONS[combination]
    for doc in docs:
        where = f"{doc['kind']} {doc['metadata'].get('name')}"
        if doc["kind"] in CRD_KINDS:
            assert operator, f"{where}: rendered without --api-versions {PROMETHEUS_OPERATOR}"
            assert crd_problem(doc) is None, crd_problem(doc)
            continue
        try:
            kubernetes_validate.validate(doc, kube, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where} (Kubernetes {kube}): {exc}")
        namespaced = doc["kind"] not in {"ClusterRole", "ClusterRoleBinding", "DeviceClass",
                                         "MutatingWebhookConfiguration"}
        assert ("namespace" in doc["metadata"]) == namespaced, where
    names = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "two objects with one name"


def test_objects_live_in_the_release_namespace_but_the_few_that_cannot() -> None:
    elsewhere = {(d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]) for d in render("full")
                 if d["metadata"].get("namespace", NAMESPACE) != NAMESPACE}
    assert elsewhere == {
        ("ConfigMap", "kube-public", "cf-crl-gpu-manager-vcuda-core"),     # the Alauda platform's convention
        ("ConfigMap", "kube-public", "cf-crl-gpu-manager-vcuda-memory"),
        ("RoleBinding", "kube-system", "vcuda-scheduler-authentication-reader"),   # where that Role lives
    }


def kinds(docs: list[dict[str, Any]]) -> set[str]:
    return {d["kind"] for d in docs}


def test_optional_objects_follow_their_values() -> None:
    assert {"ServiceMonitor", "PrometheusRule"} & kinds(render("default")) == set()
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds(render("prometheus-operator"))
    assert "DeviceClass" not in kinds(render("default")) and "DeviceClass" in kinds(render("dra"))
    assert "MutatingWebhookConfiguration" not in kinds(render("no-webhook"))
    dra_only = render("dra-only-dynamic-mig")
    assert kinds(dra_only) & {"Deployment", "MutatingWebhookConfiguration"} == set()
    assert [d["metadata"]["name"] for d in dra_only if d["kind"] == "DaemonSet"] == ["vcuda-dra-driver"]
    minimal = render("agents-only")
    assert kinds(minimal) & {"Deployment", "Service", "MutatingWebhookConfiguration"} == set()
    assert not [d for d in minimal if d["kind"] == "ConfigMap" and d["metadata"]["namespace"] == "kube-public"]
    for ds in (d for d in minimal if d["kind"] == "DaemonSet"):
        spec = ds["spec"]["template"]["spec"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert spec["nodeSelector"]["pool"] == "gpu"
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["image"] == "registry.example.com/vcuda:0.1.0-dev"


def test_images_default_to_the_charts_app_version() -> None:
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    docs = render("full")
    images = {c["image"] for d in docs if d["kind"] in ("DaemonSet", "Deployment")
              for c in d["spec"]["template"]["spec"]["containers"] + d["spec"]["template"]["spec"].get(
                  "initContainers", [])}
    assert images == {f"ghcr.io/vcuda/vcuda:{version}", "registry.k8s.io/kube-scheduler:v1.34.0"}


def test_bad_values_are_refused_with_the_value_named() -> None:
    for args, needle in [
        (("--set", "webhook.failurePolicy=Never"), "failurePolicy"),
        (("--set", "dra.mig=always"), "mig"),
        (("--set", "devicePlugin.vgpu.enable=true"), "enable"),
        (("--set", "extender.enabled=false"), "extender.enabled"),
        (("--set", "scheduler.enabled=false"), "scheduler.enabled"),
        (("--set", "dra.enabled=true", "--kube-version", "1.33.4"), "Kubernetes 1.34"),
    ]:
        out = run_helm("template", "vcuda", str(CHART), "--kube-version", KUBE_VERSIONS[0], *args)
        assert out.returncode != 0 and needle in out.stderr, (args, out.stderr)


# ---- files the chart carries in whole -------------------------------------------------------------

def test_dashboards_config_map_holds_the_generated_files() -> None:
    cm = find(render("full"), "ConfigMap", "-dashboards")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = sorted((CHART / "files" / "dashboards").glob("*.json"))
    assert [f.name for f in files] == ["vcuda-node.json", "vcuda-pod.json"]
    assert cm["data"] == {f.name: f.read_text() for f in files}


def test_alert_rules_go_in_whole_and_as_a_prometheus_rule() -> None:
    rules = CHART / "files" / "alerts" / "vcuda-alerts.yaml"
    docs = render("full")
    assert find(docs, "ConfigMap", "-alerts")["data"] == {"vcuda-alerts.yaml": rules.read_text()}
    rule = find(docs, "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(rules.read_text())["groups"]


def test_exporter_service_selects_every_node_agent_and_the_service_monitor_it() -> None:
    docs = render("full")
    svc = find(docs, "Service", "-exporter")
    assert svc["spec"]["clusterIP"] == "None"
    agents = [d for d in docs if d["kind"] == "DaemonSet"]
    assert len(agents) == 4
    for ds in agents:
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items(), ds["metadata"]["name"]
        (c,) = ds["spec"]["template"]["spec"]["containers"]
        assert [p["name"] for p in c["ports"]] == [svc["spec"]["ports"][0]["targetPort"]]
    monitor = find(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # the exporter's namespace/pod/container labels name the GPU containers: they must win over the target's
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True


# ---- vcuda-scheduler -------------------------------------------------------------------------------

def scheduler_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return config_map_file(docs, "-scheduler-config", "config.yaml")


@pytest.mark.parametrize("combination", ["default", "vgpu-only-renamed"])
def test_scheduler_profile_calls_the_extender_for_the_vgpu_resources(combination: str) -> None:
    docs = render(combination)
    cfg = scheduler_config(docs)
    assert (cfg["apiVersion"], cfg["kind"]) == ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration")
    assert cfg["profiles"] == [{"schedulerName": "vcuda-scheduler"}]
    assert "clientConnection" not in cfg   # in-cluster, its own service account
    (ext,) = cfg["extenders"]
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == ("filter", "prioritize", "bind")
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is False
    domain = "example.com" if combination == "vgpu-only-renamed" else Names().core_resource.split("/")[0]
    assert ext["managedResources"] == [{"name": f"{domain}/vcuda-core", "ignoredByScheduler": False},
                                       {"name": f"{domain}/vcuda-memory", "ignoredByScheduler": False}]
    svc = find(docs, "Service", "-extender")
    (port,) = svc["spec"]["ports"]
    assert ext["urlPrefix"] == f"http://{svc['metadata']['name']}.{NAMESPACE}.svc:{port['port']}"
    extender = find(docs, "Deployment", "-extender")
    assert svc["spec"]["selector"].items() <= extender["spec"]["template"]["metadata"]["labels"].items()


def test_scheduler_leader_election_and_rbac() -> None:
    docs = render("scheduler-ha")
    cfg = scheduler_config(docs)
    assert cfg["leaderElection"] == {"leaderElect": True, "resourceLock": "leases",
                                     "resourceName": "vcuda-scheduler", "resourceNamespace": NAMESPACE}
    deploy = find(docs, "Deployment", "-scheduler")
    assert deploy["spec"]["replicas"] == 2
    spec = deploy["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["image"] == "registry.k8s.io/kube-scheduler:v1.34.2"
    assert c["command"][:2] == ["kube-scheduler", "--config=/etc/vcuda-scheduler/config.yaml"]
    (mount,) = c["volumeMounts"]
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == find(docs, "ConfigMap", "-scheduler-config")["metadata"]["name"]
    sa = spec["serviceAccountName"]
    bound = {(d["kind"], d["metadata"].get("namespace"), d["roleRef"]["name"]) for d in docs
             if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and any(s["name"] == sa for s in d["subjects"])}
    assert bound == {("ClusterRoleBinding", None, "system:kube-scheduler"),
                     ("ClusterRoleBinding", None, "system:volume-scheduler"),
                     ("RoleBinding", "kube-system", "extension-apiserver-authentication-reader"),
                     ("RoleBinding", NAMESPACE, "vcuda-scheduler-leader-election")}
    role = find(docs, "Role", "-scheduler-leader-election")
    assert {(tuple(r.get("resourceNames", [])), v) for r in role["rules"] for v in r["verbs"]} == {
        ((), "create"), (("vcuda-scheduler",), "get"), (("vcuda-scheduler",), "update")}


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_kube_scheduler_tag_follows_the_cluster(kube: str) -> None:
    (c,) = find(render("default", kube), "Deployment", "-scheduler")["spec"]["template"]["spec"]["containers"]
    assert c["image"] == f"registry.k8s.io/kube-scheduler:v{kube}"
    (c,) = find(render_args("--set", "scheduler.image.repository=mirror.example.com/kube-scheduler", kube=kube),
                "Deployment", "-scheduler")["spec"]["template"]["spec"]["containers"]
    assert c["image"] == f"mirror.example.com/kube-scheduler:v{kube}"


def test_the_clusters_own_scheduler_is_not_touched() -> None:
    for doc in render("full"):
        assert doc["metadata"]["name"] not in ("kube-scheduler", "scheduler"), doc["kind"]
        text = yaml.safe_dump(doc)
        assert "/etc/kubernetes/scheduler.conf" not in text and "kube-scheduler.yaml" not in text


# ---- webhook objects (the webhook itself lives in the extender process) ---------------------------

def webhook_flags(docs: list[dict[str, Any]]) -> dict[str, str]:
    (c,) = find(docs, "Deployment", "-extender")["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["vcuda", "extender"]
    return dict(a.split("=", 1) for a in c["args"])


def test_extender_runs_the_webhook_with_the_agreed_flags() -> None:
    docs = render("default")
    flags = webhook_flags(docs)
    svc = find(docs, "Service", "-webhook")
    mwc = find(docs, "MutatingWebhookConfiguration")
    assert flags == {
        "--listen": ":8888",
        "--webhook-listen": ":9443",
        "--webhook-service": f"{svc['metadata']['name']}.{NAMESPACE}",
        "--webhook-tls-secret": f"{NAMESPACE}/vcuda-webhook-tls",
        "--webhook-configuration": mwc["metadata"]["name"],
        "--scheduler-name": "vcuda-scheduler",
        "--webhook-resources": "tencent.com/vcuda-core,tencent.com/vcuda-memory",
    }
    assert webhook_flags(render("scheduler-ha"))["--webhook-resources"] == \
        "tencent.com/vcuda-core,tencent.com/vcuda-memory,nvidia.com/gpu,nvidia.com/mps-core"
    assert webhook_flags(render("vgpu-only-renamed"))["--webhook-resources"] == \
        "example.com/vcuda-core,example.com/vcuda-memory"
    assert webhook_flags(render("no-webhook")) == {"--listen": ":8888"}
    (c,) = find(docs, "Deployment", "-extender")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert (env["VCUDA_RESOURCE_DOMAIN"], env["VCUDA_ANNOTATION_PREFIX"]) == ("tencent.com", "vcuda.io")
    assert {"name": "webhook", "containerPort": 9443} in c["ports"]


def test_extender_flags_the_parser_knows_parse() -> None:
    """Against the extender's own parser: every flag it has must accept the chart's value (the webhook
    flags are checked once the parser has them)."""
    import argparse

    from scheduler_extender import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    known = {f for a in parser._actions for f in a.option_strings}
    chart_args = find(render("default"), "Deployment", "-extender")["spec"]["template"]["spec"]["containers"][0][
        "args"]
    if "--webhook-listen" in known:   # the webhook is in: then every flag the chart passes must be its
        assert {a.split("=", 1)[0] for a in chart_args} <= known
    args = [a for a in chart_args if a.split("=", 1)[0] in known]
    assert "--listen=:8888" in args
    parser.parse_args(args)


def test_webhook_configuration() -> None:
    docs = render("default")
    mwc = find(docs, "MutatingWebhookConfiguration")
    (hook,) = mwc["webhooks"]
    svc = find(docs, "Service", "-webhook")
    assert hook["clientConfig"]["service"] == {"name": svc["metadata"]["name"], "namespace": NAMESPACE,
                                               "path": "/mutate-pods", "port": 443}
    assert "caBundle" not in hook["clientConfig"]   # no cluster to look the Secret up in: the extender fills it
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    assert (hook["failurePolicy"], hook["sideEffects"], hook["timeoutSeconds"], hook["reinvocationPolicy"],
            hook["admissionReviewVersions"]) == ("Ignore", "NoneOnDryRun", 5, "Never", ["v1"])
    assert hook["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}]}
    assert find(render("scheduler-ha"), "MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Fail"
    (port,) = svc["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("webhook", 443, "webhook")
    extender = find(docs, "Deployment", "-extender")
    assert svc["spec"]["selector"].items() <= extender["spec"]["template"]["metadata"]["labels"].items()


def test_webhook_ca_bundle_survives_an_upgrade() -> None:
    """On upgrade the chart copies the Secret's ca.crt (lookup); helm template cannot look, so this reads
    the template: the lookup names the Secret the extender is told to keep."""
    text = (CHART / "templates" / "webhook.yaml").read_text()
    assert re.search(r'lookup "v1" "Secret" \.Release\.Namespace \$secretName', text)
    assert '$secretName := include "vcuda.webhookSecret" .' in text
    assert re.search(r'caBundle: \{\{ \. \}\}', text) and 'index .data "ca.crt"' in text


def rules_of(doc: dict[str, Any]) -> set[tuple[str, str, tuple[str, ...], str]]:
    return {(g, r, tuple(rule.get("resourceNames", [])), v) for rule in doc["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


def test_extender_webhook_rbac_is_by_name() -> None:
    docs = render("default")
    role = find(docs, "Role", "-extender-webhook")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert rules_of(role) == {("", "secrets", ("vcuda-webhook-tls",), "get"),
                              ("", "secrets", ("vcuda-webhook-tls",), "update"),
                              ("", "secrets", (), "create")}
    cluster = find(docs, "ClusterRole", "-extender-webhook")
    assert rules_of(cluster) == {("admissionregistration.k8s.io", "mutatingwebhookconfigurations",
                                  ("vcuda-webhook",), v) for v in ("get", "patch")}
    sa = find(docs, "Deployment", "-extender")["spec"]["template"]["spec"]["serviceAccountName"]
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        binding = find(docs, kind, "-extender-webhook")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    assert ("", "events", (), "create") in rules_of(find(docs, "ClusterRole", "-extender"))
    no_webhook = render("no-webhook")
    assert not [d for d in no_webhook if d["metadata"]["name"].endswith("-webhook")]


SIM_NODE = {"devices": 2, "mig": ";off", "migModel": "h100-80gb", "memory": "17179869184",
            "stateDir": "/var/lib/vcuda-sim"}


def agents(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every node agent's DaemonSet by name (the device plugin's modes, the DRA driver)."""
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "DaemonSet"}


def test_testing_simulator_is_off_by_default_and_then_renders_nothing_of_it() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["testing"]
    assert values == {"simulator": False, "simulatedNode": SIM_NODE}
    text = run_helm("template", "vcuda", str(CHART), "--set", "dra.enabled=true,testing.simulatedNode.devices=5",
                    "--kube-version", KUBE_VERSIONS[0]).stdout
    for word in ("simulator", "VCUDA_SIM", "VCUDA_REAL", "vcuda-sim"):
        assert word not in text
    assert render_args("--set", "dra.enabled=true,testing.simulatedNode.devices=5") == render("dra")


def test_testing_simulator_runs_every_agent_on_the_simulator() -> None:
    """Each agent: --simulator, the simulator as its driver (libraries installed by its init step in the
    host directory it mounts), its state in a hostPath at the same path, the host's pid namespace."""
    found = agents(render("simulator"))
    assert set(found) == {"vcuda-device-plugin-vgpu", "vcuda-device-plugin-pgpu", "vcuda-device-plugin-mps",
                          "vcuda-dra-driver"}
    for name, ds in found.items():
        spec = ds["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        assert "--simulator" in c["args"] and "--host-lib-dir=/usr/local/vcuda/lib" in c["args"], name
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["VCUDA_REAL_LIBNVML"] == "/usr/local/vcuda/lib/libvcuda-sim-nvml.so", name
        assert env["VCUDA_REAL_LIBCUDA"] == "/usr/local/vcuda/lib/libvcuda-sim-cuda.so", name
        assert {k: v for k, v in env.items() if k.startswith("VCUDA_SIM_")} == {
            "VCUDA_SIM_STATE": "/var/lib/vcuda-sim/state", "VCUDA_SIM_DEVICES": "2",
            "VCUDA_SIM_MEMORY": "17179869184", "VCUDA_SIM_MIG": ";off", "VCUDA_SIM_MIG_MODEL": "h100-80gb"}, name
        host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        mounted = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert host[mounted["/var/lib/vcuda-sim"]] == "/var/lib/vcuda-sim", name   # host paths go to containers
        assert host[mounted["/usr/local/vcuda/lib"]] == "/usr/local/vcuda/lib", name
        assert spec["hostPID"] is True, name   # the simulator's pids are the agent's namespace's
        (init,) = spec["initContainers"]
        assert "libvcuda-sim-cuda.so libvcuda-sim-nvml.so" in init["command"][2], name


def test_testing_simulator_flags_pass_the_agents_parsers() -> None:
    import argparse

    from device_plugin import cli as dp_cli
    from device_plugin import config as dp_config
    from dra_driver import config as dra_config
    for name, ds in agents(render("simulator")).items():
        (c,) = ds["spec"]["template"]["spec"]["containers"]
        parser = argparse.ArgumentParser()
        (dra_config if name == "vcuda-dra-driver" else dp_cli).add_arguments(parser)
        parsed = parser.parse_args([a.replace("$(NODE_NAME)", "node-1") for a in c["args"]])
        cfg = (dra_config if name == "vcuda-dra-driver" else dp_config).from_args(parsed, env={})
        assert cfg.simulator is True, name


def test_testing_simulated_node_is_validated() -> None:
    for bad, field in (("testing.simulatedNode.migModel=v100", "migModel"),
                       ("testing.simulatedNode.stateDir=relative", "stateDir"),
                       ("testing.simulatedNode.memory=16Gi", "memory")):
        proc = run_helm("template", "vcuda", str(CHART), "--set", bad, "--kube-version", KUBE_VERSIONS[0])
        assert proc.returncode != 0 and field in proc.stderr, bad


def test_no_kustomize_copy_is_left() -> None:
    deploy = CHART.parents[1]
    assert not list(deploy.rglob("kustomization.yaml"))
    objects = {p for p in deploy.rglob("*.yaml") if CHART not in p.parents and "examples" not in p.parts}
    assert objects == set(), "manifests outside the chart: render them from it, do not keep a copy"
    assert not (deploy / "extender" / "scheduler-config.yaml").exists()
    assert Path(CHART / "values.schema.json").is_file()
