"""A shared-GPU container's node side: its directory (record, ledger, quota file, preload
file), its token-scheduler tenant, and the environment and mounts that put them into the container.

vgpu Allocate (device_plugin.vgpu) and the DRA driver's prepare (dra_driver.driver)
both set containers up through `set_up` and describe them through `injection`, so
a container looks the same to libvcuda, the exporter and `vcuda top` whichever
of them made it. What goes in the container (**contract** with libvcuda):

    NVIDIA_VISIBLE_DEVICES   the record's GPUs (the device-list strategy may rewrite it:
                             device_plugin.device_list)
    the driver's part        node_state.gpu_driver: nothing of ours on a real node (NVIDIA's container
                             toolkit brings the driver), the simulator's libraries and state in the
                             e2e tier. Every GPU container gets it here (`gpu_container`), whatever
                             the mode: pgpu and mps answers start from it too
    mounts: the directory's quota/ part (read-only, /run/vcuda-quota), its shared/ part,
            libvcuda, the tenant's socket directory, and /etc/ld.so.preload unless the
            operator let the container opt out (device_plugin.vgpu, dra_driver.driver)

The quota file is the only word on the quota: no VCUDA_* variable goes in the
environment. libvcuda ignores them when the file is there (with a warning naming
them), so a variable of ours would only make that warning appear in every process,
where it should mean that the pod's own spec tried to loosen its quota.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from node_state.containers import (
    CONTAINER_DIR,
    CONTAINER_LIB,
    CONTAINER_SCHED_DIR,
    PRELOAD_FILE,
    ContainerStore,
)
from node_state.layout import ContainerRecord, NodeLayout
from node_state.schedulers import SchedulerError, TokenScheduler
from py_vcuda.quota_file import CONTAINER_QUOTA_DIR

PRELOAD_TARGET = Path("/etc/ld.so.preload")


@dataclass(frozen=True)
class Mount:
    host: Path
    container: Path
    read_only: bool


@dataclass(frozen=True)
class Injection:
    """What a container gets: environment and bind mounts."""

    env: dict[str, str]
    mounts: tuple[Mount, ...]


def tenant_dir(schedulers: Mapping[str, TokenScheduler], record: ContainerRecord) -> Path | None:
    """Where the record's tenant socket lives (None: no tenant), whether or not it is registered yet."""
    if record.tenant is None:
        return None
    return schedulers[record.gpus[0]].tenant_dir(record.tenant)


def add_tenant(schedulers: Mapping[str, TokenScheduler], record: ContainerRecord) -> Path | None:
    """Register the record's tenant (if it has one) with its GPU's scheduler; returns its socket directory.

    SchedulerError when there is no scheduler for the GPU or it refuses the quota.
    """
    if record.tenant is None:
        return None
    scheduler = schedulers.get(record.gpus[0])
    if scheduler is None:
        raise SchedulerError(f"no token scheduler for GPU {record.gpus[0]}")
    return scheduler.add(record.tenant, record.core_request, record.core_limit, record.priority)


def set_up(store: ContainerStore, schedulers: Mapping[str, TokenScheduler], record: ContainerRecord, *,
           preload: bool) -> Path | None:
    """Create the container's directory and ledger, then its tenant; returns the tenant's socket directory.

    All or nothing: when the scheduler refuses, the directory goes again (SchedulerError passes on).
    """
    store.create(record, ledger=True, preload=preload)
    try:
        return add_tenant(schedulers, record)
    except Exception:
        store.remove(record.key)
        raise


def gpu_container(gpus: Sequence[str], driver: Injection, env: Mapping[str, str] | None = None,
                  mounts: Sequence[Mount] = ()) -> Injection:
    """What every GPU container gets, in every mode (vgpu, pgpu, mps, DRA): its GPUs named
    (NVIDIA_VISIBLE_DEVICES), the driver's part (node_state.gpu_driver), then `env` and `mounts`."""
    return Injection({"NVIDIA_VISIBLE_DEVICES": ",".join(gpus), **driver.env, **(env or {})},
                     (*driver.mounts, *mounts))


def injection(layout: NodeLayout, record: ContainerRecord, tenant: Path | None, host_lib: Path, *,
              preload: bool, driver: Injection) -> Injection:
    """A shared-GPU container's (vgpu Allocate, DRA prepare): gpu_container with its directory and libvcuda."""
    mounts = [Mount(layout.quota_dir(record.key), CONTAINER_QUOTA_DIR, read_only=True),
              Mount(layout.shared_dir(record.key), CONTAINER_DIR, read_only=False),
              Mount(host_lib, CONTAINER_LIB, read_only=True)]
    if tenant is not None:
        mounts.append(Mount(tenant, CONTAINER_SCHED_DIR, read_only=False))
    if preload:
        mounts.append(Mount(layout.container_dir(record.key) / PRELOAD_FILE, PRELOAD_TARGET, read_only=True))
    return gpu_container(record.gpus, driver, mounts=mounts)
