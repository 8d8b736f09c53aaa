"""`vcuda top`: a fixed snapshot rendered to text, one frame of a real bare-metal `vcuda run`, and one
frame of a node agent's state directory with names from a stand-in kubelet."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from monitoring.conftest import CORE, GiB, MiB, wait_for
from monitoring.snapshots import SNAPSHOT
from rich.console import Console

from device_plugin.testing import TestPodResources
from node_state.layout import ContainerRecord, NodeLayout, ledger_in
from node_state.metrics_snapshot import NodeSnapshot
from py_vcuda import cli, native, top
from py_vcuda.ledger import Ledger
from py_vcuda.sim import SimConfig


def render_text(snap: NodeSnapshot) -> str:
    console = Console(file=io.StringIO(), width=160, record=True, color_system=None)
    console.print(top.render(snap))
    return console.export_text()


def test_render_fixed_snapshot() -> None:
    text = render_text(SNAPSHOT)
    lines = text.splitlines()
    assert lines[0] == "vcuda top — node-a"
    assert "GPU 0  Sim GPU  [vgpu]  util 55%  mem 2.0 GiB / 16.0 GiB  42°C  75 W  scheduler up" in text
    assert "GPU 1  Sim GPU  [vgpu]  util 0%  mem 0 B / 16.0 GiB" in text
    train = next(line for line in lines if "team-a/train-0/main" in line)
    for cell in ("vgpu", "normal", "30%", "50%", "31%", "320.0 MiB / 1.0 GiB", "512.0 MiB", "5.0 / 12.0 ms", "42",
                 "3 / 120"):
        assert cell in train, (cell, train)
    bare = next(line for line in lines if "python3 train.py" in line)
    assert "500.0 MiB / 512.0 MiB" in bare and "10%" in bare and "200.0 / 200.0 ms" in bare
    assert "high" in bare and "0 / 0" in bare
    assert "(no tenants)" in text  # GPU 1
    assert "! token scheduler of GPU 3 (/x) did not answer" in text
    assert text == render_text(SNAPSHOT)  # pure: same snapshot, same frame


def test_render_marks_starved_and_full_tenants() -> None:
    console = Console(file=io.StringIO(), width=160, record=True, color_system="standard", force_terminal=True)
    console.print(top.render(SNAPSHOT))
    styled = console.export_text(styles=True)
    bare = next(line for line in styled.splitlines() if "python3 train.py" in line)
    assert "\x1b[31m  10%" in bare and "\x1b[31m500.0 MiB / 512.0 MiB" in bare  # red: starved, at its limit
    train = next(line for line in styled.splitlines() if "team-a/train-0/main" in line)
    assert "\x1b[31m" not in train


def test_render_without_gpus() -> None:
    assert "no GPUs and no tenants found" in render_text(NodeSnapshot("n", "vgpu", (), (), ()))


def test_once_shows_a_bare_metal_vcuda_run(build_c: Callable[..., Path], monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    cuprobe = build_c(["cuprobe.c"])
    root = Path(tempfile.mkdtemp(prefix="vc", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
    env.update(XDG_RUNTIME_DIR=str(root), COLUMNS="200")
    sim_state = root / "sim.state"
    run = subprocess.Popen(
        [sys.executable, "-m", "py_vcuda", "run", "--simulate", "--sim-state", str(sim_state), "--memory", "1Gi",
         "--", str(cuprobe), "init", "ctx", f"alloc:{256 * MiB}", "hold"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert run.stdout is not None
        wait_for(lambda: "holding" in run.stdout.readline(), 60, "the run to allocate")  # type: ignore[union-attr]
        records = list((root / f"vcuda-{os.getuid()}" / "containers").iterdir())
        assert [r.name for r in records] == [f"run-{run.pid}"]
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(root))
        monkeypatch.setenv("COLUMNS", "200")
        monkeypatch.setenv("VCUDA_SIM_STATE", str(sim_state))
        monkeypatch.setenv("VCUDA_REAL_LIBNVML", str(native.lib_path(native.SIM_NVML)))
        assert cli.main(["top", "--once", "--simulate"]) == 0
        out = capsys.readouterr().out
        line = next(line for line in out.splitlines() if "cuprobe" in line)
        assert "320.0 MiB / 1.0 GiB" in line, out  # 256 MiB + the 64 MiB context
        assert "GPU 0" in out
        run.communicate("\n", timeout=60)
        assert run.returncode == 0
        assert not list((root / f"vcuda-{os.getuid()}" / "containers").iterdir())  # the run removed its record
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        shutil.rmtree(root, ignore_errors=True)


def test_once_on_a_node_names_pods_through_pod_resources(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`vcuda top --state-dir` (a node agent's state directory): names a record lacks come from the kubelet's
    pod-resources socket; a GPU without tenants shows `--mode`, else the records' most common mode."""
    root = Path(tempfile.mkdtemp(prefix="vc", dir="/tmp"))
    uuids = [f"GPU-7e57{i:04d}-0000-4000-8000-00000000000{i}" for i in range(3)]
    sim = SimConfig(state_path=root / "sim.state", devices=3, memory=16 * GiB, uuids=uuids)
    for key, value in sim.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(root / "user"))  # no `vcuda run` records of this user
    monkeypatch.setenv("COLUMNS", "200")
    layout = NodeLayout(root / "state")
    web = ContainerRecord(key="c-web", mode="vgpu", resource=CORE, device_ids=tuple(f"{uuids[0]}::{i}" for i in
                          range(30)), gpus=(uuids[0],), core_request=30, core_limit=50, memory_limit=GiB,
                          tenant="c-web")
    orphan = ContainerRecord(key="c-orphan", mode="vgpu", resource=CORE, device_ids=(f"{uuids[0]}::40",),
                             gpus=(uuids[0],), core_request=1, core_limit=1, memory_limit=None, tenant="c-orphan")
    mps = ContainerRecord(key="c-mps", mode="mps", resource="nvidia.com/mps-core", device_ids=(f"{uuids[1]}::0",),
                          gpus=(uuids[1],), core_request=20, core_limit=20, memory_limit=2 * GiB,
                          namespace="team-d", pod="mps-0", container="a")
    for record in (web, orphan, mps):
        directory = layout.write_record(record)
        if record.mode == "vgpu":
            with Ledger(ledger_in(directory), create=True) as ledger:
                ledger.set_limit(uuids[0], record.memory_limit)
    kubelet = TestPodResources(root / "kubelet.sock")
    kubelet.owners = {("team-w", "web-0", "server"): {CORE: list(web.device_ids)}}
    kubelet.start()

    def frame(*extra: str) -> dict[str, str]:
        assert cli.main(["top", "--once", "--simulate", "--state-dir", str(root / "state"), *extra]) == 0
        out = capsys.readouterr().out
        lines = out.splitlines()
        return {"all": out, **{f"gpu{i}": next(line for line in lines if line.startswith(f"GPU {i} "))
                               for i in range(3)},
                "web": next((line for line in lines if "web-0" in line), ""),
                "orphan": next(line for line in lines if "c-orphan" in line)}

    try:
        f = frame("--pod-resources-socket", str(root / "kubelet.sock"))
        assert "team-w/web-0/server" in f["web"], f["all"]
        for cell in ("vgpu", "30%", "50%", "0 B / 1.0 GiB"):
            assert cell in f["web"], (cell, f["web"])
        assert "[vgpu]" in f["gpu0"] and "[mps]" in f["gpu1"]
        assert "[vgpu]" in f["gpu2"]  # no tenants: the records' most common mode
        assert "team-d/mps-0/a" in f["all"]
        assert "!" not in f["all"]
        f = frame("--pod-resources-socket", str(root / "kubelet.sock"), "--mode", "pgpu")
        assert "[pgpu]" in f["gpu2"] and "[vgpu]" in f["gpu0"] and "[mps]" in f["gpu1"]
        # no kubelet: the records' own names, and the reason on the frame
        f = frame("--pod-resources-socket", str(root / "absent.sock"))
        assert f["web"] == "" and "c-web" in f["all"]
        assert "! no kubelet pod-resources socket at" in f["all"]
    finally:
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
