"""The policy's record (`vcuda scheduler --record`) and its replay: the same decisions
from the same calls and clock readings, a record that is not the policy's refused, a
record cut short by a killed daemon replayed up to there."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from token_scheduler import replay as replay_cli
from token_scheduler.policy import MS, SECOND, PolicyConfig
from token_scheduler.record import Recorder, Replay, ReplayMismatch, read
from token_scheduler.simulate import SimTenant, Simulation
from token_scheduler.testing import AdminClient, TenantClient, spawn_daemon

CFG = PolicyConfig(window_ns=2 * SECOND)
TENANTS = [SimTenant("a", 50, 50), SimTenant("b", 13, 60), SimTenant("c", 10, 100, burst_ns=3 * MS, idle_ns=40 * MS,
                                                                       priority="high")]


def recorded_run(path: Path, seconds: int = 3) -> Simulation:
    sim = Simulation(CFG, [], keep_grants=True)
    recorder = Recorder(path, sim.policy)
    for spec in TENANTS:
        sim.add_tenant(spec)
    sim.run(seconds * SECOND)
    recorder.close()
    return sim


def test_replay_takes_the_recorded_decisions(tmp_path: Path) -> None:
    sim = recorded_run(tmp_path / "r.jsonl")
    holds: dict[str, list[tuple[int, int]]] = {}
    replay = Replay(tmp_path / "r.jsonl", on_charge=lambda name, start, end, _: holds.setdefault(name, []).append(
        (start, end)))
    steps = replay.run()
    assert steps == (tmp_path / "r.jsonl").read_text().count("\n") - 1  # the header
    assert len(sim.result.grants) > 100
    # The replayed policy charged every hold the simulated one did (the last may be in force).
    for name, simulated in sim.result.hold.items():
        assert holds[name] == simulated[:len(holds[name])]
        assert len(simulated) - len(holds[name]) <= 1
    assert replay.policy.held_back_ns == sim.policy.held_back_ns


def tamper_first(path: Path, chosen: Callable[[dict[str, Any]], bool],
                 change: Callable[[dict[str, Any]], None]) -> None:
    """Change the first recorded step `chosen` picks, in place."""
    lines = path.read_text().splitlines()
    for i, text in enumerate(lines[1:], 1):
        step = json.loads(text)
        if chosen(step):
            change(step)
            lines[i] = json.dumps(step)
            break
    else:
        raise AssertionError("no step to tamper with")
    path.write_text("\n".join(lines) + "\n")


def test_a_decision_the_record_does_not_hold_is_a_mismatch(tmp_path: Path) -> None:
    recorded_run(tmp_path / "r.jsonl", seconds=1)
    # The lease one nanosecond longer than the policy decides.
    tamper_first(tmp_path / "r.jsonl", lambda step: step["m"] == "dispatch" and bool(step.get("r")),
                 lambda step: step["r"].__setitem__(3, step["r"][3] + 1))
    with pytest.raises(ReplayMismatch, match="dispatch"):
        Replay(tmp_path / "r.jsonl").run()


def test_a_step_whose_clock_readings_differ_is_a_mismatch(tmp_path: Path) -> None:
    """The replayed policy reads the clock as often as the recorded one did, or went another way."""
    recorded_run(tmp_path / "r.jsonl", seconds=1)
    # One reading more than the policy takes.
    tamper_first(tmp_path / "r.jsonl", lambda step: step["m"] == "release" and len(step["c"]) >= 2,
                 lambda step: step["c"].append(step["c"][-1]))
    with pytest.raises(ReplayMismatch, match="the clock read"):
        Replay(tmp_path / "r.jsonl").run()


def test_a_record_cut_mid_line_replays_up_to_there(tmp_path: Path) -> None:
    recorded_run(tmp_path / "r.jsonl", seconds=1)
    text = (tmp_path / "r.jsonl").read_text()
    cut = text[: len(text) // 2]
    (tmp_path / "cut.jsonl").write_text(cut)
    assert Replay(tmp_path / "cut.jsonl").run() == cut.count("\n") - 1


def test_only_a_fresh_policy_is_recorded_and_never_over_a_record(tmp_path: Path) -> None:
    sim = Simulation(CFG, [SimTenant("a", 50, 50)])
    with pytest.raises(ValueError, match="from its creation"):
        Recorder(tmp_path / "r.jsonl", sim.policy)
    (tmp_path / "earlier.jsonl").write_text("the run that went wrong\n")
    with pytest.raises(FileExistsError):
        Recorder(tmp_path / "earlier.jsonl", Simulation(CFG, []).policy)
    assert (tmp_path / "earlier.jsonl").read_text() == "the run that went wrong\n"


def test_a_file_that_is_not_a_record_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x").write_text('{"format": "something else"}\n')
    with pytest.raises(ValueError, match="not a policy record"):
        read(tmp_path / "x")
    (tmp_path / "y").write_text("not json\n")
    with pytest.raises(ValueError, match="not a policy record"):
        read(tmp_path / "y")
    assert replay_cli.main([str(tmp_path / "y")]) == 2
    assert replay_cli.main([str(tmp_path / "missing")]) == 2


def test_the_replay_command_shows_shares_and_why_the_token_sat_free(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    sim = recorded_run(tmp_path / "r.jsonl", seconds=4)
    assert replay_cli.main([str(tmp_path / "r.jsonl"), "--from", "1", "--to", "3", "--free", "0"]) == 0
    out = capsys.readouterr().out
    header, *rows = out.split("\n\n")[0].splitlines()
    assert header.split()[:7] == ["second", "a", "50/50", "b", "13/60", "c", "10/100"]
    assert [int(r.split()[0]) for r in rows] == [1, 2]
    # Each second's charged shares are those the simulation served.
    for row in rows:
        second = int(row.split()[0])
        served = [100 * sim.result.share(name, second * SECOND, (second + 1) * SECOND) for name in "abc"]
        assert row.split()[1:4] == [f"{x:.1f}" for x in served]
    # Each free span says who waited and what held each back.
    spans = out.split("\n\n")[1:]
    assert spans, out
    assert all("waiting" in s and "may run in" in s for s in spans)


def test_the_daemon_records_what_it_decides(short_dir: Path) -> None:
    """`--record`: a real daemon's record replays to the same grants, and a daemon killed
    mid-run leaves a record that replays up to its last flush."""
    record = short_dir / "r.jsonl"
    proc = spawn_daemon(short_dir / "sched", "--window", "1s", "--record", str(record))
    context = zmq.Context()
    try:
        admin = AdminClient(short_dir / "sched" / "admin.sock", context)
        admin.wait_ready(15)
        endpoint = admin.call("add", tenant="t", request=30, limit=30)["endpoint"]
        client = TenantClient(str(endpoint), context)
        lease = client.acquire(5).fields[0]
        for _ in range(20):
            time.sleep(0.002)
            client.release(lease, 2 * MS, more=True)
            lease = client.wait_grant(5).fields[0]
        client.release(lease, 0)
        admin.call("stats")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        client.close()
        admin.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        context.destroy(linger=0)
    grants = []
    replay = Replay(record)
    while (step := replay.step()) is not None:
        if step.method == "dispatch" and step.result:
            grants.append(step.result)
    assert len(grants) == 21
    assert {g[0] for g in grants} == {"t"}


def test_the_daemon_refuses_to_record_over_a_file(short_dir: Path) -> None:
    (short_dir / "r.jsonl").write_text("kept\n")
    proc = spawn_daemon(short_dir / "sched", "--record", str(short_dir / "r.jsonl"))
    assert proc.wait(30) == 2
    assert (short_dir / "r.jsonl").read_text() == "kept\n"
