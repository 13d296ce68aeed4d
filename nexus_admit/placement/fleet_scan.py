"""The one-pod scan (`onepod.scan_candidates`) with its fleet-wide steps on columns: which
candidates have room for the pod (`reduction.room_for_one`) and the lower bound of each
(`onepod.lower_bounds`), computed as numpy arrays from `columns.py` instead of node by
node. The same candidates, the same bounds bit for bit (every operation in the same order
on the same doubles), so the same ranking, ties and placement; only the few nodes the scan
reaches are read as objects.

For the gangs `onepod.scans` takes whose candidates and bound read nothing but the node,
its rack and its clique: one pod set, no siblings (the spread term reads the node's name),
no spread limit per node, not a GPU-less pod kept off GPU nodes. Others return None and
take the scan over objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from nexus_admit.model import GPU_WHOLE, Node, NumaPolicy, Placement, PodSet
from nexus_admit.placement.baselines.podbypod import infeasible
from nexus_admit.placement.columns import Candidates, IntArray, candidate_columns, level_codes
from nexus_admit.placement.memo import NodeMemo
from nexus_admit.placement.node_kinds import clique_codes
from nexus_admit.placement.objective import term_weights
from nexus_admit.placement.onepod import Ranking, rank_order, scan_ranked
from nexus_admit.placement.order_terms import OrderTerms
from nexus_admit.placement.problem import Problem
from nexus_admit.placement.reduction import (
    keeps_off_gpus,
    lone_class_key,
    per_node_limit,
    room_for_one,
    room_shortfall,
)

__all__ = ["column_bounds", "columns_serve", "fleet_scan", "room_mask"]

FloatArray = npt.NDArray[np.float64]
_PODS, _CPU, _MEMORY = (attrgetter(a) for a in ("free_pods", "free_cpu_milli", "free_memory_mib"))


def columns_serve(problem: Problem) -> bool:
    """Whether `fleet_scan` answers for this one-pod gang (see the module)."""
    gang = problem.gang
    if len(gang.pod_sets) != 1 or gang.pod_count != 1 or gang.siblings:
        return False
    return per_node_limit(problem) is None and not keeps_off_gpus(problem, gang.pod_sets[0])


def room_mask(
    problem: Problem, nodes: Sequence[Node], where: IntArray, whole: IntArray
) -> npt.NDArray[np.bool_]:
    """`room_for_one` of each candidate (the snapshot's `nodes` at `where`, with `whole`
    free GPUs each), as a mask: a few comparisons of columns for whole GPUs (or none)
    placed without a strict NUMA zone, read only off the candidates with the whole GPUs,
    else (or with a quantity past 64 bits) node by node."""
    ps = problem.gang.pod_sets[0]
    policy = problem.gang.numa_policy
    if not (ps.fractional or policy is NumaPolicy.SINGLE_NUMA_NODE):
        mask = whole >= ps.gpus if ps.gpus else np.ones(len(where), dtype=np.bool_)
        at = np.flatnonzero(mask)
        picked = list(map(nodes.__getitem__, where[at].tolist()))
        count = len(picked)
        try:
            room = np.fromiter(map(_PODS, picked), dtype=np.int64, count=count) > 0
            if ps.cpu_milli:
                room &= np.fromiter(map(_CPU, picked), dtype=np.int64, count=count) >= ps.cpu_milli
            if ps.memory_mib:
                room &= (np.fromiter(map(_MEMORY, picked), dtype=np.int64, count=count)
                         >= ps.memory_mib)
        except OverflowError:  # a quantity past 64 bits (a malformed dump): node by node
            pass
        else:
            mask[at] = room
            return mask
    return np.fromiter((room_for_one(nodes[i], ps, policy) > 0 for i in where.tolist()),
                       dtype=np.bool_, count=len(where))


def column_bounds(
    problem: Problem, cols: Candidates, sel: IntArray, whole: IntArray, weights: dict[str, int]
) -> FloatArray:
    """`onepod.scan_lower_bound` of the candidates at positions `sel` of `cols` (`whole`: each
    candidate's whole free GPUs), bit for bit:
    `pruning.pod_cost` (tier, VRAM, the rack's GPUs left free), the fixed terms, then
    `onepod.gpu_terms`, each added in the order those add them."""
    ps = problem.gang.pod_sets[0]
    share = ps.gpu_milli_per_pod
    cost = _pod_cost(problem, cols, sel, weights, ps)
    cost = cost + (weights["nodesUsed"] + weights["maxPodsPerNode"])
    if not ps.gpus:
        return cost
    free = problem.free_gpu_column()[cols.where[sel]]
    cost = cost + weights["fragmentation"] * (free - share) / GPU_WHOLE
    count = cols.gpu_count[sel]
    pristine = (count > 0) & (whole[sel] == count)
    broken = (count >= problem.config.island_min_gpus) & pristine & (share < free)
    members = _clique_members(problem, cols)[sel]
    broken_clique = (members > 0) & ((members > 1) | (share < free))
    islands = broken.astype(np.int64) + broken_clique.astype(np.int64)
    return np.asarray(cost + weights["islandsBroken"] * islands, dtype=np.float64)


def _clique_members(problem: Problem, cols: Candidates) -> IntArray:
    """Per candidate, how many members its clique has if all are pristine, else 0 (as
    `gpu_terms` looks it up: `pristine_cliques.get(node.clique or "", ())`)."""
    cliques = problem.pristine_cliques
    codes = clique_codes(problem.snapshot)
    size = np.zeros(len(codes.cliques) + 1, dtype=np.int64)  # per clique, then for none
    for clique, names in cliques.items():
        size[codes.index[clique]] = len(names)
    size[-1] = len(cliques.get("", ()))  # a node without a clique looks "" up
    code = codes.codes[cols.where]
    return size[np.where(code >= 0, code, len(codes.cliques))]


def _pod_cost(problem: Problem, cols: Candidates, sel: IntArray, weights: dict[str, int],
              ps: PodSet) -> FloatArray:
    """`pruning.pod_cost` of a one-pod gang's candidates at `sel`."""
    config, tier = problem.config, problem.gang.tier
    class_cost = np.array([config.class_cost(tier, c) for c in cols.classes], dtype=np.int64)
    cost = weights["tierMismatch"] * class_cost[cols.hw_class[sel]] * ps.gpu_milli_per_pod / 1000
    if ps.vram_mib and not ps.fractional and ps.gpus:  # objective.stranded_vram_gib
        floor = config.min_vram_utilization(tier) * cols.vram[sel]
        stranded = np.maximum(0.0, floor - ps.vram_mib) / 1024.0
    else:
        stranded = np.zeros(len(sel))
    cost = cost + (weights["vramStrandedGiB"] * ps.gpus) * stranded
    rack_level = len(problem.levels) - 2
    if weights["domainFragmentation"] and rack_level >= 0:
        racks = level_codes(problem.snapshot, problem.levels, rack_level)
        rack = racks.codes[cols.where[sel]]
        inside = rack >= 0
        free = problem.domain_free_gpu_milli(rack_level)
        per_rack = np.fromiter(map(free.get, racks.domains, repeat(0)), dtype=np.int64,
                               count=len(racks.domains))
        left = per_rack[np.where(inside, rack, 0)] - (ps.gpu_milli_per_pod if ps.gpus else 0)
        cost = np.where(inside, cost + weights["domainFragmentation"] * left / 1000, cost)
    return np.asarray(cost, dtype=np.float64)


def fleet_scan(
    problem: Problem, memo: NodeMemo, started: float, terms: OrderTerms, policy: str
) -> Placement | None:
    """`onepod.scan_candidates(problem, candidates(problem, memo), ...)`, or its shortfall
    answer, for a gang `columns_serve`; None for any other (see the module)."""
    if not columns_serve(problem):
        return None
    ps = problem.gang.pod_sets[0]
    names = problem.candidates[ps.name]
    if not names:
        return infeasible(problem.gang, policy, room_shortfall(problem, ps, 0), started)
    cols = candidate_columns(problem.snapshot, names, problem.node_class)
    nodes = list(problem.snapshot.nodes.values())
    whole = (problem.gpu_columns().whole[cols.where] if ps.gpus
             else np.zeros(len(names), dtype=np.int64))
    sel = np.flatnonzero(room_mask(problem, nodes, cols.where, whole)).astype(np.int64)
    if not len(sel):  # the required level's domains then hold none either
        return infeasible(problem.gang, policy, room_shortfall(problem, ps, 0), started)
    weights = term_weights(problem)
    bounds = column_bounds(problem, cols, sel, whole, weights)
    room = list(map(names.__getitem__, sel.tolist()))
    ranking = Ranking(rank_order(bounds.tolist(), room), len(room), [], True)
    met: set[tuple[object, ...]] = set()

    def first_of_class(name: str) -> bool:  # reduction.class_key of a node with room
        node = problem.node(name)
        if node.clique is not None and node.clique in problem.pristine_cliques:
            return True  # a pristine clique's member: never merged
        key = lone_class_key(problem, name, 1, memo)
        if key in met:
            return False
        met.add(key)
        return True

    return scan_ranked(problem, ranking, started, terms, policy, first_of_class)
