"""CDI specs (the format the container runtimes read) and the checkpoint, on their own."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dra_driver import cdi
from dra_driver.checkpoint import PREPARED, UNPREPARING, Checkpoint, PreparedClaim, PreparedDevice, PreparedShare
from node_state.layout import ContainerRecord
from node_state.tenancy import Injection, Mount

UID = "0a4f1c2a-9e00-4c3b-9d21-8e7f6a5b4c3d"   # claim UIDs may start with a digit
# From the CDI spec: a device name is letters and digits with '-', '_', '.' between; a kind is
# <vendor domain>/<class>.
NAME = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9_.-]*[a-zA-Z0-9])?$")
KIND = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[a-zA-Z0-9]([a-zA-Z0-9_.-]*[a-zA-Z0-9])?$")


def device(request: str = "gpu") -> cdi.Device:
    return cdi.Device(cdi.device_name(UID, request), Injection(
        {"VCUDA_CORE_LIMIT": "50", "NVIDIA_VISIBLE_DEVICES": "GPU-1"},
        (Mount(Path("/var/lib/vcuda/containers/c1/shared"), Path("/run/vcuda"), read_only=False),
         Mount(Path("/usr/local/vcuda/lib/libvcuda.so"), Path("/usr/local/vcuda/lib/libvcuda.so"), read_only=True))))


def test_spec_follows_the_cdi_format(tmp_path):
    specs = cdi.SpecDir(tmp_path)
    path = specs.write(UID, [device("gpu"), device("big/sub")])
    assert path == tmp_path / f"gpu.vcuda.io-claim_{UID}.json"
    doc = json.loads(path.read_text())
    assert set(doc) == {"cdiVersion", "kind", "devices"}
    assert doc["cdiVersion"] == "0.5.0"            # the first version that allows names starting with a digit
    assert KIND.match(doc["kind"]) and doc["kind"] == "gpu.vcuda.io/claim"
    names = [d["name"] for d in doc["devices"]]
    assert names == [f"{UID}-gpu", f"{UID}-big_sub"] and all(NAME.match(n) for n in names)
    edits = doc["devices"][0]["containerEdits"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-1", "VCUDA_CORE_LIMIT=50"]
    assert edits["mounts"] == [
        {"hostPath": "/var/lib/vcuda/containers/c1/shared", "containerPath": "/run/vcuda",
         "options": ["rw", "nosuid", "nodev", "bind"]},
        {"hostPath": "/usr/local/vcuda/lib/libvcuda.so", "containerPath": "/usr/local/vcuda/lib/libvcuda.so",
         "options": ["ro", "nosuid", "nodev", "bind"]}]
    assert cdi.qualified(names[0]) == f"gpu.vcuda.io/claim={UID}-gpu"


def test_specs_are_replaced_whole_and_listed_and_removed(tmp_path):
    specs = cdi.SpecDir(tmp_path)
    specs.write(UID, [device()])
    specs.write(UID, [device("other")])
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")     # another vendor's spec
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"gpu.vcuda.io-claim_{UID}.json", "nvidia.yaml"]
    assert specs.read(UID)["devices"][0]["name"].endswith("-other")
    assert specs.claims() == {UID}
    specs.remove(UID)
    specs.remove(UID)
    assert specs.claims() == set() and (tmp_path / "nvidia.yaml").exists()


@pytest.mark.parametrize("uid", ["", "../x", ".hidden", "a/b"])
def test_bad_claim_uids_are_refused(tmp_path, uid):
    with pytest.raises(ValueError):
        cdi.SpecDir(tmp_path).path(uid)
    with pytest.raises(ValueError):
        Checkpoint(tmp_path).path(uid)


def prepared(state: str = PREPARED) -> PreparedClaim:
    record = ContainerRecord(key="c1", mode="vgpu", resource="gpu.vcuda.io", device_ids=("node-1/gpu-0",),
                             gpus=("GPU-1",), core_request=30, core_limit=50, memory_limit=1 << 30, tenant="c1",
                             namespace="ns", pod="p", pod_uid="u", container="main", created=1.5,
                             extra={"claim_uid": UID})
    return PreparedClaim(uid=UID, namespace="ns", name="c", state=state,
                         shares=(PreparedShare("gpu", record, f"{UID}-gpu"),),
                         devices=(PreparedDevice(("gpu",), "node-1", "gpu-0", (f"gpu.vcuda.io/claim={UID}-gpu",)),))


def test_checkpoint_round_trip(tmp_path):
    cp = Checkpoint(tmp_path / "claims")
    assert cp.get(UID) is None and cp.all() == [] and cp.uids() == set()
    cp.put(prepared())
    assert cp.get(UID) == prepared()
    cp.put(prepared(UNPREPARING))
    assert cp.all() == [prepared(UNPREPARING)]
    assert [p.name for p in (tmp_path / "claims").iterdir()] == [f"{UID}.json"]   # no temporary left
    cp.remove(UID)
    cp.remove(UID)
    assert cp.uids() == set()


def test_an_unreadable_checkpoint_is_kept_and_still_counts_as_a_claim(tmp_path, caplog):
    cp = Checkpoint(tmp_path)
    cp.put(prepared())
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / ".x.json.123.tmp").write_text("half")    # a write a crash interrupted
    assert cp.all() == [prepared()]
    assert "ignoring checkpoint broken.json" in caplog.text
    assert cp.uids() == {UID, "broken"}                   # its containers are not orphans to remove
    assert not (tmp_path / ".x.json.123.tmp").exists()
