"""Placing in order: a feasible answer takes its capacity at once, so the next gang cannot
get the same GPUs; an infeasible one takes nothing; undo gives back exactly what was taken."""

from __future__ import annotations

from nexus_admit.model import ClusterSnapshot, Gang, PlacementConfig, PodSet
from nexus_admit.placement.policies import make_policy
from nexus_admit.placement.sequence import OrderedPlacer
from nexus_admit.placement.tracking import TrackedSnapshot
from tests.factories import gpu_node


def gang(name: str, pods: int) -> Gang:
    return Gang(name, (PodSet("main", count=pods, gpus=8),))


def test_each_gang_sees_the_capacity_of_those_before_it() -> None:
    placer = OrderedPlacer(make_policy("nexus"), ClusterSnapshot({n: gpu_node(n) for n in "ab"}))
    first = placer.place(gang("first", 1), PlacementConfig())
    second = placer.place(gang("second", 1), PlacementConfig())
    third = placer.place(gang("third", 1), PlacementConfig())
    assert first.feasible and second.feasible and not third.feasible
    assert {first.slots[0].node, second.slots[0].node} == {"a", "b"}
    placer.undo(gang("first", 1), first.slots)
    assert placer.place(gang("again", 1), PlacementConfig()).slots[0].node == first.slots[0].node


def test_a_tracked_snapshot_logs_the_nodes_it_changes() -> None:
    snap = TrackedSnapshot.of([gpu_node("a")])
    placer = OrderedPlacer(make_policy("binpack"), snap)
    placement = placer.place(gang("g", 1), PlacementConfig())
    assert placement.feasible and snap.change_log == ["a"]
    placer.undo(gang("g", 1), placement.slots)
    assert snap.change_log == ["a", "a"] and snap.nodes["a"].free_whole_gpus == 8


def test_a_clamped_hold_on_a_tracked_snapshot_is_logged_so_the_engine_rereads_the_node() -> None:
    snap = TrackedSnapshot.of([gpu_node("a"), gpu_node("b")])
    placer = OrderedPlacer(make_policy("nexus"), snap)
    first = placer.place(gang("first", 1), PlacementConfig())
    taken = first.slots[0].node
    # a reservation found on the other node, held on top of what the snapshot counts
    other = "b" if taken == "a" else "a"
    held = [s.__class__(s.pod_set, s.index, other, s.gpu_indices, s.numa_zone) for s in first.slots]
    placer.hold(gang("found", 1), held, over=True)
    assert snap.change_log[-1] == other
    # the engine's node memo must see that node as full now
    assert not placer.place(gang("third", 1), PlacementConfig()).feasible
