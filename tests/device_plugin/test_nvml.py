"""py_vcuda.nvml on the simulator: NUMA nodes, NVLink peers, XID watches, probes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from py_vcuda.nvml import NVML, _sysfs_bus_id
from py_vcuda.sim import GiB, SimConfig, SimReader, nvml_session


def config(tmp_path: Path, **kw) -> SimConfig:  # type: ignore[no-untyped-def]
    return SimConfig(state_path=tmp_path / "state", memory=1 * GiB, **kw)


@pytest.fixture
def four(tmp_path: Path) -> Iterator[tuple[NVML, SimReader]]:
    cfg = config(tmp_path, devices=4, numa=[0, 0, 1, 1], nvlink=[(0, 1), (2, 3), (1, 2)])
    with nvml_session(cfg) as nvml, SimReader(cfg.state_path) as sim:
        yield nvml, sim


def test_numa_nodes_come_from_nvml(four: tuple[NVML, SimReader]) -> None:
    nvml, _ = four
    assert [g.numa_node for g in nvml.gpus()] == [0, 0, 1, 1]


def test_nvlink_peers(four: tuple[NVML, SimReader]) -> None:
    nvml, _ = four
    assert [nvml.nvlink_peers(i) for i in range(4)] == [{1}, {0, 2}, {1, 3}, {2}]
    assert nvml.nvlink_links(1) == {0: 1, 2: 1}  # the simulator has one link per pair


def test_gpus_on_an_nvswitch_fabric_are_all_peers(tmp_path: Path) -> None:
    with nvml_session(config(tmp_path, devices=3, nvswitch=True)) as nvml:
        assert [nvml.nvlink_peers(i) for i in range(3)] == [{1, 2}, {0, 2}, {0, 1}]
        assert nvml.nvlink_links(0) == {1: 18, 2: 18}


def test_no_numa_no_nvlink(tmp_path: Path) -> None:
    with nvml_session(config(tmp_path, devices=2)) as nvml:
        assert [g.numa_node for g in nvml.gpus()] == [None, None]
        assert nvml.nvlink_peers(0) == set()
        assert nvml.pci_bus_id(1) == "0000:11:00.0"


@pytest.mark.parametrize(("content", "expected"), [("1\n", 1), ("-1\n", None), ("junk", None)])
def test_numa_falls_back_to_sysfs(tmp_path: Path, content: str, expected: int | None) -> None:
    """NVML without a NUMA answer: the PCI device's numa_node in sysfs decides."""
    sysfs = tmp_path / "sys"
    dev = sysfs / "bus/pci/devices/0000:10:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text(content)
    with nvml_session(config(tmp_path, devices=2)) as nvml:
        nvml.sysfs = sysfs
        assert nvml.numa_node(0) == expected
        assert nvml.numa_node(1) is None  # no sysfs entry for 0000:11:00.0


def test_a_stand_in_library_does_not_read_this_hosts_sysfs(tmp_path: Path) -> None:
    with nvml_session(config(tmp_path)) as nvml:
        assert nvml.sysfs is None


@pytest.mark.parametrize(("nvml_id", "sysfs_id"), [
    ("00000000:3B:00.0", "0000:3b:00.0"),
    ("0000:3B:00.0", "0000:3b:00.0"),
    ("00000001:AF:00.1", "0001:af:00.1"),
])
def test_bus_ids_in_sysfs_spelling(nvml_id: str, sysfs_id: str) -> None:
    assert _sysfs_bus_id(nvml_id) == sysfs_id


def test_xid_watch_reports_uuid_and_xid(four: tuple[NVML, SimReader]) -> None:
    nvml, sim = four
    gpus = nvml.gpus()
    with nvml.watch_xids([gpus[1].uuid, gpus[3].uuid]) as watch:
        assert watch.wait(0) == []
        sim.inject_xid(1, 48)
        sim.inject_xid(0, 79)  # not watched
        sim.inject_xid(3, 63)
        sim.inject_xid(3, 13)
        got: list[tuple[str, int]] = []
        while len(got) < 3:
            batch = watch.wait(10_000)
            assert batch, "no event within 10 s"
            got += batch
        assert sorted(got) == sorted([(gpus[1].uuid, 48), (gpus[3].uuid, 63), (gpus[3].uuid, 13)])
        assert watch.wait(0) == []
    with pytest.raises(Exception, match="closed"):
        watch.wait(0)


def test_a_lost_gpu_is_left_out_of_a_new_watch_and_fails_its_probe(
        four: tuple[NVML, SimReader]) -> None:
    nvml, sim = four
    gpus = nvml.gpus()
    assert all(nvml.probe(i) for i in range(4))
    sim.set_lost(2)
    assert not nvml.probe(2)
    assert nvml.probe(1)
    with nvml.watch_xids(g.uuid for g in gpus) as watch:
        assert set(watch.unwatched) == {gpus[2].uuid}
        assert "lost" in watch.unwatched[gpus[2].uuid].lower()
    sim.set_lost(2, False)
    assert nvml.probe(2)
