"""Regenerate the checked-in gRPC stubs from the .proto files beside this script.

    python -m kube_contract.api.generate          # rewrite the stubs
    python -m kube_contract.api.generate --check  # exit 1 if they are stale

Run from the repository root: protoc's include root is the root, so the
generated modules import each other as `kube_contract.api.*` (no sys.path hacks).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PROTOS = ("deviceplugin_v1beta1.proto", "podresources_v1.proto", "pluginregistration_v1.proto", "dra_v1.proto",
          "dra_v1beta1.proto")


def generate(out: Path) -> None:
    from grpc_tools import protoc  # build-time tool: only needed to regenerate

    for name in PROTOS:
        proto = (HERE / name).relative_to(ROOT)
        status = protoc.main(["protoc", f"-I{ROOT}", f"--python_out={out}", f"--pyi_out={out}",
                              f"--grpc_python_out={out}", str(proto)])
        if status != 0:
            raise SystemExit(f"protoc failed on {proto}")


def generated_files(root: Path) -> dict[str, bytes]:
    rel = HERE.relative_to(ROOT)
    return {p.name: p.read_bytes() for p in sorted((root / rel).glob("*_pb2*.py*"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    if not args.check:
        generate(ROOT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = generated_files(Path(tmp))
    current = generated_files(ROOT)
    if fresh != current:
        stale = sorted(set(fresh) ^ set(current) | {k for k in fresh if fresh[k] != current.get(k)})
        print(f"stale stubs: {', '.join(stale)}; run python -m kube_contract.api.generate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
