"""Quota escapes and containers over their limit (node_state.quota_guard on the memory
reconciler's passes): a GPU process of a shared-GPU container without libvcuda mapped is
killed within two reconciler intervals (or, with report, left running), with one Event on its
pod and one count; a container over its limit for OVER_LIMIT_PASSES passes is reported (or
killed); a process whose maps cannot be read, or whose pid was reused, is never killed."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from simcontainers import Container, FakeProc
from simtool import Children

from kube_contract.apiclient import make_api_client
from kube_contract.events import EventRecorder
from kube_contract.testing import FakeApiServer
from node_state.containers import shim_required
from node_state.layout import ContainerRecord
from node_state.options import OVER_LIMIT_PASSES
from node_state.quota_guard import ESCAPE_REASON, OVER_LIMIT_REASON, QuotaGuard, Subject
from node_state.testing import wait_for
from py_vcuda.ledger import Ledger
from py_vcuda.memory_reconciler import MemoryReconciler
from py_vcuda.nvml import NVML
from py_vcuda.procfs import ProcError, ProcFS
from py_vcuda.sim import GiB, MiB

POD_UID = "1234abcd-0000-4000-8000-00000000beef"
CGROUP = f"0::/kubepods/burstable/pod{POD_UID}/0123\n"
INTERVAL_S = 0.2


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    yield server
    server.close()


@pytest.fixture
def events(api: FakeApiServer, tmp_path: Path) -> Iterator[EventRecorder]:
    core = client.CoreV1Api(make_api_client(str(api.kubeconfig(tmp_path / "kubeconfig"))))
    recorder = EventRecorder(core, component="vcuda-test", host="node-1")
    yield recorder
    recorder.stop()


def record(key: str, uuid: str, cores: int = 30) -> ContainerRecord:
    return ContainerRecord(key=key, mode="vgpu", resource="tencent.com/vcuda-core", device_ids=(), gpus=(uuid,),
                           core_request=cores, core_limit=cores, memory_limit=GiB, tenant=key,
                           namespace="team", pod="app", pod_uid=POD_UID, container="main")


def pod_events(api: FakeApiServer, reason: str) -> list[dict]:  # type: ignore[type-arg]
    with api.lock:
        return [e for e in api.objects["events"].values() if e["reason"] == reason]


def escape_cmds() -> tuple[str, ...]:
    """Waits for the test, then takes a context (visible in NVML from here) and allocates."""
    return ("ready", "init", "primary", "0", "alloc", "100M", "ready")


def start_escape(children: Children, fake_proc: FakeProc, c: Container) -> subprocess.Popen[str]:
    """A process of the container without the shim; its host pid is its real pid (the agent's
    /proc is the host's), so the guard can signal it."""
    esc = children.spawn(*escape_cmds(), env={**c.env(GiB, shim=False), "VCUDA_SIM_HOST_PID_OFFSET": "0"})
    children.ready(esc)
    fake_proc.add(esc.pid, esc.pid, cgroup=CGROUP)
    return esc


def let_go_until_visible(proc: subprocess.Popen[str]) -> None:
    """Past its first `ready`, up to the line after its context exists (NVML lists it from then)."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    for line in proc.stdout:
        if line.startswith("primary"):
            return
    raise AssertionError("the escape exited before taking a context")


@pytest.mark.parametrize("on_escape", ["kill", "report"])
def test_an_escape_is_caught_within_two_passes(children: Children, fake_proc: FakeProc, nvml: NVML, api,
                                               events: EventRecorder, tmp_path: Path, on_escape: str) -> None:
    uuid = nvml.gpu(0).uuid
    c = Container("c1", tmp_path / "c1.ledger", offset=100_000, pod_uid=POD_UID)
    shimmed = children.spawn("init", "primary", "0", "alloc", "50M", "ready", env=c.env(GiB))
    children.ready(shimmed)
    fake_proc.add(shimmed.pid, shimmed.pid + c.offset, cgroup=CGROUP)
    esc = start_escape(children, fake_proc, c)
    procfs = ProcFS(fake_proc.root)
    guard = QuotaGuard(lambda: [record("c1", uuid)], procfs, on_escape=on_escape, events=events)
    rec = MemoryReconciler(lambda: [c.account(uuid, shim=True)], nvml, procfs=procfs, interval_s=INTERVAL_S,
                           on_pass=guard)
    rec.start()
    try:
        wait_for(lambda: rec.passes >= 2, 10, "two passes with the shimmed process alone")
        assert guard.escape_counts() == {}  # a process under the shim is no escape
        let_go_until_visible(esc)
        visible = rec.passes   # a pass in flight may have missed it; the next one starts after it showed
        start_time = procfs.stat(esc.pid)[1]
        acted = wait_for(lambda: guard.acted_in.get((esc.pid, start_time)), 10, "the escape found")
        assert acted <= visible + 2, f"found in pass {acted}, visible since pass {visible}"
        subject = Subject("c1", uuid, "vgpu", "team", "app", "main")
        if on_escape == "kill":
            assert wait_for(lambda: esc.poll() is not None, 10, "the escape killed") and esc.returncode == -9
            assert guard.escape_counts() == {(subject, "killed"): 1}
        else:
            wait_for(lambda: rec.passes >= acted + 3, 10, "three more passes")
            assert esc.poll() is None   # report: it runs on
            assert guard.escape_counts() == {(subject, "reported"): 1}  # once, however many passes see it
        assert shimmed.poll() is None
        (event,) = wait_for(lambda: pod_events(api, ESCAPE_REASON), 10, "the GPUQuotaEscape Event")
        assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team", "name": "app",
                                           "uid": POD_UID}
        assert event["type"] == "Warning" and event["metadata"]["namespace"] == "team"
        assert f"host pid {esc.pid}, sim_tool" in event["message"] and uuid in event["message"]
        assert ("killed (SIGKILL)" if on_escape == "kill" else "left running") in event["message"]
    finally:
        rec.stop()
    assert len(pod_events(api, ESCAPE_REASON)) == 1


def test_unreadable_maps_are_reported_not_killed(children: Children, fake_proc: FakeProc, nvml: NVML,
                                                tmp_path: Path) -> None:
    uuid = nvml.gpu(0).uuid
    c = Container("c1", tmp_path / "c1.ledger", offset=100_000, pod_uid=POD_UID)
    Ledger(c.ledger, create=True).close()
    esc = start_escape(children, fake_proc, c)
    (fake_proc.root / str(esc.pid) / "maps").unlink()
    (fake_proc.root / str(esc.pid) / "maps").mkdir()   # reading it fails, as without CAP_SYS_PTRACE
    let_go_until_visible(esc)
    procfs = ProcFS(fake_proc.root)
    guard = QuotaGuard(lambda: [record("c1", uuid)], procfs)
    rec = MemoryReconciler(lambda: [c.account(uuid, shim=True)], nvml, procfs=procfs, on_pass=guard)
    for _ in range(3):
        rec.reconcile()
    assert esc.poll() is None
    assert guard.escape_counts() == {}
    assert rec.unmapped_counts() == {("c1", "unverified"): 1}


def test_a_reused_pid_is_not_killed(children: Children, fake_proc: FakeProc) -> None:
    proc = children.spawn("ready")
    children.ready(proc)
    fake_proc.add(proc.pid, proc.pid)
    procfs = ProcFS(fake_proc.root)
    start_time = procfs.stat(proc.pid)[1]
    with pytest.raises(ProcError) as err:
        procfs.kill(proc.pid, start_time - 1)   # the pid named a process that started earlier
    assert err.value.reason == "reused" and proc.poll() is None
    with pytest.raises(ProcError) as err:
        ProcFS(fake_proc.root / "elsewhere").kill(proc.pid, start_time)   # not this pid namespace's /proc
    assert err.value.reason == "not-killable" and proc.poll() is None
    procfs.kill(proc.pid, start_time)
    assert proc.wait(10) == -9


@pytest.mark.parametrize("on_over_limit", ["report", "kill"])
def test_a_container_over_its_limit(children: Children, fake_proc: FakeProc, nvml: NVML, api,
                                    events: EventRecorder, tmp_path: Path, on_over_limit: str) -> None:
    uuid = nvml.gpu(0).uuid
    c = Container("c1", tmp_path / "c1.ledger", offset=0, pod_uid=POD_UID)   # host pid = pid: killable
    # 64 MiB context + 300 MiB of module code loaded at the first launch, which no hook charges.
    over = children.spawn("init", "primary", "0", "module", "vcudasim-module;kernel k code=300Mi", "fn", "k",
                          "run", "0", "ready", env=c.env(256 * MiB))
    children.ready(over)
    fake_proc.add(over.pid, over.pid, cgroup=CGROUP)
    procfs = ProcFS(fake_proc.root)
    guard = QuotaGuard(lambda: [record("c1", uuid)], procfs, on_over_limit=on_over_limit, events=events)
    rec = MemoryReconciler(lambda: [c.account(uuid, shim=True)], nvml, procfs=procfs, on_pass=guard)
    for _ in range(OVER_LIMIT_PASSES - 1):
        (found,) = rec.reconcile()
        assert found.physical > found.limit == 256 * MiB
    assert guard.over_limit_counts() == {} and over.poll() is None   # not yet: a few passes may pass over
    rec.reconcile()
    subject = Subject("c1", uuid, "vgpu", "team", "app", "main")
    if on_over_limit == "kill":
        assert over.wait(10) == -9
        assert guard.over_limit_counts() == {(subject, "killed"): 1}
    else:
        for _ in range(3):
            rec.reconcile()
        assert over.poll() is None
        assert guard.over_limit_counts() == {(subject, "reported"): 1}   # once while it stays over
    (event,) = wait_for(lambda: pod_events(api, OVER_LIMIT_REASON), 10, "the GPUQuotaOverLimit Event")
    assert "above its limit of 256 MiB" in event["message"] and event["involvedObject"]["uid"] == POD_UID
    assert guard.escape_counts() == {}   # it runs under the shim


@pytest.mark.parametrize(("cores", "extra", "required"), [
    (30, {"preload": "1"}, True),                        # a share of a GPU
    (100, {"preload": "1"}, False),                      # a whole card: no neighbour to protect
    (30, {"preload": "0"}, False),                       # device plugin, opted out in an allowed namespace
    (30, {"preload": "0", "driver": "gpu.vcuda.io"}, False),  # DRA preload: false, likewise
])
def test_which_containers_need_the_shim(cores: int, extra: dict[str, str], required: bool) -> None:
    r = record("c1", "GPU-x", cores)
    assert shim_required(ContainerRecord(**{**r.__dict__, "extra": extra})) is required
