"""deploy/image/build's pure parts: arguments, which builder and runtime, the commands it runs, the
cached base's key, and its errors; no builder is run."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def which_of(*present: str):
    return lambda name: f"/usr/bin/{name}" if name in present else None


@pytest.mark.parametrize(("desc", "present", "requested", "expected"), [
    ("podman first", ("docker", "buildah", "podman"), None, "podman"),
    ("then buildah", ("docker", "buildah"), None, "buildah"),
    ("docker last", ("docker",), None, "docker"),
    ("asked for, present", ("podman", "docker"), "docker", "docker"),
])
def test_builder_choice(build: ModuleType, desc: str, present: tuple[str, ...], requested: str | None,
                        expected: str) -> None:
    assert build.choose_builder(requested, which_of(*present)) == expected, desc


@pytest.mark.parametrize(("desc", "present", "requested", "message"), [
    ("none at all", (), None, "no image builder found: install podman, buildah or docker"),
    ("asked for, missing", ("podman",), "docker", "--builder docker: docker is not on PATH"),
    ("unknown", ("podman",), "kaniko", "unknown builder 'kaniko'"),
])
def test_builder_choice_errors_say_what_to_do(build: ModuleType, desc: str, present: tuple[str, ...],
                                              requested: str | None, message: str) -> None:
    with pytest.raises(build.BuildError, match=re.escape(message)):
        build.choose_builder(requested, which_of(*present))


@pytest.mark.parametrize(("desc", "builder", "requested", "cgroup_v2", "present", "expected"), [
    ("cgroup v1 with runc: runc", "podman", None, False, ("runc", "crun"), "runc"),
    ("cgroup v1 without runc: the builder's default", "buildah", None, False, ("crun",), None),
    ("cgroup v2: the builder's default", "podman", None, True, ("runc",), None),
    ("asked for wins", "podman", "crun", False, ("runc",), "crun"),
    ("docker: its daemon decides", "docker", None, False, ("runc",), None),
])
def test_runtime_choice(build: ModuleType, desc: str, builder: str, requested: str | None, cgroup_v2: bool,
                        present: tuple[str, ...], expected: str | None) -> None:
    assert build.choose_runtime(builder, requested, cgroup_v2, which_of(*present)) == expected, desc


def test_docker_refuses_a_runtime(build: ModuleType) -> None:
    with pytest.raises(build.BuildError, match="does not apply to docker"):
        build.choose_runtime("docker", "runc", False, which_of("runc"))


def test_offline_build_commands(build: ModuleType) -> None:
    cf, ctx = Path("/r/deploy/image/Containerfile"), Path("/r")
    args = {"BASE": "localhost/b:1", "WHEELS": "context"}
    podman = build.Builder("podman", "runc").build(cf, ctx, "localhost/vcuda:t", args, network=False)
    assert podman == ["podman", "build", "--runtime", "runc", "-f", str(cf), "-t", "localhost/vcuda:t",
                      "--build-arg", "BASE=localhost/b:1", "--build-arg", "WHEELS=context",
                      "--network=none", "--pull=never", "/r"]
    buildah = build.Builder("buildah").build(cf, ctx, "t", {}, network=True)
    assert buildah[:2] == ["buildah", "bud"] and "--pull=missing" in buildah and "--network=none" not in buildah
    docker = build.Builder("docker").build(cf, ctx, "t", {}, network=False)
    assert docker[:2] == ["docker", "build"] and not any(a.startswith("--pull") for a in docker)


def test_archive_and_push_commands(build: ModuleType) -> None:
    out = Path("/tmp/v.tar")
    assert build.Builder("podman").save("r/v:1", out) == ["podman", "save", "--format", "oci-archive", "-o",
                                                          "/tmp/v.tar", "r/v:1"]
    # the ref.name in index.json is the full tag, which is the name ctr gives the image
    assert build.Builder("buildah").save("r/v:1", out) == ["buildah", "push", "r/v:1", "oci-archive:/tmp/v.tar:r/v:1"]
    assert build.Builder("docker").save("r/v:1", out)[:2] == ["docker", "save"]
    assert build.Builder("buildah").push("reg.example/v:1") == ["buildah", "push", "reg.example/v:1",
                                                               "docker://reg.example/v:1"]
    assert build.Builder("podman").push("reg.example/v:1") == ["podman", "push", "reg.example/v:1"]


def test_rootfs_import_commands(build: ModuleType) -> None:
    tar = Path("/c/base.tar")
    assert build.Builder("podman").import_rootfs(tar, "localhost/b:1") == [["podman", "import", "/c/base.tar",
                                                                            "localhost/b:1"]]
    steps = build.Builder("buildah").import_rootfs(tar, "localhost/b:1")
    assert [s[:2] for s in steps] == [["buildah", "from"], ["buildah", "add"], ["buildah", "commit"]]
    assert steps[-1][-1] == "localhost/b:1"


def test_base_key_follows_the_recipe(build: ModuleType) -> None:
    base = build.DebianBase()
    assert base.key() == build.DebianBase().key()
    assert re.fullmatch(r"localhost/vcuda-debian-base:bookworm-[0-9a-f]{16}", base.image)
    assert build.DebianBase(packages=tuple(reversed(base.packages))).key() == base.key()   # a set, not a list
    assert build.DebianBase(packages=(*base.packages, "busybox")).key() != base.key()
    assert build.DebianBase(suite="trixie").key() != base.key()
    assert build.DebianBase(mirror="http://mirror.example/debian").key() != base.key()
    assert base.tarball(Path("/cache")) == Path(f"/cache/image-base/debian-bookworm-{base.key()}.tar")


def test_mmdebstrap_command(build: ModuleType) -> None:
    cmd = build.DebianBase().mmdebstrap(Path("/c/x.partial"))
    assert cmd[0] == "mmdebstrap" and "--format=tar" in cmd   # not guessed from the file name
    assert "--include=python3,python3-venv,libstdc++6" in cmd
    assert cmd[-3:] == ["bookworm", "/c/x.partial", build.DEFAULT_MIRROR]


def test_rootfs_python(build: ModuleType, tmp_path: Path) -> None:
    tar_path = tmp_path / "rootfs.tar"
    with tarfile.open(tar_path, "w") as tar:
        link = tarfile.TarInfo("./usr/bin/python3")
        link.type, link.linkname = tarfile.SYMTYPE, "python3.11"
        tar.addfile(link)
        tar.addfile(tarfile.TarInfo("./etc/hostname"), io.BytesIO(b""))
    assert build.rootfs_python(tar_path) == "3.11"
    with tarfile.open(tmp_path / "empty.tar", "w"):
        pass
    assert build.rootfs_python(tmp_path / "empty.tar") is None


@pytest.mark.parametrize(("desc", "argv", "message"), [
    ("offline makes its own base", ["--offline", "--base", "python:3.12"], "exclude each other"),
    ("push needs a registry", ["--push"], "--push needs a --tag in your registry"),
    ("build args are KEY=VALUE", ["--build-arg", "FOO"], "expected KEY=VALUE"),
    ("unknown builder", ["--builder", "kaniko"], "invalid choice"),
])
def test_bad_arguments(build: ModuleType, capsys: pytest.CaptureFixture[str], desc: str, argv: list[str],
                       message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build.parse_args(argv)
    assert exit_info.value.code == 2, desc
    assert message in capsys.readouterr().err, desc


def test_defaults_and_build_arguments(build: ModuleType) -> None:
    args = build.parse_args(["--offline", "--build-arg", "VERSION=9"])
    assert args.tag == "localhost/vcuda:0.1.0" and args.context == REPO and args.containerfile == build.CONTAINERFILE
    built = build.build_args_for(args, "localhost/b:1")
    assert built["BASE"] == "localhost/b:1" and built["WHEELS"] == "context"
    assert built["VERSION"] == "9"   # the user's word last
    online = build.build_args_for(build.parse_args([]), None)
    assert online["WHEELS"] == "build" and "BASE" not in online   # the Containerfile's default base


def test_another_containerfile_gets_the_base_and_its_own_context(build: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "Containerfile").write_text("ARG BASE\nFROM ${BASE}\n")
    args = build.parse_args(["--offline", "--containerfile", str(tmp_path / "Containerfile"), "--tag", "localhost/p:1"])
    assert args.context == tmp_path
    assert build.build_args_for(args, "localhost/b:1") == {"BASE": "localhost/b:1"}


def test_help_runs(build: ModuleType) -> None:
    out = subprocess.run([str(REPO / "deploy" / "image" / "build"), "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "--offline" in out.stdout and "ctr -n k8s.io images import" in out.stdout


class FakeRunner:
    """Records commands; answers 'absent' to every existence check."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []
        self.said: list[str] = []

    def say(self, text: str) -> None:
        self.said.append(text)

    def __call__(self, cmd, **kwargs) -> subprocess.CompletedProcess[str]:
        self.commands.append(list(cmd))
        return subprocess.CompletedProcess(cmd, 1, "", "")


def test_no_builder_is_a_clear_error(build: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    assert build.main(["--offline"], run=FakeRunner()) == 1
    assert "no image builder found: install podman, buildah or docker" in capsys.readouterr().err


def test_missing_mmdebstrap_is_a_clear_error(build: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name: None if name == "mmdebstrap" else f"/usr/bin/{name}")
    monkeypatch.setenv("VCUDA_TOOL_CACHE", str(tmp_path))
    runner = FakeRunner()
    assert build.main(["--offline", "--builder", "podman"], run=runner) == 1
    assert "mmdebstrap, which is not installed (Debian: apt-get install mmdebstrap)" in capsys.readouterr().err
    assert not any(c[:2] == ["podman", "build"] for c in runner.commands)


def test_unreachable_debian_is_a_clear_error(build: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setenv("VCUDA_TOOL_CACHE", str(tmp_path))
    runner = FakeRunner()   # mmdebstrap "fails"
    assert build.main(["--offline", "--builder", "podman", "--mirror", "http://nowhere.invalid/debian"],
                      run=runner) == 1
    err = capsys.readouterr().err
    assert "mmdebstrap could not make the base from http://nowhere.invalid/debian" in err
    assert "are Debian's packages reachable?" in err
    assert runner.commands[0][0] == "mmdebstrap"
    assert not list((tmp_path / "image-base").iterdir())   # nothing half-made left in the cache


def test_the_source_never_imports_the_kubernetes_asyncio_client() -> None:
    """The image drops kubernetes/aio (about 70 MB) and aiohttp's family (about 13 MB, which only the
    asyncio client uses); nothing vcuda ships may import them."""
    import tomllib
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["scikit-build"]["wheel"]["packages"]
    uses = [f"{path.relative_to(REPO)}:{n}" for pkg in packages for path in (REPO / pkg).rglob("*.py")
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if re.search(r"kubernetes\.aio|from kubernetes import .*\baio\b|kubernetes_asyncio|\baiohttp\b", line)]
    assert packages and not uses, f"the image has no kubernetes.aio nor aiohttp (deploy/image/Containerfile): {uses}"


def test_what_vcuda_draws_with_rich_never_loads_pygments() -> None:
    """The image drops pygments (rich's syntax highlighter, about 10 MB): the modules that draw with
    rich (`vcuda top`, `demo`, the CLI) must work without it."""
    probe = ("import sys, py_vcuda.cli, py_vcuda.top, py_vcuda.demo; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pygments'))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"pygments loaded (deploy/image/Containerfile drops it): {out.stdout}"


def test_wheel_stamps_stay_out_of_the_image(build: ModuleType) -> None:
    """The stamps that say "up to date" sit beside .whl/vcuda and .whl/deps, which the image copies:
    inside, every source change would change the copied layer and reinstall everything."""
    assert build._stamp(Path("/r/.whl/vcuda")) == Path("/r/.whl/vcuda.key")


def test_an_unwritable_cache_is_a_clear_error(build: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name: f"/usr/bin/{name}")
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("VCUDA_TOOL_CACHE", str(tmp_path / "not-a-dir"))
    assert build.main(["--offline", "--builder", "podman"], run=FakeRunner()) == 1
    assert "the base's cache is $VCUDA_TOOL_CACHE" in capsys.readouterr().err
