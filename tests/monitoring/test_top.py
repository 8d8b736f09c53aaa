"""`vcuda top`: a fixed snapshot rendered to text, and one frame of a real bare-metal `vcuda run`."""

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
from monitoring.conftest import MiB, wait_for
from monitoring.snapshots import SNAPSHOT
from rich.console import Console

from device_plugin.metrics_snapshot import NodeSnapshot
from py_vcuda import cli, native, top


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
    for cell in ("vgpu", "30%", "50%", "31%", "320.0 MiB / 1.0 GiB", "512.0 MiB", "5.0 / 12.0 ms", "42"):
        assert cell in train, (cell, train)
    bare = next(line for line in lines if "python3 train.py" in line)
    assert "500.0 MiB / 512.0 MiB" in bare and "10%" in bare and "200.0 / 200.0 ms" in bare
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
