"""Configuration: flags > env > file > defaults, and one clear line for a bad value."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from device_plugin import config

REPO = Path(__file__).resolve().parents[2]


def parse(argv: list[str], env: dict[str, str] | None = None) -> config.PluginConfig:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.from_args(parser.parse_args(argv), env or {})


def test_defaults():
    cfg = parse(["--mode", "vgpu"], {"NODE_NAME": "n1"})
    assert cfg.device_plugin_dir == Path("/var/lib/kubelet/device-plugins")
    assert cfg.pod_resources_socket == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert cfg.state_dir == Path("/var/lib/vcuda") and cfg.metrics_port == 9394
    assert (cfg.node_name, cfg.resource_domain, cfg.annotation_prefix) == ("n1", "tencent.com", "vcuda.io")
    assert cfg.features_file == Path("/etc/kubernetes/node-feature-discovery/features.d/vcuda")
    assert (cfg.on_escape, cfg.on_over_limit) == ("kill", "report")


def test_quota_guard_options_from_flags_and_env():
    cfg = parse(["--mode", "vgpu", "--on-escape", "report"], {"VCUDA_PLUGIN_ON_OVER_LIMIT": "kill"})
    assert (cfg.on_escape, cfg.on_over_limit) == ("report", "kill")


@pytest.mark.parametrize("suffix,text", [
    (".yaml", "mode: pgpu\nmetrics-port: 1000\nstate_dir: /from/file\nnode_name: file-node\n"),
    (".json", '{"mode": "pgpu", "metrics_port": 1000, "state-dir": "/from/file", "node_name": "file-node"}'),
])
def test_precedence_flag_env_file(tmp_path, suffix, text):
    path = tmp_path / f"plugin{suffix}"
    path.write_text(text)
    cfg = parse(["--config", str(path)], {})
    assert (cfg.mode, cfg.metrics_port, cfg.state_dir, cfg.node_name) == ("pgpu", 1000, Path("/from/file"),
                                                                          "file-node")
    env = {"VCUDA_PLUGIN_METRICS_PORT": "2000", "VCUDA_PLUGIN_MODE": "mps", "NODE_NAME": "env-node"}
    cfg = parse(["--config", str(path)], env)
    assert (cfg.mode, cfg.metrics_port, cfg.node_name) == ("mps", 2000, "env-node")
    cfg = parse(["--config", str(path), "--metrics-port", "0", "--mode", "vgpu"], env)
    assert (cfg.mode, cfg.metrics_port, cfg.state_dir) == ("vgpu", 0, Path("/from/file"))


@pytest.mark.parametrize("argv,env,file_text,message", [
    ([], {}, None, "--mode: required"),
    (["--mode", "gpu"], {}, None, "--mode: 'gpu': must be one of vgpu, pgpu, mps"),
    (["--mode", "vgpu"], {"VCUDA_PLUGIN_METRICS_PORT": "99999"}, None, "VCUDA_PLUGIN_METRICS_PORT: '99999'"),
    (["--mode", "vgpu", "--metrics-port", "http"], {}, None, "--metrics-port: 'http'"),
    (["--mode", "vgpu", "--ignored-xids", "13,x"], {}, None, "'x' is not an XID number"),
    (["--mode", "vgpu", "--resource-domain", "a/b"], {}, None, "--resource-domain"),
    (["--mode", "vgpu"], {}, "colour: blue\n", "unknown option 'colour'"),
    (["--mode", "vgpu"], {}, "mode: [unclosed\n", "is not valid YAML"),
    (["--mode", "vgpu"], {}, "- a\n- b\n", "must hold a mapping"),
    (["--mode", "vgpu"], {}, "log_level: loud\n", "log_level: 'loud': must be one of"),
    (["--mode", "vgpu", "--on-escape", "ignore"], {}, None, "--on-escape: 'ignore': must be one of kill, report"),
])
def test_bad_values_name_the_option(tmp_path, argv, env, file_text, message):
    if file_text is not None:
        path = tmp_path / "c.yaml"
        path.write_text(file_text)
        argv = [*argv, "--config", str(path)]
    with pytest.raises(config.ConfigError) as e:
        parse(argv, env)
    assert message in str(e.value)


def test_cli_bad_value_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "device_plugin", "--mode", "vgpu", "--metrics-port", "-1"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "vcuda device-plugin: --metrics-port: '-1': must be a port number 0..65535 (0 disables)"]


def test_every_option_has_an_env_alias_in_the_docs():
    for option in config.OPTIONS:
        assert config.env_name(option) in config.__doc__, option.name
