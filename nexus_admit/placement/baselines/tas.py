"""Kueue Topology Aware Scheduling, BestFit profile, ported from its published description.

Per pod set: count how many pods fit under every topology domain; pick the level (the
required one, or from the preferred/lowest level upward the first where one domain fits),
choose the tightest single domain that fits (or the fewest largest domains at the top
level), then descend level by level taking the largest children until the rest fits into
one child, for which the tightest fitting child is chosen.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace

from nexus_admit.model import (
    ClusterSnapshot,
    Domain,
    Gang,
    Placement,
    PlacementConfig,
    PodSet,
    Slot,
    apply_slots,
    fit_pod,
    pod_capacity,
)
from nexus_admit.placement.baselines.podbypod import domain_choices, finish, infeasible
from nexus_admit.placement.problem import Problem, prepare

__all__ = ["TasBestFitPolicy", "tas_counts"]


def _best_fit_take(states: dict[Domain, int], need: int) -> list[tuple[Domain, int]] | None:
    """Largest first until the remainder fits into one domain, then the tightest such one."""
    taken: list[tuple[Domain, int]] = []
    remaining = need
    pool = dict(states)
    while remaining > 0:
        fitting = [d for d, s in pool.items() if s >= remaining]
        if fitting:
            d = min(fitting, key=lambda d: (pool[d], d))
            taken.append((d, remaining))
            return taken
        if not pool:
            return None
        d = max(pool, key=lambda d: (pool[d], tuple(reversed(d))))
        if pool[d] <= 0:
            return None
        taken.append((d, pool[d]))
        remaining -= pool.pop(d)
    return taken


def tas_counts(
    problem: Problem, pod_set: PodSet, scratch: ClusterSnapshot
) -> dict[str, int] | None:
    """Pods per node for one pod set, or None when it does not fit under the request."""
    levels = problem.levels
    host = len(levels) - 1
    caps = {
        n: pod_capacity(scratch.nodes[n], pod_set, problem.gang.numa_policy)
        for n in problem.candidates[pod_set.name]
    }
    caps = {n: c for n, c in caps.items() if c > 0}
    state: list[dict[Domain, int]] = [defaultdict(int) for _ in levels]
    for n, c in caps.items():
        for li, d in enumerate(problem.paths[n]):
            if d is None:
                break
            state[li][d] += c
    need = pod_set.count
    gang = problem.gang
    chosen: list[tuple[Domain, int]] | None = None
    start = 0
    required = gang.level_of(pod_set)  # the pod set's own, the gang's, or none (a free driver)
    if required is not None:
        start = levels.index(required)
        fitting = {d: s for d, s in state[start].items() if s >= need}
        if not fitting:
            return None
        d = min(fitting, key=lambda d: (fitting[d], d))
        chosen = [(d, need)]
    else:
        lowest = levels.index(gang.preferred_level) if gang.preferred_level else host
        for li in range(lowest, -1, -1):
            fitting = {d: s for d, s in state[li].items() if s >= need}
            if fitting:
                d = min(fitting, key=lambda d: (fitting[d], d))
                chosen, start = [(d, need)], li
                break
        if chosen is None:
            chosen = _best_fit_take(dict(state[0]), need)
            start = 0
            if chosen is None:
                return None
    for li in range(start + 1, len(levels)):
        nxt: list[tuple[Domain, int]] = []
        for parent, count in chosen:
            children = {d: s for d, s in state[li].items() if d[: len(parent)] == parent}
            part = _best_fit_take(children, count)
            if part is None:
                return None
            nxt.extend(part)
        chosen = nxt
    return {d[-1]: count for d, count in chosen}


class TasBestFitPolicy:
    name = "tas-bestfit"

    def place(self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig) -> Placement:
        started = time.perf_counter()
        problem = prepare(snapshot, gang, config)
        if problem.impossible:
            return infeasible(gang, self.name, problem.impossible, started, impossible=True)
        # Under a required level the whole gang shares one domain: try the tightest first.
        for allowed in domain_choices(problem, _room(snapshot)):
            sub = problem
            if allowed is not None:
                sub = replace(
                    problem,
                    candidates={
                        p: [n for n in names if n in allowed]
                        for p, names in problem.candidates.items()
                    },
                )
            slots = self._place_in(sub, snapshot)
            if slots is not None:
                return finish(problem, self.name, slots, started)
        return infeasible(
            gang,
            self.name,
            f"no topology domain can hold the gang's {gang.pod_count} pods now",
            started,
        )

    @staticmethod
    def _place_in(problem: Problem, snapshot: ClusterSnapshot) -> list[Slot] | None:
        gang = problem.gang
        touched = {name for names in problem.candidates.values() for name in names}
        scratch = ClusterSnapshot({n: snapshot.nodes[n].copy() for n in touched})
        slots: list[Slot] = []
        for pod_set in gang.pod_sets:
            counts = tas_counts(problem, pod_set, scratch)
            if counts is None:
                return None
            one = Gang(gang.name, (pod_set,))
            index = 0
            for node_name in sorted(counts, key=lambda n: problem.paths[n]):
                for _ in range(counts[node_name]):
                    fit = fit_pod(scratch.nodes[node_name], pod_set, gang.numa_policy)
                    if fit is None:  # counts come from pod_capacity; only other sets interfere
                        return None
                    slot = Slot(pod_set.name, index, node_name, fit.gpu_indices, fit.numa_zone)
                    apply_slots(scratch, one, [slot])
                    slots.append(slot)
                    index += 1
        return slots


def _room(snapshot: ClusterSnapshot) -> Callable[[Problem, Sequence[str]], float]:
    """BestFit order of domains: the least room for the gang first (domains that cannot
    hold it are tried last; they fail fast)."""

    def rank(problem: Problem, members: Sequence[str]) -> float:
        total = 0
        for ps in problem.gang.pod_sets:
            room = sum(
                pod_capacity(snapshot.nodes[m], ps, problem.gang.numa_policy) for m in members
            )
            if room < ps.count:
                return float("inf")
            total += room
        return total

    return rank


def tas_bestfit_policy(seed: int) -> TasBestFitPolicy:
    return TasBestFitPolicy()
