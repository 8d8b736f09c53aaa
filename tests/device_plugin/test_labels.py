"""The NFD feature file: labels from the simulator's NVML, valid label values, atomic writes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from device_plugin.labels import label_value, write_feature_file
from py_vcuda.sim import GiB, SimConfig, nvml_session

# Kubernetes label values (apimachinery validation.IsValidLabelValue), empty excluded.
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# NFD feature file lines: full label name = value.
LINE = re.compile(r"^vcuda\.io/[a-z0-9-]+=(.*)$")


def sim(tmp_path: Path, **kw) -> SimConfig:  # type: ignore[no-untyped-def]
    return SimConfig(state_path=tmp_path / "state", **kw)


def test_feature_file_for_an_h100_node(tmp_path: Path) -> None:
    cfg = sim(tmp_path, devices=2, memory=80 * GiB, names=["NVIDIA H100 80GB HBM3"],
              driver_version=12040)
    path = tmp_path / "features.d" / "vcuda"
    with nvml_session(cfg) as nvml:
        labels = write_feature_file(path, nvml, "vgpu")
    assert labels == {
        "vcuda.io/cuda-major-version": "12",
        "vcuda.io/cuda-minor-version": "4",
        "vcuda.io/driver-version": "580.65.06",
        "vcuda.io/gpu-product": "NVIDIA-H100-80GB-HBM3",
        "vcuda.io/gpu-memory": str(80 * 1024),
        "vcuda.io/gpu-count": "2",
        "vcuda.io/sharing-mode": "vgpu",
    }
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
    assert dict(ln.split("=", 1) for ln in lines) == labels
    for ln in lines:
        m = LINE.match(ln)
        assert m and LABEL_VALUE.match(m.group(1)), ln
    assert [p.name for p in path.parent.iterdir()] == ["vcuda"]  # no temporary file left
    assert path.stat().st_mode & 0o777 == 0o644


def test_rewrite_replaces_the_file_and_mixed_models(tmp_path: Path) -> None:
    path = tmp_path / "vcuda"
    path.write_text("stale=1\n")
    cfg = sim(tmp_path, devices=2, memory=16 * GiB, names=["Tesla T4", "NVIDIA A10"])
    with nvml_session(cfg) as nvml:
        labels = write_feature_file(path, nvml, "mps")
    assert labels["vcuda.io/gpu-product"] == "mixed"
    assert labels["vcuda.io/sharing-mode"] == "mps"
    assert "stale" not in path.read_text()


def test_unknown_mode_is_refused(tmp_path: Path) -> None:
    with nvml_session(sim(tmp_path)) as nvml, pytest.raises(ValueError, match="vgpu, pgpu, mps"):
        write_feature_file(tmp_path / "vcuda", nvml, "shared")
    assert not (tmp_path / "vcuda").exists()


@pytest.mark.parametrize(("text", "expected"), [
    ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
    ("  (weird) name!! ", "weird-name"),
    ("Quadro RTX 6000/8000", "Quadro-RTX-6000-8000"),
    ("---", "unknown"),
    ("x" * 70 + "-y", "x" * 63),
    ("a" * 62 + " b", "a" * 62),  # cut at 63 would end on '-': trimmed
])
def test_label_value_examples(text: str, expected: str) -> None:
    assert label_value(text) == expected


@given(st.text())
def test_label_value_is_always_valid(text: str) -> None:
    assert LABEL_VALUE.match(label_value(text))
