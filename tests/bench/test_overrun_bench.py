"""bench/overrun_bench.py runs, prints every figure it promises, and refuses a bad count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "bench" / "overrun_bench.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_a_few_scripts_print_every_figure() -> None:
    out = run("--scripts", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("3 scripts (seed 2;"), out.stdout
    for line in ("13/13: below 6.5 % (half its request) in some 100 ms:", "below 8 %:",
                 "50/50: below 48 % (request - 2) in some second:", "mean share"):
        assert line in out.stdout, out.stdout


def test_with_pauses() -> None:
    out = run("--scripts", "2", "--pauses", "--seed", "5")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("2 scripts (seed 5, with pauses;"), out.stdout


def test_no_scripts_is_an_error() -> None:
    out = run("--scripts", "0")
    assert out.returncode == 2 and "--scripts must be at least 1" in out.stderr
