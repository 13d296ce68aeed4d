"""Domain-first pruning (placement/pruning.py): what it computes once for many nodes or
covers gives what each computed alone gives."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace
from itertools import combinations, zip_longest

import pytest

from nexus_admit.bench.fleet import bench_config, bench_gang, generate_fleet
from nexus_admit.model import (
    GPU_WHOLE,
    ClusterSnapshot,
    Domain,
    Gang,
    Node,
    PlacementConfig,
    PodSet,
    WorkloadType,
)
from nexus_admit.placement import pruning
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.objective import evaluate_terms, term_weights, weighted_objective
from nexus_admit.placement.problem import Problem, prepare
from nexus_admit.placement.realise import slots_for
from nexus_admit.placement.reduction import Reduction, holds
from tests.strategies import BLOCK, CONFIG, PRODUCTS


def _problem(
    nodes: int, seed: int, gang: Gang, config: PlacementConfig
) -> tuple[Problem, Reduction]:
    """The bench fleet, every third node with more VRAM per GPU than its class's others."""
    snapshot = generate_fleet(nodes, seed=seed)
    for i, node in enumerate(snapshot):
        if i % 3 == 0:
            node.gpu_memory_mib += 16 * 1024
    problem = prepare(snapshot, gang, config)
    return problem, CpSatEngine(seed=0)._candidates(problem)


def _gangs() -> list[Gang]:
    one, eight, big = bench_gang(1), bench_gang(8), bench_gang(64)
    return [one, replace(one, tier="bronze"), eight, replace(eight, tier="silver"), big]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("fragmentation", [0, 3])
def test_pod_costs_are_each_nodes_pod_cost(seed: int, fragmentation: int) -> None:
    """Grouped by what `pod_cost` reads (class, VRAM, the rack for a one-pod gang), with
    and without the rack's free GPUs in the cost."""
    config = bench_config()
    config = config.model_copy(update={"weights": config.weights.model_copy(
        update={"domain_fragmentation": fragmentation})})
    for gang in _gangs():
        problem, red = _problem(300, seed, gang, config)
        weights = term_weights(problem)
        expected = {n: pruning.pod_cost(problem, n, weights) for n in red.nodes}
        assert pruning.pod_costs(problem, red.nodes, weights) == expected


def _parents_one_cover_at_a_time(
    problem: Problem, red: Reduction, by_parent: dict[Domain | None, list[list[str]]],
    parent_level: int, costing: pruning._Costing,
) -> list[Domain]:
    """`_rank_parents` as its docstring says it: every cover of every parent bounded."""
    ranked: list[tuple[float, int, Domain]] = []
    for i, (parent, group) in enumerate(by_parent.items()):
        if parent is None:
            continue
        children: dict[Domain | None, list[list[str]]] = defaultdict(list)
        for members in group:
            children[problem.paths[members[0]][parent_level + 1]].append(members)
        roomiest = sorted(children, key=lambda c: -sum(
            costing.room[m] for ms in children[c] for m in ms))[:pruning._COVER_CHILDREN]
        orders = [group] + [[ms for ms in group
                             if problem.paths[ms[0]][parent_level + 1] in pick]
                            for k in (1, 2) for pick in combinations(roomiest, k)]
        for order in orders:
            cover: list[str] = []
            for members in order:
                if sum(costing.room[m] for m in cover) >= problem.gang.pod_count:
                    break
                cover += members
            if holds(problem, red.caps, cover):
                ranked.append((costing.bound(problem, cover, parent_level), i, parent))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return list(dict.fromkeys(parent for _, _, parent in ranked))


@pytest.mark.parametrize("seed", [0, 3, 5])
def test_parents_rank_as_when_every_cover_is_bounded_alone(seed: int) -> None:
    """Racks' room and pods summed once, and a cover several orders take bounded once,
    rank the parents as bounding every cover of every order does."""
    for gang in _gangs()[2:]:
        problem, red = _problem(1200, seed, gang, bench_config())
        weights = term_weights(problem)
        room = {n: min(gang.pod_count, red.caps[(gang.pod_sets[0].name, n)]) for n in red.nodes}
        costing = pruning._Costing(room, pruning.pod_costs(problem, red.nodes, weights), weights)
        rack_level = len(problem.levels) - 2
        for parent_level in range(rack_level):
            racks: dict[Domain | None, list[str]] = defaultdict(list)
            for n in red.nodes:
                racks[problem.paths[n][rack_level]].append(n)
            by_parent: dict[Domain | None, list[list[str]]] = defaultdict(list)
            for members in racks.values():
                by_parent[problem.paths[members[0]][parent_level]].append(members)
            assert len(by_parent) > 1
            assert pruning._rank_parents(problem, red, by_parent, parent_level, costing) == \
                _parents_one_cover_at_a_time(problem, red, by_parent, parent_level, costing)


def _spanning(problem: Problem, counts: dict[tuple[str, str], int], level: int) -> bool:
    """Whether a placement is not inside one domain of `level` (a domain every node of it
    has)."""
    domains = {problem.paths[n][level] for _, n in counts}
    return len(domains) > 1 or None in domains


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_placements_over_several_domains_cost_at_least_their_bound(seed: int) -> None:
    """`lower_bound(..., split_below=True)` over every candidate is below the objective of
    every placement not inside one domain of the level below: nodes of two or three random
    domains taken in turn and filled to their room, some nodes lacking the rack's or the
    block's label (those count as one domain there, so no second one is charged)."""
    rng = random.Random(seed)
    checked = 0
    for gang in _gangs()[2:]:
        problem, red = _problem(1200, seed, gang, bench_config())
        for name in rng.sample(red.nodes, 60):
            del problem.snapshot.nodes[name].labels[problem.levels[rng.choice((1, 2))]]
            problem.paths.pop(name, None)  # worked out again from the labels
        weights = term_weights(problem)
        ps = gang.pod_sets[0]
        room = {n: min(gang.pod_count, red.caps[(ps.name, n)]) for n in red.nodes}
        costing = pruning._Costing(room, pruning.pod_costs(problem, red.nodes, weights), weights)
        for level in (1, 2):
            bound = costing.bound(problem, red.nodes, level - 1, split_below=True)
            domains: dict[Domain | None, list[str]] = defaultdict(list)
            for n in red.nodes:
                domains[problem.paths[n][level]].append(n)
            for _ in range(25):
                picked = rng.sample(list(domains), min(len(domains), rng.randint(2, 3)))
                shuffled = [rng.sample(domains[d], len(domains[d])) for d in picked]
                counts: dict[tuple[str, str], int] = {}
                left = gang.pod_count  # from each domain in turn, until they hold the gang
                for n in (n for turn in zip_longest(*shuffled) for n in turn if n):
                    if left == 0:
                        break
                    counts[(ps.name, n)] = min(room[n], left)
                    left -= counts[(ps.name, n)]
                slots = slots_for(problem, counts)
                if left or isinstance(slots, str) or not _spanning(problem, counts, level):
                    continue
                assert weighted_objective(problem, evaluate_terms(problem, slots)) >= bound
                checked += 1
    assert checked > 50


def _eight_gpu_node(name: str, block: str) -> Node:
    product, vram = PRODUCTS[0]
    return Node(name=name, labels={BLOCK: block}, cpu_milli=64_000, memory_mib=262_144,
                gpu_product=product, gpu_memory_mib=vram, gpu_free=[GPU_WHOLE] * 8,
                free_cpu_milli=64_000, free_memory_mib=262_144)


def test_the_bound_of_placements_over_several_domains_is_met_by_the_cheapest_of_them() -> None:
    """Two 8-GPU pods; block b0 holds both, b1 one; no node has a rack label. The cheapest
    placement over both blocks (a and c: two nodes, one block more) costs exactly the
    bound: the second block is charged, a second rack is not (the racks are all one, None)."""
    snapshot = ClusterSnapshot.of(
        [_eight_gpu_node("a", "b0"), _eight_gpu_node("b", "b0"), _eight_gpu_node("c", "b1")])
    gang = Gang("g", (PodSet("w", 2, cpu_milli=8_000, memory_mib=65_536, gpus=8),),
                tier="gold", workload_type=WorkloadType.TRAINING)
    problem = prepare(snapshot, gang, CONFIG)
    red = CpSatEngine(seed=0)._candidates(problem)
    weights = term_weights(problem)
    costing = pruning._Costing({n: 1 for n in red.nodes},
                               pruning.pod_costs(problem, red.nodes, weights), weights)
    over_both = slots_for(problem, {("w", "a"): 1, ("w", "c"): 1})
    assert not isinstance(over_both, str)
    cheapest = weighted_objective(problem, evaluate_terms(problem, over_both))
    assert costing.bound(problem, red.nodes, -1, split_below=True) == cheapest
    assert costing.bound(problem, red.nodes, -1) < cheapest


def test_spreading_is_not_tried_when_the_greedy_fill_beats_every_split_placement() -> None:
    """On the bench's 5,000-node fleet the 64-pod gang's greedy fill inside one block
    beats every placement over two blocks, though not the bound of every placement:
    pruning keeps no racks for spreading (the bound without the split says it might pay)."""
    snapshot = generate_fleet(5000, seed=5_000_000)
    gang = bench_gang(64)
    problem = prepare(snapshot, gang, bench_config())
    red = CpSatEngine(seed=0)._candidates(problem)
    weights = term_weights(problem)
    room = {n: min(gang.pod_count, red.caps[(gang.pod_sets[0].name, n)]) for n in red.nodes}
    costing = pruning._Costing(room, pruning.pod_costs(problem, red.nodes, weights), weights)
    level = problem.levels.index(gang.preferred_level)
    ranked = pruning._rank_domains(problem, red, level, costing)
    best = pruning._probe_greedy(problem, red, ranked)
    assert costing.bound(problem, red.nodes, level - 1) < best.value
    assert not pruning._may_spread(problem, red, level, best.value, costing)
