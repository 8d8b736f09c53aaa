"""The simulator's NVML loaded into the test process, used through
nvidia-ml-py (pynvml) as the device plugin and the node agent use it."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from py_vcuda import nvml as vnvml
from py_vcuda.sim import SimConfig


def open_nvml(cfg: SimConfig, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An NVML session on cfg's simulator for the body of a fixture (yield from it)."""
    for k in ("VCUDA_SIM_NUMA", "VCUDA_SIM_NVLINK", "VCUDA_SIM_MIG"):
        monkeypatch.delenv(k, raising=False)
    for k, v in cfg.env().items():
        monkeypatch.setenv(k, v)
    vnvml._load(cfg.env()["VCUDA_REAL_LIBNVML"])  # one NVML library per process
    pynvml.nvmlInit()
    yield
    pynvml.nvmlShutdown()


def h(i: int):  # type: ignore[no-untyped-def]
    return pynvml.nvmlDeviceGetHandleByIndex(i)


def nvml_error(fn, *args) -> int:  # type: ignore[no-untyped-def]
    """The NVML error fn(*args) raises."""
    with pytest.raises(pynvml.NVMLError) as exc:
        fn(*args)
    return exc.value.value


def check_instance_share_reported(layout, node: str, sim: SimConfig, instance_uuid: str,  # type: ignore[no-untyped-def]
                                  instances: set[str], limit: int) -> None:
    """The exporter's and `vcuda top`'s reading of a node whose one container is a share of a MIG
    instance on GPU 0: the share under its parent GPU, with its instance's token-scheduler figures,
    and every instance listed. The device plugin (vgpu) and the DRA driver must read the same."""
    from node_state.metrics_snapshot import NodeReader
    from py_vcuda.sim import nvml_session

    with nvml_session(sim) as session:
        reader = NodeReader(layout, mode="vgpu", node=node, nvml=session)
        try:
            snap = reader.snapshot()
        finally:
            reader.close()
    (row,) = snap.containers
    assert (row.uuid, row.gpu, row.memory_limit) == (instance_uuid, 0, limit)
    assert row.tenant_stats is not None and row.tenant_stats.grants > 0   # its kernels ran under the instance's
    assert {m.uuid for m in snap.mig} == instances
