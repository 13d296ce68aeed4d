"""The engine's node memo: on a TrackedSnapshot it forgets exactly the nodes the change log
names, anything else starts over, and an engine that keeps its memo across a sequence of
placements and releases answers exactly as a fresh engine on a fresh copy would."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_admit.model import (
    GPU_WHOLE,
    ClusterSnapshot,
    Gang,
    Node,
    NumaPolicy,
    PodSet,
    Slot,
    apply_slots,
)
from nexus_admit.placement.memo import NodeMemo
from nexus_admit.placement.policies import make_policy
from nexus_admit.placement.tracking import TrackedSnapshot
from tests.strategies import CONFIG, gangs, snapshots

ONE_GPU = PodSet("main", 1, cpu_milli=1000, gpus=1)


def _node(name: str) -> Node:
    return Node(name=name, cpu_milli=16_000, memory_mib=65_536, gpu_product="NVIDIA-L40S",
                gpu_memory_mib=46_068, gpu_free=[GPU_WHOLE] * 4, free_cpu_milli=16_000,
                free_memory_mib=65_536)


def _take_one_gpu(node: str) -> tuple[Gang, list[Slot]]:
    return Gang("ns/one", (ONE_GPU,)), [Slot("main", 0, node, (0,))]


def test_a_tracked_snapshot_recomputes_only_the_nodes_it_changed() -> None:
    snap = TrackedSnapshot.of([_node("a"), _node("b")])
    memo = NodeMemo()
    memo.sync(snap, CONFIG)
    before_a, before_b = memo.view(snap.nodes["a"]), memo.view(snap.nodes["b"])
    assert memo.capacity(snap.nodes["a"], ONE_GPU, NumaPolicy.PREFERRED) == 4
    snap.apply(*_take_one_gpu("a"))
    memo.sync(snap, CONFIG)
    after_a = memo.view(snap.nodes["a"])
    assert after_a is not before_a and after_a.free_whole_gpus == 3 and not after_a.pristine
    assert memo.view(snap.nodes["b"]) is before_b  # untouched: answered from the memo
    assert memo.capacity(snap.nodes["a"], ONE_GPU, NumaPolicy.PREFERRED) == 3


def test_a_plain_snapshot_starts_over_on_every_sync() -> None:
    snap = ClusterSnapshot.of([_node("a")])
    memo = NodeMemo()
    memo.sync(snap, CONFIG)
    assert memo.view(snap.nodes["a"]).free_whole_gpus == 4
    apply_slots(snap, *_take_one_gpu("a"))  # no change log says so
    memo.sync(snap, CONFIG)
    assert memo.view(snap.nodes["a"]).free_whole_gpus == 3


def test_a_node_replaced_under_its_name_is_not_answered_from_the_old_one() -> None:
    snap = TrackedSnapshot.of([_node("a")])
    memo = NodeMemo()
    memo.sync(snap, CONFIG)
    assert memo.capacity(snap.nodes["a"], ONE_GPU, NumaPolicy.PREFERRED) == 4
    smaller = _node("a")
    smaller.gpu_free = [GPU_WHOLE]
    snap.nodes["a"] = smaller
    memo.sync(snap, CONFIG)
    assert memo.capacity(snap.nodes["a"], ONE_GPU, NumaPolicy.PREFERRED) == 1
    assert memo.view(snap.nodes["a"]).free_gpu_milli == GPU_WHOLE


def test_derived_values_are_dropped_when_the_config_changes() -> None:
    snap = TrackedSnapshot.of([_node("a")])
    memo = NodeMemo()
    memo.sync(snap, CONFIG)
    assert memo.derived(snap.nodes["a"], "k", lambda: (1,)) == (1,)
    memo.sync(snap, CONFIG)
    assert memo.derived(snap.nodes["a"], "k", lambda: (2,)) == (1,)
    memo.sync(snap, CONFIG.model_copy())
    assert memo.derived(snap.nodes["a"], "k", lambda: (2,)) == (2,)


def test_a_remembered_symmetry_key_is_not_reused_for_another_pod_count() -> None:
    """Three nodes with CPU for one 2-GPU pod and one with CPU for two: for a one-pod gang
    all four are twins, for a two-pod gang the last is not. Asking the one-pod question
    first must not make the engine treat them as twins for the two-pod gang, which one
    node can hold whole."""
    def node(name: str, cpu: int) -> Node:
        n = _node(name)
        n.free_cpu_milli = cpu
        return n

    snap = TrackedSnapshot.of([node("a1", 8000), node("a2", 8000), node("a3", 8000),
                               node("b", 16_000)])
    pods = PodSet("main", 1, cpu_milli=8000, gpus=2)
    engine = make_policy("nexus", 0)
    assert engine.place(snap, Gang("ns/one", (pods,)), CONFIG).feasible  # a what-if only
    two = Gang("ns/two", (replace(pods, count=2),))
    reused = engine.place(snap, two, CONFIG)
    assert {s.node for s in reused.slots} == {"b"}
    assert reused.slots == make_policy("nexus", 0).place(snap.copy(), two, CONFIG).slots


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snapshots(max_nodes=4),
    st.lists(
        st.tuples(gangs(max_sets=2, max_count=3), st.integers(1, 4), st.booleans()),
        min_size=1,
        max_size=4,
    ),
)
def test_an_engine_reused_on_a_tracked_snapshot_answers_as_a_fresh_one(
    start: ClusterSnapshot, steps: list[tuple[Gang, int, bool]]
) -> None:
    """Place a sequence of gangs on one TrackedSnapshot with one engine, each gang a few
    times over (the same shape again, as a trace replays it) and sometimes released again;
    at every step a new engine on a plain copy of the same state must return the same
    slots. Fails if the memo answers from a node state that has changed."""
    tracked = TrackedSnapshot.of(n.copy() for n in start)
    kept = make_policy("nexus", 0)
    placed: list[tuple[Gang, list[Slot]]] = []
    for i, (template, repeats, release) in enumerate(steps):
        for k in range(repeats):
            gang = replace(template, name=f"ns/g{i}-{k}")
            fresh = make_policy("nexus", 0).place(tracked.copy(), gang, CONFIG)
            reused = kept.place(tracked, gang, CONFIG)
            assert reused.feasible == fresh.feasible
            assert reused.slots == fresh.slots
            if reused.feasible:
                tracked.apply(gang, reused.slots)
                placed.append((gang, reused.slots))
        if release and placed:
            tracked.release(*placed.pop(0))
