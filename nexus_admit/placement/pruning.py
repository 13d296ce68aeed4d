"""Domain-first pruning, when the symmetry reduction leaves more than
`solver.maxCandidateNodes` nodes: the best few domains at the lowest level where one domain
holds the gang, ranked by a lower bound and a greedy (Kueue-TAS-like) fill, plus the
densest racks of the best parent domains when spreading over several may pay. A heuristic:
placements found after it report `feasible`, not `optimal`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

from nexus_admit.model import ClusterSnapshot, Domain, Gang, PodSet, Slot, apply_slots, fit_pod
from nexus_admit.placement.baselines.tas import tas_counts
from nexus_admit.placement.objective import (
    evaluate_terms,
    level_weight,
    stranded_vram_gib,
    term_weights,
    weighted_objective,
)
from nexus_admit.placement.problem import Problem
from nexus_admit.placement.realise import slots_for
from nexus_admit.placement.reduction import Reduction, holds, restrict

__all__ = [
    "dense_racks",
    "greedy",
    "greedy_counts",
    "lower_bound",
    "pod_cost",
    "pod_costs",
    "prune_domains",
]

_GREEDY_PROBES = 16  # domains given a greedy fill while pruning
_COVER_CHILDREN = 6  # roomiest child domains (blocks) whose singles and pairs cover a parent

Counts = dict[tuple[str, str], int]  # (pod set, node) -> pods


def pod_cost(problem: Problem, name: str, weights: dict[str, int]) -> float:
    """The cheapest per-pod linear objective cost (tier, VRAM) of any pod set here; for
    a one-pod gang also the GPUs its rack keeps free (domainFragmentation is then a
    cost of the node alone, so pruning and bounds see it exactly)."""
    node = problem.node(name)
    costs = [
        weights["tierMismatch"] * problem.class_cost(name) * ps.gpu_milli_per_pod / 1000
        + weights["vramStrandedGiB"] * ps.gpus * stranded_vram_gib(problem, ps, node)
        for ps in problem.gang.pod_sets
    ]
    rack_level = len(problem.levels) - 2
    rack = problem.paths[name][rack_level] if rack_level >= 0 else None
    if problem.gang.pod_count == 1 and weights["domainFragmentation"] and rack is not None:
        left = problem.domain_free_gpu_milli(rack_level)[rack]
        ps = problem.gang.pod_sets[0]
        left -= ps.gpu_milli_per_pod if ps.gpus else 0
        costs = [c + weights["domainFragmentation"] * left / 1000 for c in costs]
    return min(costs, default=0.0)


def pod_costs(problem: Problem, names: Iterable[str], weights: dict[str, int]) -> dict[str, float]:
    """`pod_cost` of each of `names`, computed once per distinct value of what it reads of a
    node: its hardware class and VRAM per GPU, and for a one-pod gang its rack (the GPUs the
    rack keeps free). Pruning costs every candidate of a gang, thousands at 5,000 nodes, of a
    few classes."""
    rack_level = len(problem.levels) - 2
    by_rack = problem.gang.pod_count == 1 and weights["domainFragmentation"] and rack_level >= 0
    nodes, node_class, paths = problem.snapshot.nodes, problem.node_class, problem.paths
    alike: dict[tuple[object, ...], float] = {}
    out: dict[str, float] = {}
    for name in names:
        key = (node_class[name], nodes[name].gpu_memory_mib,
               paths[name][rack_level] if by_rack else None)
        value = alike.get(key)
        if value is None:
            value = alike[key] = pod_cost(problem, name, weights)
        out[name] = value
    return out


def lower_bound(
    problem: Problem,
    members: Sequence[str],
    level: int,
    room: dict[str, int],
    pod_costs: dict[str, float],
    weights: dict[str, int],
    split_below: bool = False,
) -> float:
    """A valid lower bound of the objective for the gang placed inside `members` (one
    domain of `level`): the fewest nodes and sub-domains that can hold it, and its cheapest
    per-pod costs. `split_below`: only for the placements among them not inside one domain
    of the level below `level`: they use two domains at least of each level under `level`
    whose domain every member has (the nodes lacking a level's label count as one there)."""
    need = problem.gang.pod_count

    def fewest(rooms: Iterable[int]) -> int:
        total, count = 0, 0
        for r in sorted(rooms, reverse=True):
            if total >= need:
                break
            total += r
            count += 1
        return count

    rooms = list(map(room.__getitem__, members))
    bound = weights["nodesUsed"] * fewest(rooms)
    paths = problem.paths
    for below in range(level + 1, len(problem.levels) - 1):
        sub: dict[Domain | None, int] = defaultdict(int)
        for m, r in zip(members, rooms, strict=True):
            sub[paths[m][below]] += r
        least = fewest(sub.values())
        if split_below and None not in sub:
            least = max(least, 2)
        bound += level_weight(problem, below) * (
            weights["domainSpread"] * (least - 1) + weights["gangSplit"] * (least > 1)
        )
    filled, cost = 0, 0.0
    for m in sorted(members, key=pod_costs.__getitem__):
        take = min(room[m], need - filled)
        cost += take * pod_costs[m]
        filled += take
        if filled >= need:
            break
    return bound + cost


@dataclass(slots=True)
class _Costing:
    """What the bounds read of every node: pods it can hold (at most the gang) and its
    cheapest per-pod cost, with the term weights."""

    room: dict[str, int]
    pod_costs: dict[str, float]
    weights: dict[str, int]

    def bound(
        self, problem: Problem, members: Sequence[str], level: int, split_below: bool = False
    ) -> float:
        return lower_bound(problem, members, level, self.room, self.pod_costs, self.weights,
                           split_below)


@dataclass(slots=True)
class _Incumbent:
    """The best greedy fill among the probed domains, and every probed domain's fill value."""

    upper: dict[Domain, float]
    fill: Counts | None = None
    value: float = float("inf")
    domain: Domain | None = None


def prune_domains(problem: Problem, red: Reduction) -> Reduction:
    """Domain-first decomposition. At the lowest level where one domain holds the whole
    gang, bound every such domain from below, take the best greedy (Kueue-TAS-like)
    fill of the most promising ones as an upper bound, and keep the nodes of the
    domains whose lower bound does not exceed it, best first, within the node budget."""
    outside = problem.outside_gang_domain()
    if outside and len(outside) < len(problem.gang.pod_sets):
        return _prune_around(problem, red, outside)
    solver = problem.config.solver
    budget = max(solver.max_candidate_nodes, round(solver.kept_fraction * len(red.nodes)))
    weights = term_weights(problem)
    need = problem.gang.pod_count
    room: dict[str, int] = defaultdict(int)
    for (_, n), c in red.caps.items():
        room[n] = min(need, room[n] + c)
    costing = _Costing(room, pod_costs(problem, red.nodes, weights), weights)
    for level in _levels_to_try(problem):
        ranked = _rank_domains(problem, red, level, costing)
        if ranked:
            return _keep_best_domains(problem, red, level, ranked, budget, costing)
    # No domain holds the gang at any level: keep the cheapest nodes overall.
    order = sorted(red.nodes, key=lambda m: (costing.pod_costs[m], -room[m]))
    kept: list[str] = []
    filled = 0
    for m in order:
        if len(kept) >= budget and filled >= 2 * need:
            break
        kept.append(m)
        filled += room[m]
    return restrict(red, kept, f"pruned to the {len(kept)} cheapest nodes")


def _prune_around(problem: Problem, red: Reduction, outside: list[PodSet]) -> Reduction:
    """Pruning for a gang whose required level binds only some pod sets: the domains are
    pruned for those (as a gang of their own), and each pod set outside keeps its cheapest
    nodes with room for twice its pods (inside one domain of its own level, if it has
    one). A heuristic; the solver's hint is then the greedy fill of the kept nodes."""
    names = {p.name for p in outside}
    inner = tuple(p for p in problem.gang.pod_sets if p.name not in names)
    sub = replace(problem, gang=replace(problem.gang, pod_sets=inner))
    inner_caps = {k: c for k, c in red.caps.items() if k[0] not in names}
    inner_nodes = list(dict.fromkeys(n for _, n in inner_caps))
    kept = prune_domains(sub, Reduction(inner_nodes, inner_caps)).nodes
    taken = set(kept)
    weights = term_weights(problem)
    for ps in outside:
        own = [(n, c) for (p, n), c in red.caps.items() if p == ps.name]
        costs = pod_costs(problem, (n for n, _ in own), weights)
        own.sort(key=lambda nc: (costs[nc[0]], -nc[1]))
        level = problem.gang.level_of(ps)
        if level is not None:
            li = problem.level_index(level)
            room: dict[Domain | None, int] = defaultdict(int)
            for n, c in own:
                room[problem.paths[n][li]] += c
            first = next((problem.paths[n][li] for n, _ in own
                          if room[problem.paths[n][li]] >= ps.count), None)
            own = [(n, c) for n, c in own if problem.paths[n][li] == first]
        held = 0
        for n, c in own:
            if held >= 2 * ps.count:
                break
            held += c
            if n not in taken:
                kept.append(n)
                taken.add(n)
    note = (
        f"pruned to {len(kept)} nodes: the {problem.gang.required_level} domains for the pod "
        f"sets bound to it, the cheapest nodes for {', '.join(sorted(names))}"
    )
    return restrict(red, kept, note)


def _levels_to_try(problem: Problem) -> Iterable[int]:
    """The required level alone, else from the rack level (or the preferred level, if
    lower) upwards."""
    if problem.gang.required_level is not None:
        return [problem.levels.index(problem.gang.required_level)]
    start = len(problem.levels) - 2
    if problem.gang.preferred_level:
        start = min(start, problem.levels.index(problem.gang.preferred_level))
    return range(start, -1, -1)


def _rank_domains(
    problem: Problem, red: Reduction, level: int, costing: _Costing
) -> list[tuple[float, Domain, list[str]]]:
    """(lower bound, domain, nodes) of every domain of `level` that holds the gang."""
    domains: dict[Domain | None, list[str]] = defaultdict(list)
    for n in red.nodes:
        domains[problem.paths[n][level]].append(n)
    ranked: list[tuple[float, Domain, list[str]]] = []
    for domain, members in domains.items():
        if domain is None or not holds(problem, red.caps, members):
            continue
        ranked.append((costing.bound(problem, members, level), domain, members))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return ranked


def _probe_greedy(
    problem: Problem, red: Reduction, ranked: list[tuple[float, Domain, list[str]]]
) -> _Incumbent:
    """Greedy fills in lower-bound order until no remaining domain can beat the best one;
    many domains often share the lowest bound, and only their fills tell them apart (a cap
    keeps huge fleets fast)."""
    best = _Incumbent({})
    for probe, (bound, domain, members) in enumerate(ranked):
        if bound >= best.value or probe >= _GREEDY_PROBES:
            break
        found = greedy(problem, red, members)
        best.upper[domain] = found[0] if found else float("inf")
        if found and found[0] < best.value:
            best.value, best.fill, best.domain = found[0], found[1], domain
    return best


def _keep_best_domains(
    problem: Problem,
    red: Reduction,
    level: int,
    ranked: list[tuple[float, Domain, list[str]]],
    budget: int,
    costing: _Costing,
) -> Reduction:
    """The nodes of the domains of `level` that may beat the greedy incumbent, best first
    within the budget (and the densest racks when spreading may pay), with the hint."""
    best = _probe_greedy(problem, red, ranked)
    # The incumbent's domain first (so its fill stays a valid hint), then by lower
    # bound, among equal bounds the better greedy fill first.
    ranked.sort(key=lambda r: (r[1] != best.domain, r[0], best.upper.get(r[1], float("inf")), r[1]))
    # Spreading over several domains might beat every single domain: then the best
    # single domains get three quarters of the budget, the densest cheap racks the rest.
    spread = _may_spread(problem, red, level, best.value, costing)
    kept, complete = _take_domains(ranked, best, budget * 3 // 4 if spread else budget, costing)
    complete = complete and not spread
    if spread:
        taken = set(kept)
        dense = dense_racks(
            problem, red, costing.room, costing.pod_costs, level - 1, costing.weights
        )
        kept += [n for n in dense if n not in taken][: max(0, budget - len(kept))]
    note = (
        f"pruned to {len(kept)} nodes in the {problem.levels[level]} domains whose "
        f"lower bound beats the greedy placement"
    )
    # Exact when the gang must stay in one domain and every promising one was kept.
    reduced = restrict(red, kept, note, exact=problem.gang.required_level is not None and complete)
    reduced.hint = _hint_inside(problem, reduced, kept, best, spread)
    return reduced


def _may_spread(
    problem: Problem, red: Reduction, level: int, incumbent: float, costing: _Costing
) -> bool:
    """Whether a placement over several domains of `level` might beat `incumbent` (the
    greedy fill): not when the gang must stay in one, nor when the lower bound of such
    placements (two domains of `level` at least, so two of each level below) does not."""
    if problem.gang.required_level is not None:
        return False
    return costing.bound(problem, red.nodes, level - 1, split_below=True) < incumbent


def _take_domains(
    ranked: list[tuple[float, Domain, list[str]]], best: _Incumbent, limit: int, costing: _Costing
) -> tuple[list[str], bool]:
    """The nodes of the ranked domains whose bound does not exceed the incumbent, within
    `limit` nodes (the first domain cut to its cheapest nodes if it alone is over), and
    whether every such domain was kept whole."""
    # the incumbent's nodes always stay (the solver starts from that fill)
    kept = list(dict.fromkeys(n for _, n in best.fill)) if best.fill else []
    complete = True
    first = True
    for bound, _, members in ranked:
        if bound > best.value:
            break  # no placement inside this domain can beat the greedy one
        taken = set(kept)
        members = [m for m in members if m not in taken]
        if len(kept) + len(members) > limit:
            complete = False
            if not first:
                break
            members = sorted(members, key=lambda m: (costing.pod_costs[m], -costing.room[m]))
            members = members[: max(0, limit - len(kept))]
        kept.extend(members)
        first = False
    return kept, complete


def _hint_inside(
    problem: Problem, reduced: Reduction, kept: list[str], best: _Incumbent, spread: bool
) -> Counts | None:
    """The cheapest greedy fill that lies inside the kept nodes (the solver's hint)."""
    fills = [(best.value, best.fill)] if best.fill is not None else []
    if spread:  # several domains may win: also try a greedy fill across them
        across = greedy(problem, reduced, kept)
        if across is not None:
            fills.append(across)
    kept_set = set(kept)
    inside = [f for f in fills if {n for _, n in f[1]} <= kept_set]
    return min(inside, key=lambda f: f[0])[1] if inside else None


def dense_racks(
    problem: Problem,
    red: Reduction,
    room: dict[str, int],
    pod_costs: dict[str, float],
    parent_level: int,
    weights: dict[str, int],
) -> list[str]:
    """Nodes of the lowest-level domains (racks) that hold the most pods at the lowest
    per-pod cost, best first.

    A gang spread over racks of one parent domain (e.g. a zone) spans fewer higher-level
    domains, so the racks of the parents come first. Each parent is ranked by the lowest
    bound of its covers of the gang: its densest racks first, or only the racks of one
    or two of its roomiest child domains (blocks), densest first. The densest racks
    overall follow."""
    rack_level = len(problem.levels) - 2
    racks: dict[Domain | None, list[str]] = defaultdict(list)
    for n in red.nodes:
        racks[problem.paths[n][rack_level] if rack_level >= 0 else None].append(n)

    def density(members: list[str]) -> tuple[float, int]:
        total = sum(room[m] for m in members)
        per_pod = sum(pod_costs[m] * room[m] for m in members) / max(total, 1)
        return (round(per_pod, 3), -total)

    ordered = sorted(racks.values(), key=density)
    if not 0 <= parent_level < rack_level:
        return [n for members in ordered for n in members]
    by_parent: dict[Domain | None, list[list[str]]] = defaultdict(list)
    for members in ordered:
        by_parent[problem.paths[members[0]][parent_level]].append(members)
    if len(by_parent) < 2:
        return [n for members in ordered for n in members]  # nothing to rank
    costing = _Costing(room, pod_costs, weights)
    parents = _rank_parents(problem, red, by_parent, parent_level, costing)
    out: list[str] = []
    seen: set[str] = set()
    for members in [ms for parent in parents for ms in by_parent[parent]] + ordered:
        if members[0] not in seen:
            out.extend(members)
            seen.update(members)
    return out


def _rank_parents(
    problem: Problem,
    red: Reduction,
    by_parent: dict[Domain | None, list[list[str]]],
    parent_level: int,
    costing: _Costing,
) -> list[Domain]:
    """The parent domains, best cover of the gang first (see `dense_racks`)."""
    need = problem.gang.pod_count
    room = costing.room
    child = parent_level + 1
    # each rack's room and pods per pod set, by its first node (summed for every cover)
    racks = [ms for group in by_parent.values() for ms in group]
    totals = {ms[0]: sum(room[m] for m in ms) for ms in racks}
    sets = [(ps.name, ps.count) for ps in problem.gang.pod_sets]
    caps = {ms[0]: [sum(red.caps.get((p, m), 0) for m in ms) for p, _ in sets] for ms in racks}
    ranked: list[tuple[float, int, Domain]] = []  # (cover bound, first seen, parent)
    for i, (parent, group) in enumerate(by_parent.items()):
        if parent is None:
            continue
        children: dict[Domain | None, list[list[str]]] = defaultdict(list)
        for members in group:  # densest racks first within each child
            children[problem.paths[members[0]][child]].append(members)
        roomiest = sorted(
            children, key=lambda c: -sum(totals[ms[0]] for ms in children[c])
        )[:_COVER_CHILDREN]
        child_of = [problem.paths[ms[0]][child] for ms in group]
        orders = [group] + [
            [ms for ms, c in zip(group, child_of, strict=True) if c in pick]
            for k in (1, 2)
            for pick in combinations(roomiest, k)
        ]
        # several orders often take the same racks: a cover is bounded once (an equal
        # entry again would not move the parent's place)
        covers: set[tuple[str, ...]] = set()
        for racks_order in orders:
            cover: list[list[str]] = []
            covered = 0
            for members in racks_order:
                if covered >= need:
                    break
                cover.append(members)
                covered += totals[members[0]]
            key = tuple(members[0] for members in cover)
            if key in covers:
                continue
            covers.add(key)
            if all(sum(caps[r][j] for r in key) >= count for j, (_, count) in enumerate(sets)):
                nodes = [m for members in cover for m in members]  # `holds`, rack by rack
                ranked.append((costing.bound(problem, nodes, parent_level), i, parent))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return list(dict.fromkeys(parent for _, _, parent in ranked))


def greedy(
    problem: Problem, red: Reduction, members: Sequence[str]
) -> tuple[float, Counts] | None:
    """The best of Kueue-TAS-style greedy fills restricted to the nodes whose per-pod
    cost is at most each distinct cost level (so cheap hardware is used first):
    (objective, counts), or None when no fill succeeds."""
    cost = pod_costs(problem, members, term_weights(problem))
    best: tuple[float, Counts] | None = None
    for level in sorted(set(cost.values())):
        subset = [m for m in members if cost[m] <= level]
        if not holds(problem, red.caps, subset):
            continue
        counts = greedy_counts(problem, red, subset)
        if counts is None:
            continue
        slots = slots_for(problem, counts)
        if isinstance(slots, str):
            continue
        value = weighted_objective(problem, evaluate_terms(problem, slots))
        if best is None or value < best[0]:
            best = (value, counts)
        if best is not None or len(subset) == len(members):
            break  # the cheapest hardware that holds the gang is what the greedy is for
    return best


def greedy_counts(problem: Problem, red: Reduction, nodes: Sequence[str]) -> Counts | None:
    """Kueue-TAS-style greedy pods per node inside `nodes`, or None if it fails."""
    scratch = ClusterSnapshot({n: problem.node(n).copy() for n in nodes})
    sub = Problem(
        scratch,
        problem.gang,
        problem.config,
        problem.levels,
        problem.paths,
        problem.node_class,
        {p: [n for n in nodes if (p, n) in red.caps] for p in problem.candidates},
    )
    out: Counts = {}
    for ps in problem.gang.pod_sets:
        counts = tas_counts(sub, ps, scratch)
        if counts is None:
            return None
        one = Gang(problem.gang.name, (ps,))
        for n, c in counts.items():
            for i in range(c):
                fit = fit_pod(scratch.nodes[n], ps, problem.gang.numa_policy)
                if fit is None:
                    return None
                apply_slots(scratch, one, [Slot(ps.name, i, n, fit.gpu_indices, fit.numa_zone)])
            out[(ps.name, n)] = c
    return out
