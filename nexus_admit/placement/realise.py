"""Realisation: the model's pods per (pod set, unit) turned into pods on nodes with GPUs and
NUMA zones.

The model counts pods against aggregated capacities; GPU shares and NUMA zones are only
chosen here, so a count may not be realisable (`slots` then names the node) or may leave
more pods NUMA-unaligned than the model charged (`numa_shortfall`). The solve loop
(placement/cpsolve.py) cuts those counts and solves again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import permutations

from ortools.sat.python import cp_model

from nexus_admit.model import ClusterSnapshot, Gang, PodSet, Slot, apply_slots, fit_pod
from nexus_admit.placement.objective import numa_alignable
from nexus_admit.placement.problem import Problem

__all__ = ["fit_node", "node_counts", "numa_shortfall", "slots_for"]

_MAX_PERMUTED_POD_SETS = 4  # beyond this, only the hardest-first order is tried


def slots_for(problem: Problem, counts: dict[tuple[str, str], int]) -> list[Slot] | str:
    """Turn counts into pods with GPUs and NUMA zones; consecutive indices of a pod set
    go to neighbouring nodes (nodes ordered by their topology path). Returns the name
    of a node that cannot hold its counts when the aggregated model over-promised."""
    nodes = sorted({n for _, n in counts}, key=problem.path_key)
    fits: dict[str, list[tuple[PodSet, Slot]]] = {}
    for name in nodes:
        on_node = fit_node(problem, name, counts)
        if on_node is None:
            return name
        fits[name] = on_node
    slots: list[Slot] = []
    for pod_set in problem.gang.pod_sets:
        index = 0
        for name in nodes:
            for owner, slot in fits[name]:
                if owner is pod_set:
                    slots.append(Slot(pod_set.name, index, name, slot.gpu_indices, slot.numa_zone))
                    index += 1
    return slots


def fit_node(
    problem: Problem, name: str, counts: dict[tuple[str, str], int]
) -> list[tuple[PodSet, Slot]] | None:
    """GPUs and NUMA zones for the pods counted on one node, or None if they do not fit.
    The hardest pods go first; when that greedy order strands a pod or leaves one
    NUMA-unaligned (zones packed the wrong way), the other orders of the pod sets are
    tried and the one with the fewest unaligned pods wins."""
    present = [ps for ps in problem.gang.pod_sets if counts.get((ps.name, name), 0)]
    hardest = sorted(present, key=lambda p: (-p.whole_gpus, -p.gpu_milli, -p.cpu_milli))
    orders = [hardest]
    if len(present) <= _MAX_PERMUTED_POD_SETS:
        orders += [list(o) for o in permutations(hardest) if list(o) != hardest]
    node = problem.node(name)
    best: tuple[int, list[tuple[PodSet, Slot]]] | None = None
    for order in orders:
        placed = _fit_in_order(problem, name, counts, order)
        if placed is None:
            continue
        unaligned = sum(
            1 for ps, slot in placed if slot.numa_zone is None and numa_alignable(node, ps)
        )
        if best is None or unaligned < best[0]:
            best = (unaligned, placed)
        if unaligned == 0:
            break
    return best[1] if best else None


def _fit_in_order(
    problem: Problem, name: str, counts: dict[tuple[str, str], int], order: list[PodSet]
) -> list[tuple[PodSet, Slot]] | None:
    """The pods counted on node `name`, fitted pod set by pod set in `order` on a copy of
    the node, or None when one does not fit."""
    gang = problem.gang
    scratch = ClusterSnapshot({name: problem.node(name).copy()})
    placed: list[tuple[PodSet, Slot]] = []
    for pod_set in order:
        one = Gang(gang.name, (pod_set,))
        for i in range(counts[(pod_set.name, name)]):
            fit = fit_pod(scratch.nodes[name], pod_set, gang.numa_policy)
            if fit is None:
                return None
            slot = Slot(pod_set.name, i, name, fit.gpu_indices, fit.numa_zone)
            apply_slots(scratch, one, [slot])
            placed.append((pod_set, slot))
    return placed


def node_counts(
    caps: dict[tuple[str, str], int],
    units: dict[str, list[str]],
    solver: cp_model.CpSolver,
    pods: dict[tuple[str, str], cp_model.IntVar],
    used: dict[str, cp_model.IntVar],
) -> dict[tuple[str, str], int]:
    """Spread each unit's pods over as many of its nodes as the solution uses: fill
    nodes completely first (that is what `filled` counted), at least one pod on each."""
    counts: dict[tuple[str, str], int] = {}
    for (pod_set, rep), var in pods.items():
        total = solver.value(var)
        if total <= 0:
            continue
        members = units[rep]
        if len(members) == 1:
            counts[(pod_set, rep)] = total
            continue
        nodes_used = max(1, solver.value(used[rep]))
        cap = caps[(pod_set, rep)]
        for i, name in enumerate(members[:nodes_used]):
            take = min(cap, total - (nodes_used - i - 1))
            counts[(pod_set, name)] = take
            total -= take
    return counts


def numa_shortfall(
    problem: Problem,
    units: dict[str, list[str]],
    slots: Sequence[Slot],
    solver: cp_model.CpSolver,
    unaligned: dict[str, list[cp_model.LinearExprT]],
) -> dict[str, int]:
    """Per unit, how many more pods the realised slots leave NUMA-unaligned than the
    model counted (only where that is more)."""
    if not problem.config.weights.numa_unaligned:
        return {}
    unit_of = {n: rep for rep, members in units.items() for n in members}
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
