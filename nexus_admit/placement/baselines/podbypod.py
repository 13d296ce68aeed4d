"""Pod-by-pod baselines: place one pod at a time on the best-scoring feasible node, the way
kube-scheduler and the simulators of the literature do, all-or-nothing for the gang.

A policy is a `NodeOptions` function: for one node and one pod it yields (score, fit)
options, lower score better. Scores depend only on the node's own state, so after a pod is
placed only that node is re-scored (a heap with lazy invalidation keeps each pod O(log N)).
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from nexus_admit.model import (
    ClusterSnapshot,
    Fit,
    Gang,
    Node,
    Placement,
    PlacementConfig,
    PodSet,
    Slot,
    SolveStatus,
    apply_slots,
    fit_pod,
)
from nexus_admit.placement.explain import explain
from nexus_admit.placement.objective import evaluate_terms, weighted_objective
from nexus_admit.placement.problem import Problem, prepare

__all__ = [
    "NodeOptions",
    "PodByPodPolicy",
    "RandomPolicy",
    "infeasible",
    "single_fit_options",
]

NodeOptions = Callable[[Node, PodSet, Problem], Iterable[tuple[float, Fit]]]
# Restricts a pod set's candidate nodes before scoring (e.g. to one topology domain).
CandidateFilter = Callable[[Problem, PodSet, ClusterSnapshot], Sequence[str] | None]


def single_fit_options(score: Callable[[Node, PodSet, Fit, Problem], float]) -> NodeOptions:
    """Options from `fit_pod`'s own GPU choice, scored by `score`."""

    def options(node: Node, pod_set: PodSet, problem: Problem) -> Iterable[tuple[float, Fit]]:
        fit = fit_pod(node, pod_set, problem.gang.numa_policy)
        if fit is not None:
            yield score(node, pod_set, fit, problem), fit

    return options


def infeasible(
    gang: Gang, policy: str, reason: str, started: float, *, impossible: bool = False
) -> Placement:
    return Placement(
        gang=gang.name,
        policy=policy,
        feasible=False,
        status=SolveStatus.IMPOSSIBLE if impossible else SolveStatus.INFEASIBLE,
        reason=reason,
        solve_seconds=time.perf_counter() - started,
        explanation=[reason],
    )


def finish(
    problem: Problem,
    policy: str,
    slots: list[Slot],
    started: float,
    status: SolveStatus = SolveStatus.HEURISTIC,
    extra_terms: Mapping[str, tuple[float, int]] | None = None,
    shared_terms: dict[str, float] | None = None,
) -> Placement:
    """A feasible Placement with every shared term (objective.py), plus `extra_terms`
    (name -> (value, weight)) that only the calling policy can evaluate. `shared_terms`:
    `evaluate_terms(problem, slots)` when the caller has it already (then taken over)."""
    terms = evaluate_terms(problem, slots) if shared_terms is None else shared_terms
    objective = weighted_objective(problem, terms)
    for name, (value, weight) in (extra_terms or {}).items():
        terms[name] = value
        objective += weight * value
    placement = Placement(
        gang=problem.gang.name,
        policy=policy,
        feasible=True,
        status=status,
        slots=slots,
        terms=terms,
        objective=objective,
        solve_seconds=time.perf_counter() - started,
    )
    placement.explanation = explain(problem, placement)
    return placement


class PodByPodPolicy:
    def __init__(
        self,
        name: str,
        options: NodeOptions,
        restrict: CandidateFilter | None = None,
    ) -> None:
        self.name = name
        self._options = options
        self._restrict = restrict

    def place(self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig) -> Placement:
        started = time.perf_counter()
        problem = prepare(snapshot, gang, config)
        if problem.impossible:
            return infeasible(gang, self.name, problem.impossible, started, impossible=True)
        for allowed in domain_choices(problem, self._domain_rank):
            slots = self._place_all(problem, snapshot, allowed)
            if slots is not None:
                return finish(problem, self.name, slots, started)
        where = f" inside one {gang.required_level} domain" if gang.required_level else ""
        return infeasible(
            gang, self.name, f"the gang's {gang.pod_count} pods do not all fit{where} now", started
        )

    def _domain_rank(self, problem: Problem, members: Sequence[str]) -> float:
        """Try first the domain holding this policy's favourite node for the first pod."""
        ps = problem.gang.pod_sets[0]
        scores = [
            best[0]
            for m in members
            if (best := self._best(problem.node(m), ps, problem)) is not None
        ]
        return min(scores, default=float("inf"))

    def _place_all(
        self, problem: Problem, snapshot: ClusterSnapshot, allowed: set[str] | None
    ) -> list[Slot] | None:
        touched = {n for names in problem.candidates.values() for n in names}
        if allowed is not None:
            touched &= allowed
        scratch = ClusterSnapshot(
            {name: snapshot.nodes[name].copy() for name in touched}, snapshot.kueue_topologies
        )
        slots: list[Slot] = []
        for pod_set in problem.gang.pod_sets:
            names = [n for n in problem.candidates[pod_set.name] if n in touched]
            if self._restrict is not None:
                restricted = self._restrict(problem, pod_set, scratch)
                if restricted is None:
                    return None
                names = list(restricted)
            placed = self._place_pod_set(problem, pod_set, scratch, names)
            if placed is None:
                return None
            slots.extend(placed)
        return slots

    def _best(self, node: Node, pod_set: PodSet, problem: Problem) -> tuple[float, Fit] | None:
        best: tuple[float, Fit] | None = None
        for score, fit in self._options(node, pod_set, problem):
            if best is None or score < best[0]:
                best = (score, fit)
        return best

    def _place_pod_set(
        self, problem: Problem, pod_set: PodSet, scratch: ClusterSnapshot, names: Sequence[str]
    ) -> list[Slot] | None:
        order = {name: i for i, name in enumerate(names)}
        heap: list[tuple[float, int, str, int]] = []
        version = dict.fromkeys(names, 0)
        fits: dict[str, Fit] = {}
        for name in names:
            best = self._best(scratch.nodes[name], pod_set, problem)
            if best is not None:
                fits[name] = best[1]
                heap.append((best[0], order[name], name, 0))
        heapq.heapify(heap)
        slots: list[Slot] = []
        one = Gang(problem.gang.name, (pod_set,))
        for index in range(pod_set.count):
            while heap and heap[0][3] != version[heap[0][2]]:
                heapq.heappop(heap)
            if not heap:
                return None
            _, _, name, _ = heapq.heappop(heap)
            fit = fits[name]
            slot = Slot(pod_set.name, index, name, fit.gpu_indices, fit.numa_zone)
            apply_slots(scratch, one, [slot])
            slots.append(slot)
            version[name] += 1
            best = self._best(scratch.nodes[name], pod_set, problem)
            if best is not None:
                fits[name] = best[1]
                heapq.heappush(heap, (best[0], order[name], name, version[name]))
        return slots


class RandomPolicy:
    """A uniformly random feasible node for every pod."""

    def __init__(self, seed: int = 0) -> None:
        self.name = "random"
        self._rng = random.Random(seed)

    def place(self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig) -> Placement:
        started = time.perf_counter()
        problem = prepare(snapshot, gang, config)
        if problem.impossible:
            return infeasible(gang, self.name, problem.impossible, started, impossible=True)
        for allowed in domain_choices(problem, lambda _p, _m: self._rng.random()):
            slots = self._place_all(problem, snapshot, allowed)
            if slots is not None:
                return finish(problem, self.name, slots, started)
        return infeasible(gang, self.name, "some pod fits nowhere", started)

    def _place_all(
        self, problem: Problem, snapshot: ClusterSnapshot, allowed: set[str] | None
    ) -> list[Slot] | None:
        scratch = snapshot.copy()
        slots: list[Slot] = []
        for pod_set in problem.gang.pod_sets:
            one = Gang(problem.gang.name, (pod_set,))
            names = [n for n in problem.candidates[pod_set.name] if allowed is None or n in allowed]
            for index in range(pod_set.count):
                self._rng.shuffle(names)
                for name in names:
                    fit = fit_pod(scratch.nodes[name], pod_set, problem.gang.numa_policy)
                    if fit is not None:
                        slot = Slot(pod_set.name, index, name, fit.gpu_indices, fit.numa_zone)
                        apply_slots(scratch, one, [slot])
                        slots.append(slot)
                        break
                else:
                    return None
        return slots


def domain_choices(
    problem: Problem, rank: Callable[[Problem, Sequence[str]], float]
) -> list[set[str] | None]:
    """The node sets to try in turn: everything, or, under a required topology level, one
    domain of that level at a time in `rank` order (lowest first)."""
    if problem.gang.required_level is None:
        return [None]
    li = problem.levels.index(problem.gang.required_level)
    domains: dict[object, list[str]] = {}
    for names in problem.candidates.values():
        for n in names:
            d = problem.paths[n][li]
            if d is not None:
                domains.setdefault(d, []).append(n)
    ranked = sorted(domains.values(), key=lambda members: rank(problem, members))
    return [set(members) for members in ranked]
