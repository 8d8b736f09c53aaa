"""Regenerate the checked-in gRPC stubs of the kubelet's plugin-registration and DRA APIs.

    python -m dra_driver.api.generate          # rewrite the stubs
    python -m dra_driver.api.generate --check  # exit 1 if they are stale

Same generator as device_plugin/api (run from the repository root).
"""

from __future__ import annotations

from pathlib import Path

from device_plugin.api import generate as stubs

HERE = Path(__file__).resolve().parent
PROTOS = ("pluginregistration_v1.proto", "dra_v1.proto", "dra_v1beta1.proto")


def main(argv: list[str] | None = None) -> int:
    return stubs.main(argv, HERE, PROTOS)


if __name__ == "__main__":
    raise SystemExit(main())
