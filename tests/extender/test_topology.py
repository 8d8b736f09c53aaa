"""The node topology annotation the device plugin publishes."""

from __future__ import annotations

import json

import pytest

from kube_contract.testing import T4, topology
from kube_contract.topology import GPUInfo, NodeTopology, TopologyError, decode, encode


def test_round_trip_with_nvlink_and_numa() -> None:
    topo = NodeTopology((GPUInfo(0, "GPU-a", "A100", 1 << 30, numa=0),
                         GPUInfo(1, "GPU-b", "A100", 1 << 30)), {(0, 1): 12})
    assert decode(encode(topo)) == topo
    assert decode(encode(topo)).links(1, 0) == 12


def test_builder_round_trip() -> None:
    topo = topology("n", [T4, T4, T4], nvlink="all")
    assert decode(encode(topo)) == topo


def _doc(**over: object) -> str:
    doc: dict[str, object] = {"version": 1, "gpus": [
        {"index": 0, "uuid": "a", "model": "m", "memory": 10},
        {"index": 1, "uuid": "b", "model": "m", "memory": 10}]}
    doc.update(over)
    return json.dumps(doc)


@pytest.mark.parametrize(("desc", "text", "message"), [
    ("bad json", "nope", "not JSON"),
    ("version", _doc(version=9), "version"),
    ("gpus missing", _doc(gpus=None), "gpus"),
    ("dup index", _doc(gpus=[{"index": 0, "uuid": "a", "model": "m", "memory": 1},
                             {"index": 0, "uuid": "b", "model": "m", "memory": 1}]), "index"),
    ("dup uuid", _doc(gpus=[{"index": 0, "uuid": "a", "model": "m", "memory": 1},
                            {"index": 1, "uuid": "a", "model": "m", "memory": 1}]), "uuid"),
    ("zero memory", _doc(gpus=[{"index": 0, "uuid": "a", "model": "m", "memory": 0}]), "memory"),
    ("no model", _doc(gpus=[{"index": 0, "uuid": "a", "memory": 1}]), "model"),
    ("link to unknown gpu", _doc(nvlink=[[0, 5, 1]]), "nvlink[0]"),
    ("self link", _doc(nvlink=[[1, 1, 1]]), "nvlink[0]"),
    ("zero links", _doc(nvlink=[[0, 1, 0]]), "nvlink[0]"),
])
def test_decode_rejects(desc: str, text: str, message: str) -> None:
    with pytest.raises(TopologyError) as err:
        decode(text)
    assert message in str(err.value), desc
