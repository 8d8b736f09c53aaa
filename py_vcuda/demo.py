"""`vcuda demo`: tenants with different memory quotas share one GPU.

Each tenant is a separate process under the shim that allocates 128 MiB
blocks until refused. Uses the real GPU when there is one, the simulator
otherwise, and says which.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from py_vcuda.gpu import real_gpu_count
from py_vcuda.launch import Tenant, runtime_dir, tenant_env
from py_vcuda.quantity import format_bytes

CHUNK = 128 << 20


@dataclass(frozen=True)
class DemoTenant:
    name: str
    memory: int


TENANTS = (DemoTenant("tenant-a", 1 << 30), DemoTenant("tenant-b", 3 << 29))


def run_demo(console: Console, *, simulate: bool | None = None) -> int:
    use_sim = simulate if simulate is not None else real_gpu_count() == 0
    base = dict(os.environ)
    if use_sim:
        from py_vcuda.sim import SimConfig

        state = runtime_dir() / f"demo-{os.getpid()}.state"
        base.update(SimConfig(memory=16 << 30, state_path=state).env())
        console.print("[bold]No NVIDIA GPU found[/]: running on the vcuda GPU simulator "
                      "(16 GiB simulated device).")
    else:
        console.print("[bold]Running on the real GPU[/] (device 0).")
    console.print("Each tenant allocates 128 MiB blocks until its quota refuses one.\n")
    table = Table(title="memory quotas: configured vs enforced")
    for col in ("tenant", "quota", "cuMemGetInfo total", "allocated", "refused with"):
        table.add_column(col, justify="right" if col != "tenant" else "left")
    status = 0
    for t in TENANTS:
        ledger = runtime_dir() / f"demo-{os.getpid()}-{t.name}.ledger"
        env = tenant_env(Tenant(memory=t.memory), base, ledger)
        try:
            out = subprocess.run(
                [sys.executable, "-m", "py_vcuda.probe", "fill", "--chunk", str(CHUNK),
                 "--max", str(2 * t.memory)],
                env=env, capture_output=True, text=True, timeout=120)
            lines = out.stdout.strip().splitlines()
            result = json.loads(lines[-1]) if lines else {"error": out.stderr.strip()}
        finally:
            ledger.unlink(missing_ok=True)
        if "error" in result:
            console.print(f"[red]{t.name} failed:[/] {result['error']}")
            status = 1
            continue
        refused = result["refused_with"]
        table.add_row(t.name, format_bytes(t.memory), format_bytes(result["total"]),
                      format_bytes(result["allocated"]),
                      "OUT_OF_MEMORY" if refused == 2 else str(refused))
        if result["allocated"] > t.memory:
            status = 1
    console.print(table)
    console.print("The quota includes each process's CUDA context, so a little less than the "
                  "quota is left for allocations.")
    if use_sim:
        (runtime_dir() / f"demo-{os.getpid()}.state").unlink(missing_ok=True)
    return status
