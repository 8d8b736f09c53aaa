"""`vcuda run` on bare metal reconciles its ledger too: module code loaded
lazily counts against --memory within a reconciler interval."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from simtool import lines, parse

OOM = 2


@pytest.mark.parametrize(("code", "alloc_rc"), [("0", 0), ("300Mi", OOM)])
def test_vcuda_run_counts_lazy_module_code(sim_tool: Path, tmp_path: Path, code: str, alloc_rc: int) -> None:
    # 64 MiB context + `code` of kernel code, then 700 MiB: fits 1 GiB only without the code.
    cmd = [str(sim_tool), "init", "primary", "0", "module", f"vcudasim-module;kernel k code={code}", "fn", "k",
           "run", "0", "sleep", "1500", "alloc", "700M"]  # 1.5 s: three reconciler intervals
    env = {k: v for k, v in os.environ.items()
           if (not k.startswith("VCUDA_") or k == "VCUDA_LIB_DIR") and k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-m", "py_vcuda", "run", "--simulate", "--sim-state",
                          str(tmp_path / "sim"), "--memory", "1Gi", "--", *cmd],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert lines(parse(out.stdout), "alloc")[0].rc == alloc_rc, out.stdout + out.stderr
