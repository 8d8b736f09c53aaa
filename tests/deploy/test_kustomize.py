"""Every folder under deploy/ installs with one command, `kubectl apply -k deploy/<folder>`:
each has a kustomization.yaml that lists all its manifests, renders offline with
`kubectl kustomize`, and yields objects that fit the Kubernetes API schema."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_schema import schema_problem

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# Files in deploy/ folders that are not cluster objects, and where they go instead.
NOT_OBJECTS = {
    DEPLOY / "extender" / "scheduler-config.yaml": "kube-scheduler's --config file",
    DEPLOY / "dashboards" / "generate.py": "writes the dashboards",
}


def folders() -> list[Path]:
    """Every folder under deploy/ that holds something to install."""
    return sorted(d for d in {f.parent for f in DEPLOY.rglob("*") if f.suffix in (".yaml", ".json")})


def kustomization(folder: Path) -> dict[str, Any]:
    return yaml.safe_load((folder / "kustomization.yaml").read_text())


def listed(folder: Path) -> set[Path]:
    doc = kustomization(folder)
    files = [*doc.get("resources", []), *(f for g in doc.get("configMapGenerator", []) for f in g["files"])]
    return {(folder / f).resolve() for f in files}


@pytest.mark.parametrize("folder", folders(), ids=lambda d: str(d.relative_to(DEPLOY)))
def test_every_deploy_folder_lists_all_its_manifests(folder: Path) -> None:
    assert (folder / "kustomization.yaml").is_file(), f"{folder}: no kustomization.yaml"
    present = {f.resolve() for f in folder.iterdir()
               if f.suffix in (".yaml", ".json") and f.name != "kustomization.yaml" and f not in NOT_OBJECTS}
    assert listed(folder) == present


@pytest.mark.parametrize("folder", folders(), ids=lambda d: str(d.relative_to(DEPLOY)))
def test_kustomize_renders_objects_that_fit_the_schema(folder: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (.ci/run installs it)")
    out = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d is not None]
    assert docs
    for doc in docs:
        assert schema_problem(doc) is None, schema_problem(doc)
    if kustomization(folder).get("configMapGenerator"):   # the files went in whole
        data = {k: v for d in docs if d["kind"] == "ConfigMap" for k, v in d["data"].items()}
        for f in listed(folder):
            assert data[f.name] == f.read_text()
