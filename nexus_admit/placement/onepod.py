"""A one-pod gang needs no model: its candidates are costed cheapest lower bound first,
one node per class of interchangeable nodes, until no bound can beat the best (exact)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from nexus_admit.model import GPU_WHOLE, Node, Placement, Slot, SolveStatus
from nexus_admit.placement.baselines.podbypod import finish, infeasible
from nexus_admit.placement.memo import NodeMemo
from nexus_admit.placement.objective import evaluate_terms, term_weights, weighted_objective
from nexus_admit.placement.order_terms import SCALE, OrderTerms
from nexus_admit.placement.problem import Problem
from nexus_admit.placement.pruning import pod_cost, pod_costs
from nexus_admit.placement.realise import slots_for
from nexus_admit.placement.reduction import Reduction, class_key, lone_signature
from nexus_admit.placement.spread import node_pair_cost, one_pod_allowed

__all__ = [
    "Ranking",
    "bound_contexts",
    "gpu_terms",
    "gradient_bounds",
    "gradient_scan",
    "lower_bounds",
    "rank_order",
    "scan_candidates",
    "scan_lower_bound",
    "scan_ranked",
    "scans",
    "scans_with_gradient",
]


def scans(problem: Problem) -> bool:
    """A one-pod gang is placed by costing its candidate nodes (one per class of
    interchangeable nodes) rather than by a model: with one pod every term is a cost of the node
    alone. Not with fragGradient on: its per-node value may be negative, so the scan's
    lower bound would not hold (the openb study's one-pod gangs keep the model)."""
    return problem.gang.pod_count == 1 and not problem.config.weights.frag_gradient


def scans_with_gradient(problem: Problem) -> bool:
    """A one-pod gang under fragGradient (the openb study's pods): placed by the scan over
    the symmetry reduction's nodes, each bound raised by its own fragGradient
    (`gradient_scan`), rather than by a model."""
    return problem.gang.pod_count == 1 and bool(problem.config.weights.frag_gradient)


def gradient_scan(
    problem: Problem, red: Reduction, started: float, terms: OrderTerms, policy: str
) -> Placement:
    """The cheapest node for a one-pod gang under fragGradient, exactly, from the nodes of
    the symmetry reduction `red`: each ranked by `scan_lower_bound` plus its fragGradient
    and fillOrder as the model charges them (fragGradient is negative where the pod fits
    the node's leftover well, so it cannot be left out of a bound as the scan leaves the
    terms that are never negative), then costed in that order until no bound can beat
    the best. The model's optimum, found without a model."""
    bounds = gradient_bounds(problem, red.nodes, term_weights(problem), terms)
    ranking = Ranking(rank_order(bounds, red.nodes), len(red.nodes), red.notes, red.exact)
    return scan_ranked(problem, ranking, started, terms, policy, model_costs=True)


def gradient_bounds(
    problem: Problem, names: Sequence[str], weights: dict[str, int], terms: OrderTerms
) -> list[float]:
    """`gradient_scan`'s bound of each of `names`: `lower_bounds` plus both order terms
    as the model charges them (the costing adds the same)."""
    ps = problem.gang.pod_sets[0]
    return [
        low + cost / SCALE
        for low, cost in zip(lower_bounds(problem, names, weights),
                             terms.one_pod_costs(problem, names, ps), strict=True)
    ]


def scan_lower_bound(problem: Problem, name: str, weights: dict[str, int]) -> float:
    """Every term of the pod alone on `name` except NUMA alignment and fillOrder, which
    need the pod's GPUs chosen and are never negative: a lower bound of its objective."""
    cost = pod_cost(problem, name, weights)  # tier, VRAM, rack left free
    cost += weights["nodesUsed"] + weights["maxPodsPerNode"]
    if weights["spreadPairs"] and problem.gang.siblings:
        cost += weights["spreadPairs"] * node_pair_cost(problem, name)
    for term in gpu_terms(problem, problem.node(name), weights):
        cost += term
    return cost


def gpu_terms(problem: Problem, node: Node, weights: dict[str, int]) -> tuple[float, ...]:
    """The fragmentation and islandsBroken terms of `scan_lower_bound` (none for a pod
    without GPUs). They read the node's GPU count, its free share in total, how many of
    its GPUs are whole and how many members its clique has if all are pristine."""
    ps = problem.gang.pod_sets[0]
    if not ps.gpus:
        return ()
    share = ps.gpu_milli_per_pod
    free = node.free_gpu_milli
    clique = problem.pristine_cliques.get(node.clique or "", ())
    broken = problem.is_island(node) and node.is_pristine() and share < free
    broken_clique = bool(clique) and (len(clique) > 1 or share < free)
    return (
        weights["fragmentation"] * (free - share) / GPU_WHOLE,
        weights["islandsBroken"] * (int(broken) + int(broken_clique)),
    )


def bound_contexts(problem: Problem, names: Sequence[str]) -> list[tuple[object, ...]]:
    """What `scan_lower_bound` reads of the snapshot besides the node itself, the gang
    (without siblings) and the config, per node: the free GPUs of its rack and how many
    members its clique has if all are pristine. A bound remembered with an equal context
    is the same bound."""
    rack_level = len(problem.levels) - 2
    free = problem.domain_free_gpu_milli(rack_level) if rack_level >= 0 else {}
    cliques, nodes, paths = problem.pristine_cliques, problem.snapshot.nodes, problem.paths
    out: list[tuple[object, ...]] = []
    for name in names:
        rack = paths[name][rack_level] if rack_level >= 0 else None
        clique = cliques.get(nodes[name].clique or "", ())  # as scan_lower_bound reads it
        out.append((free.get(rack) if rack is not None else None, len(clique)))
    return out


def lower_bounds(problem: Problem, names: Sequence[str], weights: dict[str, int]) -> list[float]:
    """`scan_lower_bound` of each of `names`, added up from its parts as it adds them, each
    part computed once per distinct value of what it reads: `pod_cost` per hardware class,
    VRAM and rack (`pod_costs`), `gpu_terms` per GPU count, free share, whole GPUs and
    clique. A ranking of thousands of nodes costs a few dozen of each."""
    if problem.gang.siblings:  # the spread term reads the node's name: no two alike
        return [scan_lower_bound(problem, n, weights) for n in names]
    costs = pod_costs(problem, names, weights)
    fixed = weights["nodesUsed"] + weights["maxPodsPerNode"]
    nodes, cliques = problem.snapshot.nodes, problem.pristine_cliques
    terms: dict[tuple[int, int, int, int], tuple[float, ...]] = {}
    out: list[float] = []
    for name in names:
        node = nodes[name]
        free = node.gpu_free
        key = (len(free), sum(free), free.count(GPU_WHOLE),
               len(cliques.get(node.clique or "", ())))
        extra = terms.get(key)
        if extra is None:
            extra = terms[key] = gpu_terms(problem, node, weights)
        cost = costs[name]
        cost += fixed
        for term in extra:
            cost += term
        out.append(cost)
    return out


@dataclass(frozen=True, slots=True)
class Ranking:
    """The one-pod scan's candidates: (lower bound, order, node) sorted, the order being
    the candidates' (ties keep the earlier), and what the reduction reports."""

    ranked: Iterable[tuple[float, int, str]]  # read once, in order
    units: int  # candidate nodes (with room for the pod)
    notes: list[str]
    exact: bool
    fresh: bool = False  # every candidate ranked anew, none kept from an earlier decision


def scan_candidates(
    problem: Problem,
    red: Reduction,
    memo: NodeMemo,
    started: float,
    terms: OrderTerms,
    policy: str,
) -> Placement:
    """The cheapest node for a one-pod gang, exactly, from its candidates (`candidates`,
    not reduced): each ranked by its lower bound, then costed on its realised slot as
    `finish` reports it, in that order, until no bound can beat the best. Ties keep the
    earlier candidate (the candidate order is the snapshot's).

    The answer of the scan over `reduce_symmetry(red)` without paying for the reduction:
    interchangeable nodes have one bound, so a class's first candidate ranks ahead of its
    mates; a node whose class was already met is skipped, and only the few nodes the scan
    reaches have their class worked out, not the whole fleet."""
    weights = term_weights(problem)
    bounds = lower_bounds(problem, red.nodes, weights)
    ranking = Ranking(rank_order(bounds, red.nodes), len(red.nodes), red.notes, red.exact)
    signature = lone_signature(problem)
    met: set[tuple[object, ...]] = set()

    def first_of_class(name: str) -> bool:
        key = class_key(problem, red, name, memo, signature)
        if key is None:
            return True  # a pristine clique's member: never merged
        if key in met:
            return False
        met.add(key)
        return True

    return scan_ranked(problem, ranking, started, terms, policy, first_of_class)


def rank_order(bounds: list[float], names: list[str]) -> Iterator[tuple[float, int, str]]:
    """`sorted(zip(bounds, range(len(names)), names))`, made as it is read: the scan stops
    after the first few of thousands. A stable sort of the bounds keeps equal bounds in
    candidate order, as the tuples' order does."""
    order = np.argsort(np.asarray(bounds, dtype=np.float64), kind="stable")
    for i in order.tolist():
        yield bounds[i], i, names[i]


def scan_ranked(
    problem: Problem,
    ranking: Ranking,
    started: float,
    terms: OrderTerms,
    policy: str,
    first_of_class: Callable[[str], bool] | None = None,
    model_costs: bool = False,
) -> Placement:
    """`scan_candidates` from its ranking (kept between decisions on a TrackedSnapshot, of
    one node per class: no `first_of_class` to ask). `model_costs`: fragGradient and
    fillOrder costed as the model's integer coefficients charge them (`gradient_scan`,
    which stands for the model), not as the placement reports them."""
    ps = problem.gang.pod_sets[0]
    best: tuple[float, list[Slot], dict[str, float]] | None = None
    costed = 0
    allowed = one_pod_allowed(problem)
    for low, _, name in ranking.ranked:
        if best is not None and low >= best[0] - 1e-9:
            break
        if first_of_class is not None and not first_of_class(name):
            continue  # an interchangeable node ranked ahead of it was met already
        if not allowed(name):
            continue  # the service's spread rules keep it off this node
        slots = slots_for(problem, {(ps.name, name): 1})
        if isinstance(slots, str):
            continue  # GPU shares or NUMA zones cannot hold it after all
        costed += 1
        shared = evaluate_terms(problem, slots)
        value = weighted_objective(problem, shared)
        if model_costs:
            value += terms.one_pod_costs(problem, [name], ps)[0] / SCALE
        else:
            value += sum(weight * v for v, weight in terms.values(problem, slots).values())
        if best is None or value < best[0] - 1e-9:
            best = (value, slots, shared)
    if best is None:
        return infeasible(
            problem.gang, policy, "no candidate node can hold the pod now; will retry", started
        )
    placement = finish(
        problem,
        policy,
        best[1],
        started,
        SolveStatus.OPTIMAL if ranking.exact else SolveStatus.FEASIBLE,
        terms.values(problem, best[1]),
        best[2],
    )
    placement.model_objective = best[0] if model_costs else placement.objective
    placement.explanation.extend(ranking.notes)
    placement.explanation.append(
        f"one pod: {ranking.units} candidate nodes ranked by cost, {costed} costed "
        f"exactly; objective {placement.objective:g}, bound {placement.objective:g}"
    )
    return placement
