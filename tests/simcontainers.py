"""Containers on the GPU simulator without a container runtime: sim_tool
processes under the shim, each "container" with its own ledger and a
simulated pid namespace (VCUDA_SIM_HOST_PID_OFFSET: NVML reports pid +
offset), and a fake host /proc that maps those host pids back the way the
kernel's NSpid does."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from py_vcuda import native
from py_vcuda.memory_reconciler import Account


class FakeProc:
    """A host /proc for processes that pretend to live in pid namespaces: entry
    <host pid> holds the real process's stat (so its start time), an NSpid line
    naming both pids, a cgroup file and a copy of its maps (what it has loaded).
    ``self`` names the test's own pid, as the /proc of its pid namespace would:
    a process added with host pid = its real pid can be signalled through it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "self").symlink_to(str(os.getpid()))

    def add(self, real_pid: int, host_pid: int, cgroup: str = "0::/\n", nspid: bool = True) -> None:
        entry = self.root / str(host_pid)
        entry.mkdir(exist_ok=True)
        stat = Path(f"/proc/{real_pid}/stat").read_text()
        # The parent field is the host's view; these tests never follow it across namespaces.
        (entry / "stat").write_text(stat)
        pids = f"{host_pid}\t{real_pid}" if host_pid != real_pid else f"{host_pid}"
        status = f"Name:\tsim_tool\nPid:\t{host_pid}\n" + (f"NSpid:\t{pids}\n" if nspid else "")
        (entry / "status").write_text(status)
        (entry / "cgroup").write_text(cgroup)
        (entry / "maps").write_text(Path(f"/proc/{real_pid}/maps").read_text())


@dataclass
class Container:
    key: str
    ledger: Path
    offset: int      # host pid = pid + offset
    pod_uid: str = ""

    def account(self, uuid: str, shim: bool = False) -> Account:
        return Account(key=self.key, ledger=self.ledger, gpus=(uuid,), pod_uid=self.pod_uid, shim=shim)

    def env(self, limit: int, shim: bool = True) -> dict[str, str]:
        env = {"VCUDA_SIM_HOST_PID_OFFSET": str(self.offset), "VCUDA_LEDGER": str(self.ledger),
               "VCUDA_MEMORY_LIMIT": str(limit), "VCUDA_LOG_LEVEL": "error"}
        if shim:
            env["LD_PRELOAD"] = str(native.lib_path(native.SHIM))
        return env
