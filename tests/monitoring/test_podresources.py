"""The pod-resources client against a stand-in kubelet, including a kubelet restart."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from device_plugin.testing import TestPodResources
from kube_contract.podresources import PodRef, PodResourcesClient, PodResourcesError

CORE = "tencent.com/vcuda-core"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Kubelet(TestPodResources):
    """The plugin helper's stand-in, counting List calls; stop() removes the socket like a dying kubelet."""

    __test__ = False

    def __init__(self, socket: Path, owners: dict) -> None:
        super().__init__(socket)
        self.owners = owners
        self.calls = 0
        self.start()

    def List(self, request, context):  # type: ignore[no-untyped-def]
        self.calls += 1
        return super().List(request, context)

    def stop(self) -> None:
        super().stop()
        self.socket.unlink(missing_ok=True)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="vc", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_lookup_maps_device_ids_to_containers(sock_dir: Path) -> None:
    kubelet = Kubelet(sock_dir / "kubelet.sock", {
        ("team-a", "train-0", "main"): {CORE: ["GPU-1::0", "GPU-1::1"], "tencent.com/vcuda-memory": ["GPU-1::m0"]},
        ("team-b", "infer-0", "server"): {"nvidia.com/gpu": ["GPU-2"]},
    })
    client = PodResourcesClient(sock_dir / "kubelet.sock")
    try:
        assert client.lookup(CORE, ["GPU-1::1"]) == PodRef("team-a", "train-0", "main")
        assert client.lookup("nvidia.com/gpu", ["GPU-2"]) == PodRef("team-b", "infer-0", "server")
        # an ID names a device only together with its resource: GPU-1::0 is a core, not a memory unit
        assert client.lookup("tencent.com/vcuda-memory", ["GPU-1::0"]) is None
        assert client.lookup("tencent.com/vcuda-memory", ["GPU-1::m0"]) == PodRef("team-a", "train-0", "main")
        assert client.lookup(CORE, ["GPU-9::0"]) is None
        assert client.lookup(CORE, ["GPU-1::0", "GPU-9::0"]) is None  # not all of them: not this container
        assert client.lookup(CORE, []) is None
        assert client.lookup("", ["GPU-1::0"]) is None  # a bare-metal record: no kubelet resource
    finally:
        client.close()
        kubelet.stop()


def test_cache_is_refreshed_only_when_due(sock_dir: Path) -> None:
    assignments: dict = {("ns", "p", "c"): {CORE: ["GPU-1::0"]}}
    kubelet = Kubelet(sock_dir / "kubelet.sock", assignments)
    clock = Clock()
    client = PodResourcesClient(sock_dir / "kubelet.sock", refresh_s=10, miss_refresh_s=1, clock=clock)
    try:
        for _ in range(5):
            assert client.lookup(CORE, ["GPU-1::0"]) == PodRef("ns", "p", "c")
        assert kubelet.calls == 1
        assignments[("ns", "q", "c")] = {CORE: ["GPU-1::1"]}
        assert client.lookup(CORE, ["GPU-1::1"]) is None  # a miss asks again, but not within miss_refresh_s
        clock.now += 1.5
        assert client.lookup(CORE, ["GPU-1::1"]) == PodRef("ns", "q", "c")
        assert kubelet.calls == 2
    finally:
        client.close()
        kubelet.stop()


def test_memory_ids_of_another_pod_do_not_name_a_new_container(sock_dir: Path) -> None:
    """vcuda-memory IDs have the vcuda-core form `<uuid>::<i>`: a cached listing in which a pod holds memory
    unit GPU-1::3 must not label a new container that holds core GPU-1::3, and the miss must ask again."""
    memory = "tencent.com/vcuda-memory"
    assignments: dict = {("team-a", "old-0", "main"): {CORE: ["GPU-1::0"], memory: ["GPU-1::3", "GPU-1::4"]}}
    kubelet = Kubelet(sock_dir / "kubelet.sock", assignments)
    clock = Clock()
    client = PodResourcesClient(sock_dir / "kubelet.sock", refresh_s=10, miss_refresh_s=1, clock=clock)
    try:
        assert client.lookup(CORE, ["GPU-1::0"]) == PodRef("team-a", "old-0", "main")
        assert kubelet.calls == 1
        assignments[("team-b", "new-0", "main")] = {CORE: ["GPU-1::3", "GPU-1::4"]}  # the kubelet's new container
        clock.now += 1.5  # within refresh_s: only the miss can make the client ask again
        assert client.lookup(CORE, ["GPU-1::3", "GPU-1::4"]) == PodRef("team-b", "new-0", "main")
        assert kubelet.calls == 2
    finally:
        client.close()
        kubelet.stop()


def test_a_record_newer_than_the_listing_asks_again(sock_dir: Path) -> None:
    """Device IDs freed by a deleted pod and given to a new container: the cached listing still names the old
    pod; a record created after the listing refreshes it (rate-limited), an older one waits for refresh_s."""
    assignments: dict = {("ns", "old", "c"): {CORE: ["GPU-1::0"]}}
    kubelet = Kubelet(sock_dir / "kubelet.sock", assignments)
    clock, wall = Clock(), Clock()
    client = PodResourcesClient(sock_dir / "kubelet.sock", refresh_s=10, miss_refresh_s=1, clock=clock,
                                wall_clock=wall)
    try:
        assert client.lookup(CORE, ["GPU-1::0"], since=wall.now - 5) == PodRef("ns", "old", "c")
        del assignments[("ns", "old", "c")]
        assignments[("ns", "new", "c")] = {CORE: ["GPU-1::0"]}
        clock.now += 2
        wall.now += 2
        assert client.lookup(CORE, ["GPU-1::0"], since=wall.now - 5) == PodRef("ns", "old", "c")  # older record
        assert kubelet.calls == 1
        assert client.lookup(CORE, ["GPU-1::0"], since=wall.now - 1) == PodRef("ns", "new", "c")
        assert kubelet.calls == 2
    finally:
        client.close()
        kubelet.stop()


def test_reconnects_after_kubelet_restart(sock_dir: Path) -> None:
    sock = sock_dir / "kubelet.sock"
    clock = Clock()
    kubelet = Kubelet(sock, {("ns", "old", "c"): {CORE: ["GPU-1::0"]}})
    client = PodResourcesClient(sock, refresh_s=10, clock=clock)
    try:
        assert client.lookup(CORE, ["GPU-1::0"]) == PodRef("ns", "old", "c")
        kubelet.stop()
        clock.now += 11
        with pytest.raises(PodResourcesError):
            client.list()
        # while the kubelet is down the last mapping still answers
        assert client.lookup(CORE, ["GPU-1::0"]) == PodRef("ns", "old", "c")
        kubelet = Kubelet(sock, {("ns", "new", "c"): {CORE: ["GPU-1::0"]}})
        clock.now += 11
        assert client.lookup(CORE, ["GPU-1::0"]) == PodRef("ns", "new", "c")
        assert client.last_error == ""
    finally:
        client.close()
        kubelet.stop()


def test_missing_socket_is_an_error_not_a_hang(sock_dir: Path) -> None:
    client = PodResourcesClient(sock_dir / "absent.sock", timeout_s=0.5)
    with pytest.raises(PodResourcesError, match="no kubelet pod-resources socket"):
        client.list()
    assert client.lookup(CORE, ["GPU-1::0"]) is None
