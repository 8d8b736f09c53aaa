"""One token scheduler per GPU (vgpu mode), as a supervised child process.

The scheduler keeps its tenants in ``tenants.json`` and restores them itself
after a restart; `after_start` also re-adds every tenant the plugin's records
hold, so a lost or stale file cannot leave a running container without its
socket.

Each scheduler process is started through node_state.lifeline, so it ends
with the agent even when the agent is killed without a chance to stop it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import node_state
import token_scheduler
from node_state import lifeline
from node_state.layout import ContainerRecord, NodeLayout, gpu_key
from token_scheduler.admin_client import AdminClient

log = logging.getLogger(__name__)

TenantQuota = tuple[str, int, int, str]   # (tenant, request %, limit %, priority)


class SchedulerError(RuntimeError):
    """The scheduler refused or did not answer; the message says which GPU and why."""


def child_env() -> dict[str, str]:
    """Our environment, with the directories that hold token_scheduler and node_state on PYTHONPATH."""
    env = dict(os.environ)
    roots = dict.fromkeys(str(Path(m.__file__).resolve().parents[1]) for m in (token_scheduler, node_state))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*roots, env.get("PYTHONPATH")]))
    return env


def remove_tenant(schedulers: Mapping[str, TokenScheduler], record: ContainerRecord) -> None:
    """Take a container's tenant off its GPU's scheduler. A refusal is only logged: the container is
    going away either way, and a scheduler that forgot the tenant (restarted) has nothing to remove."""
    if not record.tenant:
        return
    scheduler = schedulers.get(record.gpus[0])
    try:
        if scheduler is not None:
            scheduler.remove(record.tenant)
    except SchedulerError as exc:
        log.warning("removing tenant %s of container %s: %s", record.tenant, record.key, exc)


class TokenScheduler:
    def __init__(self, uuid: str, layout: NodeLayout, tenants: Callable[[], Iterable[TenantQuota]],
                 *, ready_timeout_s: float = 15.0) -> None:
        self.uuid = uuid
        self.name = f"token scheduler for {uuid}"
        self.directory = layout.scheduler_dir(uuid)
        self.log_path = layout.schedulers / f"{gpu_key(uuid)}.log"
        self.tenants = tenants
        self.ready_timeout_s = ready_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()   # a REQ socket serves one caller at a time

    def start(self) -> None:
        self.stop()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logfile:
            # Bound to our life (lifeline): a SIGKILLed agent leaves no scheduler behind.
            self._proc = subprocess.Popen(
                lifeline.command("token_scheduler", "--gpu", self.uuid, "--dir", str(self.directory)),
                stdin=subprocess.DEVNULL, stdout=logfile, stderr=logfile, env=child_env())
        with self._lock:
            self._admin = AdminClient(self.directory / "admin.sock")
            try:
                self._admin.wait_ready(self.ready_timeout_s)
            except TimeoutError:
                raise TimeoutError(f"{self.name} did not answer within {self.ready_timeout_s} s; "
                                   f"see {self.log_path}") from None
        log.info("%s running (pid %d)", self.name, self._proc.pid)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def after_start(self) -> None:
        for tenant, request, limit, priority in self.tenants():
            try:
                self.add(tenant, request, limit, priority)
            except SchedulerError as exc:
                log.error("re-registering tenant %s: %s", tenant, exc)

    def stop(self) -> None:
        with self._lock:
            if self._admin is not None:
                self._admin.close()
                self._admin = None
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def call(self, op: str, **fields: object) -> dict[str, object]:
        with self._lock:
            if self._admin is None:
                raise SchedulerError(f"{self.name} is not running")
            try:
                reply = self._admin.call(op, **fields)
            except TimeoutError as exc:
                raise SchedulerError(f"{self.name}: {exc}") from None
        if not reply.get("ok"):
            raise SchedulerError(f"{self.name} refused {op}: {reply.get('error')}")
        return reply

    def add(self, tenant: str, request: int, limit: int, priority: str = "normal") -> Path:
        """Register (or re-apply) a tenant; returns the directory holding its socket."""
        try:
            self.call("add", tenant=tenant, request=request, limit=limit, priority=priority)
        except SchedulerError as exc:
            if "exists" not in str(exc):
                raise
            self.call("update", tenant=tenant, request=request, limit=limit, priority=priority)
        return self.tenant_dir(tenant)

    def tenant_dir(self, tenant: str) -> Path:
        """The directory holding a tenant's socket (mounted into its container)."""
        return self.directory / "tenants" / tenant

    def update(self, tenant: str, request: int, limit: int, priority: str = "normal") -> None:
        self.call("update", tenant=tenant, request=request, limit=limit, priority=priority)

    def remove(self, tenant: str) -> None:
        try:
            self.call("remove", tenant=tenant)
        except SchedulerError as exc:
            if "no tenant" not in str(exc):
                raise
