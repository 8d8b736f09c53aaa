"""--device-list-strategy: how an Allocate answer names its GPUs to the container runtime, as
NVIDIA's device plugin does (envvar, volume-mounts, cdi-cri, or several), in every mode."""

from __future__ import annotations

import argparse

import pytest

from device_plugin import config
from device_plugin.pods import StaticPods
from node_state.options import ConfigError

CORE = "tencent.com/vcuda-core"
GPU = "nvidia.com/gpu"
ROOT = "/var/run/nvidia-container-devices"


def devices_named(resp) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """What of the answer names GPUs: the variable, the device-list mounts, the CDI devices."""
    return {"env": resp.envs.get("NVIDIA_VISIBLE_DEVICES"),
            "mounts": sorted((m.host_path, m.container_path, m.read_only) for m in resp.mounts
                             if m.container_path.startswith(ROOT)),
            "cdi": [d.name for d in resp.cdi_devices]}


def expected(strategy: str, uuids: list[str]) -> dict[str, object]:
    chosen = strategy.split(",")
    mounts = sorted(("/dev/null", f"{ROOT}/{u}", True) for u in uuids) if "volume-mounts" in chosen else []
    env = ROOT if "volume-mounts" in chosen else ",".join(uuids) if "envvar" in chosen else "void"
    cdi = [f"nvidia.com/gpu={u}" for u in uuids] if "cdi-cri" in chosen else []
    return {"env": env, "mounts": mounts, "cdi": cdi}


STRATEGIES = ["envvar", "volume-mounts", "cdi-cri", "envvar,cdi-cri", "volume-mounts,cdi-cri"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_pgpu_names_its_gpus_by_each_strategy(agent_factory, kubelet, dp, strategy):
    agent_factory("pgpu", gpus=2, device_list_strategy=strategy)
    a, b = dp.gpu(0).uuid, dp.gpu(1).uuid
    resp = kubelet.allocate(GPU, [b, a]).container_responses[0]
    assert devices_named(resp) == expected(strategy, [b, a])


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("cores", [30, 200])
def test_vgpu_names_its_gpus_by_each_strategy_beside_its_own_mounts(agent_factory, kubelet, dp, strategy, cores):
    agent_factory("vgpu", gpus=2, pods=StaticPods([dp.pod("p", cores=cores)]), device_list_strategy=strategy)
    uuids = [dp.gpu(0).uuid] if cores < 100 else [dp.gpu(0).uuid, dp.gpu(1).uuid]
    ids = [f"{u}::{i}" for u in uuids for i in range(min(cores, 100))]
    resp = kubelet.allocate(CORE, ids).container_responses[0]
    assert devices_named(resp) == expected(strategy, uuids)
    paths = {m.container_path for m in resp.mounts}
    assert {"/run/vcuda-quota", "/run/vcuda", "/etc/ld.so.preload"} <= paths   # the quota's mounts are kept


def parse(argv: list[str], env: dict[str, str] | None = None) -> config.PluginConfig:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.from_args(parser.parse_args(["--mode", "vgpu", *argv]), env or {})


def test_the_option_takes_a_comma_list_from_flag_or_env():
    assert parse([]).device_list_strategy == ("envvar",)
    assert parse(["--device-list-strategy", "volume-mounts, cdi-cri"]).device_list_strategy == \
        ("volume-mounts", "cdi-cri")
    assert parse([], {"VCUDA_PLUGIN_DEVICE_LIST_STRATEGY": "cdi-cri"}).device_list_strategy == ("cdi-cri",)


@pytest.mark.parametrize(("value", "message"), [
    ("cdi-annotations", "unknown strategy 'cdi-annotations'"),
    (",", "give at least one of envvar, volume-mounts, cdi-cri"),
])
def test_a_bad_strategy_names_the_option(value, message):
    with pytest.raises(ConfigError) as e:
        parse(["--device-list-strategy", value])
    assert str(e.value).startswith("--device-list-strategy:") and message in str(e.value)


def test_opt_out_namespaces_option():
    assert parse([]).allow_opt_out_namespaces == frozenset()
    assert parse(["--allow-opt-out-namespaces", "batch, ml-dev"]).allow_opt_out_namespaces == {"batch", "ml-dev"}
    with pytest.raises(ConfigError, match="--allow-opt-out-namespaces: 'Batch': 'Batch' is not a namespace name"):
        parse(["--allow-opt-out-namespaces", "Batch"])


def test_comma_list_options_take_a_list_in_the_config_file(tmp_path):
    path = tmp_path / "plugin.yaml"
    path.write_text("device-list-strategy: [volume-mounts, cdi-cri]\nallow-opt-out-namespaces: [batch]\n")
    cfg = parse(["--config", str(path)])
    assert (cfg.device_list_strategy, cfg.allow_opt_out_namespaces) == (("volume-mounts", "cdi-cri"), {"batch"})
