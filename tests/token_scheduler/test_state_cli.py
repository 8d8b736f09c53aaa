"""Persistence, duration strings and CLI wiring, without sockets."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from token_scheduler import cli, state
from token_scheduler.duration import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "ns"),
    [("10s", 10**10), ("500ms", 5 * 10**8), ("250us", 250_000), ("1.5s", 1_500_000_000),
     ("2", 2 * 10**9), ("1m", 60 * 10**9), ("7ns", 7)],
)
def test_parse_duration(text: str, ns: int) -> None:
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["", "ten", "5 hours", "-1s", "1e3s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration() -> None:
    assert format_duration(10**10) == "10s" and format_duration(1500) == "1500ns"


def test_state_round_trip_is_atomic(tmp_path: Path) -> None:
    specs = [state.TenantSpec("a", 10, 20), state.TenantSpec("b", 30, 30)]
    state.save(tmp_path, "GPU-1", specs)
    assert state.load(tmp_path, "GPU-1") == specs
    assert [p.name for p in tmp_path.iterdir()] == [state.STATE_FILE]  # no temp left


def test_state_missing_is_empty(tmp_path: Path) -> None:
    assert state.load(tmp_path, "0") == []


@pytest.mark.parametrize(
    ("desc", "content"),
    [("not json", "{"), ("wrong format", '{"format": 9, "gpu": "0", "tenants": []}'),
     ("other gpu", '{"format": 1, "gpu": "1", "tenants": []}'),
     ("bad tenant", '{"format": 1, "gpu": "0", "tenants": [{"name": "a"}]}')],
)
def test_state_untrusted(tmp_path: Path, desc: str, content: str) -> None:
    (tmp_path / state.STATE_FILE).write_text(content)
    with pytest.raises(state.StateError):
        state.load(tmp_path, "0")


def test_cli_defaults_and_config() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--gpu", "GPU-x", "--dir", "/tmp/x", "--window", "500ms"])
    config = cli.config_from_args(args)
    assert config.window_ns == 500_000_000
    assert (config.quantum_min_ns, config.quantum_max_ns) == (1_000_000, 50_000_000)
    assert (config.idle_ns, config.idle_high_ns) == (1_000_000, 200_000)
    assert config.short_horizon and config.allowance_ns == 8_000_000  # issue 31: every horizon, by default
    args = parser.parse_args(["--gpu", "0", "--dir", "x", "--idle", "2ms", "--idle-high", "50us"])
    assert (cli.config_from_args(args).idle_ns, cli.config_from_args(args).idle_high_ns) == (2_000_000, 50_000)
    args = parser.parse_args(["--gpu", "0", "--dir", "x", "--short-horizon", "off"])
    assert not cli.config_from_args(args).short_horizon


def test_cli_rejects_bad_duration() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--gpu", "0", "--dir", "x", "--window", "soon"])


def test_cli_bad_bounds_exit_2(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--gpu", "0", "--dir", str(tmp_path), "--quantum-min", "9ms",
                              "--quantum-max", "1ms"])
    assert cli.run(args) == 2
