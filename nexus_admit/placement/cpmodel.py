"""The CP-SAT model of one gang over the reduced nodes.

Variables are aggregated: pods per (pod set, unit) integers, nodes used per unit, a GPU-used
boolean per unit, one boolean per topology domain and level, and per-island "filled"
variables. A unit is one node, or several interchangeable nodes (twins) merged with a
multiplicity (`units`). The objective is the weighted sum of the terms in `objective.py`
plus fragGradient and fillOrder (order_terms.py), each scaled by SCALE to integer
coefficients. domainSpread is encoded as domains used rather than extra domains; that
constant is kept out of the model (`GangModel.offset`, see `_add_level`).

The order in which variables and constraints are added is part of the engine's tuning
(CP-SAT's search depends on it): keep it when editing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise

from ortools.sat.python import cp_model

from nexus_admit.model import (
    GPU_WHOLE,
    Domain,
    Node,
    NumaPolicy,
    PodSet,
    SpreadRule,
    pod_capacity,
)
from nexus_admit.placement.objective import (
    level_weight,
    numa_alignable,
    stranded_vram_gib,
    term_weights,
)
from nexus_admit.placement.order_terms import SCALE, OrderTerms
from nexus_admit.placement.problem import Problem
from nexus_admit.placement.pruning import greedy
from nexus_admit.placement.reduction import Reduction
from nexus_admit.placement.spread import (
    domain_of,
    eligible_domains,
    sibling_counts,
    spread_level_weights,
)

__all__ = ["GangModel", "build_model", "units"]

Entries = list[tuple[PodSet, cp_model.IntVar]]  # a unit's pods-per-pod-set variables


def units(problem: Problem, red: Reduction) -> dict[str, list[str]]:
    """Model units: interchangeable nodes (twins) become one unit with a multiplicity
    when the gang is one GPU pod set that packs; otherwise every node is its own unit."""
    gang = problem.gang
    single = len(gang.pod_sets) == 1 and gang.pod_sets[0].gpus > 0
    on_one_host = gang.required_level == problem.levels[-1]
    # spread rules and siblings count pods per node: every node its own unit
    per_node = bool(gang.spread_rules or gang.siblings)
    if not (single and gang.workload_type.packs) or on_one_host or per_node:
        return {n: [n] for n in red.nodes}
    groups: dict[str, list[str]] = {n: [n] for n in red.nodes}
    for twins in red.twins:
        for n in twins[1:]:
            del groups[n]
        groups[twins[0]] = list(twins)
    return groups


@dataclass(slots=True)
class GangModel:
    """The model and the variables the solve loop and realisation read back."""

    problem: Problem
    red: Reduction
    units: dict[str, list[str]]  # representative node -> its member nodes
    weights: dict[str, int]
    model: cp_model.CpModel = field(default_factory=cp_model.CpModel)
    # pods[(pod set, unit)]: pods of the set on the unit's nodes; used[unit]: nodes used
    pods: dict[tuple[str, str], cp_model.IntVar] = field(default_factory=dict)
    by_unit: dict[str, Entries] = field(default_factory=lambda: defaultdict(list))
    used: dict[str, cp_model.IntVar] = field(default_factory=dict)
    gpu_used: dict[str, cp_model.IntVar] = field(default_factory=dict)
    filled: dict[str, cp_model.IntVar] = field(default_factory=dict)
    objective: list[cp_model.LinearExprT] = field(default_factory=list)
    # per unit, the model's NUMA-unaligned counts (each pod set against the zones alone,
    # plus what realisation cuts charged)
    unaligned: dict[str, list[cp_model.LinearExprT]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # the domainSpread constant left out of the objective (subtracted when reported)
    offset: int = 0

    def minimize(self) -> None:
        self.model.minimize(sum(self.objective))


def build_model(
    problem: Problem,
    red: Reduction,
    terms: OrderTerms,
) -> GangModel:
    """The whole model of the gang over `red`'s nodes, objective set."""
    gm = GangModel(problem, red, units(problem, red), term_weights(problem))
    _add_pod_counts(gm)
    strict = problem.gang.numa_policy is NumaPolicy.SINGLE_NUMA_NODE
    for rep, entries in gm.by_unit.items():
        _add_unit(gm, rep, entries, strict, terms)
    _add_clique_terms(gm)
    _add_domain_terms(gm)
    _add_gang_terms(gm)
    _add_pod_set_domains(gm)
    _add_spread(gm)
    gm.minimize()
    return gm


def _add_pod_counts(gm: GangModel) -> None:
    """Pods of each pod set per unit, up to the unit's caps; each set placed whole."""
    model, caps = gm.model, gm.red.caps
    for ps in gm.problem.gang.pod_sets:
        for rep, members in gm.units.items():
            cap = caps.get((ps.name, rep), 0)
            if cap:
                var = model.new_int_var(0, min(ps.count, cap * len(members)), f"x[{ps.name},{rep}]")
                gm.pods[(ps.name, rep)] = var
                gm.by_unit[rep].append((ps, var))
        model.add(sum(v for (p, _), v in gm.pods.items() if p == ps.name) == ps.count)


def _add_unit(
    gm: GangModel, rep: str, entries: Entries, strict: bool, terms: OrderTerms
) -> None:
    """A unit's nodes used, its capacity, NUMA alignment, order terms and GPU terms."""
    model, caps, problem = gm.model, gm.red.caps, gm.problem
    node = problem.node(rep)
    nodes_used = model.new_int_var(0, len(gm.units[rep]), f"used[{rep}]")
    gm.used[rep] = nodes_used
    for ps, pods in entries:
        model.add(pods <= caps[(ps.name, rep)] * nodes_used)
    model.add(sum(v for _, v in entries) >= nodes_used)  # a used node holds at least one pod
    _add_node_capacity(model, node, entries, strict, caps)
    numa_weight = gm.weights["numaUnaligned"]
    for ps, pods in entries:
        if numa_weight and not strict and numa_alignable(node, ps):
            aligned = pod_capacity(node, ps, NumaPolicy.SINGLE_NUMA_NODE)
            if aligned < caps[(ps.name, rep)]:
                unaligned = model.new_int_var(0, ps.count, f"unaligned[{ps.name},{rep}]")
                model.add(unaligned >= pods - aligned * nodes_used)
                gm.objective.append(numa_weight * SCALE * unaligned)
                gm.unaligned[rep].append(unaligned)
    gm.objective.extend(
        terms.model_terms(problem, rep, entries, nodes_used, model, gm.units[rep])
    )
    gpu_entries = [(ps, v) for ps, v in entries if ps.gpus]
    if gpu_entries:
        _add_gpu_terms(gm, rep, node, nodes_used, entries, gpu_entries)


def _add_gpu_terms(
    gm: GangModel,
    rep: str,
    node: Node,
    nodes_used: cp_model.IntVar,
    entries: Entries,
    gpu_entries: Entries,
) -> None:
    """GPU used, tier mismatch, stranded VRAM, GPU fragmentation and islands broken."""
    model, caps, weights = gm.model, gm.red.caps, gm.weights
    frag_weight = weights["fragmentation"]
    if len(gpu_entries) == len(entries):
        gpu_used = nodes_used
    else:
        gpu_used = model.new_bool_var(f"gpu_used[{rep}]")
        for ps, pods in gpu_entries:
            model.add(pods <= caps[(ps.name, rep)] * gpu_used)
        model.add(gpu_used <= nodes_used)
    gm.gpu_used[rep] = gpu_used
    milli = sum(ps.gpu_milli_per_pod * v for ps, v in gpu_entries)
    model.add(milli >= gpu_used)
    cost = gm.problem.class_cost(rep)
    for ps, pods in gpu_entries:
        coef = weights["tierMismatch"] * cost * ps.gpu_milli_per_pod  # × SCALE / 1000
        coef += round(
            weights["vramStrandedGiB"] * ps.gpus * stranded_vram_gib(gm.problem, ps, node) * SCALE
        )
        coef -= frag_weight * ps.gpu_milli_per_pod  # idle share left = free·g − used
        if coef:
            gm.objective.append(coef * pods)
    if frag_weight:
        gm.objective.append(frag_weight * node.free_gpu_milli * gpu_used)
    _add_island_terms(gm, rep, node, gpu_used, milli, gpu_entries)


def _add_island_terms(
    gm: GangModel,
    rep: str,
    node: Node,
    gpu_used: cp_model.IntVar,
    milli: cp_model.LinearExprT,
    gpu_entries: Entries,
) -> None:
    """Filled nodes of pristine islands and cliques; an island node used but not filled
    is broken."""
    problem, model = gm.problem, gm.model
    pristine_island = problem.is_island(node) and node.is_pristine()
    if not (pristine_island or node.clique in problem.pristine_cliques):
        return
    unit_size = len(gm.units[rep])
    filled = model.new_int_var(0, unit_size, f"filled[{rep}]")
    gm.filled[rep] = filled
    model.add(filled <= gpu_used)
    if unit_size == 1:
        model.add(milli >= node.free_gpu_milli * filled)
    else:  # one GPU pod set: a filled node holds `full` pods, the others ≥ 1
        ps, pods = gpu_entries[0]
        full = -(-node.free_gpu_milli // ps.gpu_milli_per_pod)
        model.add(full * filled + (gpu_used - filled) <= pods)
    island_weight = gm.weights["islandsBroken"]
    if pristine_island and island_weight:
        broken = model.new_int_var(0, unit_size, f"broken[{rep}]")
        model.add(broken >= gpu_used - filled)
        gm.objective.append(island_weight * SCALE * broken)


def _add_clique_terms(gm: GangModel) -> None:
    """A pristine clique is broken when a member is used and not every member filled."""
    model, island_weight = gm.model, gm.weights["islandsBroken"]
    for clique, members in gm.problem.pristine_cliques.items():
        in_model = [n for n in members if n in gm.gpu_used]
        if not in_model or not island_weight:
            continue
        all_filled = model.new_bool_var(f"clique_filled[{clique}]")
        if len(in_model) < len(members):
            model.add(all_filled == 0)
        for n in in_model:
            model.add(all_filled <= gm.filled[n])
        clique_broken = model.new_bool_var(f"clique_broken[{clique}]")
        for n in in_model:
            model.add(clique_broken >= gm.gpu_used[n] - all_filled)
        gm.objective.append(island_weight * SCALE * clique_broken)


def _add_domain_terms(gm: GangModel) -> None:
    """Per topology level above the host: the domains used, for domainSpread, gangSplit,
    a required level binding the whole gang and domainFragmentation (rack level only)."""
    problem, weights = gm.problem, gm.weights
    host = len(problem.levels) - 1
    for level in range(host):
        best_fit = bool(weights["domainFragmentation"]) and level == host - 1
        required = problem.binds_whole_gang(level)
        if not (weights["domainSpread"] or weights["gangSplit"]) and not required and not best_fit:
            continue
        _add_level(gm, level, required, best_fit)


def _add_level(gm: GangModel, level: int, required: bool, best_fit: bool) -> None:
    problem, model, weights = gm.problem, gm.model, gm.weights
    gang_pods = problem.gang.pod_count
    domains: dict[Domain | None, list[str]] = defaultdict(list)
    for rep in gm.used:
        domains[problem.paths[rep][level]].append(rep)
    domain_vars, rooms = [], []
    for domain, reps in domains.items():
        in_domain = model.new_bool_var(f"domain[{level},{domain}]")
        for rep in reps:
            model.add(gm.used[rep] <= len(gm.units[rep]) * in_domain)
        # aggregate form: tightens the LP bound on how many domains are needed
        pods = [v for rep in reps for _, v in gm.by_unit[rep]]
        room = min(
            gang_pods,
            sum(
                gm.red.caps[(ps.name, rep)] * len(gm.units[rep])
                for rep in reps
                for ps, _ in gm.by_unit[rep]
            ),
        )
        model.add(sum(pods) <= room * in_domain)
        domain_vars.append(in_domain)
        rooms.append(room)
    # the domains chosen must have room for the whole gang (a covering cut)
    model.add(sum(r * dv for r, dv in zip(rooms, domain_vars, strict=True)) >= gang_pods)
    if required:
        model.add(sum(domain_vars) == 1)
    scaled = SCALE * level_weight(problem, level)
    if weights["domainSpread"]:
        # domainSpread is (domains used - 1) × level weight; the model counts domains used
        # (every level has at least one). The constant stays out of the model: CP-SAT's
        # relative gap is taken against the objective including any offset, so adding it
        # would change when gap-limited solves stop, hence placements. It is subtracted
        # from the objective reported instead.
        gm.objective.append(weights["domainSpread"] * scaled * sum(domain_vars))
        gm.offset += weights["domainSpread"] * scaled
    if weights["gangSplit"] and len(domain_vars) > 1:
        split = model.new_bool_var(f"split[{level}]")
        model.add(sum(domain_vars) <= 1 + (len(domain_vars) - 1) * split)
        gm.objective.append(weights["gangSplit"] * scaled * split)
    if best_fit:  # GPUs left free in the touched racks: SCALE = milli per GPU
        _add_rack_fit(gm, level, list(zip(domains, domain_vars, strict=True)))


def _add_rack_fit(
    gm: GangModel, level: int, domain_vars: list[tuple[Domain | None, cp_model.IntVar]]
) -> None:
    """domainFragmentation: the GPUs the touched racks keep free after the gang."""
    dom_weight = gm.weights["domainFragmentation"]
    free = gm.problem.domain_free_gpu_milli(level)
    for domain, in_domain in domain_vars:
        if domain is not None:
            gm.objective.append(dom_weight * free[domain] * in_domain)
    for rep, entries in gm.by_unit.items():
        if gm.problem.paths[rep][level] is not None:
            gm.objective.extend(
                -dom_weight * ps.gpu_milli_per_pod * v for ps, v in entries if ps.gpus
            )


def _add_gang_terms(gm: GangModel) -> None:
    """A required host, nodesUsed, maxPodsPerNode and the fill order of twins."""
    problem, model, weights = gm.problem, gm.model, gm.weights
    if problem.binds_whole_gang(len(problem.levels) - 1):
        model.add(sum(gm.used.values()) == 1)  # required hostname: the whole gang on one node
    if weights["nodesUsed"]:
        gm.objective.append(weights["nodesUsed"] * SCALE * sum(gm.used.values()))
    if weights["maxPodsPerNode"]:  # spread types: units are single nodes (see `units`)
        peak = model.new_int_var(0, problem.gang.pod_count, "max_pods_per_node")
        for entries in gm.by_unit.values():
            model.add(peak >= sum(v for _, v in entries))
        gm.objective.append(weights["maxPodsPerNode"] * SCALE * peak)
    for twins in gm.red.twins:  # interchangeable single-node units: fill in a fixed order
        if len(gm.units.get(twins[0], ())) > 1:
            continue
        for first, second in pairwise(twins):
            model.add(
                sum(v for _, v in gm.by_unit[first]) >= sum(v for _, v in gm.by_unit[second])
            )


def _add_pod_set_domains(gm: GangModel) -> None:
    """Required levels that bind only some pod sets (a GPU-less driver is left out of the
    workers' rack; a pod set with a level of its own): those pod sets' pods inside one
    domain of the level, the others free. (Gangs whose required level binds every pod set
    take `_add_level`'s / `_add_gang_terms`' form and never reach here.)"""
    problem, model = gm.problem, gm.model
    for level, names in problem.partial_domains():
        in_domain: dict[Domain | None, cp_model.IntVar] = {}
        for (pod_set, rep), pods in gm.pods.items():
            if pod_set not in names:
                continue
            domain = problem.paths[rep][level]
            chosen = in_domain.get(domain)
            if chosen is None:
                chosen = model.new_bool_var(f"pod_set_domain[{level},{domain}]")
                in_domain[domain] = chosen
            model.add(pods == 0).only_enforce_if(~chosen)
        model.add_exactly_one(in_domain.values())


def _domain_loads(gm: GangModel, level: int) -> dict[Domain, tuple[cp_model.LinearExpr, int]]:
    """Per domain of one level: the gang's pods in it, and the most it can hold."""
    problem = gm.problem
    exprs: dict[Domain, list[cp_model.IntVar]] = defaultdict(list)
    most: dict[Domain, int] = defaultdict(int)
    for rep, entries in gm.by_unit.items():
        domain = domain_of(problem, rep, level)
        if domain is None:
            continue
        exprs[domain].extend(v for _, v in entries)
        most[domain] += sum(gm.red.caps[(ps.name, rep)] for ps, _ in entries) * len(gm.units[rep])
    pods = problem.gang.pod_count
    return {d: (cp_model.LinearExpr.sum(vs), min(pods, most[d])) for d, vs in exprs.items()}


def _add_spread(gm: GangModel) -> None:
    """spreadPairs (pairs of the service's pods sharing a domain, siblings included; the
    convex x(x-1)/2 by its tangent lines) and the gang's hard spread rules."""
    problem, model = gm.problem, gm.model
    weight = gm.weights["spreadPairs"]
    host = len(problem.levels) - 1
    for level, per_pair in spread_level_weights(problem) if weight else []:
        siblings = sibling_counts(problem, level)
        coef = weight * per_pair * SCALE
        for domain, (load, most) in _domain_loads(gm, level).items():
            if siblings.get(domain, 0):
                gm.objective.append(coef * siblings[domain] * load)
            if most > 1:
                pairs = model.new_int_var(0, most * (most - 1) // 2, f"pairs[{level},{domain}]")
                node = gm.used[domain[-1]] if level == host else None
                for k in range(1, most):
                    if node is None:
                        model.add(pairs >= k * load - k * (k + 1) // 2)
                    else:  # on a node, the tangents scaled by its use (0 or 1: spreading
                        # units are single nodes): ties pairs to nodes used in the LP
                        model.add(pairs >= k * load - k * (k + 1) // 2 * node)
                gm.objective.append(coef * pairs)
    for rule in problem.gang.spread_rules:
        _add_rule(gm, rule)


def _add_rule(gm: GangModel, rule: SpreadRule) -> None:
    """Where the gang puts pods, at most `max_per_domain` of the service per domain, and
    each such domain within `max_skew` of the least-loaded eligible domain (siblings
    counted; a domain the gang does not use is never its to fix)."""
    problem, model = gm.problem, gm.model
    level = problem.levels.index(rule.level)
    siblings = sibling_counts(problem, level)
    loads = _domain_loads(gm, level)
    if rule.max_per_domain is not None:
        for domain, (load, _) in loads.items():
            model.add(load <= max(0, rule.max_per_domain - siblings.get(domain, 0)))
    if rule.max_skew is None:
        return
    eligible = eligible_domains(problem, level)
    low = model.new_int_var(0, problem.gang.pod_count + sum(siblings.values()), "low")
    fixed = [siblings.get(d, 0) for d in eligible if d not in loads]  # no pod can go there
    if fixed:
        model.add(low <= min(fixed))
    for domain, (load, most) in loads.items():
        count = siblings.get(domain, 0) + load
        model.add(low <= count)
        used = model.new_bool_var(f"spread_used[{level},{domain}]")
        model.add(load <= most * used)
        model.add(count - low <= rule.max_skew).only_enforce_if(used)


def _add_node_capacity(
    model: cp_model.CpModel,
    node: Node,
    entries: Entries,
    strict: bool,
    caps: dict[tuple[str, str], int],
) -> None:
    """Shared-node capacity; a single pod set is already bounded exactly by its cap."""
    if len(entries) < 2:
        return
    model.add(sum(ps.cpu_milli * v for ps, v in entries) <= node.free_cpu_milli)
    model.add(sum(ps.memory_mib * v for ps, v in entries) <= node.free_memory_mib)
    model.add(sum(v for _, v in entries) <= node.free_pods)
    model.add(sum(ps.gpu_milli_per_pod * v for ps, v in entries) <= node.free_gpu_milli)
    # Shared-GPU pods go onto partly used GPUs, or onto whole free GPUs they "open",
    # which whole-GPU pods then cannot take. (Mixed shares on one GPU may not pack as
    # the sums promise; the slot builder then cuts that combination and re-solves.)
    shared = [(ps, v) for ps, v in entries if ps.fractional]
    opened = model.new_int_var(0, node.free_whole_gpus if shared else 0, f"open[{node.name}]")
    if shared:
        partial_free = sum(f for f in node.gpu_free if f < GPU_WHOLE)
        model.add(sum(ps.gpu_milli * v for ps, v in shared) <= partial_free + GPU_WHOLE * opened)
        for ps, v in shared:
            partial = sum(f // ps.gpu_milli for f in node.gpu_free if f < GPU_WHOLE)
            model.add(v <= partial + (GPU_WHOLE // ps.gpu_milli) * opened)
    model.add(sum(ps.whole_gpus * v for ps, v in entries) + opened <= node.free_whole_gpus)
    if strict and node.numa_zones:
        _add_zone_capacity(model, node, entries, caps)


def _add_zone_capacity(
    model: cp_model.CpModel, node: Node, entries: Entries, caps: dict[tuple[str, str], int]
) -> None:
    """single-numa-node: each pod set's pods split over the zones, each zone's GPUs and
    CPUs shared by the pod sets."""
    zone_vars: dict[int, Entries] = defaultdict(list)
    for ps, v in entries:
        parts = []
        for zone in node.numa_zones:
            part = model.new_int_var(0, caps[(ps.name, node.name)], f"{v.name}@{zone.id}")
            zone_vars[zone.id].append((ps, part))
            parts.append(part)
        model.add(sum(parts) == v)
    for zone in node.numa_zones:
        free = sum(1 for i in zone.gpu_indices if node.gpu_free[i] == GPU_WHOLE)
        in_zone = zone_vars[zone.id]
        model.add(sum(ps.whole_gpus * part for ps, part in in_zone) <= free)
        model.add(sum(ps.cpu_milli * part for ps, part in in_zone) <= zone.free_cpu_milli)


def add_hint(gm: GangModel) -> None:
    """Seed the search with the greedy counts inside the reduced node set."""
    fill = gm.red.hint
    if fill is None:
        found = greedy(gm.problem, gm.red, gm.red.nodes)
        if found is None:
            return
        fill = found[1]
    unit_of = {n: rep for rep, members in gm.units.items() for n in members}
    pods: dict[tuple[str, str], int] = defaultdict(int)
    nodes_used: dict[str, set[str]] = defaultdict(set)
    for (pod_set, n), count in fill.items():
        pods[(pod_set, unit_of[n])] += count
        nodes_used[unit_of[n]].add(n)
    for key, var in gm.pods.items():
        gm.model.add_hint(var, pods.get(key, 0))
    for rep, var in gm.used.items():
        gm.model.add_hint(var, len(nodes_used.get(rep, ())))
