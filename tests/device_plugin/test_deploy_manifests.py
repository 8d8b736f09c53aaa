"""The node agent's objects, as the Helm chart renders them, agree with the code: resource and
annotation names, the agent's flags and defaults, mounts, the init step, RBAC, the CRL ConfigMaps;
and the example pods (deploy/examples/device-plugin) use the code's names."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_chart import CHART, NAMESPACE, config_map_file, find, render
from k8s_schema import schema_problem

from kube_contract.names import Names
from py_vcuda import native

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples" / "device-plugin"
MODES = ("vgpu", "pgpu", "mps")
METRICS_PORT = 9394
# The agent's flags (DESIGN.md `vcuda device-plugin`, device_plugin.config).
FLAGS = ("--mode", "--device-plugin-dir", "--pod-resources-socket", "--state-dir", "--config",
         "--metrics-port", "--node-name", "--features-file", "--host-lib-dir", "--mig-strategy", "--mig-config",
         "--device-list-strategy", "--resource-domain", "--annotation-prefix", "--allow-opt-out-namespaces")
PGPU_RESOURCE = "nvidia.com/gpu"
MPS_RESOURCE = "nvidia.com/mps-core"


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def agent_objects(combination: str = "full") -> list[dict[str, Any]]:
    """The chart's objects for the node agent (its templates device-plugin-*.yaml, resource-limitations.yaml)."""
    return [d for d in render(combination) if "device-plugin" in d["metadata"]["name"] or
            d["metadata"]["name"].startswith("cf-crl-") or d["metadata"]["name"].endswith("-mig-parted-config")]


def daemonset(mode: str, combination: str = "full") -> dict[str, Any]:
    return find(render(combination), "DaemonSet", f"-device-plugin-{mode}")


def pod_spec(ds: dict[str, Any]) -> dict[str, Any]:
    return ds["spec"]["template"]["spec"]


def agent(ds: dict[str, Any]) -> dict[str, Any]:
    (c,) = pod_spec(ds)["containers"]
    return c


def flag_values(container: dict[str, Any]) -> dict[str, str]:
    values = {}
    for arg in container["args"]:
        flag, eq, value = arg.partition("=")
        assert eq, f"{arg}: write flags as --flag=value"
        values[flag] = value
    return values


def host_paths(ds: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in pod_spec(ds)["volumes"] if "hostPath" in v}


def test_every_object_and_example_names_itself_and_fits_the_kubernetes_schema() -> None:
    """The kubernetes client's round trip (tests/deploy validates the chart against the API schemas too)."""
    docs = agent_objects()
    assert {d["kind"] for d in docs} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet",
                                         "ConfigMap"}
    examples = [(f, d) for f in sorted(EXAMPLES.glob("*.yaml")) for d in load(f)]
    assert len(examples) >= 5
    for where, doc in [*(("chart", d) for d in docs), *examples]:
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], where
        assert schema_problem(doc) is None, f"{where}: {schema_problem(doc)}"


@pytest.mark.parametrize("mode", MODES)
def test_daemonset_args_are_the_agents_flags(mode: str) -> None:
    ds = daemonset(mode)
    c = agent(ds)
    assert c["command"] == ["vcuda", "device-plugin"]
    values = flag_values(c)
    assert set(values) <= set(FLAGS), set(values) - set(FLAGS)
    assert values["--mode"] == mode
    assert values["--node-name"] == "$(NODE_NAME)"
    assert values["--metrics-port"] == str(METRICS_PORT)
    assert ("--host-lib-dir" in values) == (mode == "vgpu")  # only vgpu containers get libvcuda
    assert ("--mig-config" in values) == ("--mig-strategy" in values) == (mode == "pgpu")  # MIG: pgpu only
    assert values["--device-list-strategy"] == "envvar"
    assert pod_spec(ds)["nodeSelector"] == {"vcuda.io/device-plugin": mode}
    assert ds["metadata"]["name"] == f"vcuda-device-plugin-{mode}"


@pytest.mark.parametrize("mode", MODES)
def test_daemonset_args_pass_the_agents_parser(mode: str) -> None:
    """Against the agent's own parser when it is there: every value parses and lands."""
    cli = pytest.importorskip("device_plugin.cli")
    config = pytest.importorskip("device_plugin.config")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = [a.replace("$(NODE_NAME)", "node-1") for a in agent(daemonset(mode))["args"]]
    cfg = config.from_args(parser.parse_args(args), env={})
    assert (cfg.mode, cfg.node_name, cfg.metrics_port) == (mode, "node-1", METRICS_PORT)
    defaults = {o.name: o.default for o in config.OPTIONS}
    assert defaults["metrics_port"] == METRICS_PORT
    for name in ("device_plugin_dir", "pod_resources_socket", "state_dir", "features_file"):
        assert getattr(cfg, name) == defaults[name]  # the manifest spells out the defaults
    for flag in FLAGS:
        assert flag in parser.format_help()


def test_chart_values_reach_the_agents_config() -> None:
    """resourceDomain, annotationPrefix, allowOptOutNamespaces, deviceListStrategy: as the agent parses them."""
    cli = pytest.importorskip("device_plugin.cli")
    config = pytest.importorskip("device_plugin.config")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = [a.replace("$(NODE_NAME)", "node-1") for a in agent(daemonset("vgpu", "vgpu-only-renamed"))["args"]]
    cfg = config.from_args(parser.parse_args(args), env={})
    assert (cfg.resource_domain, cfg.annotation_prefix) == ("example.com", "gpu.example.com")
    assert cfg.allow_opt_out_namespaces == frozenset({"ml-dev", "ci"})
    assert list(cfg.device_list_strategy) == ["cdi-cri"]
    assert [d["metadata"]["name"] for d in render("vgpu-only-renamed") if d["kind"] == "DaemonSet"] == \
        ["vcuda-device-plugin-vgpu"]


@pytest.mark.parametrize("mode", MODES)
def test_node_name_metrics_and_scrape_annotations(mode: str) -> None:
    ds = daemonset(mode)
    c = agent(ds)
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert {"name": "metrics", "containerPort": METRICS_PORT} in c["ports"]
    ann = ds["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert ann["prometheus.io/port"] == str(METRICS_PORT)
    assert ann["prometheus.io/path"] == "/metrics"


@pytest.mark.parametrize("mode", MODES)
def test_host_paths_are_mounted_where_the_flags_point(mode: str) -> None:
    ds = daemonset(mode)
    c = agent(ds)
    paths = host_paths(ds)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    for name, mount in mounts.items():  # host paths go to kubelet as they are: same path inside
        if name in paths:
            assert paths[name] == mount, name
    values = flag_values(c)
    needed = {
        "--device-plugin-dir": values["--device-plugin-dir"],
        "--pod-resources-socket": str(Path(values["--pod-resources-socket"]).parent),
        "--state-dir": values["--state-dir"],
        "--features-file": str(Path(values["--features-file"]).parent),
    }
    if mode == "vgpu":
        needed["--host-lib-dir"] = values["--host-lib-dir"]
    for flag, path in needed.items():
        assert path in mounts.values(), f"{flag}: {path} is not mounted"
    assert values["--features-file"].startswith("/etc/kubernetes/node-feature-discovery/features.d/")
    assert values["--device-plugin-dir"] == "/var/lib/kubelet/device-plugins"
    assert values["--state-dir"] == "/var/lib/vcuda"


@pytest.mark.parametrize("mode", MODES)
def test_privileged_only_for_mps_and_mig_layouts(mode: str) -> None:
    ds = daemonset(mode)
    sc = agent(ds)["securityContext"]
    if mode == "mps":
        assert sc["privileged"] is True and pod_spec(ds)["hostIPC"] is True
    elif mode == "pgpu":   # MIG layouts: the toolkit grants the MIG config capability to privileged containers
        env = {e["name"]: e.get("value") for e in agent(ds)["env"]}
        assert sc["privileged"] is True and env["NVIDIA_MIG_CONFIG_DEVICES"] == "all"
        assert not pod_spec(ds).get("hostIPC")
    else:
        assert not sc.get("privileged") and not pod_spec(ds).get("hostIPC")
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        # vgpu: the quota guard reads GPU processes' maps and kills escapes (node_state.quota_guard)
        assert sc["capabilities"].get("add", []) == (["KILL", "SYS_PTRACE"] if mode == "vgpu" else [])
    for init in pod_spec(ds).get("initContainers", []):
        assert not init.get("securityContext", {}).get("privileged")


def init_script(combination: str = "full") -> tuple[str, str]:
    """The vgpu init step's shell script and the host directory it writes to, as seen inside."""
    ds = daemonset("vgpu", combination)
    (init,) = pod_spec(ds)["initContainers"]
    assert init["command"][:2] == ["/bin/sh", "-ec"]
    (mount,) = init["volumeMounts"]
    host_lib = next(a for a in agent(ds)["args"] if a.startswith("--host-lib-dir="))
    assert host_paths(ds)[mount["name"]] == host_lib.partition("=")[2]
    return init["command"][2], mount["mountPath"]


def run_init(tmp_path: Path, lib: Path, combination: str = "full") -> subprocess.CompletedProcess[str]:
    """Runs the init step here, with a `vcuda` that names lib and tmp_path/host as the host dir."""
    script, inside = init_script(combination)
    bin_dir, host = tmp_path / "bin", tmp_path / "host"
    bin_dir.mkdir()
    host.mkdir()
    fake = bin_dir / "vcuda"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = lib-path ] && echo '{lib}'\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(["/bin/sh", "-ec", script.replace(inside, str(host))], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_init_step_installs_libvcuda(tmp_path: Path) -> None:
    lib = native.lib_path(native.SHIM)
    proc = run_init(tmp_path, lib)
    assert proc.returncode == 0, proc.stderr
    installed = tmp_path / "host" / native.SHIM
    assert installed.read_bytes() == lib.read_bytes()
    assert installed.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in installed.parent.iterdir()] == [native.SHIM]  # no temporary left


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_init_step_installs_the_simulators_libraries_with_testing_simulator(tmp_path: Path) -> None:
    lib = native.lib_path(native.SHIM)
    proc = run_init(tmp_path, lib, "simulator")
    assert proc.returncode == 0, proc.stderr
    host = tmp_path / "host"
    assert sorted(p.name for p in host.iterdir()) == sorted([native.SHIM, native.SIM_CUDA, native.SIM_NVML])
    for name in (native.SIM_CUDA, native.SIM_NVML):
        assert (host / name).read_bytes() == native.lib_path(name).read_bytes()
        assert (host / name).stat().st_mode & 0o777 == 0o755


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_init_step_refuses_a_library_with_more_dependencies(tmp_path: Path) -> None:
    heavy_lib = next((p for p in Path("/usr/lib").rglob("libstdc++.so.6*") if p.is_file()), None)
    if heavy_lib is None:
        pytest.skip("no libstdc++ here to stand in for a library with dependencies")
    proc = run_init(tmp_path, heavy_lib)
    assert proc.returncode != 0
    assert "needs more than libc" in proc.stderr
    assert not (tmp_path / "host" / native.SHIM).exists()


# `api.<verb>_<kind>(...)`: the kubernetes client's CoreV1Api calls in the agent's code.
API_CALL = re.compile(r"\bapi\.(list|read|patch|create|delete|replace)_(\w+?)\(([^()]*)\)", re.S)
API_RESOURCE = {"pod": "pods", "node": "nodes", "event": "events", "pod_binding": "pods/binding"}
# `api.list_<kind>` handed (not called) to kube_contract.apiclient.ListWatch, which lists and watches with it.
LIST_WATCH = re.compile(r"\bapi\.list_(\w+)\b(?!\()")


def agent_api_calls() -> set[tuple[str, str]]:
    """(resource, RBAC verb) for every API call in device_plugin/ and the Events it records (kube_contract/events.py),
    a list with watch=True also a watch."""
    used = set()
    for path in [*sorted((REPO / "device_plugin").glob("*.py")), REPO / "kube_contract" / "events.py"]:
        for verb, kind, args in API_CALL.findall(path.read_text()):
            resource = kind.replace("namespaced_", "").replace("_for_all_namespaces", "")
            resource = API_RESOURCE.get(resource, resource)
            used.add((resource, "get" if verb == "read" else verb))
            if verb == "list" and "watch=True" in args:
                used.add((resource, "watch"))
        for kind in LIST_WATCH.findall(path.read_text()):
            resource = kind.replace("namespaced_", "").replace("_for_all_namespaces", "")
            resource = API_RESOURCE.get(resource, resource)
            used |= {(resource, "list"), (resource, "watch")}
    return used


def test_rbac_grants_what_the_agent_calls() -> None:
    docs = {d["kind"]: d for d in agent_objects() if d["kind"] in ("ServiceAccount", "ClusterRole",
                                                                   "ClusterRoleBinding")}
    granted = {(res, verb) for r in docs["ClusterRole"]["rules"] for res in r["resources"]
               for verb in r["verbs"]}
    used = agent_api_calls()
    # the calls this test must find, so that a change in how the code is written cannot make it vacuous
    assert {("pods", "list"), ("pods", "watch"), ("nodes", "patch")} <= used
    assert granted == used, f"granted but not called: {granted - used}; called but not granted: {used - granted}"
    sa = docs["ServiceAccount"]["metadata"]
    (subject,) = docs["ClusterRoleBinding"]["subjects"]
    assert (subject["name"], subject["namespace"]) == (sa["name"], sa["namespace"])
    for mode in MODES:
        ds = daemonset(mode)
        assert pod_spec(ds)["serviceAccountName"] == sa["name"]
        assert ds["metadata"]["namespace"] == sa["namespace"]


def test_mig_config_map_is_mounted_where_the_flag_points_and_parses() -> None:
    from node_state.mig import parse_layouts

    cm = find(render(), "ConfigMap", "-mig-parted-config")
    ds = daemonset("pgpu")
    volume = next(v for v in pod_spec(ds)["volumes"] if v.get("configMap"))
    assert volume["configMap"]["name"] == cm["metadata"]["name"] and cm["metadata"]["namespace"] == NAMESPACE
    mount = next(m for m in agent(ds)["volumeMounts"] if m["name"] == volume["name"])
    assert "subPath" not in mount   # a subPath mount would never see an edited ConfigMap
    path = Path(flag_values(agent(ds))["--mig-config"])
    assert path.parent == Path(mount["mountPath"]) and path.name in cm["data"]
    layouts = parse_layouts(cm["data"][path.name])
    assert {"all-disabled", "all-1g.10gb", "3g.20gb-2x2g.10gb"} <= set(layouts)


def test_topology_annotation_is_the_one_rbac_allows_patching() -> None:
    assert Names().topology == "vcuda.io/gpu-topology"
    assert Names().topology in (CHART / "templates" / "device-plugin-rbac.yaml").read_text()


def crl() -> dict[str, dict[str, Any]]:
    return {d["data"]["key"]: d for d in render() if d["metadata"]["name"].startswith("cf-crl-")}


def test_resource_limitation_configmaps() -> None:
    names = Names()
    maps = crl()
    assert set(maps) == {names.core_resource, names.memory_resource}
    for key, cm in maps.items():
        meta, data = cm["metadata"], cm["data"]
        assert cm["kind"] == "ConfigMap"
        assert meta["namespace"] == "kube-public"
        assert meta["name"] == f"cf-crl-gpu-manager-{key.split('/')[1]}"
        assert {"features.alauda.io/type": "CustomResourceLimitation", "features.alauda.io/group": "gpu-manager",
                "features.alauda.io/enabled": "true"}.items() <= meta["labels"].items()
        assert data["dataType"] == "integer" and data["defaultValue"].isdigit()
        assert data["descriptionEn"].strip() and data["descriptionZh"].strip()
        assert all(isinstance(v, str) for v in data.values())  # ConfigMap data is strings only
        # limits only: Kubernetes copies an extended resource's limit into its request
        assert data["requests"] == "disabled"
    # cores are what a vgpu pod asks for; memory is optional (whole cards need none: examples/vgpu-whole.yaml)
    assert maps[names.core_resource]["data"]["limits"] == "required"
    assert maps[names.memory_resource]["data"]["limits"] == "optional"
    assert names.memory_resource not in limits_of(example("vgpu-whole"))
    assert maps[names.core_resource]["data"]["defaultValue"] == "20"
    assert maps[names.core_resource]["metadata"]["name"] == "cf-crl-gpu-manager-vcuda-core"
    assert maps[names.memory_resource]["metadata"]["name"] == "cf-crl-gpu-manager-vcuda-memory"


def test_extender_scheduler_config_covers_the_vgpu_resources() -> None:
    cfg = config_map_file(render(), "-scheduler-config", "config.yaml")
    (ext,) = cfg["extenders"]
    managed = {r["name"] for r in ext["managedResources"]}
    names = Names()
    assert {names.core_resource, names.memory_resource} <= managed


def limits_of(pod: dict[str, Any]) -> dict[str, int]:
    (c,) = pod["spec"]["containers"]
    return {k: int(v) for k, v in c["resources"]["limits"].items()}


def example(name: str) -> dict[str, Any]:
    (pod,) = load(EXAMPLES / f"{name}.yaml")
    assert pod["kind"] == "Pod"
    return pod


def test_example_pods_use_the_codes_names() -> None:
    names = Names()
    core_limit = f"{names.annotation_prefix}/core-limit"
    try:
        from device_plugin import quota
        assert quota.core_limit_annotation(names) == core_limit
    except ImportError:
        pass
    frac = example("vgpu-fraction")
    assert limits_of(frac) == {names.core_resource: 30, names.memory_resource: 16}
    assert int(frac["metadata"]["annotations"][core_limit]) > 30  # an elastic cap above the share
    inference = example("vgpu-inference")
    priority = f"{names.annotation_prefix}/priority"
    try:
        from device_plugin import quota as quota_module
        assert quota_module.priority_annotation(names) == priority
        assert quota_module.quota(names, inference["metadata"]["annotations"], cores=40, share_memory=None,
                                  memory_units=32).priority == "high"
    except ImportError:
        pass
    assert inference["metadata"]["annotations"][priority] == "high"
    assert limits_of(inference)[names.core_resource] < 100  # priority is for a shared GPU
    assert limits_of(example("vgpu-whole")) == {names.core_resource: 100}
    assert limits_of(example("vgpu-try")) == {names.core_resource: 30, names.memory_resource: 16}   # README's
    assert limits_of(example("pgpu")) == {PGPU_RESOURCE: 2}
    mps = example("mps")
    assert limits_of(mps) == {MPS_RESOURCE: 25}
    assert mps["spec"]["hostIPC"] is True


def test_example_resource_names_match_the_plugins() -> None:
    pgpu = pytest.importorskip("device_plugin.pgpu")
    mps = pytest.importorskip("device_plugin.mps")
    assert (pgpu.RESOURCE, mps.RESOURCE) == (PGPU_RESOURCE, MPS_RESOURCE)
