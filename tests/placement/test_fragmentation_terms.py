"""The engine's optional fragGradient / fillOrder terms (weights default 0): with only the
gradient on, a one-pod gang goes where the FGD fragmentation grows least; with only the fill
order on, non-island nodes fill first, in cluster order."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_admit.model import (
    GPU_WHOLE,
    Gang,
    Node,
    ObjectiveWeights,
    PlacementConfig,
    PodSet,
)
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.fragmentation import (
    PodShape,
    TypicalPod,
    WorkloadDistribution,
    fill_rank,
    gradient_table,
)
from nexus_admit.placement.policies import make_policy
from nexus_admit.placement.tracking import TrackedSnapshot

OFF = {k: 0 for k in ObjectiveWeights.model_fields}
DIST = WorkloadDistribution((
    TypicalPod(PodShape(2000, GPU_WHOLE, 1), 0.5),
    TypicalPod(PodShape(1000, 500, 1), 0.3),
    TypicalPod(PodShape(8000, 0, 0), 0.2),
))


def node(name: str, free: list[int], cpu: int = 32_000) -> Node:
    return Node(name=name, labels={"nvidia.com/gpu.product": "T4"}, cpu_milli=64_000,
                memory_mib=262_144, gpu_product="T4", gpu_memory_mib=15_360,
                gpu_free=free, free_cpu_milli=cpu, free_memory_mib=262_144)


def test_default_weights_leave_the_terms_off() -> None:
    w = ObjectiveWeights()
    assert w.frag_gradient == 0 and w.fill_order == 0
    assert make_policy("nexus").workload is not None  # type: ignore[attr-defined]


def test_gradient_only_places_where_fragmentation_grows_least() -> None:
    rng = np.random.default_rng(11)
    config = PlacementConfig(weights=ObjectiveWeights(**{**OFF, "frag_gradient": 1000}))
    engine = CpSatEngine(0, workload=DIST)
    for case in range(25):
        nodes = [node(f"n{i}", [int(rng.choice([0, 250, 500, 800, 1000]))
                                for _ in range(int(rng.choice([1, 2, 4])))],
                      cpu=int(rng.choice([1000, 4000, 32_000])))
                 for i in range(5)]
        milli = int(rng.choice([250, 500, GPU_WHOLE]))
        ps = PodSet("p", 1, cpu_milli=500, memory_mib=512, gpus=1, gpu_milli=milli)
        gang = Gang(f"g{case}", (ps,))
        snap = TrackedSnapshot.of(nodes)
        placement = engine.place(snap, gang, config)
        options = {}
        for n in nodes:
            table = gradient_table(n.gpu_free, n.free_cpu_milli, n.gpu_product, ps.cpu_milli,
                                   1, milli, 1, DIST)
            if len(table) > 1:
                options[n.name] = table[1]
        if not options:
            assert not placement.feasible
            continue
        assert placement.feasible, placement.reason
        chosen = placement.slots[0].node
        assert options[chosen] <= min(options.values()) + 1e-6


def test_fill_order_puts_islands_last() -> None:
    nodes = [node("big-a", [GPU_WHOLE] * 8), node("small-a", [GPU_WHOLE] * 2),
             node("big-b", [GPU_WHOLE] * 8), node("small-b", [GPU_WHOLE] * 2)]
    rank = fill_rank(nodes, island_min_gpus=8)
    assert sorted(rank, key=rank.__getitem__) == ["small-a", "small-b", "big-a", "big-b"]
    config = PlacementConfig(weights=ObjectiveWeights(**{**OFF, "fill_order": 1000}))
    snap = TrackedSnapshot.of(nodes)
    gang = Gang("g", (PodSet("p", 1, cpu_milli=500, memory_mib=512, gpus=1),))
    placement = CpSatEngine(0).place(snap, gang, config)
    assert placement.slots[0].node == "small-a"


def test_order_terms_are_reported_and_counted_in_the_objective() -> None:
    nodes = [node("small", [GPU_WHOLE, 500]), node("big", [GPU_WHOLE] * 8)]
    weights = {**OFF, "frag_gradient": 1000, "fill_order": 700, "node_count": 50}
    config = PlacementConfig(weights=ObjectiveWeights(**weights))
    ps = PodSet("p", 1, cpu_milli=500, memory_mib=512, gpus=1, gpu_milli=500)
    placement = CpSatEngine(0, workload=DIST).place(TrackedSnapshot.of(nodes), Gang("g", (ps,)),
                                                    config)
    assert placement.feasible, placement.reason
    chosen = nodes[0] if placement.slots[0].node == "small" else nodes[1]
    table = gradient_table(chosen.gpu_free, chosen.free_cpu_milli, chosen.gpu_product,
                           ps.cpu_milli, 1, 500, 1, DIST)
    rank = fill_rank(nodes, island_min_gpus=8)[chosen.name]
    assert placement.terms["fragGradient"] == round(table[1] / GPU_WHOLE, 3)
    assert placement.terms["fillOrder"] == round(rank, 3)
    assert placement.objective == 1000 * placement.terms["fragGradient"] + 700 * rank + 50
    assert "fragGradient=" in placement.explanation[-2]  # the terms line shows them too
    assert f"objective {placement.objective:g}" in placement.explanation[-2]


def test_order_terms_are_absent_when_their_weights_are_off() -> None:
    nodes = [node("a", [GPU_WHOLE] * 2)]
    ps = PodSet("p", 1, cpu_milli=500, memory_mib=512, gpus=1)
    placement = CpSatEngine(0).place(TrackedSnapshot.of(nodes), Gang("g", (ps,)),
                                     PlacementConfig())
    assert "fragGradient" not in placement.terms and "fillOrder" not in placement.terms


def _workload() -> WorkloadDistribution:
    """Shapes of every kind the measure reads: whole and shared GPUs, several GPUs, a
    CPU-only pod, one bound to a GPU model (fresh caches each call)."""
    return WorkloadDistribution((
        TypicalPod(PodShape(2000, GPU_WHOLE, 1), 0.3),
        TypicalPod(PodShape(1000, 500, 1), 0.2),
        TypicalPod(PodShape(4000, 250, 1, ("T4",)), 0.1),
        TypicalPod(PodShape(8000, GPU_WHOLE, 2), 0.1),
        TypicalPod(PodShape(16000, GPU_WHOLE, 4), 0.1),
        TypicalPod(PodShape(8000, 0, 0), 0.2),
    ))


_states = st.tuples(
    st.lists(st.sampled_from((0, 130, 250, 500, 700, GPU_WHOLE)), min_size=0, max_size=8),
    st.sampled_from((0, 2000, 6000, 16_000, 32_000)),
    st.sampled_from(("T4", "A10", "G2")),
)
_shapes = st.tuples(st.sampled_from((0, 1000, 4000)), st.integers(0, 4),
                    st.sampled_from((250, 500, GPU_WHOLE)), st.integers(1, 3))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_states, _shapes, st.randoms(use_true_random=False)), min_size=1,
                max_size=12))
def test_gradient_tables_from_warm_caches_equal_cold_ones(
    calls: list[tuple[tuple[list[int], int, str], tuple[int, int, int, int], random.Random]],
) -> None:
    """`gradient_table` keeps one node's F per state (sorted GPUs, CPU, model) for every
    pod shape's table: after any calls on one distribution, each table equals the one a
    fresh distribution works out, to the bit, whatever order the node lists its GPUs in."""
    warm = _workload()
    for (free, cpu, model), (cpu_milli, gpus, share, count), rng in calls:
        gpu_milli = share if gpus == 1 else (GPU_WHOLE if gpus else 0)
        shuffled = rng.sample(free, len(free))  # the same state, its GPUs in another order
        for order in (free, shuffled):
            cold = gradient_table(order, cpu, model, cpu_milli, gpus, gpu_milli, count,
                                  _workload())
            assert gradient_table(order, cpu, model, cpu_milli, gpus, gpu_milli, count,
                                  warm) == cold
