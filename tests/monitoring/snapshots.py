"""A fixed node snapshot (two GPUs, a pod and a bare-metal run) for rendering tests."""

from __future__ import annotations

from node_state.metrics_snapshot import ContainerGPU, GPUState, NodeSnapshot, TenantStats, WaitHistogram
from py_vcuda.nvml import GPUUsage

GiB = 1 << 30
MiB = 1 << 20

UUID0 = "GPU-00000000-0000-4000-8000-000000000000"
UUID1 = "GPU-00000000-0001-4000-8000-000000000001"


def row(**overrides: object) -> ContainerGPU:
    wait = WaitHistogram((0.001, 0.01), (2, 8, 10), 0.05)
    base: dict[str, object] = dict(
        key="c1", mode="vgpu", gpu=0, uuid=UUID0, namespace="team-a", pod="train-0", container="main",
        tenant="t1", core_request=0.3, core_limit=0.5, memory_limit=1 * GiB, memory_used=320 * MiB,
        memory_peak=512 * MiB, oom_denials=2, share=0.31,
        tenant_stats=TenantStats(share=0.31, grants=42, overruns=1, waiting=0, wait_p99_s=0.012, wait=wait,
                                 revocations=3, budget_s=0.001, budget_hits=120))
    base.update(overrides)
    return ContainerGPU(**base)  # type: ignore[arg-type]


SNAPSHOT = NodeSnapshot(
    node="node-a", mode="vgpu",
    gpus=(GPUState(0, UUID0, "Sim GPU", GPUUsage(55.0, 2 * GiB, 16 * GiB, 42.0, 75.0), True, 10.0),
          GPUState(1, UUID1, "Sim GPU", GPUUsage(0.0, 0, 16 * GiB, None, None), None, None)),
    containers=(
        row(),
        row(key="c2", namespace="", pod="", container="python3 train.py", tenant="run-77", core_request=0.5,
            core_limit=0.5, memory_limit=512 * MiB, memory_used=500 * MiB, share=0.1,
            tenant_stats=TenantStats(0.1, 5, 0, 1, 0.2, WaitHistogram((0.1,), (1, 5), 1.0), priority="high")),
    ),
    errors=("token scheduler of GPU 3 (/x) did not answer",),
)
