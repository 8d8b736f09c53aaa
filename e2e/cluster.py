#!/usr/bin/env python3
"""A real single-node Kubernetes on this machine, for the e2e tier: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, CoreDNS, containerd (runc, CNI bridge), kubelet and kube-proxy,
all built from their Go modules at pinned versions (e2e/gotools.py) and run as root.

    python3 e2e/cluster.py build [--version 1.36.3]   # build what is missing into the tool cache
    python3 e2e/cluster.py up [--version 1.36.3]      # start, wait for the node to be Ready
    python3 e2e/cluster.py status | kubeconfig | down
    python3 e2e/cluster.py restart kubelet            # or containerd, ...: as `up` started it
    python3 e2e/cluster.py import IMAGE.tar...        # OCI archives into containerd's k8s.io namespace
    python3 e2e/cluster.py kubectl get pods -A        # the cluster's own kubectl, with its kubeconfig
    eval "$(python3 e2e/cluster.py env)"              # KUBECONFIG, and its kubectl and helm on PATH

Everything lives under /var/lib/vcuda-e2e/<version>/ (certificates, kubeconfigs, etcd data, the
containerd root, logs/); sockets under /run/vcuda-e2e. The node's address is 10.250.0.1, added to
`lo` at the first `up` and kept there after `down` (a non-loopback-range address, since the API
server's endpoint may not be 127.0.0.0/8: kept so that it never routes off the machine; the tool's
clients refuse to connect while it is absent). The kubelet keeps its standard root /var/lib/kubelet, so device plugins
(/var/lib/kubelet/device-plugins/kubelet.sock) and DRA plugins (/var/lib/kubelet/plugins_registry)
register where they do on any node; containerd reads CDI specs from /etc/cdi and /var/run/cdi.
One cluster runs at a time on a machine.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import resource
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gotools  # noqa: E402
import images  # noqa: E402

ROOT = Path(os.environ.get("VCUDA_E2E_ROOT", "/var/lib/vcuda-e2e"))
RUN = Path("/run/vcuda-e2e")              # short: unix socket paths are limited to 108 bytes
LOCK = Path("/run/vcuda-e2e.lock")
KUBELET_ROOT = Path("/var/lib/kubelet")   # standard, so plugins register where they do on any node
NODE = "vcuda-e2e"
NODE_IP = os.environ.get("VCUDA_E2E_NODE_IP", "10.250.0.1")
SERVICE_CIDR, API_SERVICE_IP = "10.96.0.0/16", "10.96.0.1"
CLUSTER_CIDR, POD_SUBNET = "10.244.0.0/16", "10.244.0.0/24"
CNI_BIN = Path("/usr/lib/cni")            # Debian's containernetworking-plugins
RUNC = Path(shutil.which("runc") or "/usr/sbin/runc")
BRIDGE = "vcuda-cni0"
DEFAULT_VERSION = "1.36.3"
# The sysctls the kubelet (protectKernelDefaults: false) changes: saved at `up`, put back at `down`,
# since this machine is shared. (The CNI bridge turns net.ipv4.ip_forward on; that one is left on, as
# other container tools on the machine may rely on it too.)
SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
           "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
# Features our tests need on; 1.34 has them alpha (off by default), 1.36 beta (on).
FEATURE_GATES = {
    "1.34": {"DRAConsumableCapacity": True, "DRAPartitionableDevices": True},
    "1.36": {"DRAConsumableCapacity": True, "DRAPartitionableDevices": True},
}
COMPONENTS = ("etcd", "containerd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "coredns",
              "kubelet", "kube-proxy")
# The cluster's DNS: CoreDNS on the node's address, answering cluster.local only (Services and pods by
# name, as on every real cluster); nothing is forwarded off the machine. Pods get it as their
# nameserver (kubelet clusterDNS).
DNS_PORT = 53
DNS_READY = "http://127.0.0.1:8181/ready"
RUNTIME_CONFIG = {"1.34": "resource.k8s.io/v1=true", "1.36": "resource.k8s.io/v1=true"}


class StartError(RuntimeError):
    """A component did not start: names it and carries its log's tail."""

    def __init__(self, component: str, why: str, log: Path | None = None):
        tail = ""
        if log is not None and log.exists():
            text = log.read_text(errors="replace")
            lines = text[text.rfind("\n==== ") + 1:].splitlines()[-40:]   # this start's lines only
            tail = f"\n--- last lines of {log} ---\n" + "\n".join(lines)
        super().__init__(f"{component}: {why}{tail}")
        self.component = component


def normalize(version: str) -> str:
    return version[1:] if version.startswith("v") else version


def minor(version: str) -> str:
    return ".".join(normalize(version).split(".")[:2])


@dataclass
class Component:
    name: str
    argv: list[str]
    health: str | None = None     # URL answering 200 "ok" when ready
    env: dict[str, str] | None = None


class Cluster:
    def __init__(self, version: str = DEFAULT_VERSION, log=sys.stderr):
        self.version = normalize(version)
        self.kube = gotools.kubernetes(self.version)
        self.dir = ROOT / self.version
        self.logs = self.dir / "logs"
        self.pki_dir = self.dir / "pki"
        self.pids = RUN / "pids"
        self.sock = RUN / "containerd" / "containerd.sock"
        self.images = ROOT / "images"
        self.log = log
        self._lock_depth = 0

    # ---------------------------------------------------------------- paths
    def bin(self, prog: str) -> Path:
        if prog == "etcd":
            return gotools.ETCD.path
        if prog in ("containerd", "ctr", "containerd-shim-runc-v2"):
            return gotools.CONTAINERD.program(prog)
        if prog == "coredns":
            return gotools.COREDNS.path
        return self.kube.program(prog)

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    def missing(self) -> list[str]:
        """What is not there yet for `up`, each named with how to get it."""
        out = []
        unbuilt = [f"{t.name} {t.version}" for t in (self.kube, gotools.ETCD, gotools.CONTAINERD, gotools.COREDNS)
                   if not t.path.is_file()]
        if unbuilt:
            out.append(f"not built: {', '.join(unbuilt)} (python3 e2e/cluster.py build --version {self.version}; "
                       f"cache {gotools.CACHE})")
        for what, path, pkg in (("runc", RUNC, "runc"), ("CNI bridge plugin", CNI_BIN / "bridge",
                                                           "containernetworking-plugins"),
                                ("busybox", images.BUSYBOX, "busybox-static")):
            if not Path(path).exists():
                out.append(f"{what} missing at {path} (apt-get install {pkg})")
        if not (shutil.which("cc") or shutil.which("gcc")):
            out.append("a C compiler for the pause image (apt-get install gcc libc6-dev)")
        try:
            import cryptography  # noqa: F401
        except ImportError:
            out.append("Python's cryptography, for the certificates (pip install cryptography; in .[test])")
        if shutil.which("iptables") is None:
            out.append("iptables, for kube-proxy (apt-get install iptables)")
        if os.geteuid() != 0:
            out.append("root (the cluster runs containers, mounts and network namespaces)")
        return out

    def say(self, msg: str) -> None:
        print(f"[cluster {self.version}] {msg}", file=self.log, flush=True)

    # ---------------------------------------------------------------- build
    def build(self) -> None:
        # the others reuse much of Kubernetes' build cache
        for tool in (self.kube, gotools.ETCD, gotools.CONTAINERD, gotools.COREDNS):
            gotools.ensure(tool, log=self.log)

    # ---------------------------------------------------------------- config
    def _kubeconfig(self, name: str, cert: str, server: str | None = None) -> Path:
        p = self.dir / f"{name}.kubeconfig"
        ca = base64.b64encode(self._pki("ca").read_bytes()).decode()
        crt = base64.b64encode(self._pki(cert).read_bytes()).decode()
        key = base64.b64encode(self._pki(cert, "key").read_bytes()).decode()
        p.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "vcuda-e2e",
            "clusters": [{"name": "vcuda-e2e", "cluster": {"server": server or f"https://{NODE_IP}:6443",
                                                           "certificate-authority-data": ca}}],
            "users": [{"name": name, "user": {"client-certificate-data": crt, "client-key-data": key}}],
            "contexts": [{"name": "vcuda-e2e", "context": {"cluster": "vcuda-e2e", "user": name}}],
        }, indent=1))
        p.chmod(0o600)
        return p

    def _pki(self, name: str, ext: str = "crt") -> Path:
        return self.pki_dir / f"{name}.{ext}"

    def _gates(self, extra: dict[str, bool]) -> str:
        gates = {**FEATURE_GATES.get(minor(self.version), {}), **extra}
        return ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(gates.items()))

    def _write_config(self, gates: str, kube_proxy: bool) -> None:
        from pki import PKI
        PKI(self.pki_dir).ensure(NODE, NODE_IP, API_SERVICE_IP)
        for name, cert in (("admin", "admin"), ("controller-manager", "controller-manager"),
                           ("scheduler", "scheduler"), ("kubelet", "kubelet-client"), ("kube-proxy", "kube-proxy")):
            self._kubeconfig(name, cert)
        gate_map = dict(g.split("=") for g in gates.split(",") if g)
        (self.dir / "kubelet.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False,                 # cgroup v1 here; the default is true from 1.35
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "address": NODE_IP, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self._pki("ca"))}},
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(self._pki("kubelet")), "tlsPrivateKeyFile": str(self._pki("kubelet", "key")),
            "clusterDomain": "cluster.local",
            "clusterDNS": [NODE_IP],               # CoreDNS (components())
            "failSwapOn": False,
            # Image GC off: the pause image and the images we import are never pulled again.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            # A shared test machine's disk is not this node's to protect: no disk-pressure eviction.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "0%", "nodefs.inodesFree": "0%",
                             "imagefs.available": "0%", "imagefs.inodesFree": "0%"},
            "enforceNodeAllocatable": [],
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            "featureGates": {k: v == "true" for k, v in gate_map.items()},
            "shutdownGracePeriod": "0s",
            "registerNode": True,
        }, indent=1))
        if kube_proxy:
            (self.dir / "kube-proxy.yaml").write_text(json.dumps({
                "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
                "clientConnection": {"kubeconfig": str(self.dir / "kube-proxy.kubeconfig")},
                "hostnameOverride": NODE, "clusterCIDR": CLUSTER_CIDR, "mode": "iptables",
                "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
                # Leave the machine's conntrack settings alone (0: do not set).
                "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                              "tcpCloseWaitTimeout": "0s"},
                "iptables": {"localhostNodePorts": False},
                "featureGates": {k: v == "true" for k, v in gate_map.items()},
            }, indent=1))
        (self.dir / "Corefile").write_text(f"""# CoreDNS of the e2e cluster: cluster.local, nothing else
.:{DNS_PORT} {{
    bind {NODE_IP}
    errors
    ready 127.0.0.1:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {self.dir / 'admin.kubeconfig'}
        pods insecure
    }}
    cache 30
}}
""")
        cni = self.dir / "cni" / "net.d"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-vcuda-e2e.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "vcuda-e2e",
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(RUN / "cni-ipam")}},
                {"type": "loopback"},
            ]}, indent=1))
        # Containers' open-file limit within this machine's hard NOFILE (containerd's own default for
        # containers may exceed it): a base OCI spec for the runtime, containerd's default otherwise.
        spec = json.loads(subprocess.run([str(self.bin("ctr")), "oci", "spec"], capture_output=True, text=True,
                                         check=True).stdout)
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nofile = 1 << 20 if nofile == resource.RLIM_INFINITY else nofile
        spec["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile}]
        (self.dir / "base-spec.json").write_text(json.dumps(spec, indent=1))
        cd = self.dir / "containerd"
        restrict_oom = not _has_cap(24)   # CAP_SYS_RESOURCE
        (self.dir / "containerd.toml").write_text(f"""version = 3
root = "{cd / 'root'}"
state = "{RUN / 'containerd' / 'state'}"

[grpc]
  address = "{self.sock}"

[ttrpc]
  address = "{self.sock}.ttrpc"

[debug]
  level = "info"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{images.PAUSE_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  # No CAP_SYS_RESOURCE in this machine's bounding set: a sandbox's oom_score_adj (-998) below
  # containerd's own would be refused, so it is clamped to containerd's.
  restrict_oom_score_adj = {str(restrict_oom).lower()}
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  base_runtime_spec = "{self.dir / 'base-spec.json'}"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{RUNC}"
  SystemdCgroup = false

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{CNI_BIN}"]
  conf_dir = "{cni}"
  max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
""")

    def components(self, gates: str, kube_proxy: bool) -> list[Component]:
        k = self.kube
        pki = self._pki
        d = self.dir
        gate_flag = [f"--feature-gates={gates}"] if gates else []
        comps = [
            Component("etcd", [str(self.bin("etcd")), "--name=vcuda-e2e", f"--data-dir={d / 'etcd'}",
                               "--listen-client-urls=http://127.0.0.1:2379",
                               "--advertise-client-urls=http://127.0.0.1:2379",
                               "--listen-peer-urls=http://127.0.0.1:2380",
                               "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                               "--initial-cluster=vcuda-e2e=http://127.0.0.1:2380",
                               "--listen-metrics-urls=http://127.0.0.1:2381",
                               "--quota-backend-bytes=2147483648", "--unsafe-no-fsync"],
                      "http://127.0.0.1:2379/health"),
            Component("containerd", [str(self.bin("containerd")), f"--config={d / 'containerd.toml'}"],
                      env={"PATH": f"{self.bin('containerd').parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}),
            Component("kube-apiserver", [
                str(k.program("kube-apiserver")), f"--advertise-address={NODE_IP}", f"--bind-address={NODE_IP}",
                "--secure-port=6443", "--etcd-servers=http://127.0.0.1:2379", "--allow-privileged=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=Node,RBAC",
                f"--client-ca-file={pki('ca')}", f"--tls-cert-file={pki('apiserver')}",
                f"--tls-private-key-file={pki('apiserver', 'key')}",
                f"--kubelet-client-certificate={pki('apiserver-kubelet-client')}",
                f"--kubelet-client-key={pki('apiserver-kubelet-client', 'key')}",
                f"--kubelet-certificate-authority={pki('ca')}",
                "--kubelet-preferred-address-types=InternalIP",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki('sa', 'pub')}",
                f"--service-account-signing-key-file={pki('sa', 'key')}",
                f"--runtime-config={RUNTIME_CONFIG.get(minor(self.version), '')}",
                "--enable-admission-plugins=NodeRestriction", "--profiling=false", *gate_flag],
                f"https://{NODE_IP}:6443/readyz"),
            Component("kube-controller-manager", [
                str(k.program("kube-controller-manager")), f"--kubeconfig={d / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={d / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={d / 'controller-manager.kubeconfig'}",
                "--bind-address=127.0.0.1", "--leader-elect=false", "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki('sa', 'key')}", f"--root-ca-file={pki('ca')}",
                f"--cluster-signing-cert-file={pki('ca')}", f"--cluster-signing-key-file={pki('ca', 'key')}",
                f"--service-cluster-ip-range={SERVICE_CIDR}", f"--cluster-cidr={CLUSTER_CIDR}",
                "--profiling=false", *gate_flag],
                "https://127.0.0.1:10257/healthz"),
            Component("kube-scheduler", [
                str(k.program("kube-scheduler")), f"--kubeconfig={d / 'scheduler.kubeconfig'}",
                f"--authentication-kubeconfig={d / 'scheduler.kubeconfig'}",
                f"--authorization-kubeconfig={d / 'scheduler.kubeconfig'}",
                "--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false", *gate_flag],
                "https://127.0.0.1:10259/healthz"),
            Component("coredns", [str(self.bin("coredns")), "-conf", str(d / "Corefile")], DNS_READY),
            Component("kubelet", [
                str(k.program("kubelet")), f"--config={d / 'kubelet.yaml'}", f"--kubeconfig={d / 'kubelet.kubeconfig'}",
                f"--hostname-override={NODE}", f"--node-ip={NODE_IP}", f"--root-dir={KUBELET_ROOT}", "--v=2"],
                "http://127.0.0.1:10248/healthz"),
        ]
        if kube_proxy:
            comps.append(Component("kube-proxy", [str(k.program("kube-proxy")), f"--config={d / 'kube-proxy.yaml'}"],
                                   "http://127.0.0.1:10256/healthz"))
        return comps

    # ---------------------------------------------------------------- processes
    def _pid(self, name: str) -> int | None:
        f = self.pids / f"{name}.pid"
        try:
            pid = int(f.read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        # Only our own process: its command line must be the binary we started.
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            return None
        return pid if (self.pids / f"{name}.cmd").exists() and cmd == (self.pids / f"{name}.cmd").read_text() \
            else None

    def _spawn(self, c: Component) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pids.mkdir(parents=True, exist_ok=True)

        def limits():
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

        with open(self.logs / f"{c.name}.log", "ab") as log:
            log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(c.argv)}\n".encode())
            log.flush()
            p = subprocess.Popen(c.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, preexec_fn=limits, cwd=self.dir,
                                 env={**os.environ, **(c.env or {})})
        (self.pids / f"{c.name}.pid").write_text(str(p.pid))
        (self.pids / f"{c.name}.cmd").write_text(c.argv[0])
        return p

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self._pki("ca")))
        ctx.load_cert_chain(str(self._pki("admin")), str(self._pki("admin", "key")))
        ctx.check_hostname = False
        return ctx

    def _healthy(self, url: str) -> bool:
        if NODE_IP in url and not _has_addr(NODE_IP):
            return False                     # never up on this machine: nothing local to ask
        ctx = None
        if url.startswith("https://"):
            ctx = self._ssl()
            if NODE_IP not in url:           # controller-manager/scheduler serve self-signed certificates
                ctx.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(url, timeout=3, context=ctx) as r:
                return r.status == 200
        except Exception:
            return False

    def _wait(self, c: Component, proc: subprocess.Popen, timeout: float, check=None) -> None:
        deadline = time.monotonic() + timeout
        log = self.logs / f"{c.name}.log"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise StartError(c.name, f"exited with status {proc.returncode} while starting", log)
            if check is not None:
                if check():
                    return
            elif c.health is None or self._healthy(c.health):
                return
            time.sleep(0.3)
        raise StartError(c.name, f"not ready within {timeout:.0f} s", log)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60,
                input_: str | None = None) -> subprocess.CompletedProcess:
        _refuse_unless_local()
        out = subprocess.run([str(self.kube.program("kubectl")), f"--kubeconfig={self.kubeconfig}", *args],
                             capture_output=True, text=True, timeout=timeout, input=input_)
        if check and out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
        return out

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        """helm (the pinned build, made on first use) against this cluster."""
        helm = gotools.ensure(gotools.HELM, log=self.log)
        _refuse_unless_local()
        out = subprocess.run([str(helm), f"--kubeconfig={self.kubeconfig}", *args], capture_output=True, text=True,
                             timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
        return out

    def env(self) -> dict[str, str]:
        """What a shell needs to use this cluster: its kubeconfig, its kubectl and helm first on PATH."""
        dirs = [str(self.kube.path.parent), str(gotools.HELM.path.parent)]
        return {"KUBECONFIG": str(self.kubeconfig), "PATH": ":".join([*dirs, os.environ.get("PATH", "")])}

    def ctr(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        out = subprocess.run([str(self.bin("ctr")), f"--address={self.sock}", "-n", "k8s.io", *args],
                             capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: {out.stderr.strip()}")
        return out

    def import_images(self, archives: list[Path], base_name: str | None = None) -> None:
        """OCI archives into containerd's k8s.io namespace, where the kubelet's images live. An archive
        whose index names the image only by its tag (`org.opencontainers.image.ref.name: 0.1.0`) gets
        `base_name` (e.g. vcuda.local/vcuda) in front of it."""
        for a in archives:
            extra = ["--base-name", base_name] if base_name else []
            self.ctr("images", "import", "--all-platforms", *extra, str(a), timeout=600)

    # ---------------------------------------------------------------- up / down
    @contextlib.contextmanager
    def _locked(self):
        """One `up`/`down`/`restart` at a time on the machine (the cluster's ports and dirs are fixed)."""
        if self._lock_depth:
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            self._lock_depth = 1
            try:
                yield
            finally:
                self._lock_depth = 0
                fcntl.flock(f, fcntl.LOCK_UN)

    def up(self, **kw) -> float:
        """Start the cluster (see `_up` for the arguments) and wait for the node; seconds it took."""
        with self._locked():
            return self._up(**kw)

    def down(self, quiet: bool = False) -> None:
        with self._locked():
            self._down(quiet)

    def restart(self, name: str, timeout: float = 120) -> float:
        with self._locked():
            return self._restart(name, timeout)

    def running(self) -> str | None:
        f = RUN / "version"
        return f.read_text().strip() if f.exists() else None

    def _up(self, build: bool = False, timeout: float = 180, feature_gates: dict[str, bool] | None = None,
           kube_proxy: bool = True) -> float:
        started = time.monotonic()
        other = self.running()
        if other and other != self.version:
            raise StartError("cluster", f"version {other} is running; `down` it first")
        if other == self.version and self.ready():
            self.say("already up")
            return 0.0
        if other or any(self._pid(n) for n in COMPONENTS):
            self.down(quiet=True)     # what is left of an earlier run that did not come down
        if build:
            self.build()
        missing = self.missing()
        if missing:
            raise StartError("cluster", "cannot start: " + "; ".join(missing))
        self.dir.mkdir(parents=True, exist_ok=True)
        RUN.mkdir(parents=True, exist_ok=True)
        self._save_sysctls()
        (RUN / "version").write_text(self.version)
        # A fresh cluster each time: etcd's data and the kubelet's pods go; certificates, containerd's
        # images and the built binaries stay (what makes a warm `up` take seconds).
        for stale in (self.dir / "etcd", RUN / "cni-ipam"):
            shutil.rmtree(stale, ignore_errors=True)
        self._clean_kubelet_root()
        if not _has_addr(NODE_IP):
            subprocess.run(["ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo"], check=True)
        gates = self._gates(feature_gates or {})
        self._write_config(gates, kube_proxy)
        (RUN / "options.json").write_text(json.dumps({"gates": gates, "kube_proxy": kube_proxy}))
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            for c in self.components(gates, kube_proxy):
                t0 = time.monotonic()
                if c.name == "kubelet":
                    self._prepare_runtime()
                proc = self._spawn(c)
                if c.name == "containerd":
                    self._wait(c, proc, 60, check=lambda: self.sock.exists() and self.ctr(
                        "version", check=False, timeout=10).returncode == 0)
                else:
                    self._wait(c, proc, 120 if c.name == "kube-apiserver" else 60)
                self.say(f"{c.name} ready in {time.monotonic() - t0:.1f} s")
            self._wait_node(max(30.0, timeout - (time.monotonic() - started)))
        except BaseException:
            if os.environ.get("VCUDA_E2E_KEEP_ON_FAILURE") != "1":
                self.down(quiet=True)
            raise
        took = time.monotonic() - started
        (self.dir / "up.json").write_text(json.dumps({"seconds": round(took, 1), "at": time.time()}))
        self.say(f"up in {took:.1f} s; KUBECONFIG={self.kubeconfig}")
        return took

    def _prepare_runtime(self) -> None:
        """Before the kubelet: no containers left from an earlier run, the pause (and busybox) images in."""
        self._remove_containers()
        have = set(self.ctr("images", "ls", "-q").stdout.split())
        wanted = {images.PAUSE_IMAGE: images.pause_archive, images.BUSYBOX_IMAGE: images.busybox_archive}
        for name, make in wanted.items():
            if name not in have:
                archive = self.images / (name.split("/")[-1].replace(":", "-") + ".tar")
                if not archive.exists():
                    make(archive)
                self.import_images([archive])
                self.say(f"imported {name}")

    def _wait_node(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        why = "the node never registered"
        while time.monotonic() < deadline:
            proc = self._pid("kubelet")
            if proc is None:
                raise StartError("kubelet", "exited while the node was coming up", self.logs / "kubelet.log")
            out = self.kubectl("get", "node", NODE, "-o", "json", check=False)
            if out.returncode == 0:
                node = json.loads(out.stdout)
                ready = [c for c in node["status"].get("conditions", []) if c["type"] == "Ready"]
                if ready and ready[0]["status"] == "True":
                    sa = self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False)
                    if sa.returncode == 0:
                        return
                    why = "the node is Ready but the default ServiceAccount does not exist yet"
                elif ready:
                    why = f"node not Ready: {ready[0].get('reason')}: {ready[0].get('message')}"
            time.sleep(0.5)
        raise StartError("kubelet", f"node {NODE} not Ready within {timeout:.0f} s ({why})",
                         self.logs / "kubelet.log")

    def ready(self) -> bool:
        if self._pid("kubelet") is None or not self.kubeconfig.exists():
            return False
        out = self.kubectl("get", "node", NODE, "-o",
                           "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False, timeout=10)
        return out.returncode == 0 and out.stdout.strip() == "True"

    def _options(self) -> tuple[str, bool]:
        """The feature gates and kube-proxy choice of the running cluster's `up`."""
        try:
            o = json.loads((RUN / "options.json").read_text())
            return o["gates"], o["kube_proxy"]
        except (OSError, ValueError, KeyError):
            return self._gates({}), True

    def _restart(self, name: str, timeout: float = 120) -> float:
        """Stop one component and start it again as `up` did (the fault scenarios: kubelet, containerd);
        running containers are left alone. Returns the seconds until it is healthy (and, for the
        kubelet, until the node is Ready again)."""
        if self.running() != self.version:
            raise StartError(name, f"cluster {self.version} is not up")
        gates, kube_proxy = self._options()
        comps = {c.name: c for c in self.components(gates, kube_proxy)}
        if name not in comps:
            raise StartError(name, f"not a component of this cluster ({', '.join(comps)})")
        started = time.monotonic()
        self._stop(name)
        c = comps[name]
        proc = self._spawn(c)
        if name == "containerd":
            self._wait(c, proc, timeout, check=lambda: self.sock.exists() and self.ctr(
                "version", check=False, timeout=10).returncode == 0)
        else:
            self._wait(c, proc, timeout)
        if name in ("kubelet", "containerd"):
            self._wait_node(timeout)
        took = time.monotonic() - started
        self.say(f"{name} restarted in {took:.1f} s")
        return took

    def status(self) -> dict:
        comps = {}
        gates, kube_proxy = self._options()
        for c in self.components(gates, kube_proxy):
            pid = self._pid(c.name)
            comps[c.name] = {"pid": pid, "healthy": bool(pid) and (
                c.health is None or self._healthy(c.health))}
        return {"version": self.version, "running": self.running(), "node_ready": self.ready(),
                "kubeconfig": str(self.kubeconfig), "logs": str(self.logs), "components": comps}

    def _remove_containers(self) -> None:
        if not self.sock.exists():
            return
        tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
        for t in tasks:
            self.ctr("tasks", "kill", "-a", "-s", "SIGKILL", t, check=False)
        for t in tasks:
            for _ in range(20):
                if self.ctr("tasks", "delete", "-f", t, check=False).returncode == 0:
                    break
                time.sleep(0.2)
        conts = self.ctr("containers", "ls", "-q", check=False).stdout.split()
        if conts:
            self.ctr("containers", "delete", *conts, check=False)

    def _down(self, quiet: bool = False) -> None:
        """Stops everything this tool started, then removes the containers, mounts, network namespaces,
        the bridge, kube-proxy's rules and the node address; puts the sysctls back."""
        self._stop("kubelet", "kube-proxy")
        try:
            self._remove_containers()
        except Exception as exc:   # containerd may be gone already
            if not quiet:
                self.say(f"removing containers: {exc}")
        self._stop("coredns", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "containerd")
        self._stop("etcd")
        self._kill_shims()
        if self.kube.program("kube-proxy").exists():
            subprocess.run([str(self.kube.program("kube-proxy")), "--cleanup"], capture_output=True, timeout=60)
        self._unmount()
        for ns in Path("/var/run/netns").glob("cni-*"):
            subprocess.run(["umount", "-l", str(ns)], capture_output=True)
            ns.unlink(missing_ok=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)
        # NODE_IP stays on `lo`: without it the address would route off the machine, and a client that
        # still names it (a test, a shell's kubectl) would send its traffic there.
        self._restore_sysctls()
        self._clean_kubelet_root()
        for f in (RUN / "version", RUN / "options.json", RUN / "cni-ipam"):
            if f.is_dir():
                shutil.rmtree(f, ignore_errors=True)
            else:
                f.unlink(missing_ok=True)
        if not quiet:
            self.say("down")

    def _stop(self, *names: str, grace: float = 10) -> None:
        """SIGTERM to each (together: they are independent), SIGKILL to those still there after `grace`."""
        pids = {n: p for n in names if (p := self._pid(n)) is not None}
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = {n: p for n, p in pids.items() if _alive(p)}
            time.sleep(0.05)
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for n in names:
            (self.pids / f"{n}.pid").unlink(missing_ok=True)

    def _kill_shims(self) -> None:
        """containerd's shims outlive it; ours are those running our shim binary."""
        shim = str(self.bin("containerd-shim-runc-v2"))
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                if os.readlink(p / "exe") == shim:
                    os.kill(int(p.name), signal.SIGKILL)
            except OSError:
                continue

    def _unmount(self) -> None:
        prefixes = (str(KUBELET_ROOT) + "/", str(RUN) + "/", str(self.dir) + "/", "/run/netns/cni-",
                    "/var/run/netns/cni-")
        mounts = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mp = line.split()[4].replace("\\040", " ")
            if mp.startswith(prefixes) or mp == str(KUBELET_ROOT):
                mounts.append(mp)
        for mp in sorted(set(mounts), key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], capture_output=True)

    def _clean_kubelet_root(self) -> None:
        self._unmount()
        for sub in ("pods", "plugins", "plugins_registry", "device-plugins", "pod-resources", "cpu_manager_state",
                    "memory_manager_state", "dra_manager_state", "checkpoints"):
            p = KUBELET_ROOT / sub
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)

    def _save_sysctls(self) -> None:
        saved = RUN / "sysctls.json"
        if saved.exists():
            return
        values = {}
        for s in SYSCTLS:
            with contextlib.suppress(OSError):
                values[s] = Path("/proc/sys", s).read_text().strip()
        saved.write_text(json.dumps(values))

    def _restore_sysctls(self) -> None:
        saved = RUN / "sysctls.json"
        if not saved.exists():
            return
        for s, v in json.loads(saved.read_text()).items():
            with contextlib.suppress(OSError):
                Path("/proc/sys", s).write_text(v)
        saved.unlink()


def _alive(pid: int) -> bool:
    """Running (a zombie child of ours counts as gone: it is reaped here)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _has_cap(bit: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def _refuse_unless_local() -> None:
    """The kubeconfig names NODE_IP: a client may reach it only while it is this machine's own address
    (it stays on `lo` from the first `up` on), never through a route off the machine."""
    if not _has_addr(NODE_IP):
        raise RuntimeError(f"the cluster was never up on this machine ({NODE_IP} is not on lo): "
                           "run `e2e/cluster.py up` first")


def _has_addr(ip: str) -> bool:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True)
    return f" {ip}/" in out.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    sub = parser.add_subparsers(dest="cmd", required=True)

    def with_version(p):
        p.add_argument("--version", default=None,
                       help=f"Kubernetes version (default: the running one, else {DEFAULT_VERSION})")
        return p

    with_version(sub.add_parser("build", help="build the pinned components that are not cached yet"))
    up = with_version(sub.add_parser("up", help="start the cluster and wait for the node to be Ready"))
    up.add_argument("--build", action="store_true", help="build missing components first (cold: long)")
    up.add_argument("--timeout", type=float, default=180, help="seconds for the whole start (default 180)")
    up.add_argument("--feature-gates", default="", help="extra gates, e.g. DRADeviceTaints=true,Foo=false")
    up.add_argument("--no-kube-proxy", action="store_true", help="no kube-proxy (pods cannot reach Services)")
    with_version(sub.add_parser("down", help="stop everything and clean mounts, netns, bridge, address"))
    rs = with_version(sub.add_parser("restart", help="restart one component (kubelet, containerd...) as `up` did"))
    rs.add_argument("component", choices=COMPONENTS)
    with_version(sub.add_parser("status", help="components, their health, the node's readiness (JSON)"))
    with_version(sub.add_parser("kubeconfig", help="print the admin kubeconfig's path"))
    with_version(sub.add_parser("env", help="print export lines: KUBECONFIG, and PATH with its kubectl and helm"))
    imp = with_version(sub.add_parser("import", help="import OCI image archives into containerd (k8s.io)"))
    imp.add_argument("archives", nargs="+", type=Path)
    imp.add_argument("--base-name", help="image name for archives whose index gives only a tag")
    kc = with_version(sub.add_parser("kubectl", help="run the cluster's kubectl with its kubeconfig"))
    kc.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    version = args.version or Cluster().running() or DEFAULT_VERSION
    cluster = Cluster(version)
    try:
        if args.cmd == "build":
            cluster.build()
        elif args.cmd == "up":
            gates = dict((k, v.lower() == "true") for k, v in
                         (g.split("=", 1) for g in args.feature_gates.split(",") if g))
            cluster.up(build=args.build, timeout=args.timeout, feature_gates=gates,
                       kube_proxy=not args.no_kube_proxy)
        elif args.cmd == "down":
            cluster.down()
        elif args.cmd == "restart":
            cluster.restart(args.component)
        elif args.cmd == "status":
            st = cluster.status()
            print(json.dumps(st, indent=1))
            return 0 if st["node_ready"] else 3
        elif args.cmd == "kubeconfig":
            print(cluster.kubeconfig)
        elif args.cmd == "env":
            for k, v in cluster.env().items():
                print(f"export {k}={shlex.quote(v)}")
        elif args.cmd == "import":
            cluster.import_images(args.archives, base_name=args.base_name)
        elif args.cmd == "kubectl":
            rest = args.args[1:] if args.args[:1] == ["--"] else args.args
            return subprocess.run([str(cluster.kube.program("kubectl")), f"--kubeconfig={cluster.kubeconfig}",
                                   *rest]).returncode
    except (StartError, RuntimeError) as exc:
        print(f"cluster: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
