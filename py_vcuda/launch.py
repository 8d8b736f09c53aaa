"""Running a command under quotas on this machine (`vcuda run`)."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from py_vcuda import native


@dataclass
class Tenant:
    """What one `vcuda run` asks for."""

    memory: int | None = None                  # bytes per visible GPU; None: unlimited
    memory_per_device: dict[int, int] = field(default_factory=dict)
    gpu: str | None = None                     # index or UUID; None: all visible
    ledger: Path | None = None                 # None: a fresh one for this run
    log_level: str | None = None


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = Path(base) / f"vcuda-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def tenant_env(tenant: Tenant, base: Mapping[str, str], ledger: Path) -> dict[str, str]:
    """The environment a command needs to run under the shim with `tenant`'s quotas."""
    env = dict(base)
    shim = str(native.lib_path(native.SHIM))
    preload = env.get("LD_PRELOAD", "")
    if shim not in preload.split():
        env["LD_PRELOAD"] = f"{shim} {preload}".strip()
    if tenant.memory is not None:
        env["VCUDA_MEMORY_LIMIT"] = str(tenant.memory)
    for index, limit in tenant.memory_per_device.items():
        env[f"VCUDA_MEMORY_LIMIT_{index}"] = str(limit)
    if tenant.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = tenant.gpu
    if tenant.log_level:
        env["VCUDA_LOG_LEVEL"] = tenant.log_level
    env["VCUDA_LEDGER"] = str(ledger)
    return env


def run(command: Sequence[str], tenant: Tenant, base_env: Mapping[str, str] | None = None) -> int:
    """Run `command` under the quotas; returns its exit status (128+N for signal N)."""
    own_ledger = tenant.ledger is None
    ledger = tenant.ledger or runtime_dir() / f"run-{os.getpid()}.ledger"
    env = tenant_env(tenant, os.environ if base_env is None else base_env, ledger)
    try:
        proc = subprocess.Popen(list(command), env=env)
    except FileNotFoundError:
        raise SystemExit(f"vcuda run: command not found: {command[0]}") from None
    # The child gets terminal signals itself; pass on the ones sent to us alone.
    forwarded = (signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda sig, _f: proc.send_signal(sig)) for s in forwarded}
    try:
        while True:
            try:
                status = proc.wait()
                break
            except KeyboardInterrupt:
                continue  # the child saw the SIGINT too; wait for it to finish
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if own_ledger:
            ledger.unlink(missing_ok=True)
    return status if status >= 0 else 128 - status
