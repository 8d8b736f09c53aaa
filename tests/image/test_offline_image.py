"""The image, built as the README says with no registry (`deploy/image/build --offline`), then run:
every command starts, libvcuda is where the node agents' init step looks and needs nothing but libc,
the extender's user (65534, read-only root) can run it, and the OCI archive names the image.

Needs podman, mmdebstrap and runc (cgroup v1) or crun, and containerd for the ctr part; without them
the tests skip, except under CI (`CI` set), where .ci/run installs them and a skip would hide a broken
image. The first build makes the Debian base (about a minute; cached in $VCUDA_TOOL_CACHE/image-base)
and vcuda's wheels; later ones reuse both and the builder's layer cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from imagebuild import need_tools, podman_run_prefix

REPO = Path(__file__).resolve().parents[2]
TAG = "localhost/vcuda:pytest"
SIZE_GOAL = 250 * 10**6   # bytes, uncompressed (issue 29)
NEEDS = ("podman", "mmdebstrap")

pytestmark = pytest.mark.timeout(1800)


@dataclass
class Built:
    archive: Path
    seconds: float
    run: list[str]   # `podman run` with this machine's options, up to the image


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    need_tools(NEEDS, "the offline image build")
    archive = tmp_path_factory.mktemp("image") / "vcuda.oci.tar"
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(REPO / "deploy" / "image" / "build.py"), "--offline",
                          "--builder", "podman", "--tag", TAG, "--output", str(archive)],
                         capture_output=True, text=True)
    seconds = time.monotonic() - started
    assert out.returncode == 0, f"deploy/image/build --offline failed:\n{(out.stdout + out.stderr)[-6000:]}"
    print(f"\noffline image build: {seconds:.0f} s", file=sys.stderr)
    yield Built(archive, seconds, [*podman_run_prefix()])


def run_in(built: Built, *args: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*built.run, *options, TAG, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", ["", "device-plugin", "dra-driver", "extender", "scheduler", "run", "doctor"])
def test_every_command_starts(built: Built, command: str) -> None:
    out = run_in(built, *([command] if command else []), "--help")
    assert out.returncode == 0, f"vcuda {command} --help in the image: {out.stdout}{out.stderr}"
    assert out.stdout.startswith("usage: vcuda"), out.stdout


def test_the_extender_runs_as_nobody_on_a_read_only_root(built: Built) -> None:
    out = run_in(built, "-c", "import kubernetes.client, kubernetes.config, kubernetes.watch, grpc, zmq, "
                 "scheduler_extender, device_plugin, dra_driver, token_scheduler, node_state, py_vcuda._native as n; "
                 "print(n.ffi.string(n.lib().vcuda_version()).decode())",
                 options=("--user", "65534:65534", "--read-only", "--entrypoint", "python3"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0.1.0"   # the package and its libvcuda.so agree
    out = run_in(built, "extender", "--help", options=("--user", "65534:65534", "--read-only"))
    assert out.returncode == 0, out.stderr


def test_libvcuda_is_where_the_init_step_looks_and_needs_only_libc(built: Built) -> None:
    # the same script shape as the DaemonSets' install-libvcuda init container
    script = ('lib="$(vcuda lib-path)"; test -f "$lib"; echo "$lib"; ldd "$lib"; '
              'cmp "$lib" /usr/local/vcuda/lib/libvcuda.so && echo same')
    out = run_in(built, "-ec", script, options=("--entrypoint", "/bin/sh"))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].endswith("/py_vcuda/lib/libvcuda.so"), lines
    needed = [line.split()[0] for line in lines[1:-1]]
    extra = [n for n in needed if not n.startswith(("linux-vdso", "libc.so", "/lib64/ld-linux", "ld-linux"))]
    assert needed and not extra, f"libvcuda.so needs more than libc: {extra}"
    assert lines[-1] == "same"


def test_size_goal(built: Built) -> None:
    out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", TAG], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    size = int(out.stdout)
    print(f"\nimage size: {size / 1e6:.0f} MB uncompressed; OCI archive {built.archive.stat().st_size / 1e6:.0f} MB",
          file=sys.stderr)
    assert size <= SIZE_GOAL, f"the image is {size / 1e6:.0f} MB uncompressed, over the {SIZE_GOAL / 1e6:.0f} MB goal"


def test_the_archive_names_the_image_for_ctr(built: Built) -> None:
    with tarfile.open(built.archive) as tar:
        layout = json.load(tar.extractfile("oci-layout"))
        index = json.load(tar.extractfile("index.json"))
        assert layout["imageLayoutVersion"] == "1.0.0"
        (manifest_ref,) = index["manifests"]
        # ctr images import names the image after this annotation (a full reference, not just a tag)
        assert manifest_ref["annotations"]["org.opencontainers.image.ref.name"] == TAG
        algo, digest = manifest_ref["digest"].split(":")
        manifest = json.load(tar.extractfile(f"blobs/{algo}/{digest}"))
        config = json.load(tar.extractfile("blobs/" + manifest["config"]["digest"].replace(":", "/")))
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert len(labels["org.opencontainers.image.revision"]) == 40
    assert config["config"]["Entrypoint"] == ["vcuda"]


def test_ctr_imports_and_runs_the_archive(built: Built, tmp_path: Path) -> None:
    """containerd, as the real-cluster tests will use it: a private daemon, import into k8s.io, run."""
    if shutil.which("containerd") is None or shutil.which("ctr") is None:
        message = "containerd and ctr are not installed (apt-get install containerd)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: .ci/run installs them, so under CI this is a failure")
        pytest.skip(message)
    root = Path(f"/tmp/vcctr{os.getpid()}")   # short: the socket path is limited to 107 bytes
    root.mkdir()
    sock = root / "containerd.sock"
    (root / "config.toml").write_text(f'version = 2\nroot = "{root}/root"\nstate = "{root}/state"\n'
                                      f'[grpc]\n  address = "{sock}"\n')
    log = (tmp_path / "containerd.log").open("w")
    daemon = subprocess.Popen(["containerd", "--config", str(root / "config.toml")], stdout=log, stderr=log)
    ctr = ["ctr", "--address", str(sock), "-n", "k8s.io"]
    try:
        for _ in range(100):
            if subprocess.run([*ctr, "version"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        out = subprocess.run([*ctr, "images", "import", str(built.archive)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        names = subprocess.run([*ctr, "images", "ls", "-q"], capture_output=True, text=True).stdout.split()
        assert TAG in names
        out = subprocess.run([*ctr, "run", "--rm", TAG, f"vcuda-{os.getpid()}", "vcuda", "extender", "--help"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.startswith("usage: vcuda extender"), out.stdout + out.stderr
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        subprocess.run(["umount", "-R", str(root)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
