"""vcuda on the e2e cluster, installed as a user installs it: its image built offline and imported,
`helm install` of deploy/helm/vcuda, a node label, every pod Ready. Nothing is applied by hand.

    python3 e2e/vcuda.py install [--version 1.36.3]    # images (cached), helm install, label, wait
    python3 e2e/vcuda.py uninstall [--version 1.36.3]  # helm uninstall, label off

Images, each an OCI archive in the cluster's image folder, rebuilt only when its inputs changed:
- vcuda's (deploy/image/build --offline), keyed by the files that go into it;
- the upstream kube-scheduler that vcuda-scheduler runs (the chart's default image name,
  registry.k8s.io/kube-scheduler:v<cluster version>), made from the Kubernetes we built (images.py);
- the e2e workload (e2e/workload/build: cuprobe and its entry script), when the tree has it.
The tests (tests/e2e) use the same functions.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import cluster as cluster_tool
import images

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "vcuda"
RELEASE = "vcuda"
NAMESPACE = "vcuda-system"
NODE_LABEL = "vcuda.io/device-plugin"     # <mode>: the node agent of that mode
DRA_LABEL = "vcuda.io/dra-driver"         # true: the DRA driver (a node runs one or the other)
MODES = ("vgpu", "pgpu", "mps", "dra")
VCUDA_IMAGE = "localhost/vcuda:0.1.0"          # deploy/image/build's default tag, the chart's appVersion
WORKLOAD_IMAGE = "localhost/vcuda-workload:e2e"
WORKLOAD_BUILD = REPO / "e2e" / "workload" / "build"
# What goes into vcuda's image: the wheel's packages and native sources, the image's own files.
IMAGE_INPUTS = ("py_vcuda", "token_scheduler", "kube_contract", "node_state", "scheduler_extender", "device_plugin",
                "dra_driver", "libvcuda", "gpusim", "CMakeLists.txt", "pyproject.toml", "deploy/image")
WORKLOAD_INPUTS = ("e2e/workload", "tests/c/cuprobe.c", "libvcuda/include", "deploy/image")


TIMINGS: dict[str, str] = {}   # what took how long, what was measured, in a test session (tests/e2e prints them)


def record(what: str, seconds: float) -> None:
    TIMINGS[what] = f"{seconds:8.1f} s"


def note(what: str, value: str) -> None:
    TIMINGS[what] = f"{value:>10}"


def inputs_key(paths: tuple[str, ...], repo: Path = REPO) -> str:
    """A hash of the files git would ship under `paths` (deploy/image/build.py's source key)."""
    name = "vcuda_image_build"
    if name not in sys.modules:   # deploy/ is not a package
        spec = importlib.util.spec_from_file_location(name, REPO / "deploy" / "image" / "build.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    key = sys.modules[name].source_key(repo, paths)
    if key is None:
        raise RuntimeError(f"{repo} is not a git checkout: the images' inputs cannot be keyed")
    return key


def _cached(archive: Path, key: str, make, log=sys.stderr) -> Path:
    """`archive`, made by `make(archive)` unless the one there was made from the same `key`."""
    stamp = archive.with_name(archive.name + ".key")
    if archive.is_file() and stamp.is_file() and stamp.read_text() == key:
        print(f"[vcuda e2e] {archive.name} is up to date", file=log, flush=True)
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    started = time.monotonic()
    make(archive)
    stamp.write_text(key)
    print(f"[vcuda e2e] made {archive.name} in {time.monotonic() - started:.0f} s", file=log, flush=True)
    return archive


def _run(cmd: list[str], what: str) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {out.returncode}):\n{(out.stdout + out.stderr)[-4000:]}")


def vcuda_archive(folder: Path, log=sys.stderr) -> Path:
    return _cached(folder / "vcuda.oci.tar", inputs_key(IMAGE_INPUTS), lambda out: _run(
        [sys.executable, str(REPO / "deploy" / "image" / "build.py"), "--offline", "--tag", VCUDA_IMAGE,
         "--output", str(out)], "deploy/image/build --offline"), log)


def scheduler_archive(folder: Path, c: cluster_tool.Cluster, log=sys.stderr) -> Path:
    binary = c.kube.program("kube-scheduler").resolve()
    st = binary.stat()
    key = f"{c.version} {binary} {st.st_size} {st.st_mtime_ns}"
    return _cached(folder / f"kube-scheduler-{c.version}.oci.tar", key,
                   lambda out: images.kube_scheduler_archive(out, binary, c.version), log)


def workload_archive(folder: Path, log=sys.stderr) -> Path | None:
    """The e2e workload image, or None when this tree has no e2e/workload yet."""
    if not WORKLOAD_BUILD.is_file():
        return None
    return _cached(folder / "vcuda-workload.oci.tar", inputs_key(WORKLOAD_INPUTS), lambda out: _run(
        [sys.executable, str(WORKLOAD_BUILD), "--tag", WORKLOAD_IMAGE, "--output", str(out)],
        "e2e/workload/build"), log)


def scenario_missing(inst: Install) -> str | None:
    """What a scenario on the simulated GPU lacks in this tree (the reason to skip it), or None."""
    if not inst.simulator:
        return ("the GPU simulator wiring: the chart's test-only value testing.simulator is missing from this "
                "tree, so the node agent has no GPU here")
    if not WORKLOAD_BUILD.is_file():
        return "the workload image: e2e/workload is missing from this tree"
    return None


def skip_unless_ready(inst: Install, scenario: str) -> None:
    """pytest.skip naming what `scenario` lacks in this tree (scenario_missing), if anything."""
    missing = scenario_missing(inst)
    if missing:
        import pytest  # only the tests call this; the command line runs without pytest
        pytest.skip(f"{scenario} needs {missing}")


def chart_has_simulator() -> bool:
    """Whether the chart has the test-only simulator wiring (testing.simulator with its simulatedNode)."""
    values = (CHART / "values.yaml").read_text()
    return "simulatedNode:" in values


@dataclass
class Install:
    """One Helm release of vcuda on the cluster, with the node labelled for one mode: a node agent's
    (vgpu, pgpu, mps) or the DRA driver's (dra, with the chart's dra.enabled)."""

    cluster: cluster_tool.Cluster
    mode: str = "vgpu"
    simulator: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    log: object = sys.stderr

    def say(self, msg: str) -> None:
        print(f"[vcuda e2e] {msg}", file=self.log, flush=True)

    def values(self) -> dict[str, str]:
        v = {"image.repository": VCUDA_IMAGE.rsplit(":", 1)[0], "image.tag": VCUDA_IMAGE.rsplit(":", 1)[1],
             "image.pullPolicy": "Never", "scheduler.image.pullPolicy": "Never"}
        if self.simulator:
            v["testing.simulator"] = "true"
        if self.mode == "dra":
            v["dra.enabled"] = "true"
        return {**v, **self.extra}

    def label(self) -> tuple[str, str]:
        """The node label (key, value) that puts this mode's agent on the node."""
        return (DRA_LABEL, "true") if self.mode == "dra" else (NODE_LABEL, self.mode)

    def ensure(self, mode: str = "vgpu", extra: dict[str, str] | None = None) -> float:
        """This release installed in `mode` with `extra` values: reinstalled (helm uninstall, install)
        only when it is not so already. Seconds it took (0 when nothing changed). The e2e scenarios
        share one release; each asks for the mode it needs."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        extra = dict(extra or {})
        if (mode, extra) == (self.mode, self.extra) and self.installed():
            return 0.0
        started = time.monotonic()
        if self.installed():
            self.uninstall()
        self.mode, self.extra = mode, extra
        self.install()
        return time.monotonic() - started

    def images(self) -> float:
        """Build what changed, import all three; seconds it took."""
        started = time.monotonic()
        folder = self.cluster.images
        archives = [vcuda_archive(folder, self.log), scheduler_archive(folder, self.cluster, self.log)]
        workload = workload_archive(folder, self.log)
        if workload is not None:
            archives.append(workload)
        self.cluster.import_images(archives)
        return time.monotonic() - started

    def installed(self) -> bool:
        out = self.cluster.helm("status", RELEASE, "-n", NAMESPACE, check=False)
        return out.returncode == 0

    def install(self, timeout: float = 240) -> float:
        """Label the node, helm install, wait for every pod Ready and the webhook answering; seconds from
        the label to then.

        The label goes first: right after an uninstall, 1.36's DaemonSet controller was seen to miss the
        label that came just after the DaemonSet (desired 0 until the next node update)."""
        started = time.monotonic()
        sets = [a for k, v in self.values().items() for a in ("--set", f"{k}={v}")]
        key, value = self.label()
        self.cluster.kubectl("label", "node", cluster_tool.NODE, f"{key}={value}", "--overwrite")
        self.cluster.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", *sets)
        self.wait_ready(timeout)
        ready = time.monotonic() - started
        if self.has_webhook():
            wait_for("the webhook setting a dry-run pod's schedulerName", self.webhook_answers,
                     timeout=max(30.0, timeout - ready), every=0.2, explain=self.diagnose)
        took = time.monotonic() - started
        self.say(f"installed and Ready in {ready:.1f} s, webhook answering at {took:.1f} s")
        return took

    def has_webhook(self) -> bool:
        """The chart's webhook is on (it needs the extender, which serves it): chart defaults unless set."""
        v = self.values()
        return v.get("webhook.enabled", "true") == "true" and v.get("extender.enabled", "true") == "true"

    def webhook_answers(self) -> bool:
        """A dry-run pod asking for vcuda-core comes back with vcuda-scheduler as its scheduler.

        Every pod Ready is not yet the webhook answering: the API server reaches it through its Service,
        whose endpoint follows the extender's readiness (kube-proxy then programs it). Meanwhile, with
        failurePolicy Ignore, a pod is admitted unchanged (a CI run saw one, right after an install)."""
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vcuda-webhook-probe", "namespace": "default"},
               "spec": {"containers": [{"name": "c", "image": WORKLOAD_IMAGE, "resources": {
                   "limits": {"tencent.com/vcuda-core": "1", "tencent.com/vcuda-memory": "1"}}}]}}
        out = self.cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input_=json.dumps(pod),
                                   check=False)
        return out.returncode == 0 and json.loads(out.stdout)["spec"].get("schedulerName") == "vcuda-scheduler"

    def uninstall(self, timeout: float = 120) -> None:
        """helm uninstall, then the node label off; waits for the release's pods to be gone (helm's --wait
        waits for the objects it deleted, not for the pods their garbage collection deletes after)."""
        if self.installed():
            self.cluster.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", f"--timeout={int(timeout)}s",
                              timeout=timeout + 30)
        self.cluster.kubectl("label", "node", cluster_tool.NODE, f"{NODE_LABEL}-", f"{DRA_LABEL}-", check=False)
        wait_for("the release's pods gone", lambda: not [
            p for p in self.pods() if p["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == RELEASE],
            timeout=timeout, explain=self.diagnose)

    def expected(self) -> list[str]:
        """The components whose pods must be Ready (app.kubernetes.io/name suffixes). The node agent
        only on the simulator: on this machine it has no GPU (no NVML) otherwise, and exits."""
        agent = "dra-driver" if self.mode == "dra" else "device-plugin"
        return ["extender", "scheduler", *([agent] if self.simulator else [])]

    def pods(self) -> list[dict]:
        out = self.cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json")
        return json.loads(out.stdout)["items"]

    @staticmethod
    def ready(pod: dict) -> bool:
        conds = pod.get("status", {}).get("conditions", [])
        return pod["metadata"].get("deletionTimestamp") is None and any(
            c["type"] == "Ready" and c["status"] == "True" for c in conds)

    @staticmethod
    def component(pod: dict) -> str:
        name = pod["metadata"].get("labels", {}).get("app.kubernetes.io/name", "")
        return name.removeprefix(f"{RELEASE}-")

    def wait_ready(self, timeout: float = 240) -> dict[str, dict]:
        """Each expected component has a pod and every pod of the release is Ready; raises with their
        descriptions and logs when not within `timeout`. Returns the Ready pod of each component."""
        deadline = time.monotonic() + timeout
        pods: list[dict] = []
        while time.monotonic() < deadline:
            pods = [p for p in self.pods() if self.component(p) in self.expected()]
            by = {self.component(p): p for p in pods}
            if all(c in by for c in self.expected()) and all(self.ready(p) for p in pods):
                return by
            time.sleep(1)
        raise RuntimeError(f"vcuda's pods not Ready within {timeout:.0f} s:\n{self.diagnose(pods)}")

    def diagnose(self, pods: list[dict] | None = None) -> str:
        """The state, Events and log tails of the release's pods that are not Ready."""
        pods = self.pods() if pods is None else pods
        lines = [f"pods: {', '.join(p['metadata']['name'] + ('' if self.ready(p) else ' (not Ready)') for p in pods)}"
                 f"; expected components {self.expected()}"]
        for p in pods:
            if self.ready(p):
                continue
            name = p["metadata"]["name"]
            lines.append(self.cluster.kubectl("describe", "pod", "-n", NAMESPACE, name, check=False).stdout[-3000:])
            logs = self.cluster.kubectl("logs", "-n", NAMESPACE, name, "--all-containers", "--tail=30",
                                        check=False)
            lines.append(f"--- logs of {name}:\n{(logs.stdout + logs.stderr)[-3000:]}")
            prev = self.cluster.kubectl("logs", "-n", NAMESPACE, name, "--all-containers", "--previous",
                                        "--tail=30", check=False)
            if prev.returncode == 0 and prev.stdout.strip():
                lines.append(f"--- previous logs of {name}:\n{prev.stdout[-3000:]}")
        return "\n".join(lines)


# ---------------------------------------------------------------- what the tests ask the API server

MEMORY_UNIT = 256 << 20  # tencent.com/vcuda-memory's unit


def vgpu_pod(name: str, namespace: str, cores: int, memory: int, command: list[str],
             env: dict[str, str] | None = None, restart: str = "Never") -> dict:
    """A workload pod asking `cores` of a GPU and `memory` bytes (whole units) of it."""
    container = {"name": "main", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never", "command": command,
                 "resources": {"limits": {"tencent.com/vcuda-core": str(cores),
                                          "tencent.com/vcuda-memory": str(memory // MEMORY_UNIT)}}}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": {
        "hostPID": True,  # the simulator's driver shares its state by host pid (README testing.simulator)
        "terminationGracePeriodSeconds": 1, "restartPolicy": restart, "containers": [container]}}


def create(c: cluster_tool.Cluster, obj: dict) -> subprocess.CompletedProcess:
    """kubectl create of one object (its stderr carries admission warnings)."""
    return c.kubectl("create", "-f", "-", input_=json.dumps(obj))


def get(c: cluster_tool.Cluster, kind: str, name: str, namespace: str | None = None) -> dict:
    ns = ["-n", namespace] if namespace else []
    return json.loads(c.kubectl("get", kind, name, *ns, "-o", "json").stdout)


def events(c: cluster_tool.Cluster, namespace: str, name: str) -> list[dict]:
    """The Events about the object `name` in `namespace`."""
    out = c.kubectl("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json")
    return json.loads(out.stdout)["items"]


def exporter_metrics(c: cluster_tool.Cluster, agent: str) -> dict[tuple[str, str], dict[str, float]]:
    """The node agent `agent`'s exporter through the API server's pod proxy: {(pod, metric): {gpu uuid: value}}."""
    from prometheus_client.parser import text_string_to_metric_families
    text = c.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{agent}:9394/proxy/metrics").stdout
    out: dict[tuple[str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "pod" in s.labels:
                out.setdefault((s.labels["pod"], s.name), {})[s.labels.get("uuid", "")] = s.value
    return out


def wait_for(what: str, check, timeout: float = 120, every: float = 0.5, explain=None):
    """check()'s first truthy value within `timeout`; RuntimeError naming `what` (and explain()) if none."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            detail = f":\n{explain()}" if explain else ""
            raise RuntimeError(f"{what}: not within {timeout:.0f} s{detail}")
        time.sleep(every)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["install", "uninstall"])
    parser.add_argument("--version", default=cluster_tool.DEFAULT_VERSION)
    parser.add_argument("--mode", default="vgpu", choices=MODES)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra chart value (repeatable), as helm's --set")
    parser.add_argument("--no-simulator", action="store_true", help="do not set testing.simulator")
    args = parser.parse_args(argv)
    c = cluster_tool.Cluster(args.version)
    if c.running() != c.version:
        print(f"vcuda e2e: cluster {c.version} is not up (python3 e2e/cluster.py up --version {c.version})",
              file=sys.stderr)
        return 1
    extra = dict(kv.split("=", 1) for kv in args.set if "=" in kv)
    inst = Install(c, mode=args.mode, simulator=chart_has_simulator() and not args.no_simulator, extra=extra)
    try:
        if args.action == "install":
            inst.images()
            if inst.installed():
                inst.uninstall()
            inst.install()
        else:
            inst.uninstall()
    except RuntimeError as exc:
        print(f"vcuda e2e: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
