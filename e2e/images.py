"""OCI image archives written by hand (tar, json, sha256): no registry, no builder.

The cluster's pause image and a busybox test image are made this way from files on this machine
(a static `pause` compiled from e2e/pause.c, Debian's busybox-static); the archive is what
`ctr -n k8s.io images import` takes.

    python3 e2e/images.py pause OUT.tar      # vcuda.local/pause:3.10
    python3 e2e/images.py busybox OUT.tar    # vcuda.local/busybox:1.35
    python3 e2e/images.py kube-scheduler OUT.tar --version 1.36.3
                                             # registry.k8s.io/kube-scheduler:v1.36.3 (the built one)

The kube-scheduler image is what the chart's vcuda-scheduler runs by default
(`registry.k8s.io/kube-scheduler:<the cluster's version>`), made from the Kubernetes we built
(gotools.py): the multi-call binary copied in as /usr/local/bin/kube-scheduler, so that its argv[0]
picks the scheduler.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAUSE_IMAGE = "vcuda.local/pause:3.10"
BUSYBOX_IMAGE = "vcuda.local/busybox:1.35"
KUBE_SCHEDULER_REPOSITORY = "registry.k8s.io/kube-scheduler"   # the chart's scheduler.image default
BUSYBOX = Path("/bin/busybox")   # Debian's busybox-static
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class Layer:
    """One filesystem layer: regular files (path in the image -> bytes and mode), symlinks, dirs."""

    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    symlinks: dict[str, str] = field(default_factory=dict)
    dirs: list[str] = field(default_factory=list)

    def tar(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            def add(info: tarfile.TarInfo, data: bytes | None = None):
                info.uid = info.gid = 0
                info.mtime = 0          # the same files give the same digest
                tar.addfile(info, io.BytesIO(data) if data is not None else None)

            parents = set(self.dirs)
            for p in [*self.files, *self.symlinks]:
                parts = p.strip("/").split("/")[:-1]
                parents.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
            for d in sorted(x.strip("/") for x in parents if x.strip("/")):
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
                add(info)
            for p, (data, mode) in sorted(self.files.items()):
                info = tarfile.TarInfo(p.strip("/"))
                info.size, info.mode = len(data), mode
                add(info, data)
            for p, target in sorted(self.symlinks.items()):
                info = tarfile.TarInfo(p.strip("/"))
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
                add(info)
        return buf.getvalue()


def write_archive(out: Path, name: str, layers: list[Layer], entrypoint: list[str] | None = None,
                  cmd: list[str] | None = None, env: list[str] | None = None) -> Path:
    """An OCI image layout, as one tar, holding one linux/amd64 image named `name` (registry/repo:tag)."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer_descs, diff_ids = [], []
    for layer in layers:
        data = layer.tar()
        layer_descs.append(blob(data, "application/vnd.oci.image.layer.v1.tar"))
        diff_ids.append(layer_descs[-1]["digest"])   # uncompressed: the diff id is the blob's digest
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Env": env or [PATH_ENV], "WorkingDir": "/",
                   **({"Entrypoint": entrypoint} if entrypoint else {}), **({"Cmd": cmd} if cmd else {})},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": "vcuda e2e/images.py"} for _ in layers],
    }
    config_desc = blob(json.dumps(config, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config_desc, "layers": layer_descs}
    manifest_desc = blob(json.dumps(manifest, sort_keys=True).encode(), "application/vnd.oci.image.manifest.v1+json")
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{**manifest_desc, "platform": {"architecture": "amd64", "os": "linux"},
                            "annotations": {"io.containerd.image.name": name,
                                            "org.opencontainers.image.ref.name": tag}}]}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    with tarfile.open(tmp, "w") as tar:
        def add(path: str, data: bytes):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        add("index.json", json.dumps(index, sort_keys=True).encode())
        for digest, data in blobs.items():
            add("blobs/sha256/" + digest.split(":", 1)[1], data)
    tmp.rename(out)
    return out


def build_pause(work: Path) -> bytes:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("the pause image needs a C compiler with a static libc (apt-get install gcc libc6-dev)")
    work.mkdir(parents=True, exist_ok=True)
    binary = work / "pause"
    out = subprocess.run([cc, "-static", "-Os", "-s", "-o", str(binary), str(HERE / "pause.c")],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"compiling e2e/pause.c failed:\n{out.stderr[-2000:]}")
    return binary.read_bytes()


def pause_archive(out: Path) -> Path:
    layer = Layer(files={"pause": (build_pause(out.parent / "pause-build"), 0o755)})
    return write_archive(out, PAUSE_IMAGE, [layer], entrypoint=["/pause"])


def busybox_archive(out: Path) -> Path:
    if not BUSYBOX.is_file():
        raise RuntimeError(f"the busybox test image needs {BUSYBOX} (apt-get install busybox-static)")
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    layer = Layer(files={"bin/busybox": (BUSYBOX.read_bytes(), 0o755)},
                  symlinks={f"bin/{a}": "busybox" for a in applets if a != "busybox"},
                  dirs=["tmp", "etc", "proc", "sys", "dev", "root", "var"])
    layer.files["etc/passwd"] = (b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n", 0o644)
    layer.files["etc/group"] = (b"root:x:0:\nnogroup:x:65534:\n", 0o644)
    return write_archive(out, BUSYBOX_IMAGE, [layer], cmd=["sh"])


def kube_scheduler_image(version: str) -> str:
    return f"{KUBE_SCHEDULER_REPOSITORY}:v{version.lstrip('v')}"


def kube_scheduler_archive(out: Path, binary: Path, version: str) -> Path:
    """The upstream scheduler's image from our build: `binary` is the multi-call Kubernetes program (or a
    symlink to it), copied in as the file /usr/local/bin/kube-scheduler (its name dispatches). No shell, no
    libc: the program is static. /tmp for its self-signed serving certificate, nobody in /etc/passwd."""
    real = binary.resolve()
    if not real.is_file():
        raise RuntimeError(f"the kube-scheduler image needs the built Kubernetes {version} at {binary} "
                           f"(python3 e2e/cluster.py build --version {version.lstrip('v')})")
    layer = Layer(files={"usr/local/bin/kube-scheduler": (real.read_bytes(), 0o755),
                         "etc/passwd": (b"root:x:0:0:root:/root:/sbin/nologin\n"
                                        b"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n", 0o644),
                         "etc/group": (b"root:x:0:\nnonroot:x:65532:\n", 0o644)},
                  dirs=["tmp", "etc", "home/nonroot"])
    return write_archive(out, kube_scheduler_image(version), [layer], entrypoint=["/usr/local/bin/kube-scheduler"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("image", choices=["pause", "busybox", "kube-scheduler"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--version", default=None, help="kube-scheduler: the built Kubernetes version (1.36.3)")
    args = parser.parse_args(argv)
    try:
        if args.image == "kube-scheduler":
            import gotools

            version = args.version or "1.36.3"
            tool = gotools.kubernetes(version)
            print(kube_scheduler_archive(args.out, tool.program("kube-scheduler"), version))
            return 0
        print({"pause": pause_archive, "busybox": busybox_archive}[args.image](args.out))
    except RuntimeError as exc:
        print(f"images: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
