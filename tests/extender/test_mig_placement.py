"""The extender places vgpu shares on MIG instances as on GPUs: the device plugin's topology
annotation of a MIG node (each instance a GPU of its own, the MIG-mode parent left out) read
back by the extender; shares binpack onto an instance and never straddle two."""

from __future__ import annotations

from device_plugin.node_topology import encode
from kube_contract import topology
from node_state.testing import ISSUE_NODE_MIG, FakeMig
from scheduler_extender.placement import ContainerRequest, NodeGPUs, Placement, PodRequest, Policy, Tags, Unfit, place

GiB = 1 << 30


def mig_node(mig: list[str]) -> tuple[NodeGPUs, FakeMig]:
    fake = FakeMig(mig)
    topo = topology.decode(encode(fake.inventory().shareable()))
    return NodeGPUs.from_topology("n1", topo), fake


def share(cores: int, memory: int) -> PodRequest:
    return PodRequest((ContainerRequest("c0", cores, memory),), Policy.BINPACK, (), (), Tags())


def placed_on(result: Placement | Unfit) -> list[str]:
    assert isinstance(result, Placement), getattr(result, "reason", result)
    ((_, shares),) = result.containers
    return [s.uuid for s in shares]


def test_instances_are_gpus_and_their_parent_is_not():
    node, fake = mig_node(list(ISSUE_NODE_MIG))
    parent = fake.gpus()[0]
    instances = {d.uuid: d for d in fake.mig_devices(0)}
    by_uuid = {g.uuid: g for g in node.gpus}
    assert parent.uuid not in by_uuid                      # a GPU in MIG mode is never offered whole
    assert set(instances) <= set(by_uuid)
    for uuid, d in instances.items():
        assert by_uuid[uuid].memory == d.memory_total       # an instance's own memory, not the parent's
    assert {g.uuid for g in fake.gpus()[1:]} <= set(by_uuid)   # MIG off / not capable: whole GPUs


def test_a_share_binpacks_onto_a_used_instance():
    node, fake = mig_node(list(ISSUE_NODE_MIG))
    small = fake.mig_devices(0)[0]
    used = next(g for g in node.gpus if g.uuid == small.uuid)
    used.add(30, 2 * GiB, Tags())
    node.refresh()
    assert placed_on(place(node, share(30, 4 * GiB))) == [small.uuid]


def test_a_share_never_lands_where_its_memory_does_not_fit():
    node, fake = mig_node(list(ISSUE_NODE_MIG))
    for d in fake.mig_devices(0):                          # make every instance the binpack favourite
        g = next(g for g in node.gpus if g.uuid == d.uuid)
        g.add(10, GiB, Tags())
    node.refresh()
    (uuid,) = placed_on(place(node, share(30, 20 * GiB)))
    chosen = next(g for g in node.gpus if g.uuid == uuid)
    assert chosen.memory - chosen.used_memory >= 20 * GiB   # the 1g.10gb instances cannot hold it


def test_a_share_is_never_split_across_two_instances():
    node, _ = mig_node(["on:1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb"])
    assert len(node.gpus) == 7 and sum(g.memory for g in node.gpus) >= 60 * GiB
    result = place(node, share(50, 15 * GiB))              # fits the seven together, no one instance
    assert isinstance(result, Unfit), result
    assert isinstance(place(node, share(50, 8 * GiB)), Placement)
