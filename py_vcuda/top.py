"""`vcuda top`: every GPU on this machine and its tenants (quota, priority, share, memory,
token wait, revocations and in-flight budget waits), refreshing in place.

It reads what the exporter reads (node_state.metrics_snapshot): on a node the
agent's state directory, with names a record lacks from the kubelet's
pod-resources API; on bare metal the `vcuda run` records under the per-user
runtime directory. A GPU's mode is its containers'; for a GPU without any,
`--mode`, else the most common mode of the records. `render` is pure, so a
fixed snapshot renders to a fixed text.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kube_contract.podresources import DEFAULT_SOCKET, PodResourcesClient
from node_state.layout import DEFAULT_STATE_DIR, NodeLayout
from node_state.metrics_snapshot import ContainerGPU, GPUState, NodeReader, NodeSnapshot, gpu_modes
from py_vcuda.launch import runtime_dir
from py_vcuda.nvml import NVML, NVMLUnavailable


def _bytes(n: int | None) -> str:
    if n is None:
        return "–"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _pct(ratio: float | None) -> str:
    return "–" if ratio is None else f"{100 * ratio:.0f}%"


def _share(row: ContainerGPU) -> Text:
    if row.share is None:
        return Text("–")
    style = "red" if row.share < 0.9 * row.core_request and row.tenant_stats and row.tenant_stats.waiting else ""
    return Text(_pct(row.share), style=style)


def _memory(row: ContainerGPU) -> Text:
    text = f"{_bytes(row.memory_used)} / {_bytes(row.memory_limit)}"
    full = row.memory_used is not None and row.memory_limit and row.memory_used > 0.95 * row.memory_limit
    return Text(text, style="red" if full else "")


def _wait(row: ContainerGPU) -> str:
    t = row.tenant_stats
    if t is None:
        return "–"
    mean = t.wait.sum_s / t.wait.count if t.wait.count else 0.0
    return f"{1000 * mean:.1f} / {1000 * t.wait_p99_s:.1f} ms"


def _preempted(row: ContainerGPU) -> str:
    """Leases revoked for a `high` tenant / launches that waited at the in-flight budget."""
    t = row.tenant_stats
    return "–" if t is None else f"{t.revocations} / {t.budget_hits}"


def _gpu_title(g: GPUState, mode: str) -> str:
    parts = [f"GPU {g.index}  {g.name}  [{mode or '?'}]"]
    if g.usage is not None:
        if g.usage.utilization is not None:
            parts.append(f"util {g.usage.utilization:.0f}%")
        parts.append(f"mem {_bytes(g.usage.memory_used)} / {_bytes(g.usage.memory_total)}")
        if g.usage.temperature_c is not None:
            parts.append(f"{g.usage.temperature_c:.0f}°C")
        if g.usage.power_w is not None:
            parts.append(f"{g.usage.power_w:.0f} W")
    if g.scheduler_up is not None:
        parts.append("scheduler up" if g.scheduler_up else "scheduler DOWN")
    return "  ".join(parts)


def _tenant_table(title: str, rows: list[ContainerGPU]) -> Table:
    table = Table(title=Text(title), title_justify="left", expand=False)  # Text: names are not markup
    for name, justify in (("tenant", "left"), ("mode", "left"), ("prio", "left"), ("request", "right"),
                          ("limit", "right"), ("share", "right"), ("memory used / limit", "right"),
                          ("peak", "right"), ("OOM", "right"), ("wait mean / p99", "right"), ("grants", "right"),
                          ("revoked / budget waits", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in sorted(rows, key=lambda r: r.display_name):
        t = r.tenant_stats
        table.add_row(Text(r.display_name), r.mode, "–" if t is None else t.priority, _pct(r.core_request),
                      _pct(r.core_limit), _share(r), _memory(r), _bytes(r.memory_peak),
                      "–" if r.oom_denials is None else str(r.oom_denials), _wait(r),
                      "–" if t is None else str(t.grants), _preempted(r))
    if not rows:
        table.add_row("(no tenants)", *[""] * 11)
    return table


def render(snap: NodeSnapshot) -> RenderableType:
    """The whole frame for one snapshot (pure)."""
    modes = gpu_modes(snap)
    parts: list[RenderableType] = [Text(f"vcuda top — {snap.node}", style="bold")]
    known = {g.uuid for g in snap.gpus} | {m.uuid for m in snap.mig}
    for g in snap.gpus:
        parts.append(_tenant_table(_gpu_title(g, modes[g.uuid]), [r for r in snap.containers if r.uuid == g.uuid]))
        for m in (m for m in snap.mig if m.parent_uuid == g.uuid):   # a GPU in MIG mode: each instance
            used = "?" if m.memory_used is None else _bytes(m.memory_used)
            title = f"  GPU {g.index} MIG {m.profile}  {m.uuid}  mem {used} / {_bytes(m.memory_total)}"
            parts.append(_tenant_table(title, [r for r in snap.containers if r.uuid == m.uuid]))
    others = [r for r in snap.containers if r.uuid not in known]
    if others:
        parts.append(_tenant_table("GPUs not seen by NVML", others))
    if not snap.gpus and not others:
        parts.append(Text("no GPUs and no tenants found"))
    parts.extend(Text(f"! {e}", style="yellow") for e in snap.errors)
    return Group(*parts)


def _state_dir(args: argparse.Namespace) -> Path | None:
    if args.state_dir is not None:
        return Path(args.state_dir)
    return DEFAULT_STATE_DIR if DEFAULT_STATE_DIR.is_dir() else None


def _pod_resources(args: argparse.Namespace, node_dir: Path | None) -> PodResourcesClient | None:
    """The kubelet's pod-resources client: the socket given, else on a node the default one if present."""
    socket = args.pod_resources_socket
    if socket is None and node_dir is not None and DEFAULT_SOCKET.exists():
        socket = DEFAULT_SOCKET
    return PodResourcesClient(socket) if socket is not None else None


def _open_nvml(simulate: bool) -> tuple[NVML | None, str]:
    if simulate:
        from py_vcuda.sim import SimConfig

        for key, value in SimConfig().env().items():
            os.environ.setdefault(key, value)
    try:
        return NVML(), ""
    except NVMLUnavailable as exc:
        return None, f"{exc}; showing tenants only"


def run(args: argparse.Namespace) -> int:
    bare_metal = NodeLayout(runtime_dir())
    node_dir = _state_dir(args)
    layout = NodeLayout(node_dir) if node_dir is not None else bare_metal
    extra = (bare_metal,) if node_dir is not None else ()
    nvml, why = _open_nvml(args.simulate)
    pod_resources = _pod_resources(args, node_dir)
    # `vcuda run` tenants are vGPU; on a node, the records say (NodeReader infers it when mode is None).
    mode = args.mode or (None if node_dir is not None else "vgpu")
    reader = NodeReader(layout, mode=mode, nvml=nvml, pod_resources=pod_resources, extra_layouts=extra)
    console = Console()
    if why:
        console.print(Text(why, style="yellow"))
    try:
        if args.once:
            console.print(render(reader.snapshot()))
            return 0
        with Live(render(reader.snapshot()), console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(args.interval)
                live.update(render(reader.snapshot()), refresh=True)
    except KeyboardInterrupt:
        return 0
    finally:
        reader.close()
        if pod_resources is not None:
            pod_resources.close()
        if nvml is not None:
            with contextlib.suppress(Exception):
                nvml.close()
