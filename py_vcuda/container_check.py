"""`vcuda doctor` inside a vgpu container: are this container's quotas in force?

The node agent gives a vgpu or DRA container its quota file, read-only at
/run/vcuda-quota (py_vcuda.quota_file); that directory (or, set up by hand,
VCUDA_LEDGER or VCUDA_SCHEDULER) says where we are. When the quota directory is
there the file is the only source of the quota, as for libvcuda: two lines
first say so —

- quota: the file, and the quota it holds (or why it cannot be used: then
  libvcuda refuses CUDA in this container, it never runs unlimited);
- ignored: the VCUDA_* quota variables set in this environment, which
  libvcuda ignores (a pod's spec may set them; they change nothing);

and the checks below read the ledger, scheduler and limits from the file. Four
checks, one line each, each saying what is wrong and what it costs:

- preload: libvcuda is loaded into this very process (through /etc/ld.so.preload
  or LD_PRELOAD), so every CUDA program started here is under the shim;
- ledger: the container's ledger opens as a vcuda ledger and this uid may write
  it (every process charges its allocations there);
- scheduler: the GPU's token scheduler answers a PING on the tenant socket;
- limits: the memory limit and the share of GPU time in force, and that the
  ledger holds the same memory limit as the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from py_vcuda import native
from py_vcuda.quantity import QuantityError, format_bytes, parse_quantity
from py_vcuda.quota_file import (
    CONTAINER_QUOTA_DIR,
    QUOTA_FILE,
    QuotaFile,
    QuotaFileError,
    bare_metal_env,
    ignored_env,
    read,
)

PING_TIMEOUT_MS = 1000


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    text: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.name}: {self.text}"


def in_container(env: Mapping[str, str], quota_dir: Path = CONTAINER_QUOTA_DIR) -> bool:
    return quota_dir.is_dir() or "VCUDA_LEDGER" in env or "VCUDA_SCHEDULER" in env


def describe_quota(q: QuotaFile) -> str:
    gpus = "; ".join(f"{g.uuid} memory {'unlimited' if g.memory is None else format_bytes(g.memory)}, "
                     f"{'scheduler ' + g.scheduler if g.scheduler else 'no scheduler'}" for g in q.gpus)
    return (f"cores {q.core_request}% guaranteed, at most {q.core_limit}%, priority {q.priority}; ledger {q.ledger}; "
            f"{len(q.gpus)} GPU(s): {gpus}; other GPUs are refused")


def quota_env(q: QuotaFile, env: Mapping[str, str]) -> dict[str, str]:
    """The environment as libvcuda sees it under the quota file: the ignored variables gone, the file's
    values in their place (so the checks below read what is in force)."""
    out = {k: v for k, v in env.items() if k not in ignored_env(env)}
    out.update(bare_metal_env(q))
    return out


def scheduler_endpoint(env: Mapping[str, str]) -> str:
    """The tenant's scheduler endpoint: VCUDA_SCHEDULER, else the first VCUDA_SCHEDULER_<i> set ('': none)."""
    indexed = sorted((int(k.rpartition("_")[2]), v) for k, v in env.items()
                     if k.startswith("VCUDA_SCHEDULER_") and k.rpartition("_")[2].isdigit() and v)
    return env.get("VCUDA_SCHEDULER") or next((v for _, v in indexed), "")


def quota_source(env: Mapping[str, str], quota_dir: Path) -> tuple[list[Check], dict[str, str] | None]:
    """The quota and ignored lines, and the environment libvcuda goes by (None: the file cannot be used)."""
    path = quota_dir / QUOTA_FILE
    try:
        q = read(path)
    except QuotaFileError as exc:
        return [Check("quota", False, f"{exc}: libvcuda refuses CUDA in this container (it fails closed, never "
                      "unlimited); the node agent writes this file, ask the cluster's operator")], None
    ignored = ignored_env(env)
    said = ", ".join(f"{k}={env[k]!r}" for k in ignored) if ignored else "none set"
    return [Check("quota", True, f"from {path} (the node's, read-only): {describe_quota(q)}"),
            Check("ignored", True, f"VCUDA_* quota variables in this environment: {said}; the quota file is the "
                  "only source")], quota_env(q, env)


def check_preload(env: Mapping[str, str], maps: Path = Path("/proc/self/maps")) -> Check:
    if env.get("VCUDA_DISABLE") == "1":
        return Check("preload", False, "VCUDA_DISABLE=1: libvcuda passes everything through, no quota applies")
    try:
        mapped = {line.split()[-1] for line in maps.read_text().splitlines() if native.SHIM in line}
    except OSError as exc:
        return Check("preload", False, f"cannot read {maps}: {exc.strerror}")
    if mapped:
        return Check("preload", True, f"{', '.join(sorted(mapped))} is loaded in this process")
    return Check("preload", False, f"{native.SHIM} is not loaded in this process: neither /etc/ld.so.preload "
                 "nor LD_PRELOAD names it, so CUDA programs here run without quotas")


def check_ledger(env: Mapping[str, str]) -> Check:
    from py_vcuda.ledger import Ledger, LedgerError

    path = env.get("VCUDA_LEDGER")
    if not path:
        return Check("ledger", False, "VCUDA_LEDGER is not set: each process would get a private ledger, "
                     "so the container's processes would not share one quota")
    if not os.access(path, os.R_OK | os.W_OK):
        try:
            st = os.stat(path)
            why = f"owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}"
        except OSError as exc:
            why = exc.strerror or str(exc)
        return Check("ledger", False, f"{path} is not writable by uid {os.getuid()} ({why}): "
                     "CUDA programs here cannot charge allocations and refuse them")
    try:
        with Ledger(path) as ledger:
            devices = ledger.devices()
    except LedgerError as exc:
        return Check("ledger", False, str(exc))
    return Check("ledger", True, f"{path} is writable by uid {os.getuid()} ({len(devices)} GPU(s) recorded)")


def check_scheduler(env: Mapping[str, str]) -> Check:
    import zmq

    from token_scheduler import wire

    endpoint = scheduler_endpoint(env)
    if not endpoint:
        return Check("scheduler", True, "none (VCUDA_SCHEDULER unset): whole GPUs, compute not throttled")
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(wire.encode_ping(1, os.getpid()))
        if not sock.poll(PING_TIMEOUT_MS):
            return Check("scheduler", False, f"{endpoint} does not answer within {PING_TIMEOUT_MS} ms: "
                         "kernel launches wait for it (or run unthrottled, VCUDA_ON_SCHEDULER_LOSS=run)")
        msg = wire.decode_server(sock.recv())
    except (zmq.ZMQError, wire.WireError) as exc:
        return Check("scheduler", False, f"{endpoint}: {exc}")
    finally:
        sock.close(0)
        context.term()
    if msg.type != wire.MsgType.PONG:
        return Check("scheduler", False, f"{endpoint} answered {msg.type.name}, not PONG: {msg.text}")
    return Check("scheduler", True, f"{endpoint} answers (epoch {msg.fields[1]:08x})")


def check_limits(env: Mapping[str, str]) -> Check:
    from py_vcuda.ledger import Ledger, LedgerError

    text = env.get("VCUDA_MEMORY_LIMIT")
    try:
        memory = parse_quantity(text) if text is not None else None
    except QuantityError as exc:
        return Check("limits", False, f"VCUDA_MEMORY_LIMIT={text!r}: {exc}; CUDA fails to initialise")
    request = env.get("VCUDA_CORE_REQUEST", "100")
    limit = env.get("VCUDA_CORE_LIMIT", request)
    cores = f"GPU time {request}% guaranteed, at most {limit}%" if scheduler_endpoint(env) \
        else "GPU time not limited"
    shown = f"memory {format_bytes(memory)} per GPU" if memory is not None else "memory unlimited"
    if memory is not None and env.get("VCUDA_LEDGER"):
        try:
            with Ledger(env["VCUDA_LEDGER"]) as ledger:
                other = {d.limit for d in ledger.devices()} - {memory}
        except LedgerError:
            other = set()   # the ledger check says why
        if other:
            return Check("limits", False, f"{shown} in the environment, but the ledger holds "
                         f"{', '.join('unlimited' if o is None else format_bytes(o) for o in other)}")
    return Check("limits", True, f"{shown}; {cores}")


def container_report(env: Mapping[str, str] | None = None,
                     quota_dir: Path = CONTAINER_QUOTA_DIR) -> tuple[list[str], int]:
    """One line per check and the exit status (1 when one fails)."""
    env = os.environ if env is None else env
    checks: list[Check] = []
    if quota_dir.is_dir():
        checks, in_force = quota_source(env, quota_dir)
        if in_force is None:
            return [c.line() for c in checks], 1
        env = in_force
    checks += [check_preload(env), check_ledger(env), check_scheduler(env), check_limits(env)]
    return [c.line() for c in checks], 0 if all(c.ok for c in checks) else 1
