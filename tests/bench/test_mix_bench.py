"""bench/mix_bench.py runs, prints every figure it promises, and refuses a bad count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "bench" / "mix_bench.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_a_few_mixes_print_every_figure() -> None:
    out = run("--seeds", "31", "--mixes", "4")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("4 mixes (seeds 31, 4 each;"), out.stdout
    for line in ("tenants above L + 1 pp in some second: 0", "busy tenants more than 0.5 pp under it",
                 "the most under what the busy tenants' limits allow", "below R - 2 in some second",
                 "below R / 2 in some 100 ms"):
        assert line in out.stdout, out.stdout


def test_no_mixes_is_an_error() -> None:
    out = run("--mixes", "0")
    assert out.returncode == 2 and "--mixes must be at least 1" in out.stderr


def test_beside_a_high_tenant() -> None:
    out = run("--seeds", "31", "--mixes", "3", "--high")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("3 mixes (seeds 31, 3 each;") and "each beside a high tenant" in out.stdout, out.stdout
    assert "tenants above L + 1 pp in some second: 0" in out.stdout, out.stdout
