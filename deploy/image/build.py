"""Build vcuda's image (deploy/image/Containerfile) with podman, buildah or docker, offline too.

    deploy/image/build --tag registry.example.com/vcuda:0.1.0 --push   # public base, wheels built inside
    deploy/image/build --offline --output vcuda.oci.tar                # no registry: Debian base, host wheels
    deploy/image/build --offline --containerfile DIR/Containerfile --context DIR --tag localhost/pause:e2e

Online, the Containerfile's builder stage compiles vcuda's wheel on the public base (docker.io's
python:3.11-slim-bookworm unless --base says otherwise). Offline (--offline), nothing comes from a
container registry: the base is made from Debian packages with mmdebstrap, cached by its recipe (suite,
mirror, package list) in $VCUDA_TOOL_CACHE/image-base (default /var/cache/vcuda-tools) and imported into
the builder's store; vcuda's wheel and its dependencies' wheels are made on the host into .whl/ (PyPI,
or pip's cache) and the build itself runs with no network. Any other Containerfile can be built offline
from the same kind of base (it gets it as the build argument BASE; --base-package adds packages).

--output writes an OCI archive (index.json names the image, org.opencontainers.image.ref.name = the
tag) that containerd imports as it is, for kubelet in the k8s.io namespace:
    ctr -n k8s.io images import vcuda.oci.tar
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "deploy" / "image" / "Containerfile"
WHEELS = REPO / ".whl"
BUILDERS = ("podman", "buildah", "docker")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
IMAGE_NAME = "localhost/vcuda"

Which = Callable[[str], "str | None"]


class BuildError(RuntimeError):
    """A build step failed; the message says which and what to do."""


def tool_cache() -> Path:
    return Path(os.environ.get("VCUDA_TOOL_CACHE", "/var/cache/vcuda-tools"))


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


# --- which builder, which runtime --------------------------------------------------------------

def choose_builder(requested: str | None, which: Which | None = None) -> str:
    """The builder asked for, or the first of podman, buildah, docker on PATH."""
    which = which or shutil.which
    if requested:
        if requested not in BUILDERS:
            raise BuildError(f"unknown builder {requested!r}: choose one of {', '.join(BUILDERS)}")
        if which(requested) is None:
            raise BuildError(f"--builder {requested}: {requested} is not on PATH")
        return requested
    for name in BUILDERS:
        if which(name):
            return name
    raise BuildError("no image builder found: install podman, buildah or docker "
                     "(Debian: apt-get install podman), or name one with --builder")


def choose_runtime(builder: str, requested: str | None, cgroup_v2: bool, which: Which | None = None) -> str | None:
    """The OCI runtime podman/buildah run the build's RUN steps with (None: their default).

    On a cgroup v1 host crun (Debian's default for podman) can refuse to start containers ("cgroups in
    hybrid mode not supported"), so runc is chosen there when it is installed. docker's daemon picks
    its own runtime."""
    if builder == "docker":
        if requested:
            raise BuildError("--runtime does not apply to docker: its daemon's configuration picks the runtime")
        return None
    if requested:
        return requested
    if not cgroup_v2 and (which or shutil.which)("runc"):
        return "runc"
    return None


def host_cgroup_v2() -> bool:
    return Path("/sys/fs/cgroup/cgroup.controllers").exists()


# --- the commands, per builder (pure: tested without a builder) ---------------------------------

@dataclass(frozen=True)
class Builder:
    name: str
    runtime: str | None = None

    def build(self, containerfile: Path, context: Path, tag: str, build_args: dict[str, str],
              network: bool = True) -> list[str]:
        cmd = [self.name, "bud" if self.name == "buildah" else "build"]
        if self.runtime:
            cmd += ["--runtime", self.runtime]
        cmd += ["-f", str(containerfile), "-t", tag]
        for key, value in build_args.items():
            cmd += ["--build-arg", f"{key}={value}"]
        if not network:
            cmd += ["--network=none"]
        if self.name != "docker":
            cmd += ["--pull=missing" if network else "--pull=never"]
        return [*cmd, str(context)]

    def exists(self, image: str) -> list[str]:
        if self.name == "podman":
            return ["podman", "image", "exists", image]
        if self.name == "buildah":
            return ["buildah", "inspect", "--type", "image", image]
        return ["docker", "image", "inspect", image]

    def import_rootfs(self, tarball: Path, image: str) -> list[list[str]]:
        """Commands that turn a root filesystem tarball into the image `image`."""
        if self.name == "buildah":
            work = f"vcuda-base-import-{os.getpid()}"
            return [["buildah", "from", "--name", work, "scratch"],
                    ["buildah", "add", work, str(tarball), "/"], ["buildah", "commit", "--rm", work, image]]
        return [[self.name, "import", str(tarball), image]]

    def save(self, tag: str, output: Path) -> list[str]:
        """Write the image as an OCI archive (docker: its own `save` format, which ctr imports too)."""
        if self.name == "podman":
            return ["podman", "save", "--format", "oci-archive", "-o", str(output), tag]
        if self.name == "buildah":
            return ["buildah", "push", tag, f"oci-archive:{output}:{tag}"]
        return ["docker", "save", "-o", str(output), tag]

    def push(self, tag: str) -> list[str]:
        if self.name == "buildah":
            return ["buildah", "push", tag, f"docker://{tag}"]
        return [self.name, "push", tag]

    def size(self, tag: str) -> list[str]:
        """Prints the image's uncompressed size in bytes."""
        if self.name == "buildah":
            return ["podman", "image", "inspect", "--format", "{{.Size}}", tag]   # buildah shares podman's store
        return [self.name, "image", "inspect", "--format", "{{.Size}}", tag]


# --- the local Debian base -----------------------------------------------------------------------

@dataclass(frozen=True)
class DebianBase:
    """A root filesystem from Debian packages (mmdebstrap), made once per recipe and cached."""

    suite: str = "bookworm"
    mirror: str = DEFAULT_MIRROR
    # libstdc++6: pyzmq's and grpcio's wheels link it (apt brings it into other bases)
    packages: tuple[str, ...] = ("python3", "python3-venv", "libstdc++6")
    # Essential packages only (no apt): the image installs nothing at run time.
    variant: str = "essential"
    # Documentation, manual pages and translations are left out.
    dpkg_options: tuple[str, ...] = (
        "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/info/*", "path-exclude=/usr/share/locale/*",
        "path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
    )
    recipe_version: int = 1   # bump when the way the base is made changes

    def key(self) -> str:
        recipe = {"suite": self.suite, "mirror": self.mirror, "packages": sorted(set(self.packages)),
                  "variant": self.variant, "dpkg": list(self.dpkg_options), "recipe": self.recipe_version,
                  "arch": os.uname().machine}
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def image(self) -> str:
        return f"localhost/vcuda-debian-base:{self.suite}-{self.key()}"

    def tarball(self, cache: Path) -> Path:
        return cache / "image-base" / f"debian-{self.suite}-{self.key()}.tar"

    def mmdebstrap(self, output: Path) -> list[str]:
        cmd = ["mmdebstrap", "--format=tar", f"--variant={self.variant}", "--include=" + ",".join(self.packages),
               # merged /usr made by the hook, not by the usrmerge package (which pulls in perl)
               "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr", "--skip=output/dev"]
        cmd += [f"--dpkgopt={opt}" for opt in self.dpkg_options]
        return [*cmd, self.suite, str(output), self.mirror]


def rootfs_python(tarball: Path) -> str | None:
    """The X.Y of the python3 a root filesystem tarball holds (from /usr/bin/python3's link)."""
    with tarfile.open(tarball) as tar:
        for name in ("./usr/bin/python3", "usr/bin/python3"):
            try:
                member = tar.getmember(name)
            except KeyError:
                continue
            target = member.linkname.rsplit("/", 1)[-1]
            return target.removeprefix("python") if target.startswith("python3.") else None
    return None


# --- running things ------------------------------------------------------------------------------

@dataclass
class Runner:
    """Runs commands, echoing them; failures become BuildError with the command's last output."""

    log: TextIO = field(default_factory=lambda: sys.stderr)

    def say(self, text: str) -> None:
        print(f"build: {text}", file=self.log, flush=True)

    def __call__(self, cmd: Sequence[str], *, env: dict[str, str] | None = None, check: bool = True,
                 capture: bool = False, what: str = "") -> subprocess.CompletedProcess[str]:
        if not capture:
            self.say("$ " + " ".join(cmd))
        out = subprocess.run(list(cmd), env=env, text=True, capture_output=capture)
        if check and out.returncode != 0:
            tail = ((out.stdout or "") + (out.stderr or ""))[-4000:]
            raise BuildError(f"{what or cmd[0]} failed (exit {out.returncode}): {' '.join(cmd)}\n{tail}".rstrip())
        return out


def ensure_base(base: DebianBase, builder: Builder, run: Runner, refresh: bool = False) -> Path:
    """The base's tarball in the cache (made with mmdebstrap if missing) and its image in the builder's store."""
    tarball = base.tarball(tool_cache())
    if refresh:
        tarball.unlink(missing_ok=True)
    if not tarball.is_file():
        if shutil.which("mmdebstrap") is None:
            raise BuildError("--offline makes its base with mmdebstrap, which is not installed "
                             "(Debian: apt-get install mmdebstrap)")
        tarball.parent.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".partial")
        started = time.monotonic()
        run.say(f"making the Debian {base.suite} base ({', '.join(base.packages)}) from {base.mirror} (cold: a minute)")
        out = run(base.mmdebstrap(partial), check=False, capture=True)
        if out.returncode != 0:
            partial.unlink(missing_ok=True)
            raise BuildError(f"mmdebstrap could not make the base from {base.mirror} (are Debian's packages "
                             f"reachable? --mirror names another mirror):\n{(out.stdout + out.stderr)[-3000:]}")
        partial.rename(tarball)   # the cache never holds a half-made base
        run.say(f"made {tarball} in {time.monotonic() - started:.0f} s")
    present = run(builder.exists(base.image), check=False, capture=True).returncode == 0
    if refresh or not present:
        for cmd in builder.import_rootfs(tarball, base.image):
            run(cmd, what="importing the base")
    return tarball


# --- wheels made on the host ---------------------------------------------------------------------

def source_key(repo: Path, paths: Sequence[str] = ()) -> str | None:
    """A hash of every file git would ship (tracked or untracked, not ignored), or of those under `paths`;
    None outside git."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "-c", "-o", "--exclude-standard", "--", *paths],
                         capture_output=True)
    if out.returncode != 0:
        return None
    digest = hashlib.sha256()
    for name in sorted(set(out.stdout.decode().split("\0")) - {""}):
        path = repo / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def python_version(python: str) -> str:
    out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise BuildError(f"cannot run {python}: {out.stderr.strip()}")
    return out.stdout.strip()


def _stamp(folder: Path) -> Path:
    # beside the folder, not in it: the folder is copied into the image, its key must not be
    return folder.with_name(folder.name + ".key")


def _stamped(folder: Path, key: str) -> bool:
    stamp = _stamp(folder)
    return stamp.is_file() and stamp.read_text() == key and any(folder.glob("*.whl"))


def _restamp(folder: Path) -> None:
    _stamp(folder).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def build_wheels(python: str, run: Runner, out: Path = WHEELS, repo: Path = REPO) -> None:
    """vcuda's wheel into out/vcuda and its dependencies' into out/deps, each rebuilt only when its input
    changed (the sources; the dependency list and Python version)."""
    version = python_version(python)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    commit_time = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%ct"], capture_output=True, text=True)
    if commit_time.returncode == 0 and commit_time.stdout.strip():
        env["SOURCE_DATE_EPOCH"] = commit_time.stdout.strip()   # the same sources give the same wheel, byte for byte
    src = source_key(repo)
    vcuda_dir = out / "vcuda"
    vcuda_key = f"{version} {src}"
    if src is None or not _stamped(vcuda_dir, vcuda_key):
        _restamp(vcuda_dir)
        run([python, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(vcuda_dir), str(repo)],
            env=env, what="building vcuda's wheel")
        _stamp(vcuda_dir).write_text(vcuda_key)
    else:
        run.say(f"vcuda's wheel is up to date in {vcuda_dir}")
    deps_dir = out / "deps"
    deps_key = json.dumps({"python": version, "dependencies": sorted(project()["dependencies"])})
    if not _stamped(deps_dir, deps_key):
        _restamp(deps_dir)
        wheel = next(vcuda_dir.glob("vcuda-*.whl"))
        run([python, "-m", "pip", "wheel", "--wheel-dir", str(deps_dir), str(wheel)], env=env,
            what="fetching the dependencies' wheels (PyPI or pip's cache)")
        for own in deps_dir.glob("vcuda-*.whl"):
            own.unlink()
        _stamp(deps_dir).write_text(deps_key)
    else:
        run.say(f"the dependencies' wheels are up to date in {deps_dir}")


# --- the whole build -----------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    version = project()["version"]
    parser = argparse.ArgumentParser(prog="deploy/image/build", description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--builder", choices=BUILDERS, help="default: the first of podman, buildah, docker found")
    parser.add_argument("--tag", default=f"{IMAGE_NAME}:{version}", help="the image's name (default: %(default)s)")
    parser.add_argument("--push", action="store_true", help="push --tag to its registry after the build")
    parser.add_argument("--output", type=Path, metavar="FILE", help="also write the image to FILE as an OCI archive")
    parser.add_argument("--offline", action="store_true",
                        help="no registry: a base made from Debian packages, vcuda's wheels made on the host")
    parser.add_argument("--base", help="online: the base image (default: the Containerfile's, python:3.11-slim)")
    parser.add_argument("--containerfile", type=Path, default=CONTAINERFILE,
                        help="build another Containerfile (it gets BASE as a build argument; default: vcuda's)")
    parser.add_argument("--context", type=Path, help="build context (default: the repository, for vcuda's own)")
    parser.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE", help="passed to the builder")
    parser.add_argument("--runtime", help="OCI runtime for podman/buildah (default: runc on a cgroup v1 host)")
    offline = parser.add_argument_group("offline base")
    offline.add_argument("--suite", default="bookworm", help="Debian suite (default: %(default)s)")
    offline.add_argument("--mirror", default=os.environ.get("VCUDA_DEBIAN_MIRROR", DEFAULT_MIRROR),
                         help="Debian mirror (default: $VCUDA_DEBIAN_MIRROR or %(default)s)")
    offline.add_argument("--base-package", action="append", default=[], metavar="PKG",
                         help="one more Debian package in the base (a base of its own, cached apart)")
    offline.add_argument("--refresh-base", action="store_true", help="make the cached base again (newer packages)")
    offline.add_argument("--python", default=sys.executable,
                         help="the host Python that makes the wheels; must match the base's (default: this one)")
    args = parser.parse_args(argv)
    if args.base and args.offline:
        parser.error("--base and --offline exclude each other: offline, the base is made from Debian packages")
    if args.push and args.tag.startswith("localhost/"):
        parser.error(f"--push needs a --tag in your registry (registry.example.com/vcuda:{version}), not {args.tag}")
    for item in args.build_arg:
        if "=" not in item:
            parser.error(f"--build-arg {item!r}: expected KEY=VALUE")
    args.containerfile = args.containerfile.resolve()
    default_context = REPO if args.containerfile == CONTAINERFILE else args.containerfile.parent
    args.context = (args.context or default_context).resolve()
    return args


def build_args_for(args: argparse.Namespace, base_image: str | None) -> dict[str, str]:
    """The build arguments: BASE, WHEELS (vcuda's Containerfile), version labels, then the user's."""
    result: dict[str, str] = {}
    if base_image:
        result["BASE"] = base_image
    if args.containerfile == CONTAINERFILE:
        result["WHEELS"] = "context" if args.offline else "build"
        result["VERSION"] = project()["version"]
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
        if rev.returncode == 0:
            result["REVISION"] = rev.stdout.strip()
    result.update(item.split("=", 1) for item in args.build_arg)
    return result


def main(argv: Sequence[str] | None = None, run: Runner | None = None) -> int:
    args = parse_args(argv)
    run = run or Runner()
    started = time.monotonic()
    try:
        builder = Builder(choose_builder(args.builder), None)
        builder = Builder(builder.name, choose_runtime(builder.name, args.runtime, host_cgroup_v2()))
        if not args.containerfile.is_file():
            raise BuildError(f"no Containerfile at {args.containerfile}")
        base_image = args.base
        if args.offline:
            base = DebianBase(suite=args.suite, mirror=args.mirror,
                              packages=tuple(dict.fromkeys([*DebianBase.packages, *args.base_package])))
            tarball = ensure_base(base, builder, run, refresh=args.refresh_base)
            base_image = base.image
            if args.containerfile == CONTAINERFILE:
                have, want = python_version(args.python), rootfs_python(tarball)
                if want and have != want:
                    raise BuildError(f"the base's Python is {want} but {args.python} is {have}: the wheels must "
                                     f"be made for {want} (--python python{want})")
                build_wheels(args.python, run)
        run(builder.build(args.containerfile, args.context, args.tag, build_args_for(args, base_image),
                          network=not args.offline), what="the image build")
        size = run(builder.size(args.tag), check=False, capture=True)
        if size.returncode == 0 and size.stdout.strip().isdigit():
            run.say(f"{args.tag}: {int(size.stdout) / 1e6:.0f} MB uncompressed")
        if args.output:
            output = args.output.resolve()
            output.unlink(missing_ok=True)
            run(builder.save(args.tag, output), what="writing the OCI archive")
            run.say(f"wrote {output}; containerd: ctr -n k8s.io images import {output}")
        if args.push:
            run(builder.push(args.tag), what=f"pushing {args.tag}")
    except BuildError as exc:
        print(f"build: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:   # the cache or .whl/ not writable, a builder gone missing
        print(f"build: error: {exc} (the base's cache is $VCUDA_TOOL_CACHE, now {tool_cache()})", file=sys.stderr)
        return 1
    run.say(f"built {args.tag} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
