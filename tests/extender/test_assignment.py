"""The decision annotation: round trip and validation errors that name the field."""

from __future__ import annotations

import json

import pytest

from kube_contract.assignment import (
    Assignment,
    AssignmentError,
    ContainerAssignment,
    GPUShare,
    decode,
    encode,
)

GOOD = Assignment(node="n1", containers=(
    ContainerAssignment("train", (GPUShare("GPU-a", 30, 4 << 30),)),
    ContainerAssignment("big", (GPUShare("GPU-b", 100, 80 << 30),
                                GPUShare("GPU-c", 100, 80 << 30))),
))


def test_round_trip() -> None:
    text = encode(GOOD)
    assert decode(text) == GOOD
    assert decode(text.encode()) == GOOD
    doc = json.loads(text)
    assert doc["version"] == 1 and doc["node"] == "n1"
    assert doc["containers"][0] == {"name": "train",
                                    "gpus": [{"uuid": "GPU-a", "cores": 30, "memory": 4 << 30}]}


def test_gpu_totals_and_lookup() -> None:
    a = Assignment("n", (ContainerAssignment("x", (GPUShare("g", 10, 5),)),
                         ContainerAssignment("y", (GPUShare("g", 20, 7),))))
    assert a.gpu_totals() == {"g": (30, 12)}
    assert a.container("y") == a.containers[1]
    assert a.container("zzz") is None


def _doc(**over: object) -> str:
    doc: dict[str, object] = {"version": 1, "node": "n1", "containers": [
        {"name": "c", "gpus": [{"uuid": "GPU-a", "cores": 30, "memory": 1024}]}]}
    doc.update(over)
    return json.dumps(doc)


def _gpu(**over: object) -> str:
    g: dict[str, object] = {"uuid": "GPU-a", "cores": 30, "memory": 1024}
    g.update(over)
    return _doc(containers=[{"name": "c", "gpus": [g]}])


@pytest.mark.parametrize(("desc", "text", "message"), [
    ("not json", "{", "not JSON"),
    ("not an object", "[]", "top level"),
    ("future version", _doc(version=2), "version: 2 is not supported"),
    ("version is a string", _doc(version="1"), "version"),
    ("no node", _doc(node=""), "node"),
    ("containers not list", _doc(containers={}), "containers"),
    ("duplicate container", _doc(containers=[
        {"name": "c", "gpus": [{"uuid": "a", "cores": 1, "memory": 0}]},
        {"name": "c", "gpus": [{"uuid": "b", "cores": 1, "memory": 0}]}]), "listed twice"),
    ("no gpus", _doc(containers=[{"name": "c", "gpus": []}]), "containers[0].gpus"),
    ("cores zero", _gpu(cores=0), "containers[0].gpus[0].cores"),
    ("cores above 100", _gpu(cores=101), "cores"),
    ("cores bool", _gpu(cores=True), "cores"),
    ("memory negative", _gpu(memory=-1), "memory"),
    ("memory float", _gpu(memory=1.5), "memory"),
    ("uuid empty", _gpu(uuid=""), "uuid"),
    ("uuid twice", _doc(containers=[{"name": "c", "gpus": [
        {"uuid": "a", "cores": 1, "memory": 0}, {"uuid": "a", "cores": 1, "memory": 0}]}]),
     "listed twice"),
])
def test_decode_rejects(desc: str, text: str, message: str) -> None:
    with pytest.raises(AssignmentError, match=None) as err:
        decode(text)
    assert message in str(err.value), desc


def test_encode_refuses_invalid() -> None:
    bad = Assignment("n", (ContainerAssignment("c", (GPUShare("g", 0, 0),)),))
    with pytest.raises(AssignmentError):
        encode(bad)


def test_importable_without_kubernetes() -> None:
    import subprocess
    import sys
    code = ("import sys; sys.modules['kubernetes'] = None; "
            "import kube_contract.assignment, kube_contract.topology")
    subprocess.run([sys.executable, "-c", code], check=True)
