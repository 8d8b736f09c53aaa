"""Test doubles of the node, for tests and benchmarks of the node daemons (device plugin, DRA driver),
importable outside pytest: GPUs with the simulator's UUIDs (a simulated program sees the same cards),
and waiting for a condition without sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from node_state.gpus import Inventory
from py_vcuda.nvml import GPUInfo
from py_vcuda.sim import GiB


def gpu(index: int, *, numa: int | None = None, memory: int = 16 * GiB) -> GPUInfo:
    """A GPU with the simulator's UUID scheme, so a simulated program sees the same card."""
    return GPUInfo(index=index, uuid=f"GPU-5157a0c0-{index:04x}-4000-8000-{index:012x}",
                   name="vcuda simulated GPU", memory_total=memory, minor=index, numa_node=numa)


def inventory(n: int, **kw: Any) -> Inventory:
    return Inventory(tuple(gpu(i, **kw) for i in range(n)))


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)
