"""Where a slot whose node failed goes (`placement/replacement.py`): inside its pod set's
domain, on a node it may use with room now, GPUs from one NUMA zone when one has them."""

from __future__ import annotations

from nexus_admit.model import (
    GPU_WHOLE,
    ClusterSnapshot,
    Gang,
    Node,
    NumaPolicy,
    NumaZone,
    PodSet,
    Slot,
)
from nexus_admit.placement.replacement import replacement_slots, shared_domain

RACK = "rack"


def gpu_node(name: str, rack: str, free: int = 8, *, ready: bool = True) -> Node:
    gpus = [GPU_WHOLE] * free + [0] * (8 - free)
    return Node(
        name, labels={RACK: rack, "kubernetes.io/hostname": name}, cpu_milli=64000,
        memory_mib=512000, gpu_free=gpus, free_cpu_milli=64000, free_memory_mib=512000,
        numa_zones=[NumaZone(0, (0, 1, 2, 3), 32000, 32000),
                    NumaZone(1, (4, 5, 6, 7), 32000, 32000)],
        schedulable=ready,
    )


def gang(gpus: int = 8, count: int = 2, numa: NumaPolicy = NumaPolicy.PREFERRED) -> Gang:
    return Gang("t/w", (PodSet("main", count, cpu_milli=1000, memory_mib=1024, gpus=gpus),),
                numa_policy=numa)


def snapshot(*nodes: Node) -> ClusterSnapshot:
    return ClusterSnapshot(nodes={n.name: n for n in nodes})


def test_the_shared_domain_is_what_every_node_has_alike() -> None:
    a = {RACK: "r1", "block": "b1", "zone": "z"}
    b = {RACK: "r2", "block": "b1", "zone": "z"}
    assert shared_domain([a, a], [RACK, "block"]) == {RACK: "r1", "block": "b1"}
    assert shared_domain([a, b], ["zone", "block", RACK]) == {"zone": "z", "block": "b1"}
    assert shared_domain([], [RACK]) == {}
    assert shared_domain([{"zone": "z"}, a], [RACK, "zone"]) == {"zone": "z"}


def test_a_slot_moves_to_the_fullest_node_of_its_rack_that_holds_it() -> None:
    snap = snapshot(gpu_node("dead", "r1", ready=False), gpu_node("empty", "r1"),
                    gpu_node("half", "r1", free=4), gpu_node("other-rack", "r2", free=4))
    moved = replacement_slots(snap, gang(gpus=4), [Slot("main", 0, "dead", (0, 1, 2, 3), 0)],
                              {"main": {RACK: "r1"}})
    assert moved == [Slot("main", 0, "half", (0, 1, 2, 3), 0)]
    assert snap.nodes["half"].gpu_free == [0] * 8, "its capacity taken"


def test_two_slots_never_get_the_same_gpus() -> None:
    snap = snapshot(gpu_node("dead", "r1", ready=False), gpu_node("a", "r1"))
    moved = replacement_slots(
        snap, gang(gpus=4),
        [Slot("main", 0, "dead", (0, 1, 2, 3), 0), Slot("main", 1, "dead", (4, 5, 6, 7), 1)],
        {"main": {RACK: "r1"}})
    assert moved == [Slot("main", 0, "a", (0, 1, 2, 3), 0), Slot("main", 1, "a", (4, 5, 6, 7), 1)]


def test_no_room_in_the_domain_is_none_whatever_is_free_outside_it() -> None:
    snap = snapshot(gpu_node("dead", "r1", ready=False), gpu_node("full", "r1", free=0),
                    gpu_node("elsewhere", "r2"))
    assert replacement_slots(snap, gang(), [Slot("main", 0, "dead", tuple(range(8)))],
                             {"main": {RACK: "r1"}}) is None


def test_a_not_ready_or_cordoned_node_is_never_a_replacement() -> None:
    snap = snapshot(gpu_node("dead", "r1", ready=False), gpu_node("also-dead", "r1", ready=False))
    assert replacement_slots(snap, gang(), [Slot("main", 0, "dead", tuple(range(8)))],
                             {"main": {RACK: "r1"}}) is None


def test_single_numa_node_wants_its_gpus_in_one_zone() -> None:
    split = gpu_node("split", "r1")
    split.gpu_free = [GPU_WHOLE, GPU_WHOLE, 0, 0, GPU_WHOLE, GPU_WHOLE, 0, 0]
    snap = snapshot(split)
    moving = [Slot("main", 0, "dead", (0, 1, 2, 3), 0)]
    strict = gang(gpus=4, numa=NumaPolicy.SINGLE_NUMA_NODE)
    assert replacement_slots(snap, strict, moving, {}) is None
    assert replacement_slots(snap, gang(gpus=4), moving, {}) == [
        Slot("main", 0, "split", (0, 1, 4, 5), None)]


def test_a_gpu_less_pod_needs_cpu_memory_and_a_pod_slot() -> None:
    cpu = Gang("t/w", (PodSet("driver", 1, cpu_milli=70000, memory_mib=1024),))
    snap = snapshot(gpu_node("small", "r1"))
    assert replacement_slots(snap, cpu, [Slot("driver", 0, "dead")], {}) is None
    cpu = Gang("t/w", (PodSet("driver", 1, cpu_milli=1000, memory_mib=1024),))
    assert replacement_slots(snap, cpu, [Slot("driver", 0, "dead")], {}) == [
        Slot("driver", 0, "small")]
