"""The container quota file (/run/vcuda-quota/quota.conf, "the node's word"):
when its directory exists it is the only source of the quota, whatever the
process's environment; only the GPUs it names can be used; a file that cannot
be read or understood fails closed.

The file sits at a fixed path with no override, so these programs run in a
private mount namespace with a tmpfs on /run and a host directory bound
read-only at /run/vcuda-quota, under a clean environment (`env -i`, as sshd,
cron or `su -` start processes) plus what each case adds. The parser is also
tested on its own, through vcuda_quota_parse."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubecontainer import skip_unless_namespaces, skip_unless_others_can_read
from shimtest import MiB, Result, Runner, one_gpu_sim_env, parse

from py_vcuda import native
from py_vcuda._native import ffi, lib
from py_vcuda.ledger import Ledger
from token_scheduler.testing import AdminClient

QUOTA_FILE = "/run/vcuda-quota/quota.conf"
GPU0 = "GPU-5157a0c0-0000-4000-8000-000000000000"  # the simulator's UUIDs
GPU1 = "GPU-5157a0c0-0001-4000-8000-000000000001"
LIMIT = 1024 * MiB
NOT_INITIALIZED = 3
OUT_OF_MEMORY = 2
INVALID_DEVICE = 101
NOBODY = 65534


@dataclass
class Gpu:
    uuid: str
    memory: int | None  # None: unlimited
    scheduler: str = ""

    def line(self) -> str:
        return f"gpu={self.uuid} memory={'unlimited' if self.memory is None else self.memory} " \
               f"scheduler={self.scheduler}"


def quota_text(ledger: str, gpus: Sequence[Gpu], *, core_request: int = 30, core_limit: int = 60,
               priority: str = "normal", timeout_ms: int = 5000, on_loss: str = "block") -> str:
    """A quota file in the canonical form (every optional key written), as vcuda_quota_parse gives it back."""
    lines = ["version=1", f"ledger={ledger}", f"core_request={core_request}", f"core_limit={core_limit}",
             f"priority={priority}", f"scheduler_timeout_ms={timeout_ms}", f"on_scheduler_loss={on_loss}",
             *(g.line() for g in gpus), "end"]
    return "\n".join(lines) + "\n"


def parse_quota(text: str | bytes) -> tuple[bool, str]:
    """libvcuda's reading of a quota file: (valid, canonical text or the reason)."""
    data = text.encode() if isinstance(text, str) else text
    out = ffi.new("char[]", 65536)
    rc = lib().vcuda_quota_parse(data, len(data), out, 65536)
    return rc == 0, ffi.string(out).decode()


# --- the parser ------------------------------------------------------------------------------------

GOOD = quota_text("/run/vcuda/ledger", [Gpu(GPU0, LIMIT, "ipc:///run/vcuda/sched/sched.sock"), Gpu(GPU1, None)])


def test_a_canonical_file_reads_back_unchanged() -> None:
    assert parse_quota(GOOD) == (True, GOOD)


def test_comments_blank_lines_and_defaults() -> None:
    text = ("# vcuda quota of this container: written by the node agent, read-only here\n\nversion=1\n"
            "ledger=/l\n  # an indented comment\ncore_request=10\ncore_limit=10\npriority=high\n"
            f"gpu=MIG-{GPU0[4:]} memory=0 scheduler=\n\nend\n# after the end\n")
    ok, back = parse_quota(text)
    assert ok, back
    assert back == quota_text("/l", [Gpu(f"MIG-{GPU0[4:]}", 0)], core_request=10, core_limit=10,
                              priority="high")


def test_the_last_line_needs_no_newline() -> None:
    assert parse_quota(GOOD.rstrip("\n")) == (True, GOOD)


def test_crlf_line_ends_read_as_py_vcuda_reads_them() -> None:
    assert parse_quota(GOOD.replace("\n", "\r\n")) == (True, GOOD)


def test_what_the_node_agent_writes_is_what_libvcuda_reads() -> None:
    """py_vcuda.quota_file renders the file the node agent mounts: libvcuda reads it the same."""
    quota_file = pytest.importorskip("py_vcuda.quota_file")
    q = quota_file.QuotaFile(ledger="/run/vcuda/ledger", core_request=25, core_limit=80, priority="high",
                             gpus=(quota_file.GPUQuota(GPU0, LIMIT, "ipc:///run/vcuda/sched/t.sock"),
                                   quota_file.GPUQuota(f"MIG-{GPU1[4:]}", None)),
                             scheduler_timeout_ms=0, on_scheduler_loss="run")
    ok, back = parse_quota(q.render())
    assert ok, back
    assert back == quota_text("/run/vcuda/ledger", [Gpu(GPU0, LIMIT, "ipc:///run/vcuda/sched/t.sock"),
                                                   Gpu(f"MIG-{GPU1[4:]}", None)],
                              core_request=25, core_limit=80, priority="high", timeout_ms=0, on_loss="run")
    assert quota_file.parse(back) == q


def _edit(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new, 1)


GPU0_LINE = Gpu(GPU0, LIMIT, "ipc:///run/vcuda/sched/sched.sock").line()
# description, text, what the reason says
CORRUPT = [
    ("empty file", "", "no version line"),
    ("only comments", "# nothing\n", "no version line"),
    ("wrong version", _edit("version=1", "version=2"), "line 1: version 2, this libvcuda reads 1"),
    ("version not a number", _edit("version=1", "version=one"), "line 1: version=\"one\" is not a number"),
    ("version not first", "ledger=/l\n" + GOOD, "line 1: the first key must be version"),
    ("truncated: no end", GOOD.replace("end\n", ""), "no end line (truncated?)"),
    ("truncated mid-line", GOOD[: GOOD.index("memory=unlimited") + 3], "expected \" memory=\""),
    ("text after end", GOOD + "core_request=100\n", "text after end"),
    ("unknown key", _edit("priority=normal", "priority=normal\ncore_max=100"), "line 6: unknown key \"core_max\""),
    ("key case matters", _edit("priority=normal", "Priority=normal"), "unknown key \"Priority\""),
    ("not key=value", _edit("priority=normal", "priority normal"), "is not key=value"),
    ("repeated scalar", _edit("core_limit=60", "core_limit=60\ncore_limit=70"), "core_limit given twice"),
    ("relative ledger", _edit("ledger=/run/vcuda/ledger", "ledger=run/ledger"), "not an absolute path"),
    ("ledger with a space", _edit("ledger=/run/vcuda/ledger", "ledger=/run/my ledger"), "without spaces"),
    ("empty ledger", _edit("ledger=/run/vcuda/ledger", "ledger="), "not an absolute path"),
    ("no ledger", _edit("ledger=/run/vcuda/ledger\n", ""), "no ledger line"),
    ("core request 0", _edit("core_request=30", "core_request=0"), "from 1 to 100"),
    ("core request over 100", _edit("core_request=30", "core_request=101"), "from 1 to 100"),
    ("core request negative", _edit("core_request=30", "core_request=-5"), "from 1 to 100"),
    ("core limit below request", _edit("core_limit=60", "core_limit=20"), "core_limit 20 is below core_request 30"),
    ("no core limit", _edit("core_limit=60\n", ""), "no core_limit line"),
    ("bad priority", _edit("priority=normal", "priority=urgent"), "is not high or normal"),
    ("no priority", _edit("priority=normal\n", ""), "no priority line"),
    ("negative timeout", _edit("scheduler_timeout_ms=5000", "scheduler_timeout_ms=-1"), "milliseconds"),
    ("bad loss policy", _edit("on_scheduler_loss=block", "on_scheduler_loss=ignore"), "is not block or run"),
    ("no gpu", GOOD.replace(GPU0_LINE + "\n", "").replace(Gpu(GPU1, None).line() + "\n", ""), "no gpu line"),
    ("gpu not a UUID", _edit(f"gpu={GPU0}", "gpu=0"), "is not a GPU-... or MIG-... UUID"),
    ("gpu memory with a unit", _edit(f"memory={LIMIT}", "memory=1Gi"), "is not a number of bytes or unlimited"),
    ("gpu memory negative", _edit(f"memory={LIMIT}", "memory=-1"), "is not a number of bytes or unlimited"),
    ("gpu fields swapped", _edit(GPU0_LINE, f"gpu={GPU0} scheduler= memory=1"), "expected \" memory=\""),
    ("gpu without scheduler", _edit(GPU0_LINE, f"gpu={GPU0} memory=1"), "has no scheduler= field"),
    ("gpu double space", _edit(GPU0_LINE, f"gpu={GPU0}  memory=1 scheduler="), "expected \" memory=\""),
    ("gpu extra field", _edit(GPU0_LINE, f"gpu={GPU0} memory=1 scheduler= extra=1"), "unexpected text"),
    ("gpu named twice", _edit(GPU0_LINE, f"{GPU0_LINE}\ngpu={GPU0} memory=1 scheduler="), "named twice"),
    ("17 gpus", _edit(GPU0_LINE, "\n".join(Gpu(f"GPU-{i:04d}", 1).line() for i in range(17))), "more than 16"),
    ("NUL byte", GOOD.replace("priority=normal", "priority=nor\0mal"), "NUL byte"),
]


@pytest.mark.parametrize(("text", "reason"), [c[1:] for c in CORRUPT], ids=[c[0] for c in CORRUPT])
def test_a_corrupt_file_is_refused_with_its_reason(text: str, reason: str) -> None:
    ok, why = parse_quota(text)
    assert not ok, f"accepted:\n{why}"
    assert reason in why


# --- in a container: the file at its fixed path ---------------------------------------------------

# A private mount namespace: a tmpfs on /run, the host directory $1 read-only at /run/vcuda-quota,
# then the rest of the arguments (env -i ... program) as the container's process.
CONTAINER_SCRIPT = """
mount -t tmpfs vcuda-quota-test /run
mkdir /run/vcuda-quota
mount --bind -o ro "$1" /run/vcuda-quota
shift
exec "$@"
"""


@pytest.fixture(scope="module")
def namespaces() -> None:
    skip_unless_namespaces()   # to mount /run/vcuda-quota


@dataclass
class Container:
    """A host directory that the container sees at /run/vcuda-quota, and how its processes start."""

    quota_dir: Path
    base_env: dict[str, str]   # the simulated GPU and the preload: what every process of it gets
    ledger: Path               # the file's ledger (host path, outside /run)

    def write(self, gpus: Sequence[Gpu], *, core_request: int = 30, core_limit: int = 60) -> None:
        text = quota_text(str(self.ledger), gpus, core_request=core_request, core_limit=core_limit)
        (self.quota_dir / "quota.conf").write_text(text)

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None, *, user: int | None = None,
            timeout: float = 120) -> Result:
        """argv under `env -i` with the base environment and `env`, optionally as uid/gid `user`."""
        full = {**self.base_env, **(env or {})}
        as_user = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"] if user else []
        cmd = ["unshare", "-m", "/bin/sh", "-ec", CONTAINER_SCRIPT, "container", str(self.quota_dir), *as_user,
               "env", "-i", *(f"{k}={v}" for k, v in full.items()), *argv]
        proc = subprocess.run(cmd, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, capture_output=True,
                              text=True, timeout=timeout)
        return Result(proc.returncode, proc.stdout, proc.stderr, parse(proc.stdout))


@pytest.fixture
def container(namespaces: None, short_dir: Path, lib_dir: Path) -> Iterator[Container]:
    # What uid 65534 must reach too: the probe, the simulator's state, the quota directory.
    short_dir.chmod(0o755)
    quota_dir = short_dir / "quota"
    quota_dir.mkdir()
    quota_dir.chmod(0o755)
    shared = short_dir / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env = {"LD_PRELOAD": str(lib_dir / native.SHIM), **one_gpu_sim_env(lib_dir, shared / "sim.state")}
    yield Container(quota_dir, env, shared / "ledger")


def probe_path(container: Container, cuprobe: Path) -> str:
    """The probe where any uid can run it."""
    path = container.quota_dir.parent / "shared" / "cuprobe"
    if not path.exists():
        shutil.copy(cuprobe, path)
    return str(path)


def vcuda_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("vcuda:")]


# What a pod's spec (or a clean environment) would use to loosen its quota: none of it counts.
LOOSENING = [
    ("memory-limit-8Gi", {"VCUDA_MEMORY_LIMIT": "8Gi"}, "VCUDA_MEMORY_LIMIT"),
    ("per-device-limit", {"VCUDA_MEMORY_LIMIT_0": "8Gi"}, "VCUDA_MEMORY_LIMIT_0"),
    ("disable", {"VCUDA_DISABLE": "1"}, "VCUDA_DISABLE"),
    ("other-ledger", {"VCUDA_LEDGER": "/tmp/elsewhere.ledger"}, "VCUDA_LEDGER"),
    ("clean-environment", {}, None),
]


@pytest.mark.parametrize(("env", "ignored"), [c[1:] for c in LOOSENING], ids=[c[0] for c in LOOSENING])
def test_the_files_memory_limit_holds_whatever_the_environment(container: Container, cuprobe: Path,
                                                               env: dict[str, str], ignored: str | None) -> None:
    container.write([Gpu(GPU0, LIMIT)])
    res = container.run([probe_path(container, cuprobe), "init", "ctx", f"alloc:{512 * MiB}",
                         f"alloc:{512 * MiB}", "info"], env)
    assert res.returncode == 0, res.stderr
    assert [int(d["rc"]) for d in res.lines if d["cmd"] == "alloc"] == [0, OUT_OF_MEMORY], res.stdout + res.stderr
    assert res.get("info", "total") == LIMIT
    with Ledger(container.ledger) as ledger:   # the file's ledger, not the environment's (or none)
        (device,) = ledger.devices()
    assert (device.uuid, device.limit) == (GPU0, LIMIT)
    warnings = [line for line in vcuda_lines(res.stderr) if "ignoring" in line]
    if ignored is None:
        assert warnings == [], res.stderr
    else:
        assert len(warnings) == 1 and ignored in warnings[0] and QUOTA_FILE in warnings[0], res.stderr


def test_an_empty_scheduler_in_the_environment_keeps_the_files(container: Container, cuprobe: Path,
                                                               scheduler: AdminClient) -> None:
    endpoint = str(scheduler.call("add", tenant="a", request=30, limit=30)["endpoint"])
    container.write([Gpu(GPU0, None, endpoint)], core_request=30, core_limit=30)
    res = container.run([probe_path(container, cuprobe), "init", "ctx", "spin:2000:1500:10"],
                        {"VCUDA_SCHEDULER": "", "VCUDA_CORE_LIMIT": "100"})
    assert res.rc("spin") == 0, res.stderr
    stats = scheduler.call("stats")["tenants"]["a"]
    assert stats["grants"] >= 1, stats   # its launches waited for the token of the file's scheduler
    assert res.get("spin", "busy_us") / res.get("spin", "wall_us") < 0.6, res.stdout  # not the whole GPU
    (warning,) = [line for line in vcuda_lines(res.stderr) if "ignoring" in line]
    assert "VCUDA_SCHEDULER" in warning and "VCUDA_CORE_LIMIT" in warning


CONFIG_TEXT = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
buf = ctypes.create_string_buffer(65536)
lib.vcuda_config_text(buf, len(buf))
print(buf.value.decode(), end="")
"""


def config_text(container: Container, env: Mapping[str, str]) -> dict[str, list[str]]:
    """vcuda_config_text of a process in the container: {name: [values]} (gpu= lines repeat)."""
    res = container.run([sys.executable, "-c", CONFIG_TEXT, container.base_env["LD_PRELOAD"]], env)
    assert res.returncode == 0, res.stderr
    out: dict[str, list[str]] = {}
    for line in res.stdout.splitlines():
        name, _, value = line.partition("=")
        out.setdefault(name, []).append(value)
    return out


def test_config_text_says_where_the_quota_comes_from(container: Container) -> None:
    endpoint = "ipc:///run/vcuda/sched/sched.sock"
    container.write([Gpu(GPU0, LIMIT, endpoint), Gpu(GPU1, None)], core_request=30, core_limit=60)
    text = config_text(container, {"VCUDA_SCHEDULER": "", "VCUDA_CORE_LIMIT": "100", "VCUDA_DISABLE": "1"})
    assert text["source"] == [QUOTA_FILE]
    assert text["ignored"] == ["VCUDA_CORE_LIMIT,VCUDA_SCHEDULER,VCUDA_DISABLE"]
    assert text["gpu"] == [f"{GPU0} memory={LIMIT} scheduler={endpoint}", f"{GPU1} memory=unlimited scheduler="]
    assert (text["VCUDA_CORE_LIMIT"], text["VCUDA_DISABLE"], text["error"]) == (["60"], ["0"], [""])
    assert text["VCUDA_LEDGER"] == [str(container.ledger)]


def test_config_text_without_the_file_names_the_environment(lib_dir: Path) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "VCUDA_MEMORY_LIMIT": "1Gi"}
    proc = subprocess.run([sys.executable, "-c", CONFIG_TEXT, str(lib_dir / native.SHIM)], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    if Path("/run/vcuda-quota").exists():
        pytest.skip("this machine has a quota directory")
    assert "source=environment\nignored=\n" in proc.stdout
    assert f"VCUDA_MEMORY_LIMIT={1 << 30}\n" in proc.stdout


# --- only its own GPUs ----------------------------------------------------------------------------


def test_a_gpu_the_file_does_not_name_is_refused(container: Container, cuprobe: Path) -> None:
    container.write([Gpu(GPU0, LIMIT)])
    res = container.run([probe_path(container, cuprobe), "init", "devs", "ctx:1", "newctx:1", "devmem:1", "ctx:0",
                         "graphnew", "graphalloc:2097152:1", "devmem:0", f"alloc:{64 * MiB}"],
                        {"VCUDA_SIM_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert res.returncode == 0, res.stderr
    # refused, not hidden: the driver's numbering stays (libvcuda/src/process.c)
    devs = res.lines[[d["cmd"] for d in res.lines].index("devs")]
    assert (devs["rc"], devs["count"], devs["uuid0"], devs["uuid1"]) == ("0", "2", GPU0, GPU1)
    assert res.rc("ctx", 0) == INVALID_DEVICE      # cuDevicePrimaryCtxRetain
    assert res.rc("newctx") == INVALID_DEVICE      # cuCtxCreate
    refused = res.lines[[d["cmd"] for d in res.lines].index("devmem")]
    assert refused == {"cmd": "devmem", "rc": "0", "create": str(INVALID_DEVICE), "pool": str(INVALID_DEVICE),
                       "setpool": str(INVALID_DEVICE)}
    assert res.rc("graphalloc") == INVALID_DEVICE  # an allocation node on GPU 1
    # its own GPU works as ever
    assert res.rc("ctx", 1) == 0 and res.rc("alloc") == 0
    assert [d for d in res.lines if d["cmd"] == "devmem"][1] == {"cmd": "devmem", "rc": "0", "create": "0",
                                                                  "pool": "0", "setpool": "0"}
    lines = vcuda_lines(res.stderr)
    assert len(lines) == 1, res.stderr   # one line per refused device
    assert GPU1 in lines[0] and "not this container's GPU" in lines[0]


def test_without_the_file_every_gpu_is_usable(run_probe: Runner, sim_env: dict[str, str]) -> None:
    if Path("/run/vcuda-quota").exists():
        pytest.skip("this machine has a quota directory")
    sim_env["VCUDA_SIM_DEVICES"] = "2"
    res = run_probe(["init", "ctx:1", "devmem:1"])
    assert res.rc("ctx") == 0
    assert res.get("devmem", "create") == 0 and res.get("devmem", "pool") == 0


# --- failing closed -------------------------------------------------------------------------------


def expect_closed(res: Result, reason: str) -> None:
    assert res.rc("init") == NOT_INITIALIZED, res.stdout + res.stderr
    assert res.rc("ctx") == NOT_INITIALIZED
    (line,) = vcuda_lines(res.stderr)
    assert line.startswith("vcuda: error:") and QUOTA_FILE in line and reason in line, res.stderr


BAD_FILES: list[tuple[str, Callable[[str], str], str]] = [
    ("corrupt-line", lambda t: t.replace("priority=normal", "priority normal"), "is not key=value"),
    ("unknown-key", lambda t: t.replace("priority=normal", "priority=normal\nunlimited=1"), "unknown key"),
    ("wrong-version", lambda t: t.replace("version=1", "version=2"), "version 2, this libvcuda reads 1"),
    ("truncated", lambda t: t[: t.index("end")], "truncated"),
]


@pytest.mark.parametrize(("edit", "reason"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_a_bad_file_fails_closed(container: Container, cuprobe: Path, edit: Callable[[str], str],
                                 reason: str) -> None:
    container.write([Gpu(GPU0, LIMIT)])
    path = container.quota_dir / "quota.conf"
    path.write_text(edit(path.read_text()))
    expect_closed(container.run([probe_path(container, cuprobe), "init", "ctx", f"alloc:{64 * MiB}"],
                                {"VCUDA_MEMORY_LIMIT": "8Gi"}), reason)


def test_a_missing_file_fails_closed(container: Container, cuprobe: Path) -> None:
    expect_closed(container.run([probe_path(container, cuprobe), "init", "ctx"]), "No such file or directory")


def test_a_directory_in_place_of_the_file_fails_closed(container: Container, cuprobe: Path) -> None:
    (container.quota_dir / "quota.conf").mkdir()
    expect_closed(container.run([probe_path(container, cuprobe), "init", "ctx"]), "Is a directory")


def test_an_unreadable_file_fails_closed(container: Container, cuprobe: Path) -> None:
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux) to run as another user")
    skip_unless_others_can_read(container.base_env["LD_PRELOAD"])
    container.write([Gpu(GPU0, LIMIT)])
    (container.quota_dir / "quota.conf").chmod(0o000)
    res = container.run([probe_path(container, cuprobe), "init", "ctx"], user=NOBODY)
    expect_closed(res, "Permission denied")
