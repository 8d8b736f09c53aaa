"""The exporter per MIG instance: `vcuda_mig_instance_*` with the parent GPU's labels, the instance
and its profile (node_state.metrics, NodeReader on node_state.testing.FakeMig)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from node_state import metrics_text
from node_state.layout import ContainerRecord, NodeLayout
from node_state.metrics import snapshot_metrics
from node_state.metrics_snapshot import NodeReader
from node_state.testing import ISSUE_NODE_MIG, FakeMig


def samples(reader: NodeReader, name: str) -> dict[tuple[str, str], tuple[dict[str, str], float]]:
    text = metrics_text.render(snapshot_metrics(reader.snapshot())).decode()
    return {(s.labels["mig_instance"], s.labels["profile"]): (s.labels, s.value)
            for f in text_string_to_metric_families(text) for s in f.samples if s.name == name}


def node_with_a_container_on_3g(tmp_path: Path) -> tuple[FakeMig, NodeReader]:
    """The issue's MIG node, 3 GiB used on its 3g.40gb instance by container ns/p/main."""
    fake = FakeMig(list(ISSUE_NODE_MIG))
    big = fake.instances[0][2]
    fake.memory_used[big.uuid] = 3 << 30
    layout = NodeLayout(tmp_path / "n")
    layout.write_record(ContainerRecord(key="c1", mode="pgpu", resource="nvidia.com/mig-3g.40gb",
                                        device_ids=(big.uuid,), gpus=(big.uuid,), core_request=100, core_limit=100,
                                        memory_limit=None, namespace="ns", pod="p", container="main"))
    return fake, NodeReader(layout, mode="pgpu", node="node-a", nvml=fake)  # type: ignore[arg-type]


def test_each_mig_instance_is_exported_with_its_profile_parent_memory_and_containers(tmp_path: Path) -> None:
    fake, reader = node_with_a_container_on_3g(tmp_path)
    small, _, big = fake.instances[0]
    try:
        total = samples(reader, "vcuda_mig_instance_memory_total_bytes")
        assert set(total) == {(d.uuid, d.profile) for d in fake.instances[0]}   # GPU 1 and 2: not in MIG mode
        labels, value = total[(big.uuid, "3g.40gb")]
        assert value == big.memory_total
        assert (labels["gpu"], labels["uuid"], labels["node"]) == ("0", fake.gpus_[0].uuid, "node-a")
        used = samples(reader, "vcuda_mig_instance_memory_used_bytes")
        assert used[(big.uuid, "3g.40gb")][1] == 3 << 30 and used[(small.uuid, "1g.10gb")][1] == 0
        containers = samples(reader, "vcuda_mig_instance_containers")
        assert containers[(big.uuid, "3g.40gb")][1] == 1 and containers[(small.uuid, "1g.10gb")][1] == 0
        (row,) = reader.snapshot().containers
        assert (row.uuid, row.gpu) == (big.uuid, 0)    # a container on an instance: its parent's index
        # A layout changes the instances: the next reading follows.
        fake.instances[0].remove(small)
        assert (small.uuid, "1g.10gb") not in samples(reader, "vcuda_mig_instance_info")
    finally:
        reader.close()


def test_top_shows_each_instance_under_its_gpu_with_its_containers(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from py_vcuda import top

    fake, reader = node_with_a_container_on_3g(tmp_path)
    big = fake.instances[0][2]
    try:
        console = Console(file=io.StringIO(), width=200, record=True, color_system=None)
        console.print(top.render(reader.snapshot()))
        text = console.export_text()
    finally:
        reader.close()
    head = f"GPU 0 MIG 3g.40gb  {big.uuid}  mem 3.0 GiB / {big.memory_total / (1 << 30):.1f} GiB"
    assert head in text
    under = text[text.index(head):].split("MIG 1g.10gb")[0]
    assert "ns/p/main" in under   # listed under its instance
    assert "GPUs not seen by NVML" not in text
    assert text.count("MIG 1g.10gb") == 2
