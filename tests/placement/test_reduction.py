"""The candidates' room: the shortcut a one-pod decision takes against pod_capacity; the
symmetry reduction's twins found after pruning (a gang bigger than any rack)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_admit.bench.fleet import BENCH_LEVELS, bench_config, bench_gang, generate_fleet
from nexus_admit.model import (
    GPU_WHOLE,
    Gang,
    Node,
    NumaPolicy,
    PlacementConfig,
    PodSet,
    WorkloadType,
    pod_capacity,
)
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.memo import NodeMemo
from nexus_admit.placement.problem import Problem, prepare
from nexus_admit.placement.pruning import prune_domains
from nexus_admit.placement.reduction import (
    Reduction,
    candidates,
    keeps_every_candidate,
    lone_class_key,
    lone_entries,
    lone_signature,
    reduce_symmetry,
    room_for_one,
    shortfall,
    with_twins,
)
from nexus_admit.placement.tracking import TrackedSnapshot
from tests.strategies import CONFIG, RACK, gangs, nodes, pod_sets

_near = st.integers(-2, 2)  # a node's free amount minus the pod's need, in units of 1,000


@settings(max_examples=400)
@given(
    node=nodes("n"),
    ps=pod_sets("ps"),
    policy=st.sampled_from(list(NumaPolicy)),
    free_pods=st.integers(-1, 2),
    cpu=_near,
    memory=_near,
    busy=st.lists(st.sampled_from((0, 250, 500, GPU_WHOLE)), max_size=8),
)
def test_room_for_one_pod_is_pod_capacity_capped_at_one(
    node: Node, ps: PodSet, policy: NumaPolicy, free_pods: int, cpu: int, memory: int,
    busy: list[int],
) -> None:
    node.free_pods = free_pods
    node.free_cpu_milli = ps.cpu_milli + 1000 * cpu  # on either side of the pod's need
    node.free_memory_mib = ps.memory_mib + 1000 * memory
    node.gpu_free = [*busy, *node.gpu_free][: len(node.gpu_free)]
    assert room_for_one(node, ps, policy) == min(pod_capacity(node, ps, policy), 1)


# ------------------------------------------------------- pruning before the twins
# A gang of more pods than any rack has candidates: the symmetry reduction keeps every
# node, so the engine prunes first and finds the twins among the kept nodes only.

_PRUNED = PlacementConfig.model_validate({
    "topology": {"levels": list(BENCH_LEVELS)},
    # a small budget, so the small fleets below are pruned as the bench's large ones
    "solver": {"maxCandidateNodes": 8, "keptFraction": 0.0, "timeLimitSeconds": 10.0},
})


def _gang(count: int, gpus: int, tier: str, kind: WorkloadType, preferred: str | None) -> Gang:
    ps = PodSet("workers", count, cpu_milli=8000, memory_mib=65536, gpus=gpus,
                vram_mib=20 * 1024, indexed=True)
    return Gang("g", (ps,), tier=tier, workload_type=kind, preferred_level=preferred)


def _before(problem: Problem, red: Reduction, memo: NodeMemo) -> Reduction:
    """The order before: the symmetry reduction of every candidate, then pruning."""
    return prune_domains(problem, reduce_symmetry(problem, red, memo))


@pytest.mark.parametrize("nodes", [1000, 5000])
@pytest.mark.parametrize("repeat", [0, 1, 2])
def test_twins_after_pruning_are_the_reduction_before_on_the_bench_fleets(
    nodes: int, repeat: int
) -> None:
    """On the bench's own instances, the reduction pruned first and twinned after is the
    reduction before, node for node: the same model, so the same placement."""
    config = bench_config()
    snapshot = generate_fleet(nodes, seed=1000 * nodes + repeat)
    compared = 0
    for size in (8, 64, 256):
        problem = prepare(snapshot, bench_gang(size), config)
        memo = NodeMemo()
        memo.sync(snapshot, config)
        red = candidates(problem, memo)
        if len(red.nodes) <= config.solver.max_candidate_nodes:
            continue  # not pruned: the engine takes the order before
        assert keeps_every_candidate(problem, red)  # no rack holds 8 or more candidates
        compared += 1
        after = with_twins(problem, prune_domains(problem, red), memo, red.nodes)
        before = _before(problem, red, memo)
        assert (after.nodes, after.caps, after.exact, after.notes, after.twins, after.hint) == (
            before.nodes, before.caps, before.exact, before.notes, before.twins, before.hint)
    assert compared >= 2  # the 64- and 256-pod gangs at least


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    racks=st.integers(3, 8),
    count=st.integers(2, 24),
    gpus=st.sampled_from((1, 2, 4, 8)),
    tier=st.sampled_from(("gold", "silver", "bronze")),
    kind=st.sampled_from(list(WorkloadType)),
    preferred=st.sampled_from((None, BENCH_LEVELS[1], BENCH_LEVELS[2])),
)
def test_keeps_every_candidate_only_when_the_symmetry_reduction_does(
    seed: int, racks: int, count: int, gpus: int, tier: str, kind: WorkloadType,
    preferred: str | None,
) -> None:
    snapshot = generate_fleet(racks * 8, seed=seed)
    problem = prepare(snapshot, _gang(count, gpus, tier, kind, preferred), _PRUNED)
    memo = NodeMemo()
    memo.sync(snapshot, _PRUNED)
    red = candidates(problem, memo)
    if keeps_every_candidate(problem, red):
        assert reduce_symmetry(problem, red, memo).nodes == red.nodes


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    racks=st.integers(3, 6),
    count=st.integers(8, 24),
    gpus=st.sampled_from((1, 2, 4, 8)),
    tier=st.sampled_from(("gold", "silver", "bronze")),
    kind=st.sampled_from(list(WorkloadType)),
    preferred=st.sampled_from((None, BENCH_LEVELS[1], BENCH_LEVELS[2])),
)
def test_the_engine_pruning_first_is_no_worse_than_the_order_before(
    seed: int, racks: int, count: int, gpus: int, tier: str, kind: WorkloadType,
    preferred: str | None,
) -> None:
    """Random small pruned fleets: the engine's placement (pruned first, twins after) has
    the objective of the order before (every candidate's twins, then pruning) whenever
    that one is solved to optimal over its nodes, and never a worse one."""
    snapshot = generate_fleet(racks * 8, seed=seed)
    gang = _gang(count, gpus, tier, kind, preferred)
    engine = CpSatEngine(seed=0)
    placed = engine.place(snapshot, gang, _PRUNED)
    problem = prepare(snapshot, gang, _PRUNED)
    memo = NodeMemo()
    memo.sync(snapshot, _PRUNED)
    red = candidates(problem, memo)
    if shortfall(problem, red) or len(red.nodes) <= _PRUNED.solver.max_candidate_nodes:
        return
    before = CpSatEngine(seed=0)._solve(problem, _before(problem, red, memo),
                                         time.perf_counter())
    assert placed.feasible == before.feasible
    if before.feasible:
        assert placed.objective <= before.objective + 1e-6
        assert placed.model_objective == before.model_objective


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(nodes("t"), min_size=1, max_size=3),
       st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 7)), min_size=1, max_size=10),
       gangs(max_sets=1, max_count=3), st.booleans())
def test_lone_entries_worked_out_per_node_state_equal_each_nodes_own(
    templates: list[Node], picks: list[tuple[int, int]], gang: Gang, clique_pristine: bool
) -> None:
    """The tracker's entries, worked out once per node state, are each node's own room
    and `lone_class_key`: nodes copied from a few templates (some with one GPU taken)
    share states but not names, racks or cliques."""
    fleet = []
    for i, (pick, taken) in enumerate(picks):
        template = templates[pick % len(templates)]
        node = replace(template.copy(), name=f"n{i}",
                       labels={**template.labels, RACK: f"r{i % 2}"},
                       clique=f"c{i % 3}" if template.gpu_free else None)
        if clique_pristine:
            node.gpu_free = [GPU_WHOLE] * len(node.gpu_free)
        if 0 <= taken < len(node.gpu_free):
            node.gpu_free[taken] = 0
        fleet.append(node)
    snapshot = TrackedSnapshot.of(fleet)
    problem = prepare(snapshot, gang, CONFIG)
    if lone_signature(problem) is None or gang.siblings:
        return
    names = problem.candidates[gang.pod_sets[0].name]
    memo = NodeMemo()
    memo.sync(snapshot, CONFIG)
    expected = []
    ps = gang.pod_sets[0]
    for name in names:
        node = problem.node(name)
        cap = min(pod_capacity(node, ps, gang.numa_policy), ps.count)
        if cap <= 0:
            continue
        whole = node.clique is not None and node.clique in problem.pristine_cliques
        expected.append((name, cap, None if whole else lone_class_key(problem, name, cap,
                                                                      NodeMemo())))
    assert lone_entries(problem, names, memo) == expected
