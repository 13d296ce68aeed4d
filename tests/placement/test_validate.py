"""The independent validator: hand-made broken placements must be caught, each with a
message that names what is wrong; a sound placement yields nothing."""

from __future__ import annotations

from nexus_admit.model import (
    Gang,
    NumaPolicy,
    Placement,
    PodSet,
    Slot,
    SolveStatus,
    Taint,
)
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.validate import violations
from tests.factories import RACK, config, gpu_node, snapshot

CONFIG = config()
WORKERS = PodSet("w", 2, cpu_milli=4000, memory_mib=4096, gpus=1)
GANG = Gang("ns/g", (WORKERS,))


def plan(*slots: Slot) -> Placement:
    return Placement("ns/g", "hand", True, SolveStatus.HEURISTIC, list(slots))


def test_a_sound_placement_has_no_violations() -> None:
    snap = snapshot(gpu_node("a"), gpu_node("b"))
    assert violations(snap, GANG, plan(Slot("w", 0, "a", (0,), 0), Slot("w", 1, "b", (0,), 0)),
                      CONFIG) == []
    engine = CpSatEngine().place(snap, GANG, CONFIG)
    assert engine.feasible and violations(snap, GANG, engine, CONFIG) == []


def test_an_infeasible_answer_without_slots_is_sound_and_one_with_slots_is_not() -> None:
    snap = snapshot(gpu_node("a"))
    empty = Placement("ns/g", "hand", False, SolveStatus.INFEASIBLE)
    assert violations(snap, GANG, empty, CONFIG) == []
    empty.slots.append(Slot("w", 0, "a", (0,), 0))
    assert violations(snap, GANG, empty, CONFIG) == ["infeasible placement carries slots"]


def test_over_committed_gpu_share() -> None:
    snap = snapshot(gpu_node("a", shares={0: 500}))
    out = violations(snap, GANG, plan(Slot("w", 0, "a", (0,), 0), Slot("w", 1, "a", (1,), 0)),
                     CONFIG)
    assert out == ["a GPU 0: 1000 milli asked, 500 free"]


def test_two_whole_gpu_pods_on_one_gpu() -> None:
    snap = snapshot(gpu_node("a"))
    out = violations(snap, GANG, plan(Slot("w", 0, "a", (3,), 0), Slot("w", 1, "a", (3,), 0)),
                     CONFIG)
    assert out == ["a GPU 3: 2000 milli asked, 1000 free"]


def test_shared_gpu_pods_beyond_the_free_share() -> None:
    share = PodSet("s", 3, gpus=1, gpu_milli=400)
    gang = Gang("ns/g", (share,))
    snap = snapshot(gpu_node("a", gpus=1, numa=False))
    two = plan(Slot("s", 0, "a", (0,)), Slot("s", 1, "a", (0,)), Slot("s", 2, "a", (0,)))
    assert violations(snap, gang, two, CONFIG) == ["a GPU 0: 1200 milli asked, 1000 free"]


def test_duplicated_index() -> None:
    snap = snapshot(gpu_node("a"))
    out = violations(snap, GANG, plan(Slot("w", 0, "a", (0,), 0), Slot("w", 0, "a", (1,), 0)),
                     CONFIG)
    assert "w[0] placed twice" in out
    assert "pod set w: placed indices 1 of 2" in out


def test_missing_pods() -> None:
    snap = snapshot(gpu_node("a"))
    out = violations(snap, GANG, plan(Slot("w", 1, "a", (0,), 0)), CONFIG)
    assert out == ["pod set w: placed indices 1 of 2"]


def test_index_out_of_range_counts_as_missing() -> None:
    snap = snapshot(gpu_node("a"))
    out = violations(snap, GANG, plan(Slot("w", 0, "a", (0,), 0), Slot("w", 5, "a", (1,), 0)),
                     CONFIG)
    assert out == ["pod set w: placed indices 2 of 2"]


def test_node_not_eligible() -> None:
    snap = snapshot(gpu_node("a"), gpu_node("tainted", taints=(Taint("dedicated", "x"),)))
    out = violations(
        snap, GANG, plan(Slot("w", 0, "a", (0,), 0), Slot("w", 1, "tainted", (0,), 0)), CONFIG
    )
    assert out == ["w[1] on tainted: untolerated taint"]


def test_node_outside_the_assigned_flavor() -> None:
    ps = PodSet("w", 1, gpus=1, allowed_nodes=frozenset({"a"}))
    snap = snapshot(gpu_node("a"), gpu_node("b"))
    out = violations(snap, Gang("ns/g", (ps,)), plan(Slot("w", 0, "b", (0,), 0)), CONFIG)
    assert out == ["w[0] on b: outside assigned flavor"]


def test_unknown_node_and_unknown_pod_set() -> None:
    snap = snapshot(gpu_node("a"))
    out = violations(snap, GANG, plan(Slot("w", 0, "ghost", (0,)), Slot("x", 0, "a", (0,))),
                     CONFIG)
    assert "slot on unknown node 'ghost'" in out
    assert "slot for unknown pod set 'x'" in out


def test_wrong_number_of_gpus() -> None:
    snap = snapshot(gpu_node("a"))
    out = violations(snap, GANG, plan(Slot("w", 0, "a", (0, 1), 0), Slot("w", 1, "a", (), 0)),
                     CONFIG)
    assert "w[0] has 2 GPUs, needs 1" in out
    assert "w[1] has 0 GPUs, needs 1" in out


def test_gpu_that_does_not_exist() -> None:
    snap = snapshot(gpu_node("a", gpus=2))
    out = violations(snap, GANG, plan(Slot("w", 0, "a", (0,), 0), Slot("w", 1, "a", (9,))),
                     CONFIG)
    assert out == ["w[1] on a: no GPU 9"]


def test_cpu_memory_and_pod_slots_over_committed() -> None:
    snap = snapshot(gpu_node("a"))
    node = snap.nodes["a"]
    node.free_cpu_milli = 6000
    node.free_memory_mib = 6000
    node.free_pods = 1
    out = violations(snap, GANG, plan(Slot("w", 0, "a", (0,)), Slot("w", 1, "a", (1,))), CONFIG)
    assert "a: CPU over-committed (8000m > 6000m free)" in out
    assert "a: memory over-committed" in out
    assert "a: pod slots over-committed" in out


def test_gpus_outside_the_stated_numa_zone() -> None:
    snap = snapshot(gpu_node("a"))
    out = violations(snap, GANG, plan(Slot("w", 0, "a", (0,), 1), Slot("w", 1, "a", (5,), 1)),
                     CONFIG)
    assert out == ["w[0] GPUs not in its NUMA zone 1"]


def test_single_numa_node_requires_a_zone_per_pod() -> None:
    gang = Gang("ns/g", (WORKERS,), numa_policy=NumaPolicy.SINGLE_NUMA_NODE)
    snap = snapshot(gpu_node("a"))
    out = violations(snap, gang, plan(Slot("w", 0, "a", (0,), 0), Slot("w", 1, "a", (1,))),
                     CONFIG)
    assert out == ["w[1] on a: no single NUMA zone"]


def test_required_level_violation() -> None:
    gang = Gang("ns/g", (WORKERS,), required_level=RACK)
    snap = snapshot(gpu_node("a", rack="r0"), gpu_node("b", rack="r1"), gpu_node("c", rack="r1"))
    split = plan(Slot("w", 0, "a", (0,), 0), Slot("w", 1, "b", (0,), 0))
    assert violations(snap, gang, split, CONFIG) == [f"required {RACK}: spans 2 domains"]
    together = plan(Slot("w", 0, "b", (0,), 0), Slot("w", 1, "c", (0,), 0))
    assert violations(snap, gang, together, CONFIG) == []


def test_same_rack_name_in_different_blocks_is_not_the_same_rack() -> None:
    gang = Gang("ns/g", (WORKERS,), required_level=RACK)
    snap = snapshot(gpu_node("a", rack="r0", block="b0"), gpu_node("b", rack="r0", block="b1"))
    split = plan(Slot("w", 0, "a", (0,), 0), Slot("w", 1, "b", (0,), 0))
    assert violations(snap, gang, split, CONFIG) == [f"required {RACK}: spans 2 domains"]
