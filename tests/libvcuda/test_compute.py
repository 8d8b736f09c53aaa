"""Compute quotas end to end: the shim's token client against a real token
scheduler daemon, tenants' kernels on the simulator's shared timeline."""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from shimtest import StepProbe, parse

from py_vcuda.sim import SimReader
from token_scheduler.testing import AdminClient, spawn_daemon

KERNEL_US = 2000
SYNC_EVERY = 10


def tenant_env(shim: Path, sim_env: dict[str, str], tmp_path: Path, name: str, endpoint: str | None,
               **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
    env.update(sim_env, LD_PRELOAD=str(shim), VCUDA_LEDGER=str(tmp_path / f"{name}.ledger"), **extra)
    if endpoint:
        env["VCUDA_SCHEDULER"] = endpoint
    return env


def spin(cuprobe: Path, env: dict[str, str], ms: int, sync_every: int = SYNC_EVERY,
         kernel_us: int = KERNEL_US, door: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen([str(cuprobe), *door, "init", "ctx", f"spin:{kernel_us}:{ms}:{sync_every}"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def busy_us(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, int]:
    return run_spin(proc, timeout)[:2]


def run_spin(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, int, str]:
    out, err = proc.communicate(timeout=timeout)
    line = next(d for d in parse(out) if d["cmd"] == "spin")
    assert line["rc"] == "0", err
    return int(line["busy_us"]), int(float(line["wall_us"])), err


@pytest.mark.parametrize("requests", [(30, 70), (10, 20, 30, 40), (5, 5, 10, 10, 15, 15, 20, 20)],
                         ids=["2-tenants", "4-tenants", "8-tenants"])
def test_saturating_tenants_get_their_requests(scheduler: AdminClient, cuprobe: Path, shim: Path,
                                               sim_env: dict[str, str], tmp_path: Path,
                                               requests: tuple[int, ...]) -> None:
    names = [f"t{i}" for i in range(len(requests))]
    envs = [tenant_env(shim, sim_env, tmp_path, n, str(scheduler.call("add", tenant=n, request=r)["endpoint"]))
            for n, r in zip(names, requests, strict=True)]
    procs = [spin(cuprobe, env, 10_000) for env in envs]
    # How busy the GPU is while every tenant runs (the simulator's served time over 6 s): not
    # over each one's whole run, whose tail, tenants capped at their limits finishing one by
    # one, leaves the GPU idle by configuration.
    time.sleep(2)
    with SimReader(sim_env["VCUDA_SIM_STATE"]) as sim:
        t0, b0 = time.monotonic(), sim.device(0).busy_ns
        time.sleep(6)
        t1, b1 = time.monotonic(), sim.device(0).busy_ns
    results = [busy_us(p) for p in procs]
    total = sum(b for b, _ in results)
    shares = [100 * b / total for b, _ in results]
    for want, got in zip(requests, shares, strict=True):
        assert abs(got - want) <= 2.0, f"configured {requests}, achieved {[round(s, 2) for s in shares]}"
    busy = (b1 - b0) / 1e9 / (t1 - t0)
    assert busy >= 0.9, f"GPU busy only {busy:.3f} of the time"


def test_elastic_limit_next_to_an_idle_tenant(scheduler: AdminClient, cuprobe: Path, shim: Path,
                                              sim_env: dict[str, str], tmp_path: Path) -> None:
    a = scheduler.call("add", tenant="a", request=40, limit=70)["endpoint"]
    scheduler.call("add", tenant="b", request=60)  # registered, idle
    busy, wall = busy_us(spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "a", str(a)), 6000))
    assert abs(100 * busy / wall - 70) <= 3.0, f"elastic tenant got {100 * busy / wall:.1f}% of the GPU"


LEASE_LAUNCH = re.compile(r"quantum (\d+) us, held (\d+) us \(drain (\d+) us.*; a launch (\d+) us, K (\d+)")


def test_launches_are_never_measured_shorter_than_they_run(cuprobe: Path, shim: Path, sim_env: dict[str, str],
                                                            tmp_path: Path) -> None:
    """The in-flight budget rests on the GPU time per launch measured between
    checkpoints. A segment counted with a K that changed since its countdown
    started (K follows the measurement) made 2 ms launches look 1.5 ms long in
    the first lease; once K outgrows the launches between the process's own
    synchronizes no segment runs back to back, nothing corrects it, and twice
    the budget goes in flight (the elastic stall of issue 31). Measured right, a
    launch is never shorter than it runs (a figure across an idle gap is longer),
    and with a 10 ms budget K never outgrows 10 / (2 x 2 ms) = 2 after the first
    lease (segments of 2 never straddle a synchronize every 10 launches)."""
    directory = tmp_path / "sched"
    daemon = spawn_daemon(directory, "--window", "2s", "--budget", "10ms")
    admin = AdminClient(directory / "admin.sock")
    try:
        admin.wait_ready()
        a = admin.call("add", tenant="a", request=13, limit=60)["endpoint"]
        admin.call("add", tenant="b", request=50)  # registered, idle
        env = tenant_env(shim, sim_env, tmp_path, "a", str(a), VCUDA_LOG_LEVEL="debug")
        _, _, err = run_spin(spin(cuprobe, env, 2000))
    finally:
        admin.close()
        daemon.kill()
        daemon.wait()
    leases = [tuple(int(x) for x in m.groups()) for m in LEASE_LAUNCH.finditer(err)]
    assert len(leases) >= 10, err[-2000:]
    launch_us = [lease[3] for lease in leases]
    assert min(launch_us) >= 0.97 * KERNEL_US, f"a launch measured {launch_us} us, it runs {KERNEL_US}"
    assert max(lease[4] for lease in leases[1:]) <= 2, [lease[4] for lease in leases]  # less, late wake-ups


@pytest.mark.parametrize(("priority", "kernel_us", "sync_every"), [("normal", KERNEL_US, 200), ("high", 200, 20)],
                         ids=["deep-queue", "high-synchronized-requests"])
def test_a_tenant_alone_keeps_its_lease_through_renewals(scheduler: AdminClient, cuprobe: Path, shim: Path,
                                                         sim_env: dict[str, str], tmp_path: Path, priority: str,
                                                         kernel_us: int, sync_every: int) -> None:
    """Nobody else waits: at each quantum's end the holder renews (RENEW) rather than
    draining its queue, releasing and being granted again, which left the GPU idle.
    A high tenant synchronizing on each 4 ms request keeps the client thread
    waiting for that work through its renewal time and its quantum's end: it
    asks as the wait ends and keeps the lease all the same."""
    a = scheduler.call("add", tenant="a", request=40, limit=100, priority=priority)["endpoint"]
    scheduler.call("add", tenant="b", request=60)  # registered, idle
    busy, wall = busy_us(spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "a", str(a)), 3000,
                              sync_every=sync_every, kernel_us=kernel_us))
    stats = scheduler.call("stats")["tenants"]["a"]
    # Without renewals: a grant per quantum (at most 50 ms), 60 or more. A few idle
    # releases may come at its synchronizes.
    counts = {k: stats[k] for k in ("grants", "renewals", "renew_denied", "expiries")}
    assert stats["renewals"] >= 20 and stats["grants"] <= 10, counts
    assert busy / wall >= 0.95, f"{busy / wall:.3f} of the GPU, {counts}"


def test_live_update_takes_effect(scheduler: AdminClient, cuprobe: Path, shim: Path, sim_env: dict[str, str],
                                  tmp_path: Path) -> None:
    a = scheduler.call("add", tenant="a", request=50, limit=50)["endpoint"]
    proc = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "a", str(a)), 8000)
    time.sleep(4)
    scheduler.call("update", tenant="a", request=20, limit=20)
    busy, wall = busy_us(proc)
    # about 4 s at 50 % and 4 s at 20 % (plus at most one window of transition)
    assert 25 <= 100 * busy / wall <= 42


def test_without_scheduler_nothing_is_limited(cuprobe: Path, shim: Path, sim_env: dict[str, str],
                                              tmp_path: Path) -> None:
    busy, wall = busy_us(spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "free", None), 1000))
    assert busy / wall >= 0.9


def test_lost_scheduler_with_run_policy(cuprobe: Path, shim: Path, sim_env: dict[str, str],
                                        tmp_path: Path) -> None:
    env = tenant_env(shim, sim_env, tmp_path, "x", f"ipc://{tmp_path}/absent.sock",
                     VCUDA_SCHEDULER_TIMEOUT_MS="300", VCUDA_ON_SCHEDULER_LOSS="run")
    busy, wall, err = run_spin(spin(cuprobe, env, 1500))
    assert busy >= 0.5 * wall  # unthrottled once the 300 ms timeout passed
    assert "launching unthrottled" in err


def test_lost_scheduler_with_block_policy(cuprobe: Path, shim: Path, sim_env: dict[str, str],
                                          tmp_path: Path) -> None:
    env = tenant_env(shim, sim_env, tmp_path, "x", f"ipc://{tmp_path}/absent.sock",
                     VCUDA_SCHEDULER_TIMEOUT_MS="300", VCUDA_ON_SCHEDULER_LOSS="block")
    proc = spin(cuprobe, env, 500)
    time.sleep(2.0)
    assert proc.poll() is None, "a blocked tenant must not launch"
    proc.kill()
    _, err = proc.communicate()
    assert "VCUDA_ON_SCHEDULER_LOSS=block" in err


def test_scheduler_restart_is_survived(tmp_path: Path, cuprobe: Path, shim: Path,
                                       sim_env: dict[str, str]) -> None:
    directory = tmp_path / "sched"
    daemon = spawn_daemon(directory, "--window", "2s")
    admin = AdminClient(directory / "admin.sock")
    admin.wait_ready()
    # `high`: the fault path holds with priorities set (a lone high tenant, its limit kept).
    endpoint = str(admin.call("add", tenant="a", request=50, limit=50, priority="high")["endpoint"])
    admin.close()
    proc = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "a", endpoint), 6000)
    try:
        time.sleep(2)
        daemon.kill()
        daemon.wait()
        time.sleep(0.5)
        daemon = spawn_daemon(directory, "--window", "2s")  # restores the tenant list from disk
        busy, wall = busy_us(proc)
    finally:
        daemon.kill()
        daemon.wait()
    # it kept running after the restart, and the 50 % limit still held
    assert 30 <= 100 * busy / wall <= 55


def test_latency_sensitive_tenant_waits_at_most_a_quantum(scheduler: AdminClient, cuprobe: Path, shim: Path,
                                                          sim_env: dict[str, str], tmp_path: Path) -> None:
    """A mostly idle tenant with short bursts next to a saturating one waits at most
    one quantum (the scheduler's default maximum, 50 ms) at p99: the saturating
    tenant (it synchronises every 10 kernels of 2 ms, so it overruns its lease by
    up to 20 ms) gets leases shortened by its recent overrun. 10 ms of slack for
    scheduling noise on a shared 2-core machine."""
    hog = scheduler.call("add", tenant="hog", request=50, limit=100)["endpoint"]
    lat = scheduler.call("add", tenant="lat", request=50, limit=100)["endpoint"]
    hog_proc = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "hog", str(hog)), 6000)
    lat_proc = subprocess.Popen([str(cuprobe), "init", "ctx", "bursts:200:20:5000"],
                                env=tenant_env(shim, sim_env, tmp_path, "lat", str(lat)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = lat_proc.communicate(timeout=60)
    line = next(d for d in parse(out) if d["cmd"] == "bursts")
    assert line["rc"] == "0", err
    stats = scheduler.call("stats")["tenants"]
    busy_us(hog_proc)
    assert int(line["count"]) >= 200  # it kept its 20 ms rhythm
    assert stats["lat"]["wait_us"]["p99"] <= 50_000 + 10_000, stats
    assert float(line["worst_us"]) <= 50_000 + SYNC_EVERY * KERNEL_US + 10_000


@pytest.mark.parametrize("priority", ["normal", "high"])
def test_killed_holder_costs_at_most_its_lease(scheduler: AdminClient, cuprobe: Path, shim: Path,
                                               sim_env: dict[str, str], tmp_path: Path, priority: str) -> None:
    """A holder SIGKILLed while it holds the token (`high`: one nobody revokes) frees it:
    its connection closes and the scheduler forgets it at once."""
    import signal

    a = scheduler.call("add", tenant="a", request=50, limit=100, priority=priority)["endpoint"]
    b = scheduler.call("add", tenant="b", request=50, limit=100)["endpoint"]
    pa = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "a", str(a)), 10_000)
    pb = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "b", str(b)), 4000)
    time.sleep(1.5)
    pa.send_signal(signal.SIGKILL)  # while it holds the token about half the time
    pa.wait()
    busy, wall = busy_us(pb)
    stats = scheduler.call("stats")["tenants"]
    # b never waited longer than a lease (quantum + grace) plus 50 ms, and after the
    # kill it had the GPU to itself
    assert stats["b"]["wait_us"]["max"] <= 50_000 + 10_000 + 50_000
    assert busy / wall >= 0.6


def test_elastic_tenant_returns_to_its_request_when_the_other_wakes(scheduler: AdminClient, cuprobe: Path,
                                                                    shim: Path, sim_env: dict[str, str],
                                                                    tmp_path: Path) -> None:
    a = scheduler.call("add", tenant="a", request=40, limit=70)["endpoint"]
    b = scheduler.call("add", tenant="b", request=60)["endpoint"]
    pa = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "a", str(a)), 9000)
    time.sleep(3)
    alone = scheduler.call("stats")["tenants"]["a"]["share"]
    pb = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "b", str(b)), 5500)
    time.sleep(3)  # more than one window (2 s) after b woke up
    # A 2 s window holds only ~40 quanta, so one reading is off by up to a quantum (2.5 pp) at the
    # moment it is taken; the mean of readings spread over the next window is the share.
    readings = []
    for _ in range(5):
        readings.append(scheduler.call("stats")["tenants"])
        time.sleep(0.5)
    busy_us(pa), busy_us(pb)
    assert abs(100 * alone - 70) <= 3
    for name, request in (("a", 40), ("b", 60)):
        share = statistics.fmean(r[name]["share"] for r in readings)
        assert abs(100 * share - request) <= 2, (name, [r[name]["share"] for r in readings])


def test_unthrottled_tenant_is_limited_again_when_the_scheduler_returns(tmp_path: Path, cuprobe: Path, shim: Path,
                                                                       sim_env: dict[str, str]) -> None:
    directory = Path(tempfile.mkdtemp(prefix="vr", dir="/tmp"))  # unix socket paths are short
    endpoint = f"ipc://{directory}/tenants/a/sched.sock"
    env = tenant_env(shim, sim_env, tmp_path, "a", endpoint, VCUDA_SCHEDULER_TIMEOUT_MS="200",
                     VCUDA_ON_SCHEDULER_LOSS="run")
    proc = spin(cuprobe, env, 5000)
    time.sleep(1.0)  # lost: running unthrottled
    daemon = spawn_daemon(directory, "--window", "2s")
    admin = AdminClient(directory / "admin.sock")
    try:
        admin.wait_ready()
        admin.call("add", tenant="a", request=20, limit=20, priority="high")
        busy, wall, err = run_spin(proc)
    finally:
        admin.close()
        daemon.kill()
        daemon.wait()
        shutil.rmtree(directory, ignore_errors=True)
    assert "launching unthrottled" in err
    # ~1 s at full speed, then ~4 s at 20 %: far below running unthrottled throughout
    assert 0.25 <= busy / wall <= 0.6


def test_each_device_has_its_own_token(tmp_path: Path, cuprobe: Path, shim: Path, sim_env: dict[str, str]) -> None:
    """A process on two GPUs holds two independent tokens (VCUDA_SCHEDULER_<i>): 30 % of
    GPU 0 and 60 % of GPU 1 at the same time, each charged to its own GPU's scheduler."""
    admins, daemons, env = [], [], tenant_env(shim, {**sim_env, "VCUDA_SIM_DEVICES": "2"}, tmp_path, "x", None)
    try:
        for gpu, share in ((0, 30), (1, 60)):
            directory = Path(tempfile.mkdtemp(prefix=f"vd{gpu}", dir="/tmp"))
            daemons.append(spawn_daemon(directory, "--window", "2s", gpu=str(gpu)))
            admin = AdminClient(directory / "admin.sock")
            admins.append(admin)
            admin.wait_ready()
            reply = admin.call("add", tenant="x", request=share, limit=share)
            env[f"VCUDA_SCHEDULER_{gpu}"] = str(reply["endpoint"])
        proc = subprocess.Popen([str(cuprobe), "init", f"spindevs:{KERNEL_US}:5000:{SYNC_EVERY}:2"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # The schedulers' shares while it runs, past the first window: a 2 s window holds only
        # ~40 quanta, so one reading is off by up to a quantum; the mean of several is the share.
        time.sleep(2.5)
        readings = []
        for _ in range(5):
            readings.append([admin.call("stats")["tenants"]["x"]["share"] for admin in admins])
            time.sleep(0.4)
        shares = [statistics.fmean(r[gpu] for r in readings) for gpu in (0, 1)]
        out, err = proc.communicate(timeout=120)
        line = next(d for d in parse(out) if d["cmd"] == "spindevs")
        assert line["rc"] == "0", err
        wall = float(line["wall_us"])
    finally:
        for admin in admins:
            admin.close()
        for daemon in daemons:
            daemon.kill()
            daemon.wait()
    assert abs(100 * int(line["busy0_us"]) / wall - 30) <= 5, line
    assert abs(100 * int(line["busy1_us"]) / wall - 60) <= 5, line
    assert abs(100 * shares[0] - 30) <= 3 and abs(100 * shares[1] - 60) <= 3, shares


# --- priority, revocation and the in-flight budget (issue 15) -------------------------------------


def add(scheduler: AdminClient, name: str, request: int, limit: int | None = None,
        priority: str = "normal") -> str:
    reply = scheduler.call("add", tenant=name, request=request, limit=limit or request, priority=priority)
    assert reply["ok"], reply
    return str(reply["endpoint"])


def bursts(cuprobe: Path, env: dict[str, str], kernel_us: int, every_ms: int, ms: int) -> subprocess.Popen:
    return subprocess.Popen([str(cuprobe), "init", "ctx", f"bursts:{kernel_us}:{every_ms}:{ms}"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def burst_result(proc: subprocess.Popen) -> dict[str, str]:
    out, err = proc.communicate(timeout=120)
    line = next(d for d in parse(out) if d["cmd"] == "bursts")
    assert line["rc"] == "0", err
    return line


@pytest.mark.parametrize("door", [(), ("--via=proc", "--ptds")], ids=["legacy-stream", "per-thread-stream"])
def test_deep_queue_trainer_leaves_the_small_tenant_its_share(scheduler: AdminClient, cuprobe: Path, shim: Path,
                                                              sim_env: dict[str, str], tmp_path: Path,
                                                              door: tuple[str, ...]) -> None:
    """The issue's case: --core 70 --core-limit 100 launching 200 kernels of 2 ms between
    synchronizes (400 ms queued) beside --core 30 synchronizing every 4 kernels. Without an
    in-flight budget the 30 % tenant got about 1 %. The trainer launches on the legacy
    default stream, or through cuLaunchKernel_ptsz on its per-thread default stream (as
    cudart built with per-thread default streams does): the checkpoints must follow it."""
    train = add(scheduler, "train", 70, 100)
    small = add(scheduler, "small", 30)
    pt = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "train", train), 8000, sync_every=200, door=door)
    ps = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "small", small), 8000, sync_every=4)
    (bt, _), (bs, _) = busy_us(pt), busy_us(ps)
    assert abs(100 * bs / (bt + bs) - 30) <= 2.0, f"small tenant got {100 * bs / (bt + bs):.1f} %"


def high_bursts_beside_trainer(scheduler: AdminClient, cuprobe: Path, shim: Path, sim_env: dict[str, str],
                               tmp_path: Path, kernel_us: int, every_ms: int, ms: int,
                               ) -> tuple[dict[str, str], dict, int, int]:
    """A trainer (40 %, limit 100) queuing 1000 kernels of 500 us between synchronizes and,
    after a second, a `high` tenant (60 %, limit 100) running one `kernel_us` kernel every
    `every_ms` for `ms`: the bursts' result, the scheduler's tenant stats, the trainer's
    busy and wall time (us)."""
    train = add(scheduler, "train", 40, 100)
    lat = add(scheduler, "lat", 60, 100, priority="high")
    pt = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "train", train), ms + 2000, sync_every=1000,
              kernel_us=500)
    time.sleep(1)
    line = burst_result(bursts(cuprobe, tenant_env(shim, sim_env, tmp_path, "lat", lat), kernel_us, every_ms, ms))
    stats = scheduler.call("stats")["tenants"]
    busy, wall = busy_us(pt)
    return line, stats, busy, wall


def test_high_tenant_is_served_within_the_trainers_budget(scheduler: AdminClient, cuprobe: Path, shim: Path,
                                                          sim_env: dict[str, str], tmp_path: Path) -> None:
    """A `high` tenant with one 200 us kernel every 20 ms beside a trainer queuing 1000
    kernels of 500 us between synchronizes: each burst revokes the trainer, which drains at
    most its in-flight budget (1 ms), so the high tenant waits milliseconds, not a lease
    (50 ms); the trainer gets the time it leaves, and reports its budget waits."""
    line, stats, busy, wall = high_bursts_beside_trainer(scheduler, cuprobe, shim, sim_env, tmp_path,
                                                         kernel_us=200, every_ms=20, ms=5000)
    assert int(line["count"]) >= 240  # it kept its rhythm
    assert stats["lat"]["preempt_wait_us"]["samples"] >= 100, stats["lat"]
    # 1 ms of budget, plus handoffs and wake-ups on a loaded 2-core machine; a lease is 50 ms
    assert stats["lat"]["wait_us"]["p99"] <= 10_000, stats["lat"]
    assert stats["train"]["revocations"] >= 100 and stats["train"]["revoke_reclaims"] == 0, stats["train"]
    assert stats["train"]["budget_hits"] > 0 and stats["train"]["budget_us"] == 1000
    assert busy / wall >= 0.8, f"the trainer got only {busy / wall:.2f} of the GPU"


def test_saturating_high_tenant_cannot_push_a_normal_one_below_its_request(
        scheduler: AdminClient, cuprobe: Path, shim: Path, sim_env: dict[str, str], tmp_path: Path) -> None:
    high = add(scheduler, "high", 30, 100, priority="high")
    normal = add(scheduler, "normal", 70, 100)
    ph = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "high", high), 8000)
    pn = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "normal", normal), 8000)
    (bh, _), (bn, _) = busy_us(ph), busy_us(pn)
    assert 100 * bn / (bh + bn) >= 70 - 2.0, f"normal tenant got {100 * bn / (bh + bn):.1f} %"


def simulator_answers(cuprobe: Path, sim_env: dict[str, str]) -> bool:
    """Whether a process with no shim gets a context on the simulator within 5 s. One stopped (SIGSTOP)
    inside the simulator's state lock would hold every other process back (its robust lock recovers from
    a holder's death, not from a stop): the stalled high tenant would be the simulator's, not the
    scheduler's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_") and k != "LD_PRELOAD"}
    env.update(sim_env)
    try:
        subprocess.run([str(cuprobe), "init", "ctx"], env=env, capture_output=True, timeout=5, check=True)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_stopped_holder_is_reclaimed_after_its_budget(scheduler: AdminClient, cuprobe: Path, shim: Path,
                                                      sim_env: dict[str, str], tmp_path: Path) -> None:
    """A holder that never answers the revocation (stopped while holding) loses the token
    after its budget plus the revoke grace (1 + 5 ms), not at the end of its lease, and the
    high tenant goes on."""
    import signal

    train = add(scheduler, "train", 40, 100)
    lat = add(scheduler, "lat", 60, 100, priority="high")
    pt = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "train", train), 20_000, sync_every=1000, kernel_us=500)
    try:
        for _ in range(200):  # alone it holds the token nearly always: stop it while it does
            time.sleep(0.05)
            pt.send_signal(signal.SIGSTOP)
            holder = scheduler.call("stats")["holder"]
            if holder and holder["tenant"] == "train" and simulator_answers(cuprobe, sim_env):
                break
            pt.send_signal(signal.SIGCONT)
        else:
            pytest.fail("the trainer never held the token")
        line = burst_result(bursts(cuprobe, tenant_env(shim, sim_env, tmp_path, "lat", lat), 200, 20, 2000))
        stats = scheduler.call("stats")["tenants"]
    finally:
        pt.send_signal(signal.SIGCONT)
        pt.kill()
        pt.communicate()
    assert stats["train"]["revoke_reclaims"] == 1, stats["train"]
    assert int(line["count"]) >= 95
    assert stats["lat"]["wait_us"]["max"] <= 30_000, stats["lat"]  # a lease would be 50 + 10 ms


@pytest.mark.parametrize(("priority", "begin"), [("normal", "mcapture:0"), ("high", "mcapture:0"),
                                                 ("normal", "lcapture")])
def test_a_global_stream_capture_survives_the_token_client(scheduler: AdminClient, cuprobe: Path, shim: Path,
                                                           sim_env: dict[str, str], tmp_path: Path,
                                                           priority: str, begin: str) -> None:
    """PyTorch captures CUDA graphs in GLOBAL mode: a synchronize or an event query from
    any thread of the process during the capture invalidates it. The token client drains
    the process's work at its idle looks and at the end of every lease, and the in-flight
    budget queries its checkpoints: a capture that spans several of those must still end
    with a graph, and the graph must run. Also when it was begun with the legacy
    cuStreamBeginCapture (no mode: GLOBAL), as the driver hands it out below 10010."""
    other = add(scheduler, "other", 50, 100)
    tenant = add(scheduler, "t", 50, 100, priority=priority)
    ph = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "other", other), 1500, sync_every=50, kernel_us=500)
    out = subprocess.run([str(cuprobe), "init", "ctx", "stream", begin, "slaunch:200:300", "sleep:60",
                          "slaunch:200:300", "sleep:60", "endcapture", "instantiate", "glaunch"],
                         env=tenant_env(shim, sim_env, tmp_path, "t", tenant), capture_output=True, text=True,
                         timeout=60, check=False)
    busy_us(ph)
    rcs = {d["cmd"]: d.get("rc") for d in parse(out.stdout)}
    assert rcs.get("endcapture") == "0" and rcs.get("glaunch") == "0", (rcs, out.stderr[-2000:])


@pytest.mark.parametrize("short_horizon", ["off", "on"])
def test_idle_grace_learns_the_pauses_within_a_high_tenants_work(tmp_path: Path, cuprobe: Path, shim: Path,
                                                                 sim_env: dict[str, str], short_horizon: str) -> None:
    """A `high` tenant beside a saturating trainer, the scheduler's idle grace 8 ms; the
    tenant runs a 10 ms kernel, synchronizes, pauses, and so on. Pauses of 30 ms are idle
    time: the grace it waits after its work before giving the token back shrinks (holds
    end well before kernel + 8 ms). Then pauses of 3 ms, within its work: the first costs
    a handoff, after which the grace covers them and it keeps the token, instead of giving
    it back and revoking the trainer at every kernel."""
    directory = tmp_path / "sched"
    daemon = spawn_daemon(directory, "--window", "2s", "--idle-high", "8ms", "--short-horizon", short_horizon)
    scheduler = AdminClient(directory / "admin.sock")
    try:
        scheduler.wait_ready()
        train = add(scheduler, "train", 40, 100)
        lat = add(scheduler, "lat", 60, 100, priority="high")
        pt = spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "train", train), 8000, sync_every=1000, kernel_us=500)
        probe = StepProbe(str(cuprobe), tenant_env(shim, sim_env, tmp_path, "lat", lat))
        try:
            assert probe.rc("init") == 0 and probe.rc("ctx") == 0
            probe.do("bursts:10000:40:1600")  # 40 idle pauses: the grace shrinks
            before = scheduler.call("stats")["tenants"]
            probe.do("bursts:10000:40:800")
            after = scheduler.call("stats")["tenants"]
            line = probe.do("bursts:10000:13:1300")  # 100 pauses within its work
            last = scheduler.call("stats")["tenants"]
        finally:
            probe.close()
            pt.kill()
            pt.communicate()
    finally:
        scheduler.close()
        daemon.kill()
        daemon.wait()
    grants = after["lat"]["grants"] - before["lat"]["grants"]
    held_ms = (after["lat"]["held_ms_total"] - before["lat"]["held_ms_total"]) / max(grants, 1)
    assert grants >= 15 and held_ms < 14, f"{grants} grants of {held_ms:.1f} ms each: the grace did not shrink"
    revoked = last["train"]["revocations"] - after["train"]["revocations"]
    assert int(line["count"]) >= 70
    # A grace that did not grow revokes the trainer at nearly every kernel (~100). Some
    # revocations are the policy's: with short horizons the tenant's holds, its pauses
    # within them, pass its request over the last second, so the trainer gets its turns
    # and the tenant revokes it as it is owed again (23-24 here; 6 with the window alone,
    # whose 2 s still count the idle phases before).
    assert revoked <= 40, f"the trainer was revoked {revoked} times in 100 kernels: the grace did not grow"


def test_high_tenant_gives_the_token_back_when_its_short_work_is_done(scheduler: AdminClient, cuprobe: Path,
                                                                      shim: Path, sim_env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    """A `high` tenant running one 300 us kernel every 2 ms and synchronizing, beside a
    trainer. Its holder looks at the process when its synchronize returns, so it gives the
    token back about its idle grace (0.2 ms) after each kernel: the trainer gets most of the
    85 % of the GPU it leaves. Looking only every millisecond, the holder saw every look
    busy and held the token through the idle time (3.2 ms per lease, the trainer 0.59)."""
    line, stats, busy, wall = high_bursts_beside_trainer(scheduler, cuprobe, shim, sim_env, tmp_path,
                                                         kernel_us=300, every_ms=2, ms=4000)
    held_ms = stats["lat"]["held_ms_total"] / max(stats["lat"]["grants"], 1)
    assert int(line["count"]) >= 1500
    assert held_ms < 1.0, f"the high tenant held each lease {held_ms:.2f} ms for 0.3 ms of work"
    assert busy / wall >= 0.65, f"the trainer got only {busy / wall:.2f} of the GPU"


# --- liveness is not lease time (issue 31) ---------------------------------------------------------

LIVENESS_TIMEOUT_MS = 300


def test_tenant_waiting_at_its_limit_never_takes_its_scheduler_for_lost(scheduler: AdminClient, cuprobe: Path,
                                                                        shim: Path, sim_env: dict[str, str],
                                                                        tmp_path: Path) -> None:
    """A tenant capped at 1 % with 20 ms kernels may launch one kernel per ~2 s: it waits for
    its lease several times VCUDA_SCHEDULER_TIMEOUT_MS (300 ms) while its scheduler answers
    every PING. Waiting in line is not silence: nothing is "lost", and VCUDA_ON_SCHEDULER_LOSS=run
    never lifts the limit (before issue 31 it logged "lost" and launched unthrottled)."""
    endpoint = add(scheduler, "capped", 1, 1)
    env = tenant_env(shim, sim_env, tmp_path, "capped", endpoint,
                     VCUDA_SCHEDULER_TIMEOUT_MS=str(LIVENESS_TIMEOUT_MS), VCUDA_ON_SCHEDULER_LOSS="run")
    busy, wall, err = run_spin(spin(cuprobe, env, 5000, sync_every=1, kernel_us=20_000))
    grants = scheduler.call("stats")["tenants"]["capped"]["grants"]
    assert "lost" not in err, err
    # The policy lets a limit be overshot by one lease (quantum ≤ 50 ms, plus the 20 ms kernel
    # running past it) per 2 s window: 0.045 at most. Unthrottled it got 0.72 (0.03 held).
    assert busy / wall <= 0.01 + (50_000 + 20_000) / 2_000_000, f"{busy / wall:.3f} of the GPU, limit 0.01"
    # The premise: it wanted the GPU all along, so the time it did not run was spent waiting,
    # in at most grants + 1 waits; at least one of them was this long, well past the timeout.
    longest_wait_at_least_ms = (wall - busy) / 1000 / (grants + 1)
    assert longest_wait_at_least_ms >= 2 * LIVENESS_TIMEOUT_MS, (busy, wall, grants)


def test_silent_scheduler_is_lost_after_the_timeout(tmp_path: Path, cuprobe: Path, shim: Path,
                                                    sim_env: dict[str, str]) -> None:
    """A scheduler that is stopped (SIGSTOP: its connections stay open, nothing answers) is
    still declared lost VCUDA_SCHEDULER_TIMEOUT_MS into the silence, and `run` applies."""
    import signal

    directory = tmp_path / "sched"
    daemon = spawn_daemon(directory, "--window", "2s")
    admin = AdminClient(directory / "admin.sock")
    try:
        admin.wait_ready()
        endpoint = add(admin, "a", 10, 10)
        env = tenant_env(shim, sim_env, tmp_path, "a", endpoint,
                         VCUDA_SCHEDULER_TIMEOUT_MS=str(LIVENESS_TIMEOUT_MS), VCUDA_ON_SCHEDULER_LOSS="run")
        proc = spin(cuprobe, env, 4000)
        time.sleep(1.0)  # limited to 10 % meanwhile
        daemon.send_signal(signal.SIGSTOP)
        busy, wall, err = run_spin(proc)
    finally:
        daemon.send_signal(signal.SIGCONT)
        admin.close()
        daemon.kill()
        daemon.wait()
    assert "lost: launching unthrottled" in err, err
    # ~1 s at 10 %, then unthrottled after at most a lease and the 300 ms of silence: ~0.7 of
    # the 4 s; held at its limit throughout it would be ~0.1.
    assert busy / wall >= 0.4, f"{busy / wall:.3f} of the GPU"


def test_a_capped_tenant_does_not_ask_for_renewals_it_would_be_denied(scheduler: AdminClient, cuprobe: Path,
                                                                       shim: Path, sim_env: dict[str, str],
                                                                       tmp_path: Path) -> None:
    """Under short horizons a capped tenant's lease is what its frame allows, and its GRANT
    says a RENEW would be denied (NO_RENEW): the shim does not ask, which saved a message
    each way and a wake-up on every lease. Its share is unchanged."""
    a = scheduler.call("add", tenant="a", request=30, limit=30)["endpoint"]
    scheduler.call("add", tenant="b", request=60)  # registered, idle
    busy, wall = busy_us(spin(cuprobe, tenant_env(shim, sim_env, tmp_path, "a", str(a)), 3000))
    stats = scheduler.call("stats")["tenants"]["a"]
    counts = {k: stats[k] for k in ("grants", "renewals", "renew_denied", "expiries")}
    assert stats["grants"] >= 20 and stats["renew_denied"] == 0 and stats["renewals"] == 0, counts
    assert abs(100 * busy / wall - 30) <= 3.0, f"{100 * busy / wall:.1f} % of the GPU, {counts}"
