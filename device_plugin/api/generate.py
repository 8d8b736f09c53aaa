"""Regenerate the checked-in gRPC stubs from the .proto files beside this script.

    python -m device_plugin.api.generate          # rewrite the stubs
    python -m device_plugin.api.generate --check  # exit 1 if they are stale

Run from the repository root: protoc's include root is the root, so the
generated modules import each other as `device_plugin.api.*` (no sys.path hacks).
Other stub packages (dra_driver/api) call `main` with their own folder and protos.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PROTOS = ("deviceplugin_v1beta1.proto", "podresources_v1.proto")


def generate(out: Path, here: Path = HERE, protos: Sequence[str] = PROTOS) -> None:
    from grpc_tools import protoc  # build-time tool: only needed to regenerate

    for name in protos:
        proto = (here / name).relative_to(ROOT)
        status = protoc.main(["protoc", f"-I{ROOT}", f"--python_out={out}", f"--pyi_out={out}",
                              f"--grpc_python_out={out}", str(proto)])
        if status != 0:
            raise SystemExit(f"protoc failed on {proto}")


def generated_files(root: Path, here: Path = HERE) -> dict[str, bytes]:
    rel = here.relative_to(ROOT)
    return {p.name: p.read_bytes() for p in sorted((root / rel).glob("*_pb2*.py*"))}


def main(argv: list[str] | None = None, here: Path = HERE, protos: Sequence[str] = PROTOS) -> int:
    module = ".".join(here.relative_to(ROOT).parts) + ".generate"
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    if not args.check:
        generate(ROOT, here, protos)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp), here, protos)
        fresh = generated_files(Path(tmp), here)
    current = generated_files(ROOT, here)
    if fresh != current:
        stale = sorted(set(fresh) ^ set(current) | {k for k in fresh if fresh[k] != current.get(k)})
        print(f"stale stubs: {', '.join(stale)}; run python -m {module}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
