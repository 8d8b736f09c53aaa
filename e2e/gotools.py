"""Third-party programs the tests run (helm, and the cluster's components), built from their Go
modules at pinned versions into a cache outside the tree, keyed by version.

The cache is a fixed directory (``VCUDA_TOOL_CACHE``, default ``/var/cache/vcuda-tools``) so that
CI on a machine that already built a tool reuses it; nothing built here is ever committed.

    python3 e2e/gotools.py helm          # build if missing, print the binary's path
    python3 e2e/gotools.py --list        # what is pinned and what is cached
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("VCUDA_TOOL_CACHE", "/var/cache/vcuda-tools"))


@dataclass(frozen=True)
class GoTool:
    """One program of a Go module, installed with `go install package@version`."""

    name: str
    package: str
    version: str
    ldflags: str = ""

    @property
    def path(self) -> Path:
        return CACHE / f"{self.name}-{self.version}" / "bin" / self.name


HELM = GoTool(
    "helm", "helm.sh/helm/v3/cmd/helm", "v3.22.0",
    # Without it helm reports a "+unreleased" version.
    ldflags="-X helm.sh/helm/v3/internal/version.version=v3.22.0",
)
TOOLS = {t.name: t for t in (HELM,)}


def ensure(tool: GoTool, log=sys.stderr) -> Path:
    """The tool's binary, built into the cache first if it is not there yet."""
    if tool.path.is_file():
        return tool.path
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(f"building {tool.name} {tool.version} needs Go (apt-get install golang-go)")
    staging = tool.path.parent.with_name(tool.path.parent.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    env = {**os.environ, "GOBIN": str(staging), "CGO_ENABLED": "0", "GOFLAGS": "-trimpath"}
    cmd = [go, "install"]
    if tool.ldflags:
        cmd += ["-ldflags", tool.ldflags]
    cmd.append(f"{tool.package}@{tool.version}")
    started = time.monotonic()
    print(f"building {tool.name} {tool.version} from {tool.package} (cold: minutes)", file=log, flush=True)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"go install {tool.package}@{tool.version} failed:\n{out.stderr[-4000:]}")
    tool.path.parent.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tool.path.parent, ignore_errors=True)
    staging.rename(tool.path.parent)   # the cache never holds a half-built tool
    print(f"built {tool.name} in {time.monotonic() - started:.0f} s", file=log, flush=True)
    return tool.path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tool", nargs="?", choices=sorted(TOOLS), help="build (if missing) and print its path")
    parser.add_argument("--list", action="store_true", help="list the pinned tools and whether each is cached")
    args = parser.parse_args(argv)
    if args.list or args.tool is None:
        for t in TOOLS.values():
            print(f"{t.name}\t{t.version}\t{t.package}\t{'cached' if t.path.is_file() else 'not built'}")
        return 0
    try:
        print(ensure(TOOLS[args.tool]))
    except RuntimeError as exc:
        print(f"gotools: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
