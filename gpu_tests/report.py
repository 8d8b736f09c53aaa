"""Helpers of gpu_tests/run_all.sh: record the machine, merge the suite's figures,
write results.json and summary.md. Standard library only.

  python3 gpu_tests/report.py env                      # JSON facts about this machine
  python3 gpu_tests/report.py summarize --env E --tests T --pytest-exit N --out DIR
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

FRAMEWORK_PROBE = """
import json
out = {}
try:
    import cupy
    out["cupy"] = {"version": cupy.__version__, "runtime": cupy.cuda.runtime.runtimeGetVersion()}
except Exception as e:
    out["cupy"] = {"error": f"{type(e).__name__}: {e}"[:200]}
try:
    import torch
    out["torch"] = {"version": torch.__version__, "runtime": torch.version.cuda,
                    "cuda_available": torch.cuda.is_available()}
except Exception as e:
    out["torch"] = {"error": f"{type(e).__name__}: {e}"[:200]}
try:
    import pynvml
    out["nvidia_ml_py"] = getattr(pynvml, "__version__", "present")
except Exception:
    out["nvidia_ml_py"] = None
print(json.dumps(out))
"""


def _run(cmd: list[str], timeout: float = 120) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO))
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("VCUDA_")}


def frameworks(python: str) -> dict[str, Any]:
    try:
        out = subprocess.run([python, "-c", FRAMEWORK_PROBE], capture_output=True, text=True, timeout=300,
                             env=_plain_env(), cwd="/")
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError, IndexError) as exc:
        return {"error": str(exc)}


def cuda_driver_version() -> int | None:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    v = ctypes.c_int()
    return v.value if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 else None


def machine() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "cuda_driver_version": cuda_driver_version(),
        "git_commit": _run(["git", "rev-parse", "HEAD"]),
        "git_dirty": bool(_run(["git", "status", "--porcelain", "--untracked-files=no"])),
        "vcuda_lib_dir": os.environ.get("VCUDA_LIB_DIR"),
        "gpus": [],
    }
    if shutil.which("nvidia-smi"):
        rows = _run(["nvidia-smi", "--query-gpu=index,name,uuid,driver_version,memory.total",
                     "--format=csv,noheader,nounits"]) or ""
        for line in rows.splitlines():
            idx, name, uuid, driver, total = (c.strip() for c in line.split(","))
            facts["gpus"].append({"index": int(idx), "name": name, "uuid": uuid, "driver_version": driver,
                                  "memory_total_mib": int(total)})
        facts["driver_version"] = facts["gpus"][0]["driver_version"] if facts["gpus"] else None
    try:
        sys.path.insert(0, str(REPO))
        from py_vcuda import __version__, native

        facts["vcuda_version"] = __version__
        facts["libvcuda"] = str(native.lib_path(native.SHIM))
    except Exception as exc:  # missing library: say so in the results
        facts["libvcuda"] = f"unavailable: {exc}"
    facts["frameworks"] = frameworks(sys.executable)
    cuda12 = os.environ.get("VCUDA_CUDA12_PYTHON")
    if cuda12:
        facts["cuda12_python"] = cuda12
        facts["cuda12_frameworks"] = frameworks(cuda12)
    return facts


# --------------------------------------------------------------------------
# summary
# --------------------------------------------------------------------------


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, default=str, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


SKIP_FIGURES = {"samples_ms", "owners", "loaded_libs", "init", "released", "nvml_context_per_process",
                "nvml_holding_per_process"}


def summary_md(results: dict[str, Any]) -> str:
    env, suite = results.get("environment", {}), results.get("suite", {})
    tests: dict[str, Any] = suite.get("tests", {})
    counts: dict[str, int] = {}
    for t in tests.values():
        counts[t.get("outcome") or "unknown"] = counts.get(t.get("outcome") or "unknown", 0) + 1
    gpus = env.get("gpus") or []
    fw = env.get("frameworks", {})
    lines = [
        "# vcuda gpu_tests run",
        "",
        f"- date: {env.get('date')}",
        f"- GPU: {', '.join(g['name'] + ' (' + str(g['memory_total_mib']) + ' MiB)' for g in gpus) or 'none found'}",
        f"- driver: {env.get('driver_version')}, CUDA driver API {env.get('cuda_driver_version')}",
        f"- CuPy: {_short(fw.get('cupy'))}",
        f"- PyTorch: {_short(fw.get('torch'))}",
    ]
    if env.get("cuda12_python"):
        lines.append(f"- CUDA 12 interpreter {env['cuda12_python']}: {_short(env.get('cuda12_frameworks'))}")
    lines += [
        f"- vcuda {env.get('vcuda_version')} at commit {env.get('git_commit')}"
        f"{' (with local changes)' if env.get('git_dirty') else ''}; libvcuda: {env.get('libvcuda')}",
        f"- pytest exit status: {results.get('pytest_exit')}; outcomes: "
        + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none recorded"),
    ]
    if suite.get("skip_reason"):
        lines += ["", f"**Nothing measured:** {suite['skip_reason']}"]
    lines += ["", "## Tests", ""]
    for nodeid, t in sorted(tests.items()):
        lines.append(f"### {nodeid} — {t.get('outcome')}")
        if t.get("reason") and t.get("outcome") != "passed":
            reason = t["reason"].strip().splitlines()
            lines.append("")
            lines.append("```")
            lines.extend(reason[-15:])
            lines.append("```")
        figures = {k: v for k, v in (t.get("figures") or {}).items() if k not in SKIP_FIGURES}
        if figures:
            lines.append("")
            lines.extend(f"- {k}: {_short(v)}" for k, v in sorted(figures.items()))
        lines.append("")
    return "\n".join(lines) + "\n"


def summarize(env_path: Path, tests_path: Path, pytest_exit: int, out_dir: Path) -> int:
    env = json.loads(env_path.read_text()) if env_path.is_file() else {}
    suite = json.loads(tests_path.read_text()) if tests_path.is_file() else {}
    results = {"environment": env, "suite": suite, "pytest_exit": pytest_exit}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True, default=str) + "\n")
    (out_dir / "summary.md").write_text(summary_md(results))
    if pytest_exit != 0:
        return pytest_exit
    if not suite:
        print("report: the suite wrote no results file", file=sys.stderr)
        return 4
    if suite.get("skip_reason"):
        print(f"report: nothing was measured: {suite['skip_reason']}", file=sys.stderr)
        return 3
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="print facts about this machine as JSON")
    p = sub.add_parser("summarize", help="write results.json and summary.md")
    p.add_argument("--env", type=Path, required=True)
    p.add_argument("--tests", type=Path, required=True)
    p.add_argument("--pytest-exit", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "env":
        print(json.dumps(machine(), indent=2, sort_keys=True, default=str))
        return 0
    return summarize(args.env, args.tests, args.pytest_exit, args.out)


if __name__ == "__main__":
    sys.exit(main())
