"""The memory reconciler maps NVML's host pids to ledgers (slot through
NSpid and start time, pod cgroup, process tree) and writes what no hook
charged into each ledger; what it cannot map is logged and counted."""

from __future__ import annotations

import subprocess
from pathlib import Path

from simcontainers import Container, FakeProc
from simtool import Children, lines, mem

from py_vcuda.ledger import Ledger
from py_vcuda.memory_reconciler import Account, MemoryReconciler
from py_vcuda.nvml import NVML
from py_vcuda.procfs import ProcFS
from py_vcuda.sim import GiB, MiB

CTX = 64 * MiB


def lazy(code: str) -> tuple[str, ...]:
    """A process that loads a kernel with `code` bytes of code and launches it (lazy loading)."""
    return ("init", "primary", "0", "module", f"vcudasim-module;kernel k code={code}", "fn", "k",
            "run", "0", "mem", "ready")


def ledger_device(path: Path):  # type: ignore[no-untyped-def]
    with Ledger(path) as book:
        (device,) = book.devices()
        return device


def test_ledger_slots_map_namespaced_host_pids(children: Children, fake_proc: FakeProc, nvml: NVML,
                                                tmp_path: Path) -> None:
    uuid = nvml.gpu(0).uuid
    a = Container("a", tmp_path / "a.ledger", offset=100_000)
    b = Container("b", tmp_path / "b.ledger", offset=200_000)
    # One after the other: each shim measures its own context then, with no neighbour starting beside
    # it (a context measured beside others is charged their average; test_context_overhead.py).
    pa = children.spawn(*lazy("300Mi"), env=a.env(GiB))
    held = {pa.pid: mem(lines(children.ready(pa), "mem")[0]).total}
    pb = children.spawn(*lazy("100Mi"), env=b.env(GiB))
    held[pb.pid] = mem(lines(children.ready(pb), "mem")[0]).total
    host = children.spawn("init", "primary", "0", "alloc", "50M", "ready")  # no vcuda account
    children.ready(host)
    fake_proc.add(pa.pid, pa.pid + a.offset)
    fake_proc.add(pb.pid, pb.pid + b.offset)
    fake_proc.add(host.pid, host.pid)
    assert held == {pa.pid: CTX + 300 * MiB, pb.pid: CTX + 100 * MiB}
    rec = MemoryReconciler(lambda: [a.account(uuid), b.account(uuid)], nvml, procfs=ProcFS(fake_proc.root))
    for _ in range(2):  # a second pass changes nothing: the difference is set, never added again
        found = {f.keys: f for f in rec.reconcile()}
        assert (found[("a",)].physical, found[("a",)].charged) == (CTX + 300 * MiB, CTX)
        assert found[("a",)].unattributed == 300 * MiB
        assert found[("b",)].unattributed == 100 * MiB
        for c, p in ((a, pa), (b, pb)):
            device = ledger_device(c.ledger)
            assert device.used == held[p.pid]  # physical use <= ledger (here equal)
    assert rec.unmapped_counts() == {}  # the host's own process is simply not ours


def test_a_slot_no_process_maps_to_is_reported(children: Children, fake_proc: FakeProc, nvml: NVML,
                                               tmp_path: Path) -> None:
    uuid = nvml.gpu(0).uuid
    a = Container("a", tmp_path / "a.ledger", offset=100_000)
    pa = children.spawn(*lazy("200Mi"), env=a.env(GiB))
    children.ready(pa)
    fake_proc.add(pa.pid, pa.pid + a.offset, nspid=False)  # an old kernel: no NSpid line
    rec = MemoryReconciler(lambda: [a.account(uuid)], nvml, procfs=ProcFS(fake_proc.root))
    rec.reconcile()
    assert rec.unmapped_counts() == {}  # one miss may be a process exiting
    rec.reconcile()
    rec.reconcile()
    assert rec.unmapped_counts() == {("a", "slot-not-seen"): 1}  # named, and counted once
    assert ledger_device(a.ledger).unattributed == 0


def test_unreadable_proc_entries_are_counted(children: Children, fake_proc: FakeProc, nvml: NVML,
                                             tmp_path: Path) -> None:
    uuid = nvml.gpu(0).uuid
    a = Container("a", tmp_path / "a.ledger", offset=100_000)
    gone, odd = (children.spawn("init", "primary", "0", "ready", env=a.env(GiB)) for _ in range(2))
    children.ready(gone)
    children.ready(odd)
    (fake_proc.root / str(odd.pid + a.offset) / "status").mkdir(parents=True)  # reading it fails
    (fake_proc.root / str(odd.pid + a.offset) / "stat").write_text(Path(f"/proc/{odd.pid}/stat").read_text())
    rec = MemoryReconciler(lambda: [a.account(uuid)], nvml, procfs=ProcFS(fake_proc.root))
    rec.reconcile()
    rec.reconcile()
    # Each pid once, whatever the passes; and the container's two slots NVML never mapped to.
    assert rec.unmapped_counts() == {("", "exited"): 1, ("", "unreadable"): 1, ("a", "slot-not-seen"): 2}


def test_pod_cgroup_maps_a_process_without_the_shim(children: Children, fake_proc: FakeProc, nvml: NVML,
                                                    tmp_path: Path) -> None:
    uuid = nvml.gpu(0).uuid
    pod = "1234abcd-0000-4000-8000-00000000beef"
    cgroup = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod.replace('-', '_')}"
              ".slice/cri-containerd-0123.scope\n")
    c = Container("c", tmp_path / "c.ledger", offset=100_000, pod_uid=pod)
    bare = children.spawn("init", "primary", "0", "alloc", "50M", "ready", env=c.env(GiB, shim=False))
    children.ready(bare)
    fake_proc.add(bare.pid, bare.pid + c.offset, cgroup=cgroup)
    Ledger(c.ledger, create=True).close()  # Allocate creates it; nothing charged it yet
    rec = MemoryReconciler(lambda: [c.account(uuid)], nvml, procfs=ProcFS(fake_proc.root))
    (found,) = rec.reconcile()
    assert (found.physical, found.charged, found.unattributed) == (CTX + 50 * MiB, 0, CTX + 50 * MiB)
    assert ledger_device(c.ledger).used == CTX + 50 * MiB
    # Two accounts of that pod on the GPU: the process cannot be told apart.
    d = Container("d", tmp_path / "d.ledger", offset=100_000, pod_uid=pod)
    Ledger(d.ledger, create=True).close()
    rec2 = MemoryReconciler(lambda: [c.account(uuid), d.account(uuid)], nvml, procfs=ProcFS(fake_proc.root))
    rec2.reconcile()
    assert rec2.unmapped_counts() == {("c,d", "ambiguous-pod"): 1}


def test_process_tree_maps_bare_metal_children(sim_tool: Path, nvml: NVML, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    uuid = nvml.gpu(0).uuid
    # A shell that forks the GPU process (`; true` keeps sh from exec'ing it): the account's root.
    sh = subprocess.Popen(["sh", "-c", f"{sim_tool} init primary 0 alloc 30M ready; true"],
                          env={**sim.env(), "PATH": "/usr/bin:/bin"}, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        Children.ready(sh)
        run = Account(key="run-1", ledger=tmp_path / "run.ledger", gpus=(uuid,), root_pid=sh.pid)
        Ledger(run.ledger, create=True).close()
        rec = MemoryReconciler(lambda: [run], nvml)  # the real /proc: no namespaces on bare metal
        (found,) = rec.reconcile()
        assert found.physical == CTX + 30 * MiB == found.unattributed
    finally:
        sh.communicate("\n", timeout=30)
