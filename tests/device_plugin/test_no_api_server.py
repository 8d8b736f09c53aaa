"""vgpu mode without an API server: memory requests cannot be applied to a container, so the agent
refuses to start unless the operator says so (--without-api-server), and then warns on every
Allocate that carries memory units."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from device_plugin.pods import NoPods
from py_vcuda.sim import SimConfig

MEMORY = "tencent.com/vcuda-memory"
GiB = 1 << 30


def test_vgpu_refuses_to_start_without_an_api_server(short_dir: Path, dp) -> None:  # noqa: ANN001
    sim = SimConfig(state_path=short_dir / "sim", devices=1, memory=2 * GiB)
    proc = dp.spawn_plugin(short_dir, sim, "--mode", "vgpu")
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        code = None
    log = dp.stop_plugin(proc, short_dir)
    assert code == 2, log
    assert "no API server" in log and "--without-api-server" in log and "NOT enforced" in log, log


def test_the_flag_says_what_it_costs() -> None:
    out = subprocess.run([sys.executable, "-m", "device_plugin", "--help"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    text = " ".join(out.split())
    assert "--without-api-server" in text
    assert "Memory requests (vcuda-memory units, vcuda.io/memory) are then NOT enforced" in text


def test_memory_allocate_without_an_api_server_warns(agent_factory, kubelet, dp,  # noqa: ANN001
                                                     caplog: pytest.LogCaptureFixture) -> None:
    agent_factory("vgpu", pods=NoPods("no kubeconfig"), without_api_server=True)
    uuid = dp.gpu(0).uuid
    kubelet.latest_devices(MEMORY)
    with caplog.at_level(logging.WARNING, logger="device_plugin.vgpu"):
        for _ in range(2):   # every Allocate, not only the first
            kubelet.allocate(MEMORY, [f"{uuid}::{i}" for i in range(4)])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "NOT enforced" in w and "1024 MiB" in w]) == 2, warnings
