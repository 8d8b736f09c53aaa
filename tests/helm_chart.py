"""The Helm chart deploy/helm/vcuda as the tests see it: helm located through e2e/gotools.py, every
documented values combination, and the objects `helm template` renders for one.

Without helm the tests that need it skip, unless the CI variable is set (.ci/run builds helm), in
which case they fail: CI must never pass by skipping the chart."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "vcuda"
RELEASE, NAMESPACE = "vcuda", "vcuda-system"
KUBE_VERSIONS = ("1.34.0", "1.36.0")
PROMETHEUS_OPERATOR = "monitoring.coreos.com/v1"

# Every documented values combination (the chart's README lists the same, a test checks): name ->
# the `helm template` arguments after the chart. The ported manifest tests read `full`.
COMBINATIONS: dict[str, tuple[str, ...]] = {
    "default": (),
    "full": ("--set", "dra.enabled=true", "--api-versions", PROMETHEUS_OPERATOR),
    "prometheus-operator": ("--api-versions", PROMETHEUS_OPERATOR),
    "dra": ("--set", "dra.enabled=true"),
    "dra-only-dynamic-mig": ("--set", "dra.enabled=true,dra.mig=dynamic,devicePlugin.vgpu.enabled=false,"
                             "devicePlugin.pgpu.enabled=false,devicePlugin.mps.enabled=false,extender.enabled=false,"
                             "scheduler.enabled=false,webhook.enabled=false"),
    "vgpu-only-renamed": ("--set", "devicePlugin.pgpu.enabled=false,devicePlugin.mps.enabled=false,"
                          "resourceDomain=example.com,annotationPrefix=gpu.example.com,"
                          "allowOptOutNamespaces={ml-dev,ci},devicePlugin.deviceListStrategy=cdi-cri"),
    "no-webhook": ("--set", "webhook.enabled=false"),
    "scheduler-ha": ("--set", "scheduler.replicas=2,scheduler.image.tag=v1.34.2,webhook.pgpu=true,webhook.mps=true,"
                     "webhook.failurePolicy=Fail"),
    "agents-only": ("--set", "extender.enabled=false,scheduler.enabled=false,webhook.enabled=false,"
                    "monitoring.enabled=false,crl.enabled=false,devicePlugin.pgpu.migStrategy=none,"
                    "image.repository=registry.example.com/vcuda,image.tag=0.1.0-dev,"
                    "imagePullSecrets[0].name=regcred,nodeSelector.pool=gpu"),
    "simulator": ("--set", "testing.simulator=true,dra.enabled=true"),
}


def _gotools() -> Any:
    spec = importlib.util.spec_from_file_location("vcuda_gotools", REPO / "e2e" / "gotools.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@functools.cache
def helm_path() -> Path | None:
    """The pinned helm e2e/gotools.py builds, else one on PATH, else None."""
    pinned = _gotools().HELM.path
    if pinned.is_file():
        return pinned
    found = shutil.which("helm")
    return Path(found) if found else None


def helm() -> Path:
    """helm, or skip the test (fail it under CI)."""
    path = helm_path()
    if path is None:
        message = "helm not found: `python3 e2e/gotools.py helm` builds it (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm()), *args], capture_output=True, text=True, timeout=120, check=False)


@functools.cache
def _template(args: tuple[str, ...], kube: str) -> str:
    out = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube, *args)
    assert out.returncode == 0, out.stderr
    return out.stdout


class _StrictLoader(yaml.SafeLoader):
    """YAML as the API server's decoder reads it: a key given twice in one mapping is an error."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    keys = [loader.construct_object(key) for key, _ in node.value]
    twice = sorted({str(k) for k in keys if keys.count(k) > 1})
    if twice:
        raise yaml.constructor.ConstructorError(None, None, f"keys given twice: {twice}", node.start_mark)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]


def render(combination: str = "full", kube: str = KUBE_VERSIONS[0]) -> list[dict[str, Any]]:
    """The objects `helm template` renders for a documented combination (a fresh copy each call)."""
    return objects(_template(COMBINATIONS[combination], kube))


def render_args(*args: str, kube: str = KUBE_VERSIONS[0]) -> list[dict[str, Any]]:
    """The objects for ad hoc `helm template` arguments."""
    return objects(_template(tuple(args), kube))


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of `kind` (named `name`, or a suffix of the release's prefix: "-extender")."""
    hits = [d for d in docs if d["kind"] == kind and (
        name is None or d["metadata"]["name"] in (name, f"{RELEASE}{name}"))]
    assert len(hits) == 1, f"{len(hits)} {kind} objects named {name!r}"
    return hits[0]


def config_map_file(docs: list[dict[str, Any]], name: str, key: str) -> Any:
    """A YAML file held in a rendered ConfigMap, parsed."""
    return yaml.safe_load(find(docs, "ConfigMap", name)["data"][key])
