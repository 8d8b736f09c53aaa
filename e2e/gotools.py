"""Third-party programs the tests run (helm, and the cluster's components), built from their Go
modules at pinned versions into a cache outside the tree, keyed by version.

The cache is a fixed directory (``VCUDA_TOOL_CACHE``, default ``/var/cache/vcuda-tools``) so that
CI on a machine that already built a tool reuses it; nothing built here is ever committed.

    python3 e2e/gotools.py helm          # build if missing, print the binary's path
    python3 e2e/gotools.py --list        # what is pinned and what is cached
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path(os.environ.get("VCUDA_TOOL_CACHE", "/var/cache/vcuda-tools"))


@dataclass(frozen=True)
class GoTool:
    """One program of a Go module, installed with `go install package@version`."""

    name: str
    package: str
    version: str
    ldflags: str = ""
    extra: tuple[str, ...] = ()   # further programs of the same module@version, installed beside it
    tags: str = ""

    @property
    def path(self) -> Path:
        return CACHE / f"{self.name}-{self.version}" / "bin" / self.name

    def program(self, prog: str) -> Path:
        return self.path.parent / prog


HELM = GoTool(
    "helm", "helm.sh/helm/v3/cmd/helm", "v3.22.0",
    # Without it helm reports a "+unreleased" version.
    ldflags="-X helm.sh/helm/v3/internal/version.version=v3.22.0",
)


@dataclass(frozen=True)
class WrappedTool:
    """Programs of a Go module whose go.mod replaces its sibling modules with local paths.

    `go install pkg@version` refuses such a module, so it is built from a wrapper module generated in
    the cache (never in the repository): it requires the module at its pinned version and turns each
    local-path `replace` into the sibling's published release (Kubernetes' staging modules `k8s.io/x`
    at v0.Y.Z, etcd's at the same version). The programs' `main` files are copied in, each `main`
    renamed, and one small dispatcher picks the program by argv[0] (or by its first argument), so
    that four Kubernetes servers and kubectl cost one link instead of five. Every program name is a
    symlink to the binary in the same bin directory.
    """

    name: str
    module: str
    version: str
    programs: dict[str, str] = field(hash=False)   # program name -> main package's directory in the module
    ldflags: str = ""

    @property
    def path(self) -> Path:
        return CACHE / f"{self.name}-{self.version}" / "bin" / self.name

    def program(self, prog: str) -> Path:
        return self.path.parent / prog

    def sibling_version(self, module: str) -> str:
        """The published release of a sibling module the main module replaces with a local path."""
        if self.module == "k8s.io/kubernetes":
            return "v0." + self.version.split(".", 1)[1]     # v1.36.3 -> v0.36.3
        return self.version


def kubernetes(version: str) -> WrappedTool:
    """kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy (so that pods reach
    the API server by its Service, as in-cluster clients do) and kubectl of one release."""
    v = version if version.startswith("v") else "v" + version
    major, minor = v[1:].split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        # What `hack/lib/version.sh` sets: without it the servers call themselves v0.0.0-master and
        # the node reports no real version (the API server's emulation version is derived from it).
        flags += [f"-X {pkg}.gitVersion={v}", f"-X {pkg}.gitMajor={major}", f"-X {pkg}.gitMinor={minor}",
                  f"-X {pkg}.gitTreeState=clean", f"-X {pkg}.buildDate=@BUILD_DATE@",
                  f"-X {pkg}.gitCommit=@GIT_COMMIT@"]
    return WrappedTool(
        "kubernetes", "k8s.io/kubernetes", v,
        {"kube-apiserver": "cmd/kube-apiserver", "kube-controller-manager": "cmd/kube-controller-manager",
         "kube-scheduler": "cmd/kube-scheduler", "kubelet": "cmd/kubelet", "kube-proxy": "cmd/kube-proxy",
         "kubectl": "cmd/kubectl"},
        ldflags=" ".join(flags),
    )


def etcd(version: str) -> WrappedTool:
    v = version if version.startswith("v") else "v" + version
    return WrappedTool("etcd", "go.etcd.io/etcd/server/v3", v, {"etcd": ""},
                       ldflags="-X go.etcd.io/etcd/api/v3/version.GitSHA=@GIT_COMMIT@")


KUBERNETES_VERSIONS = ("v1.36.3", "v1.34.4")
ETCD = etcd("v3.6.16")
CONTAINERD = GoTool(
    "containerd", "github.com/containerd/containerd/v2/cmd/containerd", "v2.2.9",
    ldflags="-X github.com/containerd/containerd/v2/version.Version=v2.2.9",
    extra=("github.com/containerd/containerd/v2/cmd/ctr",
           "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"),
    # btrfs needs cgo and its headers; this machine's snapshotter is overlayfs (or native).
    tags="no_btrfs",
)
# The cluster's DNS (Services by name, as every real cluster has: vcuda-scheduler reaches the extender
# at <service>.<namespace>.svc). Its go.mod has no local replaces: plain go install.
COREDNS = GoTool(
    "coredns", "github.com/coredns/coredns", "v1.15.0",
    ldflags="-X github.com/coredns/coredns/coremain.GitCommit=v1.15.0",
)
TOOLS: dict[str, GoTool | WrappedTool] = {t.name: t for t in (HELM, ETCD, CONTAINERD, COREDNS)}
TOOLS.update({f"kubernetes-{v}": kubernetes(v) for v in KUBERNETES_VERSIONS})


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("building the pinned tools needs Go (apt-get install golang-go, or go.dev/dl)")
    return go


def _env(**extra: str) -> dict[str, str]:
    # Static binaries; the main module is ours (the wrapper), so the toolchain on the machine builds.
    return {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-trimpath -buildvcs=false", "GOTOOLCHAIN": "local",
            **extra}


def _run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed ({' '.join(cmd[:3])} ...):\n{(out.stderr or out.stdout)[-4000:]}")
    return out


def _publish(staging: Path, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)   # the cache never holds a half-built tool


def ensure(tool: GoTool | WrappedTool, log=sys.stderr) -> Path:
    """The tool's binary, built into the cache first if it is not there yet."""
    if tool.path.is_file():
        return tool.path
    if isinstance(tool, WrappedTool):
        return _ensure_wrapped(tool, log)
    go = _go()
    staging = tool.path.parent.with_name(tool.path.parent.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    cmd = [go, "install"]
    if tool.ldflags:
        cmd += ["-ldflags", tool.ldflags]
    if tool.tags:
        cmd += ["-tags", tool.tags]
    cmd += [f"{pkg}@{tool.version}" for pkg in (tool.package, *tool.extra)]
    started = time.monotonic()
    print(f"building {tool.name} {tool.version} from {tool.package} (cold: minutes)", file=log, flush=True)
    _run(cmd, f"go install {tool.package}@{tool.version}", env=_env(GOBIN=str(staging)))
    _publish(staging, tool.path.parent)
    print(f"built {tool.name} {tool.version} in {time.monotonic() - started:.0f} s", file=log, flush=True)
    return tool.path


_REPLACE_LOCAL = re.compile(r"^\s*(?:replace\s+)?(\S+)(?:\s+v\S+)?\s+=>\s+(\.\.?/\S*)\s*$")


def _local_replaces(gomod: str) -> list[str]:
    """Modules a go.mod replaces with a local directory (its siblings in the same repository)."""
    return [m.group(1) for line in gomod.splitlines() if (m := _REPLACE_LOCAL.match(line))]


def _module_info(go: str, mod: str, env: dict) -> dict | None:
    out = subprocess.run([go, "mod", "download", "-json", mod], capture_output=True, text=True, env=env)
    info = json.loads(out.stdout) if out.stdout.strip() else {}
    return None if out.returncode != 0 or info.get("Error") else info


def _dispatcher(tool: WrappedTool) -> str:
    cases = "\n".join(f'\tcase "{p}":\n\t\t{_main_name(p)}()' for p in tool.programs)
    names = " ".join(tool.programs)
    return f"""// Generated by vcuda's e2e/gotools.py: one binary for {names}.
package main

import (
\t"fmt"
\t"os"
\t"path/filepath"
)

func main() {{
\tname := filepath.Base(os.Args[0])
\tif !known(name) && len(os.Args) > 1 && known(os.Args[1]) {{
\t\tname = os.Args[1]
\t\tos.Args = append([]string{{name}}, os.Args[2:]...)
\t}}
\tswitch name {{
{cases}
\tdefault:
\t\tfmt.Fprintf(os.Stderr, "usage: {tool.name} PROGRAM [ARGS...] (or call it by a symlink); programs: {names}\\n")
\t\tos.Exit(2)
\t}}
\tos.Exit(0)
}}

func known(name string) bool {{
\tswitch name {{
\tcase {", ".join(f'"{p}"' for p in tool.programs)}:
\t\treturn true
\t}}
\treturn false
}}
"""


def _main_name(prog: str) -> str:
    return "main_" + re.sub(r"\W", "_", prog)


def _ensure_wrapped(tool: WrappedTool, log) -> Path:
    go = _go()
    started = time.monotonic()
    print(f"building {tool.name} {tool.version} ({', '.join(tool.programs)}) from {tool.module} through a "
          f"wrapper module (cold: many minutes)", file=log, flush=True)
    src = CACHE / "src" / f"{tool.name}-{tool.version}"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    env = _env()
    info = _module_info(go, f"{tool.module}@{tool.version}", env)
    if info is None:
        raise RuntimeError(f"the Go module proxy does not serve {tool.module}@{tool.version}")
    gomod = Path(info["GoMod"]).read_text()
    go_line = next((ln.split()[1] for ln in gomod.splitlines() if ln.startswith("go ")), "1.24")
    replaces = []
    for sib in _local_replaces(gomod):
        sv = tool.sibling_version(sib)
        # Some siblings are never published (samples, FORBIDDEN_DEPENDENCY guards): the build does not
        # need them, so they are left out rather than guessed at.
        if _module_info(go, f"{sib}@{sv}", env) is not None:
            replaces.append(f"\t{sib} => {sib} {sv}")
    (src / "go.mod").write_text(
        f"module vcuda.local/{tool.name}\n\ngo {go_line}\n\nrequire {tool.module} {tool.version}\n\n"
        "replace (\n" + "\n".join(replaces) + "\n)\n")
    for prog, rel in tool.programs.items():
        pkg_dir = Path(info["Dir"]) / rel
        mains = [f for f in sorted(pkg_dir.glob("*.go"))
                 if not f.name.endswith("_test.go") and re.search(r"^func main\(\)", f.read_text(), re.M)]
        if len(mains) != 1 or len(list(pkg_dir.glob("*.go"))) - len(list(pkg_dir.glob("*_test.go"))) != 1:
            raise RuntimeError(f"{tool.module}/{rel}: expected one main file, found {[f.name for f in mains]}")
        text = re.sub(r"^func main\(\)", f"func {_main_name(prog)}()", mains[0].read_text(), flags=re.M)
        (src / f"{_main_name(prog)}.go").write_text(text)
    (src / "main.go").write_text(_dispatcher(tool))
    _run([go, "mod", "tidy"], f"go mod tidy in {src}", cwd=src, env=env)
    stamp = json.loads(Path(info["Info"]).read_text()) if info.get("Info") else {}
    when = stamp.get("Time", "1970-01-01T00:00:00Z")       # the release's commit time, as the proxy has it
    commit = (stamp.get("Origin") or info.get("Origin") or {}).get("Hash", "")
    ldflags = "-s -w " + tool.ldflags.replace("@BUILD_DATE@", when).replace("@GIT_COMMIT@", commit)
    staging = tool.path.parent.with_name(tool.path.parent.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    _run([go, "build", "-ldflags", ldflags, "-o", str(staging / tool.name), "."],
         f"building {tool.name} {tool.version}", cwd=src, env=env)
    for prog in tool.programs:
        if prog != tool.name:
            (staging / prog).symlink_to(tool.name)
    _publish(staging, tool.path.parent)
    print(f"built {tool.name} {tool.version} in {time.monotonic() - started:.0f} s", file=log, flush=True)
    return tool.path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tool", nargs="?", choices=sorted(TOOLS), help="build (if missing) and print its path")
    parser.add_argument("--list", action="store_true", help="list the pinned tools and whether each is cached")
    args = parser.parse_args(argv)
    if args.list or args.tool is None:
        for key, t in TOOLS.items():
            source = t.package if isinstance(t, GoTool) else t.module
            print(f"{key}\t{t.version}\t{source}\t{'cached' if t.path.is_file() else 'not built'}")
        return 0
    try:
        print(ensure(TOOLS[args.tool]))
    except RuntimeError as exc:
        print(f"gotools: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
