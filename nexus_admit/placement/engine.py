"""The nexus placement engine: the whole gang as one CP-SAT problem.

Variables are aggregated: pods per (pod set, node) integers, a used / GPU-used boolean per
node, one boolean per topology domain and level, and per-island "filled" booleans. The
objective is the weighted sum of the terms in `objective.py` plus fragGradient and fillOrder,
each scaled by SCALE to integer coefficients. domainSpread is encoded as domains used rather
than extra domains; that constant is kept out of the model (see `_solve`) and taken off
the objective the placement reports as `model_objective`, so that equals the weighted terms
of the returned slots (up to the per-coefficient rounding of the real-valued terms:
stranded VRAM, fragGradient, fillOrder) whenever the status is `optimal`. Nodes merged
into one unit (twins) are charged fillOrder at the first twin's rank.

Large clusters are reduced before the solve, in two steps:
1. symmetry: nodes that are interchangeable for this gang (same domains above the host,
   hardware, free vector, NUMA state, clique, eligibility) are kept only as many times as
   the gang could use them. This is exact.
2. domain-first pruning (only when still above `solver.maxCandidateNodes`; it keeps that
   many nodes or `solver.keptFraction` of them): the best few domains at the lowest level
   where one domain holds the gang, ranked by a greedy cost estimate, plus the densest
   racks of the best parent domains when spreading over several may pay. This is a
   heuristic; placements found after it report `feasible`, not `optimal`.

A one-pod gang needs no model (`_scan_single`): after the symmetry reduction every node left
is costed, cheapest lower bound first, until no bound can beat the best (exact).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations, pairwise, permutations

from ortools.sat.python import cp_model

from nexus_admit.model import (
    GPU_WHOLE,
    ClusterSnapshot,
    Domain,
    Gang,
    Node,
    NumaPolicy,
    Placement,
    PlacementConfig,
    PodSet,
    Slot,
    SolveStatus,
    apply_slots,
    fit_pod,
    pod_capacity,
)
from nexus_admit.placement.baselines.podbypod import finish, infeasible
from nexus_admit.placement.baselines.tas import tas_counts
from nexus_admit.placement.fragmentation import WorkloadDistribution, fill_rank, gradient_table
from nexus_admit.placement.memo import NodeMemo, pod_shape
from nexus_admit.placement.objective import (
    evaluate_terms,
    level_weight,
    numa_alignable,
    stranded_vram_gib,
    term_weights,
    weighted_objective,
)
from nexus_admit.placement.problem import Problem, prepare

__all__ = ["CpSatEngine", "Reduction"]

SCALE = 1000  # every term is multiplied by this to make coefficients integers
_MAX_REALISATION_CUTS = 5
_MAX_PERMUTED_POD_SETS = 4  # beyond this, only the hardest-first order is tried
_GREEDY_PROBES = 16  # domains given a greedy fill while pruning
_COVER_CHILDREN = 6  # roomiest child domains (blocks) whose singles and pairs cover a parent


@dataclass(slots=True)
class Reduction:
    """Which nodes enter the model and whether the reduction kept optimality."""

    nodes: list[str]
    caps: dict[tuple[str, str], int]  # (pod set, node) -> max pods
    exact: bool = True
    notes: list[str] = field(default_factory=list)
    # groups of interchangeable nodes: the model orders their loads to break symmetry
    twins: list[list[str]] = field(default_factory=list)
    # a greedy placement inside the kept nodes, found while pruning (the solver's hint)
    hint: dict[tuple[str, str], int] | None = None


class CpSatEngine:
    """`place()` is the one placement code path of the controller, CLI, simulator and bench.

    `reduce=False` solves the full candidate set (the benchmarks' long-run reference)."""

    name = "nexus"

    def __init__(
        self,
        seed: int = 0,
        *,
        reduce: bool = True,
        time_limit: float | None = None,
        workload: WorkloadDistribution | None = None,
    ):
        self._seed = seed
        self._reduce = reduce
        self._time_limit = time_limit
        # target workload for the fragmentation-gradient term (weights.fragGradient)
        self.workload = workload or WorkloadDistribution.default()
        self._rank: tuple[tuple[int, int], dict[str, float]] | None = None
        # node views and pod capacities, kept between solves on a TrackedSnapshot
        self._memo = NodeMemo()

    def set_workload(self, dist: WorkloadDistribution) -> None:
        self.workload = dist

    # ------------------------------------------------------------------ public
    def place(self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig) -> Placement:
        started = time.perf_counter()
        self._memo.sync(snapshot, config)
        try:
            problem = prepare(snapshot, gang, config)
        except ValueError as err:
            return infeasible(gang, self.name, str(err), started, impossible=True)
        wait = config.locality_wait
        level = self._locality_hold(problem)
        if wait is None or level is None:
            placement = self._place(problem, started)
            if wait is not None and wait.level not in problem.levels[:-1]:
                # a Kueue Topology (topologyName) is resolved only now: say why no hold
                placement.explanation.append(
                    f"localityWait.level {wait.level!r} is not a topology level above the host "
                    f"{list(problem.levels[:-1])}; localityWait is ignored"
                )
            return placement
        held = prepare(snapshot, replace(gang, required_level=level), config)
        inside = self._place(held, started)
        waited = f"waited {gang.waited_seconds:.0f} of {wait.max_wait_seconds:.0f} s"
        if inside.feasible:
            inside.explanation.insert(1, f"kept inside one {level} domain (localityWait, {waited})")
            return inside
        held_back = infeasible(
            gang,
            self.name,
            f"held for locality: no {level} domain has room for the whole gang now; "
            f"localityWait keeps it waiting rather than split it ({waited})",
            started,
        )
        held_back.retry_after_seconds = wait.max_wait_seconds - gang.waited_seconds
        return held_back

    def _locality_hold(self, problem: Problem) -> str | None:
        """The level to keep this gang inside one domain of, if PlacementConfig.localityWait
        holds it back: a packing (or preferred-level) gang of several pods that has waited less
        than the limit, with no required level at or below the wait's, and some domain of the
        level that could hold it were its nodes idle (else waiting cannot help)."""
        wait, gang = problem.config.locality_wait, problem.gang
        if wait is None or gang.waited_seconds >= wait.max_wait_seconds or gang.pod_count < 2:
            return None
        if problem.impossible:
            return None  # _place reports why
        if not (gang.workload_type.packs or gang.preferred_level):
            return None
        if wait.level not in problem.levels[:-1]:
            return None  # a Kueue Topology without that level
        index = problem.level_index(wait.level)
        if gang.required_level is not None and problem.level_index(gang.required_level) >= index:
            return None  # already inside one domain of that level or a smaller one
        if max(problem.idle_room(index).values(), default=0) < 1:
            return None
        return wait.level

    def _place(self, problem: Problem, started: float) -> Placement:
        gang, config = problem.gang, problem.config
        if problem.impossible:
            return infeasible(gang, self.name, problem.impossible, started, impossible=True)
        reduction = self._candidates(problem)
        short = self._shortfall(problem, reduction)
        if short:
            return infeasible(gang, self.name, short, started)
        if self._reduce:
            reduction = self._reduce_symmetry(problem, reduction)
            if self._scans(problem):
                return self._scan_single(problem, reduction, started)
            if len(reduction.nodes) > config.solver.max_candidate_nodes:
                reduction = self._prune_domains(problem, reduction)
        return self._solve(problem, reduction, started)

    # ------------------------------------------------------------- one pod
    @staticmethod
    def _scans(problem: Problem) -> bool:
        """A one-pod gang is placed by costing every candidate node (after the exact symmetry
        reduction) rather than by a model: with one pod every term is a cost of the node
        alone. Not with fragGradient on: its per-node value may be negative, so the scan's
        lower bound would not hold (the openb study's one-pod gangs keep the model)."""
        return problem.gang.pod_count == 1 and not problem.config.weights.frag_gradient

    def _scan_lower_bound(self, problem: Problem, name: str, weights: dict[str, int]) -> float:
        """Every term of the pod alone on `name` except NUMA alignment and fillOrder, which
        need the pod's GPUs chosen and are never negative: a lower bound of its objective."""
        ps = problem.gang.pod_sets[0]
        node = problem.node(name)
        cost = self._pod_cost(problem, name, weights)  # tier, VRAM, rack left free
        cost += weights["nodesUsed"] + weights["maxPodsPerNode"]
        if ps.gpus:
            share = ps.gpu_milli_per_pod
            cost += weights["fragmentation"] * (node.free_gpu_milli - share) / GPU_WHOLE
            clique = problem.pristine_cliques.get(node.clique or "", ())
            broken = problem.is_island(node) and node.is_pristine() and share < node.free_gpu_milli
            broken_clique = bool(clique) and (len(clique) > 1 or share < node.free_gpu_milli)
            cost += weights["islandsBroken"] * (int(broken) + int(broken_clique))
        return cost

    def _scan_single(self, problem: Problem, red: Reduction, started: float) -> Placement:
        """The cheapest node for a one-pod gang, exactly: candidates in lower-bound order,
        each costed on its realised slot as `finish` reports it, until no bound can beat
        the best. Ties keep the earlier candidate (the candidate order is the snapshot's)."""
        weights = term_weights(problem)
        ps = problem.gang.pod_sets[0]
        ranked = sorted(
            (self._scan_lower_bound(problem, n, weights), i, n) for i, n in enumerate(red.nodes)
        )
        best: tuple[float, list[Slot]] | None = None
        costed = 0
        for bound, _, name in ranked:
            if best is not None and bound >= best[0] - 1e-9:
                break
            slots = self._slots(problem, {(ps.name, name): 1})
            if isinstance(slots, str):
                continue  # GPU shares or NUMA zones cannot hold it after all
            costed += 1
            terms = evaluate_terms(problem, slots)
            value = weighted_objective(problem, terms) + sum(
                weight * v for v, weight in self._order_values(problem, slots).values()
            )
            if best is None or value < best[0] - 1e-9:
                best = (value, slots)
        if best is None:
            return infeasible(
                problem.gang, self.name, "no candidate node can hold the pod now; will retry",
                started,
            )
        placement = finish(
            problem,
            self.name,
            best[1],
            started,
            SolveStatus.OPTIMAL if red.exact else SolveStatus.FEASIBLE,
            self._order_values(problem, best[1]),
        )
        placement.model_objective = placement.objective
        placement.explanation.extend(red.notes)
        placement.explanation.append(
            f"one pod: {len(red.nodes)} candidate nodes ranked by cost, {costed} costed "
            f"exactly; objective {placement.objective:g}, bound {placement.objective:g}"
        )
        return placement

    # ------------------------------------------------------------- candidates
    def _candidates(self, problem: Problem) -> Reduction:
        caps: dict[tuple[str, str], int] = {}
        nodes: dict[str, None] = {}
        policy = problem.gang.numa_policy
        all_nodes = problem.snapshot.nodes
        for ps in problem.gang.pod_sets:
            names = problem.candidates[ps.name]
            fits = self._memo.capacities([all_nodes[n] for n in names], ps, policy)
            for name, fit in zip(names, fits, strict=True):
                cap = min(fit, ps.count)
                if cap > 0:
                    caps[(ps.name, name)] = cap
                    nodes[name] = None
        return Reduction(list(nodes), caps)

    def _shortfall(self, problem: Problem, red: Reduction) -> str:
        for ps in problem.gang.pod_sets:
            room = sum(c for (p, _), c in red.caps.items() if p == ps.name)
            if room < ps.count:
                what = f"{ps.gpus} GPU" if ps.gpus else "CPU-only"
                return (
                    f"pod set {ps.name!r}: {ps.count} pods ({what} each) requested, "
                    f"free capacity for {room} now; will retry"
                )
        req = problem.gang.required_level
        if req is not None:
            li = problem.levels.index(req)
            per_domain: dict[Domain | None, int] = defaultdict(int)
            for (_, n), c in red.caps.items():
                per_domain[problem.paths[n][li]] += c
            if (
                max(per_domain.values(), default=0) < problem.gang.pod_count
                and len(problem.gang.pod_sets) == 1
            ):
                return (
                    f"no single {req} domain has room for all {problem.gang.pod_count} pods now "
                    f"(largest: {max(per_domain.values(), default=0)}); will retry"
                )
        return ""

    def _reduce_symmetry(self, problem: Problem, red: Reduction) -> Reduction:
        need = problem.gang.pod_count
        kept: list[str] = []
        seen: dict[tuple[object, ...], int] = defaultdict(int)
        groups: dict[tuple[object, ...], list[str]] = defaultdict(list)
        gang = problem.gang
        # a lone pod set's key reads only the node, the config and these (its caps are
        # min(pod_capacity, count)), so it is remembered per node state between solves
        signature = (
            (*pod_shape(gang.pod_sets[0]), gang.pod_sets[0].count, gang.numa_policy,
             problem.levels)
            if len(gang.pod_sets) == 1
            else None
        )
        for name in red.nodes:
            node = problem.node(name)
            if node.clique is not None and node.clique in problem.pristine_cliques:
                kept.append(name)  # filling a clique needs every member in the model
                continue

            def compute(name: str = name) -> tuple[object, ...]:
                return (*self._symmetry_key(problem, red, name), *self._frag_key(problem, name))

            key = (
                self._memo.derived(node, signature, compute)
                if signature is not None
                else compute()
            )
            if seen[key] < need:
                seen[key] += 1
                kept.append(name)
                groups[key].append(name)
        keep = set(kept)
        caps = {k: v for k, v in red.caps.items() if k[1] in keep}
        notes = list(red.notes)
        if len(kept) < len(red.nodes):
            notes.append(f"{len(red.nodes)} candidate nodes, {len(kept)} after symmetry")
        twins = [members for members in groups.values() if len(members) > 1]
        return Reduction(kept, caps, red.exact, notes, twins)

    def _frag_key(self, problem: Problem, name: str) -> tuple[object, ...]:
        """With the fragmentation gradient on, nodes are twins only if the gradient is equal."""
        if not problem.config.weights.frag_gradient:
            return ()
        node = problem.node(name)
        return (self._memo.view(node).sorted_gpu_free, node.free_cpu_milli, node.gpu_product)

    def _frag_per_pod(self, problem: Problem, node: Node, ps: PodSet) -> float:
        """fragGradient per pod of `ps` on `node`, in GPUs: the fragmentation (FGD measure,
        `self.workload`) that as many of these pods as fit add, averaged per pod, so the
        term is linear in the pod count."""
        cap = max(1, min(ps.count, self._memo.capacity(node, ps, problem.gang.numa_policy)))
        table = gradient_table(
            node.gpu_free,
            node.free_cpu_milli,
            node.gpu_product,
            ps.cpu_milli,
            ps.gpus,
            ps.gpu_milli,
            cap,
            self.workload,
        )
        return table[-1] / max(len(table) - 1, 1) / GPU_WHOLE

    def _fill_rank(self, problem: Problem) -> dict[str, float]:
        """fillOrder's rank of every node of the snapshot, cached while the snapshot object
        and its size stay the same."""
        nodes = problem.snapshot.nodes
        if self._rank is None or self._rank[0] != (id(nodes), len(nodes)):
            self._rank = (
                (id(nodes), len(nodes)),
                fill_rank(list(nodes.values()), problem.config.island_min_gpus),
            )
        return self._rank[1]

    def _order_terms(
        self,
        problem: Problem,
        rep: str,
        entries: list[tuple[PodSet, cp_model.IntVar]],
        u: cp_model.IntVar,
        model: cp_model.CpModel,
        members: list[str],
    ) -> list[cp_model.LinearExprT]:
        """Two optional terms (weights default 0), see placement/fragmentation.py:
        fragGradient: per GPU of fragmentation the pods add to the node; fillOrder: per
        node used, its rank in the snapshot's order, so successive packing gangs fill the
        same nodes. `_order_values` reports the same two terms for the returned slots.

        A unit of several twins uses its first `u` members (`_node_counts`), each at its
        own rank. A one-pod gang uses at most one node, the first member, so its unit is
        charged that member's rank per node used, as before (the openb study's gangs are
        all one pod: their models are unchanged)."""
        w = problem.config.weights
        out: list[cp_model.LinearExprT] = []
        if w.frag_gradient:
            node = problem.node(rep)
            for ps, var in entries:
                coef = round(w.frag_gradient * self._frag_per_pod(problem, node, ps) * SCALE)
                if coef:
                    out.append(coef * var)
        if w.fill_order and problem.gang.workload_type.packs:
            rank = self._fill_rank(problem)
            if len(members) > 1 and problem.gang.pod_count > 1:
                # found by the oracle property test: charging every twin the first one's
                # rank made the model's objective differ from the reported fillOrder
                first = [model.new_bool_var(f"uses[{rep},{i}]") for i in range(len(members))]
                model.add(sum(first) == u)
                for a, b in pairwise(first):
                    model.add(a >= b)
                for member, flag in zip(members, first, strict=True):
                    coef = round(w.fill_order * SCALE * rank.get(member, 1.0))
                    if coef:
                        out.append(coef * flag)
                return out
            coef = round(w.fill_order * SCALE * rank.get(rep, 1.0))
            if coef:
                out.append(coef * u)
        return out

    def _order_values(
        self, problem: Problem, slots: Sequence[Slot]
    ) -> dict[str, tuple[float, int]]:
        """The fragGradient and fillOrder terms of `slots` as the model above counts them,
        with their weights (only the terms whose weight is on). The shared evaluation
        (objective.py) has no workload distribution or fill order, so the engine adds them."""
        w = problem.config.weights
        out: dict[str, tuple[float, int]] = {}
        if w.frag_gradient:
            pods: Counter[tuple[str, str]] = Counter((s.pod_set, s.node) for s in slots)
            value = sum(
                n * self._frag_per_pod(problem, problem.node(node), problem.pod_set(p))
                for (p, node), n in pods.items()
            )
            out["fragGradient"] = (round(value, 3), w.frag_gradient)
        if w.fill_order and problem.gang.workload_type.packs:
            rank = self._fill_rank(problem)
            value = sum(rank.get(n, 1.0) for n in {s.node for s in slots})
            out["fillOrder"] = (round(value, 3), w.fill_order)
        return out

    def _symmetry_key(self, problem: Problem, red: Reduction, name: str) -> tuple[object, ...]:
        """Everything the model reads of a node: equal keys mean interchangeable nodes."""
        node = problem.node(name)
        view = self._memo.view(node)
        caps = tuple(red.caps.get((ps.name, name), 0) for ps in problem.gang.pod_sets)
        aligned = tuple(
            self._memo.capacity(node, ps, NumaPolicy.SINGLE_NUMA_NODE) if node.numa_zones else -1
            for ps in problem.gang.pod_sets
        )
        zones = (
            tuple((z.gpu_indices, z.free_cpu_milli) for z in node.numa_zones)
            if problem.gang.numa_policy is NumaPolicy.SINGLE_NUMA_NODE
            and len(problem.gang.pod_sets) > 1
            else ()
        )
        return (
            problem.paths[name][:-1],
            problem.node_class[name],
            node.gpu_memory_mib,
            caps,
            aligned,
            zones,
            node.free_cpu_milli if len(caps) > 1 else 0,
            node.free_memory_mib if len(caps) > 1 else 0,
            node.free_pods if len(caps) > 1 else 0,
            view.free_whole_gpus,
            view.free_gpu_milli,
            view.pristine and problem.is_island(node),
            node.clique,
        )

    @staticmethod
    def _pod_cost(problem: Problem, name: str, weights: dict[str, int]) -> float:
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

    def _lower_bound(
        self,
        problem: Problem,
        members: Sequence[str],
        li: int,
        room: dict[str, int],
        pod_cost: dict[str, float],
        weights: dict[str, int],
    ) -> float:
        """A valid lower bound of the objective for the gang placed inside `members`: the
        fewest nodes and sub-domains that can hold it, and its cheapest per-pod costs."""
        need = problem.gang.pod_count

        def fewest(rooms: Iterable[int]) -> int:
            total, count = 0, 0
            for r in sorted(rooms, reverse=True):
                if total >= need:
                    break
                total += r
                count += 1
            return count

        bound = weights["nodesUsed"] * fewest(room[m] for m in members)
        for lj in range(li + 1, len(problem.levels) - 1):
            sub: dict[Domain | None, int] = defaultdict(int)
            for m in members:
                sub[problem.paths[m][lj]] += room[m]
            least = fewest(sub.values())
            bound += level_weight(problem, lj) * (
                weights["domainSpread"] * (least - 1) + weights["gangSplit"] * (least > 1)
            )
        filled, cost = 0, 0.0
        for m in sorted(members, key=lambda m: pod_cost[m]):
            take = min(room[m], need - filled)
            cost += take * pod_cost[m]
            filled += take
            if filled >= need:
                break
        return bound + cost

    def _prune_domains(self, problem: Problem, red: Reduction) -> Reduction:
        """Domain-first decomposition. At the lowest level where one domain holds the whole
        gang, bound every such domain from below, take the best greedy (Kueue-TAS-like)
        fill of the most promising ones as an upper bound, and keep the nodes of the
        domains whose lower bound does not exceed it, best first, within the node budget."""
        solver = problem.config.solver
        budget = max(solver.max_candidate_nodes, round(solver.kept_fraction * len(red.nodes)))
        weights = term_weights(problem)
        need = problem.gang.pod_count
        room: dict[str, int] = defaultdict(int)
        for (_, n), c in red.caps.items():
            room[n] = min(need, room[n] + c)
        pod_cost = {n: self._pod_cost(problem, n, weights) for n in red.nodes}
        host = len(problem.levels) - 1
        required = problem.gang.required_level is not None
        if required:
            levels: Iterable[int] = [problem.levels.index(problem.gang.required_level or "")]
        else:
            start = host - 1
            if problem.gang.preferred_level:
                start = min(start, problem.levels.index(problem.gang.preferred_level))
            levels = range(start, -1, -1)
        for li in levels:
            domains: dict[Domain | None, list[str]] = defaultdict(list)
            for n in red.nodes:
                domains[problem.paths[n][li]].append(n)
            ranked: list[tuple[float, Domain, list[str]]] = []
            for d, members in domains.items():
                if d is None or not self._holds(problem, red.caps, members):
                    continue
                lb = self._lower_bound(problem, members, li, room, pod_cost, weights)
                ranked.append((lb, d, members))
            if not ranked:
                continue
            ranked.sort(key=lambda r: (r[0], r[1]))
            upper: dict[Domain, float] = {}
            best_fill: dict[tuple[str, str], int] | None = None
            best_upper = float("inf")
            best_domain: Domain | None = None
            # Greedy fills in lower-bound order until no remaining domain can beat the best
            # one; many domains often share the lowest bound, and only their fills tell them
            # apart (a cap keeps huge fleets fast).
            for probe, (lb, d, members) in enumerate(ranked):
                if lb >= best_upper or probe >= _GREEDY_PROBES:
                    break
                found = self._greedy(problem, red, members)
                upper[d] = found[0] if found else float("inf")
                if found and found[0] < best_upper:
                    (best_upper, best_fill), best_domain = found, d
            # The incumbent's domain first (so its fill stays a valid hint), then by lower
            # bound, among equal bounds the better greedy fill first.
            ranked.sort(
                key=lambda r: (r[1] != best_domain, r[0], upper.get(r[1], float("inf")), r[1])
            )
            # the incumbent's nodes always stay (the solver starts from that fill)
            kept = list(dict.fromkeys(n for _, n in best_fill)) if best_fill else []
            spanning = self._lower_bound(problem, red.nodes, li - 1, room, pod_cost, weights)
            # Spreading over several domains might beat every single domain: then the best
            # single domains get three quarters of the budget, the densest cheap racks the rest.
            spread = not required and spanning < best_upper
            limit = budget * 3 // 4 if spread else budget
            complete = not spread
            first = True
            for lb, _, members in ranked:
                if lb > best_upper:
                    break  # no placement inside this domain can beat the greedy one
                taken = set(kept)
                members = [m for m in members if m not in taken]
                if len(kept) + len(members) > limit:
                    complete = False
                    if not first:
                        break
                    members = sorted(members, key=lambda m: (pod_cost[m], -room[m]))
                    members = members[: max(0, limit - len(kept))]
                kept.extend(members)
                first = False
            if spread:
                taken = set(kept)
                dense = self._dense_racks(problem, red, room, pod_cost, li - 1, weights)
                kept += [n for n in dense if n not in taken][: max(0, budget - len(kept))]
            note = (
                f"pruned to {len(kept)} nodes in the {problem.levels[li]} domains whose "
                f"lower bound beats the greedy placement"
            )
            # Exact when the gang must stay in one domain and every promising one was kept.
            reduced = self._restrict(red, kept, note, exact=required and complete)
            # the hint: the cheapest greedy fill that lies inside the kept nodes
            fills = [(best_upper, best_fill)] if best_fill is not None else []
            if spread:  # several domains may win: also try a greedy fill across them
                across = self._greedy(problem, reduced, kept)
                if across is not None:
                    fills.append(across)
            kept_set = set(kept)
            inside = [f for f in fills if {n for _, n in f[1]} <= kept_set]
            reduced.hint = min(inside, key=lambda f: f[0])[1] if inside else None
            return reduced
        # No domain holds the gang at any level: keep the cheapest nodes overall.
        order = sorted(red.nodes, key=lambda m: (pod_cost[m], -room[m]))
        kept, filled = [], 0
        for m in order:
            if len(kept) >= budget and filled >= 2 * need:
                break
            kept.append(m)
            filled += room[m]
        return self._restrict(red, kept, f"pruned to the {len(kept)} cheapest nodes")

    def _dense_racks(
        self,
        problem: Problem,
        red: Reduction,
        room: dict[str, int],
        pod_cost: dict[str, float],
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

        def key(members: list[str]) -> tuple[float, int]:
            total = sum(room[m] for m in members)
            per_pod = sum(pod_cost[m] * room[m] for m in members) / max(total, 1)
            return (round(per_pod, 3), -total)

        ordered = sorted(racks.values(), key=key)
        if not 0 <= parent_level < rack_level:
            return [n for members in ordered for n in members]
        need = problem.gang.pod_count
        child = parent_level + 1
        by_parent: dict[Domain | None, list[list[str]]] = defaultdict(list)
        for members in ordered:
            by_parent[problem.paths[members[0]][parent_level]].append(members)
        if len(by_parent) < 2:
            return [n for members in ordered for n in members]  # nothing to rank
        ranked: list[tuple[float, int, Domain]] = []  # (cover bound, first seen, parent)
        for i, (parent, group) in enumerate(by_parent.items()):
            if parent is None:
                continue
            children: dict[Domain | None, list[list[str]]] = defaultdict(list)
            for members in group:  # densest racks first within each child
                children[problem.paths[members[0]][child]].append(members)
            roomiest = sorted(
                children, key=lambda c: -sum(room[m] for ms in children[c] for m in ms)
            )[:_COVER_CHILDREN]
            orders = [group] + [
                [ms for ms in group if problem.paths[ms[0]][child] in pick]
                for k in (1, 2)
                for pick in combinations(roomiest, k)
            ]
            for racks_order in orders:
                cover: list[list[str]] = []
                covered = 0
                for members in racks_order:
                    if covered >= need:
                        break
                    cover.append(members)
                    covered += sum(room[m] for m in members)
                nodes = [m for members in cover for m in members]
                if self._holds(problem, red.caps, nodes):
                    bound = self._lower_bound(problem, nodes, parent_level, room, pod_cost, weights)
                    ranked.append((bound, i, parent))
        ranked.sort(key=lambda r: (r[0], r[1]))
        parents = list(dict.fromkeys(parent for _, _, parent in ranked))
        out: list[str] = []
        seen: set[str] = set()
        for members in [ms for parent in parents for ms in by_parent[parent]] + ordered:
            if members[0] not in seen:
                out.extend(members)
                seen.update(members)
        return out

    @staticmethod
    def _holds(problem: Problem, room: dict[tuple[str, str], int], members: list[str]) -> bool:
        return all(
            sum(room.get((ps.name, m), 0) for m in members) >= ps.count
            for ps in problem.gang.pod_sets
        )

    def _greedy(
        self, problem: Problem, red: Reduction, members: Sequence[str]
    ) -> tuple[float, dict[tuple[str, str], int]] | None:
        """The best of Kueue-TAS-style greedy fills restricted to the nodes whose per-pod
        cost is at most each distinct cost level (so cheap hardware is used first):
        (objective, counts), or None when no fill succeeds."""
        weights = term_weights(problem)
        cost = {m: self._pod_cost(problem, m, weights) for m in members}
        best: tuple[float, dict[tuple[str, str], int]] | None = None
        for level in sorted(set(cost.values())):
            subset = [m for m in members if cost[m] <= level]
            if not self._holds(problem, red.caps, subset):
                continue
            counts = self._greedy_counts(problem, red, subset)
            if counts is None:
                continue
            slots = self._slots(problem, counts)
            if isinstance(slots, str):
                continue
            value = weighted_objective(problem, evaluate_terms(problem, slots))
            if best is None or value < best[0]:
                best = (value, counts)
            if best is not None or len(subset) == len(members):
                break  # the cheapest hardware that holds the gang is what the greedy is for
        return best

    @staticmethod
    def _restrict(red: Reduction, kept: Sequence[str], note: str, exact: bool = False) -> Reduction:
        keep = set(kept)
        caps = {k: v for k, v in red.caps.items() if k[1] in keep}
        twins = [[n for n in group if n in keep] for group in red.twins]
        return Reduction(
            list(kept),
            caps,
            exact and red.exact,
            [*red.notes, note],
            [g for g in twins if len(g) > 1],
        )

    # ------------------------------------------------------------------ model
    @staticmethod
    def _groups(problem: Problem, red: Reduction) -> dict[str, list[str]]:
        """Model units: interchangeable nodes (twins) become one unit with a multiplicity
        when the gang is one GPU pod set that packs; otherwise every node is its own unit."""
        gang = problem.gang
        single = len(gang.pod_sets) == 1 and gang.pod_sets[0].gpus > 0
        on_one_host = gang.required_level == problem.levels[-1]
        if not (single and gang.workload_type.packs) or on_one_host:
            return {n: [n] for n in red.nodes}
        groups: dict[str, list[str]] = {n: [n] for n in red.nodes}
        for twins in red.twins:
            for n in twins[1:]:
                del groups[n]
            groups[twins[0]] = list(twins)
        return groups

    def _solve(self, problem: Problem, red: Reduction, started: float) -> Placement:
        gang = problem.gang
        config = problem.config
        weights = term_weights(problem)
        strict = gang.numa_policy is NumaPolicy.SINGLE_NUMA_NODE
        groups = self._groups(problem, red)
        model = cp_model.CpModel()
        # x[(pod set, unit)]: pods of the set on the unit's nodes; used[unit]: nodes used
        x: dict[tuple[str, str], cp_model.IntVar] = {}
        by_unit: dict[str, list[tuple[PodSet, cp_model.IntVar]]] = defaultdict(list)
        for ps in gang.pod_sets:
            for rep, members in groups.items():
                cap = red.caps.get((ps.name, rep), 0)
                if cap:
                    var = model.new_int_var(
                        0, min(ps.count, cap * len(members)), f"x[{ps.name},{rep}]"
                    )
                    x[(ps.name, rep)] = var
                    by_unit[rep].append((ps, var))
            model.add(sum(v for (p, _), v in x.items() if p == ps.name) == ps.count)

        used: dict[str, cp_model.IntVar] = {}
        gpu_used: dict[str, cp_model.IntVar] = {}
        objective: list[cp_model.LinearExprT] = []
        frag_w, tier_w = weights["fragmentation"], weights["tierMismatch"]
        vram_w, numa_w = weights["vramStrandedGiB"], weights["numaUnaligned"]
        isl_w = weights["islandsBroken"]
        filled: dict[str, cp_model.IntVar] = {}
        # per unit, the model's NUMA-unaligned counts (each pod set against the zones alone,
        # plus what realisation cuts charged)
        unaligned: dict[str, list[cp_model.LinearExprT]] = defaultdict(list)
        for rep, entries in by_unit.items():
            node = problem.node(rep)
            m = len(groups[rep])
            u = model.new_int_var(0, m, f"used[{rep}]")
            used[rep] = u
            for ps, var in entries:
                model.add(var <= red.caps[(ps.name, rep)] * u)
            model.add(sum(v for _, v in entries) >= u)  # a used node holds at least one pod
            self._node_capacity(model, node, entries, strict, red.caps)
            for ps, var in entries:
                if numa_w and not strict and numa_alignable(node, ps):
                    aligned = pod_capacity(node, ps, NumaPolicy.SINGLE_NUMA_NODE)
                    if aligned < red.caps[(ps.name, rep)]:
                        un = model.new_int_var(0, ps.count, f"unaligned[{ps.name},{rep}]")
                        model.add(un >= var - aligned * u)
                        objective.append(numa_w * SCALE * un)
                        unaligned[rep].append(un)
            objective.extend(self._order_terms(problem, rep, entries, u, model, groups[rep]))
            gpu_entries = [(ps, v) for ps, v in entries if ps.gpus]
            if not gpu_entries:
                continue
            if len(gpu_entries) == len(entries):
                g = u
            else:
                g = model.new_bool_var(f"gpu_used[{rep}]")
                for ps, var in gpu_entries:
                    model.add(var <= red.caps[(ps.name, rep)] * g)
                model.add(g <= u)
            gpu_used[rep] = g
            milli = sum(ps.gpu_milli_per_pod * v for ps, v in gpu_entries)
            model.add(milli >= g)
            cost = problem.class_cost(rep)
            for ps, var in gpu_entries:
                coef = tier_w * cost * ps.gpu_milli_per_pod  # × SCALE / 1000
                coef += round(vram_w * ps.gpus * stranded_vram_gib(problem, ps, node) * SCALE)
                coef -= frag_w * ps.gpu_milli_per_pod  # idle share left = free·g − used
                if coef:
                    objective.append(coef * var)
            if frag_w:
                objective.append(frag_w * node.free_gpu_milli * g)
            pristine_island = problem.is_island(node) and node.is_pristine()
            if pristine_island or node.clique in problem.pristine_cliques:
                f = model.new_int_var(0, m, f"filled[{rep}]")
                filled[rep] = f
                model.add(f <= g)
                if m == 1:
                    model.add(milli >= node.free_gpu_milli * f)
                else:  # one GPU pod set: a filled node holds `full` pods, the others ≥ 1
                    ps, var = gpu_entries[0]
                    full = -(-node.free_gpu_milli // ps.gpu_milli_per_pod)
                    model.add(full * f + (g - f) <= var)
                if pristine_island and isl_w:
                    broken = model.new_int_var(0, m, f"broken[{rep}]")
                    model.add(broken >= g - f)
                    objective.append(isl_w * SCALE * broken)
        for clique, members in problem.pristine_cliques.items():
            in_model = [n for n in members if n in gpu_used]
            if not in_model or not isl_w:
                continue
            all_filled = model.new_bool_var(f"clique_filled[{clique}]")
            if len(in_model) < len(members):
                model.add(all_filled == 0)
            for n in in_model:
                model.add(all_filled <= filled[n])
            clique_broken = model.new_bool_var(f"clique_broken[{clique}]")
            for n in in_model:
                model.add(clique_broken >= gpu_used[n] - all_filled)
            objective.append(isl_w * SCALE * clique_broken)

        # topology domains
        host = len(problem.levels) - 1
        spread_w = weights["domainSpread"]
        split_w = weights["gangSplit"]
        dom_w = weights["domainFragmentation"]
        req_idx = problem.levels.index(gang.required_level) if gang.required_level else None
        # domainSpread is (domains used - 1) × level weight; the model counts domains used
        # (every level has at least one). The constant stays out of the model: CP-SAT's
        # relative gap is taken against the objective including any offset, so adding it
        # would change when gap-limited solves stop, hence placements. It is subtracted
        # from the objective reported instead.
        offset = 0
        for li in range(host):
            best_fit = dom_w and li == host - 1
            if not (spread_w or split_w) and li != req_idx and not best_fit:
                continue
            domains: dict[Domain | None, list[str]] = defaultdict(list)
            for rep in used:
                domains[problem.paths[rep][li]].append(rep)
            dvars, rooms = [], []
            for d, reps in domains.items():
                dv = model.new_bool_var(f"domain[{li},{d}]")
                for rep in reps:
                    model.add(used[rep] <= len(groups[rep]) * dv)
                # aggregate form: tightens the LP bound on how many domains are needed
                pods = [v for rep in reps for _, v in by_unit[rep]]
                room = min(
                    gang.pod_count,
                    sum(
                        red.caps[(ps.name, rep)] * len(groups[rep])
                        for rep in reps
                        for ps, _ in by_unit[rep]
                    ),
                )
                model.add(sum(pods) <= room * dv)
                dvars.append(dv)
                rooms.append(room)
            # the domains chosen must have room for the whole gang (a covering cut)
            model.add(sum(r * dv for r, dv in zip(rooms, dvars, strict=True)) >= gang.pod_count)
            if li == req_idx:
                model.add(sum(dvars) == 1)
            if spread_w:
                objective.append(spread_w * SCALE * level_weight(problem, li) * sum(dvars))
                offset += spread_w * SCALE * level_weight(problem, li)
            if split_w and len(dvars) > 1:
                split = model.new_bool_var(f"split[{li}]")
                model.add(sum(dvars) <= 1 + (len(dvars) - 1) * split)
                objective.append(split_w * SCALE * level_weight(problem, li) * split)
            if best_fit:  # GPUs left free in the touched racks: SCALE = milli per GPU
                free = problem.domain_free_gpu_milli(li)
                for d, dv in zip(domains, dvars, strict=True):
                    if d is not None:
                        objective.append(dom_w * free[d] * dv)
                for rep, entries in by_unit.items():
                    if problem.paths[rep][li] is not None:
                        objective.extend(
                            -dom_w * ps.gpu_milli_per_pod * v for ps, v in entries if ps.gpus
                        )
        if req_idx == host:  # required hostname: the whole gang on one node
            model.add(sum(used.values()) == 1)
        if weights["nodesUsed"]:
            objective.append(weights["nodesUsed"] * SCALE * sum(used.values()))
        if weights["maxPodsPerNode"]:  # spread types: units are single nodes (see _groups)
            peak = model.new_int_var(0, gang.pod_count, "max_pods_per_node")
            for entries in by_unit.values():
                model.add(peak >= sum(v for _, v in entries))
            objective.append(weights["maxPodsPerNode"] * SCALE * peak)
        for twins in red.twins:  # interchangeable single-node units: fill in a fixed order
            if len(groups.get(twins[0], ())) > 1:
                continue
            for first, second in pairwise(twins):
                model.add(sum(v for _, v in by_unit[first]) >= sum(v for _, v in by_unit[second]))
        model.minimize(sum(objective))

        self._add_hint(problem, red, groups, model, x, used)
        solver = cp_model.CpSolver()
        limit = self._time_limit or config.solver.time_limit_seconds
        solver.parameters.max_time_in_seconds = max(0.01, limit - (time.perf_counter() - started))
        solver.parameters.num_workers = config.solver.workers
        if config.solver.workers == 1:
            # Measured on the bench instances (1k-12.5k nodes, 1-256 pods): the full LP
            # relaxation proves the domain/node counts fastest, while CG/MIR cuts on these
            # aggregated capacities, probing and repeated presolve cost more than they save
            # (15 captured 64-pod models on 1,000 nodes, side by side: 3.0 s in all with 8
            # workers, 1.0 s with one worker and the full LP, less again without probing).
            solver.parameters.linearization_level = 2
            solver.parameters.add_cg_cuts = False
            solver.parameters.add_mir_cuts = False
            solver.parameters.cp_model_probing_level = 0
            solver.parameters.max_presolve_iterations = 1
        solver.parameters.random_seed = self._seed
        if not self._reduce:
            # Thousands of interchangeable nodes left in the model send CP-SAT's symmetry
            # presolve into tens of seconds (measured: 1-pod gang on 5,000 nodes, 43 s with,
            # 1 s without); the reduced model has merged them already.
            solver.parameters.symmetry_level = 0
        if len(red.nodes) > config.solver.exact_below_nodes:
            solver.parameters.relative_gap_limit = config.solver.relative_gap
        def same_counts(rep: str) -> list[cp_model.IntVar]:
            """Booleans, one per variable of unit `rep` (its pods per pod set and nodes used),
            true when it takes the value it has in the last solution."""
            unit_vars = [var for key, var in x.items() if key[1] == rep]
            if rep in used:
                unit_vars.append(used[rep])
            same = []
            for var in unit_vars:
                value = solver.value(var)
                eq = model.new_bool_var(f"cut[{var.name}]")
                model.add(var == value).only_enforce_if(eq)
                model.add(var != value).only_enforce_if(~eq)
                same.append(eq)
            return same

        # slots, costed exactly by the model, the model's objective and bound for them
        realised: tuple[list[Slot], bool, float, float] | None = None
        for _attempt in range(_MAX_REALISATION_CUTS + 1):
            status = solver.solve(model)
            if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                if realised is not None:
                    break  # keep the placement realised before the last cut
                reason = (
                    "no placement satisfies every constraint now; will retry"
                    if status == cp_model.INFEASIBLE
                    else f"no placement found within {limit:g}s; will retry"
                )
                return infeasible(gang, self.name, reason, started)
            counts = self._node_counts(problem, red, groups, solver, x, used)
            slots = self._slots(problem, counts)
            if isinstance(slots, str):
                # The aggregated model let through counts that GPU shares or NUMA zones
                # cannot hold on node `slots` (a single-node unit): forbid them, solve again.
                model.add_bool_or([~eq for eq in same_counts(slots)])
            else:
                short = self._numa_shortfall(problem, groups, slots, solver, unaligned)
                realised = (slots, not short, solver.objective_value, solver.best_objective_bound)
                if not short:
                    break
                # Pod sets sharing a node's NUMA zones: the model counted each against the
                # zones alone, fewer unaligned pods than the realisation has. Charge the
                # difference whenever the unit takes these counts again, solve again.
                for rep, missing in short.items():
                    charged = model.new_bool_var(f"numa_shortfall[{rep}]")
                    model.add_bool_or([~eq for eq in same_counts(rep)] + [charged])
                    objective.append(weights["numaUnaligned"] * SCALE * missing * charged)
                    unaligned[rep].append(missing * charged)
                model.minimize(sum(objective))
            solver.parameters.max_time_in_seconds = max(
                0.01, limit - (time.perf_counter() - started)
            )
        if realised is None:
            return infeasible(
                gang, self.name, "solver counts could not be realised on GPUs; will retry", started
            )
        slots, exact_cost, model_value, model_bound = realised
        bound = solver.best_objective_bound
        proven = (
            exact_cost
            and status == cp_model.OPTIMAL
            and red.exact
            and solver.objective_value <= bound + 0.5
        )
        placement = finish(
            problem,
            self.name,
            slots,
            started,
            SolveStatus.OPTIMAL if proven else SolveStatus.FEASIBLE,
            self._order_values(problem, slots),
        )
        placement.model_objective = (model_value - offset) / SCALE
        placement.explanation.extend(red.notes)
        placement.explanation.append(
            f"CP-SAT {solver.status_name(status).lower()} in {solver.wall_time:.3f}s over "
            f"{len(red.nodes)} nodes in {len(groups)} units; objective "
            f"{placement.model_objective:g}, bound {(model_bound - offset) / SCALE:g}"
        )
        return placement

    @staticmethod
    def _numa_shortfall(
        problem: Problem,
        groups: dict[str, list[str]],
        slots: Sequence[Slot],
        solver: cp_model.CpSolver,
        unaligned: dict[str, list[cp_model.LinearExprT]],
    ) -> dict[str, int]:
        """Per unit, how many more pods the realised slots leave NUMA-unaligned than the
        model counted (only where that is more)."""
        if not problem.config.weights.numa_unaligned:
            return {}
        unit_of = {n: rep for rep, members in groups.items() for n in members}
        realised: Counter[str] = Counter(
            unit_of[s.node]
            for s in slots
            if s.numa_zone is None
            and numa_alignable(problem.node(s.node), problem.pod_set(s.pod_set))
        )
        out = {}
        for rep, count in realised.items():
            missing = count - sum(solver.value(v) for v in unaligned.get(rep, ()))
            if missing > 0:
                out[rep] = missing
        return out

    @staticmethod
    def _node_counts(
        problem: Problem,
        red: Reduction,
        groups: dict[str, list[str]],
        solver: cp_model.CpSolver,
        x: dict[tuple[str, str], cp_model.IntVar],
        used: dict[str, cp_model.IntVar],
    ) -> dict[tuple[str, str], int]:
        """Spread each unit's pods over as many of its nodes as the solution uses: fill
        nodes completely first (that is what `filled` counted), at least one pod on each."""
        counts: dict[tuple[str, str], int] = {}
        for (p, rep), var in x.items():
            total = solver.value(var)
            if total <= 0:
                continue
            members = groups[rep]
            if len(members) == 1:
                counts[(p, rep)] = total
                continue
            k = max(1, solver.value(used[rep]))
            cap = red.caps[(p, rep)]
            for i, n in enumerate(members[:k]):
                take = min(cap, total - (k - i - 1))
                counts[(p, n)] = take
                total -= take
        return counts

    @staticmethod
    def _node_capacity(
        model: cp_model.CpModel,
        node: Node,
        entries: list[tuple[PodSet, cp_model.IntVar]],
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
            model.add(
                sum(ps.gpu_milli * v for ps, v in shared) <= partial_free + GPU_WHOLE * opened
            )
            for ps, v in shared:
                partial = sum(f // ps.gpu_milli for f in node.gpu_free if f < GPU_WHOLE)
                model.add(v <= partial + (GPU_WHOLE // ps.gpu_milli) * opened)
        model.add(sum(ps.whole_gpus * v for ps, v in entries) + opened <= node.free_whole_gpus)
        if strict and node.numa_zones:
            zone_vars: dict[int, list[tuple[PodSet, cp_model.IntVar]]] = defaultdict(list)
            for ps, v in entries:
                parts = []
                for z in node.numa_zones:
                    zv = model.new_int_var(0, caps[(ps.name, node.name)], f"{v.name}@{z.id}")
                    zone_vars[z.id].append((ps, zv))
                    parts.append(zv)
                model.add(sum(parts) == v)
            for z in node.numa_zones:
                free = sum(1 for i in z.gpu_indices if node.gpu_free[i] == GPU_WHOLE)
                zv_list = zone_vars[z.id]
                model.add(sum(ps.whole_gpus * zv for ps, zv in zv_list) <= free)
                model.add(sum(ps.cpu_milli * zv for ps, zv in zv_list) <= z.free_cpu_milli)

    @staticmethod
    def _greedy_counts(
        problem: Problem, red: Reduction, nodes: Sequence[str]
    ) -> dict[tuple[str, str], int] | None:
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
        out: dict[tuple[str, str], int] = {}
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

    def _add_hint(
        self,
        problem: Problem,
        red: Reduction,
        groups: dict[str, list[str]],
        model: cp_model.CpModel,
        x: dict[tuple[str, str], cp_model.IntVar],
        used: dict[str, cp_model.IntVar],
    ) -> None:
        """Seed the search with the greedy counts inside the reduced node set."""
        fill = red.hint
        if fill is None:
            found = self._greedy(problem, red, red.nodes)
            if found is None:
                return
            fill = found[1]
        unit_of = {n: rep for rep, members in groups.items() for n in members}
        pods: dict[tuple[str, str], int] = defaultdict(int)
        nodes_used: dict[str, set[str]] = defaultdict(set)
        for (p, n), c in fill.items():
            pods[(p, unit_of[n])] += c
            nodes_used[unit_of[n]].add(n)
        for key, var in x.items():
            model.add_hint(var, pods.get(key, 0))
        for rep, var in used.items():
            model.add_hint(var, len(nodes_used.get(rep, ())))

    # ------------------------------------------------------------------ slots
    @staticmethod
    def _slots(problem: Problem, counts: dict[tuple[str, str], int]) -> list[Slot] | str:
        """Turn counts into pods with GPUs and NUMA zones; consecutive indices of a pod set
        go to neighbouring nodes (nodes ordered by their topology path). Returns the name
        of a node that cannot hold its counts when the aggregated model over-promised."""
        gang = problem.gang
        nodes = sorted({n for _, n in counts}, key=problem.path_key)
        fits: dict[str, list[tuple[PodSet, Slot]]] = {}
        for n in nodes:
            on_node = CpSatEngine._fit_node(problem, n, counts)
            if on_node is None:
                return n
            fits[n] = on_node
        slots: list[Slot] = []
        for ps in gang.pod_sets:
            index = 0
            for n in nodes:
                for owner, slot in fits[n]:
                    if owner is ps:
                        slots.append(Slot(ps.name, index, n, slot.gpu_indices, slot.numa_zone))
                        index += 1
        return slots

    @staticmethod
    def _fit_node(
        problem: Problem, name: str, counts: dict[tuple[str, str], int]
    ) -> list[tuple[PodSet, Slot]] | None:
        """GPUs and NUMA zones for the pods counted on one node, or None if they do not fit.
        The hardest pods go first; when that greedy order strands a pod or leaves one
        NUMA-unaligned (zones packed the wrong way), the other orders of the pod sets are
        tried and the one with the fewest unaligned pods wins."""
        gang = problem.gang
        present = [ps for ps in gang.pod_sets if counts.get((ps.name, name), 0)]
        hardest = sorted(present, key=lambda p: (-p.whole_gpus, -p.gpu_milli, -p.cpu_milli))
        orders = [hardest]
        if len(present) <= _MAX_PERMUTED_POD_SETS:
            orders += [list(o) for o in permutations(hardest) if list(o) != hardest]
        node = problem.node(name)
        best: tuple[int, list[tuple[PodSet, Slot]]] | None = None
        for order in orders:
            scratch = ClusterSnapshot({name: node.copy()})
            placed: list[tuple[PodSet, Slot]] = []
            for ps in order:
                one = Gang(gang.name, (ps,))
                for i in range(counts[(ps.name, name)]):
                    fit = fit_pod(scratch.nodes[name], ps, gang.numa_policy)
                    if fit is None:
                        break
                    slot = Slot(ps.name, i, name, fit.gpu_indices, fit.numa_zone)
                    apply_slots(scratch, one, [slot])
                    placed.append((ps, slot))
                else:
                    continue
                break
            else:
                unaligned = sum(
                    1 for ps, slot in placed if slot.numa_zone is None and numa_alignable(node, ps)
                )
                if best is None or unaligned < best[0]:
                    best = (unaligned, placed)
                if unaligned == 0:
                    break
        return best[1] if best else None


def nexus_policy(seed: int) -> CpSatEngine:
    return CpSatEngine(seed)
