"""`vcuda demo`: tenants with different quotas share one GPU.

Part 1, memory: each tenant is a process under the shim that allocates
128 MiB blocks until refused. Part 2, compute: three tenants with different
shares of GPU time keep the GPU busy at once, the GPU's token scheduler
deciding who runs; their live shares are shown as they converge, then the
configured and achieved shares side by side. Uses the real GPU when there is
one, the simulator otherwise, and says which.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from py_vcuda.gpu import real_gpu_count
from py_vcuda.launch import SchedulerError, Tenant, ensure_scheduler, runtime_dir, tenant_env
from py_vcuda.quantity import format_bytes

CHUNK = 128 << 20


@dataclass(frozen=True)
class DemoTenant:
    name: str
    memory: int


TENANTS = (DemoTenant("tenant-a", 1 << 30), DemoTenant("tenant-b", 3 << 29))
COMPUTE = (("tenant-a", 20, 20), ("tenant-b", 30, 30), ("tenant-c", 50, 50))  # name, request, limit
COMPUTE_SECONDS = 8.0


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
                  "quota is left for allocations.\n")
    try:
        status |= compute_demo(console, base, use_sim)
    except SchedulerError as exc:
        console.print(f"[red]compute demo failed:[/] {exc}")
        status = 1
    if use_sim:
        (runtime_dir() / f"demo-{os.getpid()}.state").unlink(missing_ok=True)
    return status


def compute_demo(console: Console, base: dict[str, str], use_sim: bool) -> int:
    """Three tenants with different shares of GPU time, all saturating the GPU."""
    admin = ensure_scheduler("0", simulated=use_sim)
    names = {t: f"demo-{os.getpid()}-{t}" for t, _, _ in COMPUTE}
    procs: dict[str, subprocess.Popen[str]] = {}
    ledgers = []
    try:
        for tenant, request, limit in COMPUTE:
            reply = admin.call("add", tenant=names[tenant], request=request, limit=limit)
            if not reply.get("ok"):
                raise SchedulerError(f"the scheduler refused {tenant}: {reply.get('error')}")
            ledger = runtime_dir() / f"{names[tenant]}.ledger"
            ledgers.append(ledger)
            env = tenant_env(Tenant(core_request=request, core_limit=limit), base, ledger)
            env["VCUDA_SCHEDULER"] = str(reply["endpoint"])
            procs[tenant] = subprocess.Popen(
                [sys.executable, "-m", "py_vcuda.probe", "spin", "--seconds", str(COMPUTE_SECONDS)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        console.print(f"Compute: {len(COMPUTE)} tenants keep the GPU busy for {COMPUTE_SECONDS:.0f} s; "
                      "the token scheduler hands out GPU time by their requests.")
        progress = Progress(TextColumn("{task.description:<10}"), BarColumn(bar_width=40),
                            TextColumn("{task.fields[share]:>6.1f} % of the GPU (request {task.fields[req]} %)"))
        tasks = {t: progress.add_task(t, total=100, share=0.0, req=r) for t, r, _ in COMPUTE}
        with Live(progress, console=console, refresh_per_second=4):
            while any(p.poll() is None for p in procs.values()):
                stats = admin.call("stats").get("tenants", {})
                for tenant, task in tasks.items():
                    share = 100 * float(stats.get(names[tenant], {}).get("share", 0.0))
                    progress.update(task, completed=share, share=share)
                time.sleep(0.25)
        console.print()
        results = {t: _last_json(p) for t, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for name in names.values():
            admin.call("remove", tenant=name)
        admin.close()
        for ledger in ledgers:
            ledger.unlink(missing_ok=True)
    failed = [t for t, r in results.items() if "error" in r]
    for t in failed:
        console.print(f"[red]{t} failed:[/] {results[t]['error']}")
    if failed:
        return 1
    total = sum(r["busy_us"] for r in results.values())
    wall = max(r["wall_us"] for r in results.values())
    table = Table(title="compute shares: configured vs achieved")
    for col in ("tenant", "request", "limit", "achieved share"):
        table.add_column(col, justify="right" if col != "tenant" else "left")
    for tenant, request, limit in COMPUTE:
        table.add_row(tenant, f"{request} %", f"{limit} %", f"{100 * results[tenant]['busy_us'] / total:.1f} %")
    console.print(table)
    console.print(f"The GPU was busy {100 * total / wall:.1f} % of the time.")
    return 0


def _last_json(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=60)
    lines = out.strip().splitlines()
    return json.loads(lines[-1]) if lines else {"error": err.strip() or "no output"}
