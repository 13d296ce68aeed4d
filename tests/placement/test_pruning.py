"""Domain-first pruning (placement/pruning.py): what it computes once for many nodes or
covers gives what each computed alone gives."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from itertools import combinations

import pytest

from nexus_admit.bench.fleet import bench_config, bench_gang, generate_fleet
from nexus_admit.model import Domain, Gang, PlacementConfig
from nexus_admit.placement import pruning
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.objective import term_weights
from nexus_admit.placement.problem import Problem, prepare
from nexus_admit.placement.reduction import Reduction, holds


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
