"""A burst placed jointly: the gangs waiting at once in one CP-SAT model, never worse on any
objective term than placing them one by one in Kueue's order.

The one-by-one answers come first (the caller's ordinary pass: `decide` per gang, each on
the capacity the earlier ones left). `BatchEngine.place_burst` then puts the burst's gangs
that the plain "Place" rung solved into one model over the capacity before any of them:
one `cpmodel.build_model` per gang in a shared `CpModel`, and each node's CPU, memory, pods
and GPUs shared between the gangs. In that model

- every gang placed one by one is placed again (its pods per pod set are fixed, not its
  nodes), and its own weighted objective may not exceed what its one-by-one slots cost in
  the same model (`each_gang=False`: only their sum is bounded, so one gang may give way
  to another); the one-by-one slots are the solution hint, so the model is feasible;
- gangs that found no room one by one are added in Kueue's order, one at a time, each
  only if the model stays feasible with it and every earlier one added: a later gang never
  takes what an earlier one needs to fit (an earlier gang whose model timed out stops the
  additions);
- the objective is the sum of the gangs' engine objectives, each charged what it costs
  on the capacity the burst's earlier gangs leave (`_ordered_terms`: GPUs they took are
  not idle, a node they started is no pristine island; NVLink cliques are not corrected).

The joint answer is realised gang by gang in order (GPUs, NUMA zones) and evaluated the
way the one-by-one answers are: each gang's terms (`objective.evaluate_terms` and the
engine's order terms) on the capacity the earlier gangs of the burst left. It is taken
only when every term summed over the gangs placed one by one is no higher than one by one
and it places more gangs or has a lower objective; otherwise the one-by-one answers stand.
Preemption, drains and fractional-GPU gangs stay one by one (their slots count as taken).

Bounded: at most `MAX_BURST_GANGS` gangs join (the rest keep their one-by-one answers, as
taken capacity), each solve has the config's time limit, additions stop after
`budget_seconds`, and a gang with more candidate nodes than `solver.maxCandidateNodes`
(where the engine would prune) stays one by one.

Pure: no client, no clock beyond measuring its own time; it never changes the snapshot.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ortools.sat.python import cp_model

from nexus_admit.model import (
    ClusterSnapshot,
    Domain,
    Gang,
    Placement,
    PlacementConfig,
    Slot,
    SolveStatus,
    apply_slots,
)
from nexus_admit.placement.baselines.podbypod import finish
from nexus_admit.placement.cpmodel import GangModel, build_model
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.fragmentation import WorkloadDistribution
from nexus_admit.placement.memo import NodeMemo
from nexus_admit.placement.objective import (
    TERMS,
    evaluate_terms,
    term_weights,
    weighted_objective,
)
from nexus_admit.placement.order_terms import SCALE, OrderTerms
from nexus_admit.placement.problem import Problem, prepare
from nexus_admit.placement.realise import slots_for
from nexus_admit.placement.reduction import Reduction, candidates, shortfall

__all__ = ["MAX_BURST_GANGS", "BatchEngine", "BurstEntry", "BurstOutcome", "batch_policy"]

MAX_BURST_GANGS = 8
_EPS = 1e-6

Counts = dict[tuple[str, str], int]  # (pod set, node) -> pods


@dataclass(frozen=True, slots=True)
class BurstEntry:
    """One gang of the burst, in Kueue's order: the gang as the Place rung solved it
    (backfill and drains applied) and its one-by-one answer."""

    gang: Gang
    placement: Placement


@dataclass(slots=True)
class BurstOutcome:
    """The burst's answers, per entry in order: the joint ones when `joint`, else the
    one-by-one answers unchanged. Terms (each weighted as the gang's objective weighs it)
    and objectives are summed over the gangs placed one by one, each evaluated on the
    capacity the burst's earlier gangs left."""

    placements: list[Placement]
    joint: bool
    reason: str
    solve_seconds: float = 0.0
    gangs: int = 0  # gangs in the joint model (0: no joint model was built)
    placed_one_by_one: int = 0
    placed_jointly: int = 0
    terms_one_by_one: dict[str, float] = field(default_factory=dict)
    terms_joint: dict[str, float] = field(default_factory=dict)
    objective_one_by_one: float = 0.0
    objective_joint: float | None = None


@dataclass(slots=True)
class _Joined:
    """A gang in the joint model: its entry index, the problem the engine solves for it
    (a localityWait hold binds its level), the candidate nodes, and its one-by-one counts
    (None for a gang that found no room one by one)."""

    index: int
    problem: Problem
    red: Reduction
    counts: Counts | None
    bound: int | None = None  # its model objective at its one-by-one slots


@dataclass(slots=True)
class _Evaluated:
    slots: dict[int, list[Slot]]  # entry index -> slots, gangs of the model only
    terms: dict[str, float]
    objective: float
    per_gang: dict[int, tuple[Problem, dict[str, tuple[float, int]]]]


class BatchEngine(CpSatEngine):
    """The nexus engine (one gang at a time, unchanged) that can also place a burst jointly
    (`place_burst`). Its name marks its placements as the batch policy's."""

    name = "nexus-batch"

    def __init__(self, seed: int = 0, *, budget_seconds: float | None = None,
                 each_gang: bool = True,
                 workload: WorkloadDistribution | None = None) -> None:
        super().__init__(seed, workload=workload)
        self.budget_seconds = budget_seconds
        # True: each gang placed one by one keeps its own objective at most its one-by-one
        # value (Kueue's order as priority in quality too); False: only the burst's total
        # is bounded in the model, so one gang may give way to another while every term
        # summed over the burst is still no higher (docs/simulator.md measures both)
        self.each_gang = each_gang

    def place_burst(
        self,
        snapshot: ClusterSnapshot,
        burst: Sequence[BurstEntry],
        config: PlacementConfig,
        admit: Callable[[Sequence[Gang]], bool] = lambda extra: True,
    ) -> BurstOutcome:
        """`snapshot`: the capacity before any gang of `burst` took its one-by-one slots
        (everything else counted). `admit(extra)`: whether these gangs, which found no room
        one by one, may all be placed besides (the caller's quota). Never mutates
        `snapshot`."""
        started = time.perf_counter()
        answers = [e.placement for e in burst]
        work = snapshot.copy()
        memo = NodeMemo()
        joined = self._joinable(work, burst, config, memo)
        members = [j for j in joined if j.counts is not None]
        extras = [j for j in joined if j.counts is None]
        alone = sum(p.feasible for p in answers)
        kept = BurstOutcome(answers, False, "", placed_one_by_one=alone, placed_jointly=alone)
        if not members or (len(members) == 1 and not extras):
            kept.reason = "nothing to place jointly"
            return _timed(kept, started)
        joined_at = {j.index for j in joined}
        for k, entry in enumerate(burst):  # one-by-one answers that stay count as taken
            if k not in joined_at and entry.placement.feasible:
                apply_slots(work, entry.gang, entry.placement.slots)
        memo.sync(work, config)
        for j in joined:  # the problems again, on the capacity the fixed gangs left
            j.problem = self._problem(work, burst[j.index].gang, config)
            j.red = candidates(j.problem, memo)
        extras = [j for j in extras if not shortfall(j.problem, j.red)]
        if len(members) == 1 and not extras:
            kept.reason = "nothing to place jointly"
            return _timed(kept, started)
        if not all(_within(j) for j in members):
            kept.reason = "one-by-one slots outside the joint model"
            return _timed(kept, started)
        terms = OrderTerms(memo, self.workload)
        sequential = {j.index: _slots(answers[j.index]) for j in members}
        one_by_one = _evaluate(snapshot, config, burst, sequential, joined, self.workload)
        kept.terms_one_by_one = one_by_one.terms
        kept.objective_one_by_one = one_by_one.objective
        if not _bounds(members, terms, self._seed):
            kept.reason = "the one-by-one slots could not be costed in the joint model"
            return _timed(kept, started)
        found = self._search(work, burst, config, members, extras, terms, admit, started)
        kept.gangs = len(members) + len(extras)
        if found is None:
            kept.reason = "no joint answer within the time limit"
            return _timed(kept, started)
        chosen, placed = found
        joint = _evaluate(snapshot, config, burst, chosen, joined, self.workload)
        kept.terms_joint, kept.objective_joint = joint.terms, joint.objective
        worse = [t for t, v in joint.terms.items() if v > one_by_one.terms.get(t, 0.0) + _EPS]
        more = len(placed) > len(members)
        better = joint.objective < one_by_one.objective - _EPS
        if worse or not (more or better):
            kept.reason = (f"joint answer worse on {', '.join(worse)}" if worse
                           else "joint answer no better")
            return _timed(kept, started)
        out = list(answers)
        for k, slots in chosen.items():
            problem, order = joint.per_gang[k]
            placement = finish(problem, self.name, slots, started, SolveStatus.FEASIBLE, order)
            placement.explanation.append(
                f"placed jointly with {len(chosen) - 1} other gang(s) of the burst "
                f"(never worse on any term than one by one)")
            out[k] = placement
        kept.placements, kept.joint = out, True
        kept.placed_jointly = kept.placed_one_by_one + len(placed) - len(members)
        kept.reason = "more gangs placed" if more else "lower objective"
        return _timed(kept, started)

    # ------------------------------------------------------------------ the steps
    def _problem(self, snapshot: ClusterSnapshot, gang: Gang,
                 config: PlacementConfig) -> Problem:
        """The problem `place` solves for `gang`: inside one domain under a localityWait
        hold."""
        problem = prepare(snapshot, gang, config)
        level = self._locality_hold(problem) if config.locality_wait else None
        return problem if level is None else prepare(
            snapshot, replace(gang, required_level=level), config)

    def _joinable(self, snapshot: ClusterSnapshot, burst: Sequence[BurstEntry],
                  config: PlacementConfig, memo: NodeMemo) -> list[_Joined]:
        """The first `MAX_BURST_GANGS` gangs the joint model can take: placed, or waiting
        for room (retryable), no fractional GPUs, no more candidates than the engine keeps
        unpruned."""
        memo.sync(snapshot, config)
        out: list[_Joined] = []
        for k, entry in enumerate(burst):
            if len(out) >= MAX_BURST_GANGS:
                break
            answer = entry.placement
            if not (answer.feasible or answer.retryable):
                continue
            if any(ps.fractional for ps in entry.gang.pod_sets):
                continue
            try:
                problem = self._problem(snapshot, entry.gang, config)
            except ValueError:
                continue
            if problem.impossible:
                continue
            red = candidates(problem, memo)
            if len(red.nodes) > config.solver.max_candidate_nodes:
                continue
            counts = Counter((s.pod_set, s.node) for s in answer.slots) if answer.feasible \
                else None
            out.append(_Joined(k, problem, red, dict(counts) if counts is not None else None))
        return out

    def _search(self, work: ClusterSnapshot, burst: Sequence[BurstEntry],
                config: PlacementConfig, members: list[_Joined], extras: list[_Joined],
                terms: OrderTerms, admit: Callable[[Sequence[Gang]], bool],
                started: float) -> tuple[dict[int, list[Slot]], list[_Joined]] | None:
        """The best joint answer: the gangs placed one by one, plus those waiting that fit
        in Kueue's order; (slots per entry, gangs placed) or None."""
        budget = self.budget_seconds or 2 * config.solver.time_limit_seconds
        limit = self._time_limit or config.solver.time_limit_seconds
        best: tuple[dict[int, list[Slot]], list[_Joined]] | None = None
        accepted: list[_Joined] = []
        for extra in extras:
            if time.perf_counter() - started > budget:
                break
            if not admit([burst[j.index].gang for j in (*accepted, extra)]):
                continue
            gangs = sorted([*members, *accepted, extra], key=lambda j: j.index)
            status, slots = _solve_joint(work, gangs, terms, self._seed, limit,
                                         each_gang=self.each_gang)
            if status == cp_model.UNKNOWN:
                break  # not known within the limit: a later gang must not pass it
            if slots is None:
                continue  # it does not fit beside the earlier ones
            accepted.append(extra)
            best = (slots, [*members, *accepted])
        if best is None:
            _, slots = _solve_joint(work, members, terms, self._seed, limit,
                                    each_gang=self.each_gang)
            best = (slots, members) if slots is not None else None
        return best


def batch_policy(seed: int) -> BatchEngine:
    return BatchEngine(seed)


# ---------------------------------------------------------------------- helpers
def _timed(outcome: BurstOutcome, started: float) -> BurstOutcome:
    outcome.solve_seconds = time.perf_counter() - started
    return outcome


def _slots(placement: Placement) -> list[Slot]:
    return list(placement.slots)


def _within(joined: _Joined) -> bool:
    """Whether the one-by-one counts fit the gang's candidates (they do unless the capacity
    changed under it)."""
    assert joined.counts is not None
    return all(joined.red.caps.get(key, 0) >= n for key, n in joined.counts.items())


def _models(gangs: Sequence[_Joined], terms: OrderTerms,
            model: cp_model.CpModel) -> list[tuple[GangModel, cp_model.LinearExpr]]:
    """Every gang's model in `model`, nodes shared; per gang, its objective on the capacity
    the earlier gangs of the burst leave (the engine's objective, corrected by
    `_ordered_terms`). The model's objective is their sum."""
    gms = [build_model(j.problem, j.red, terms, model) for j in gangs]
    _share_nodes(model, gms)
    out = []
    for k, gm in enumerate(gms):
        rebate = [-1 * term for term in _ordered_terms(model, gm, gms[:k])]
        out.append((gm, cp_model.LinearExpr.sum([*gm.objective, *rebate])))
    model.minimize(cp_model.LinearExpr.sum([objective for _, objective in out]))
    return out


def _gpu_milli(gm: GangModel, rep: str) -> cp_model.LinearExprT:
    return sum(ps.gpu_milli_per_pod * v for ps, v in gm.by_unit.get(rep, ()) if ps.gpus)


def _ordered_terms(model: cp_model.CpModel, gm: GangModel,
                   earlier: Sequence[GangModel]) -> list[cp_model.LinearExprT]:
    """What the engine's model over-charges a gang whose nodes the burst's earlier gangs
    use: GPUs they took are no longer idle (fragmentation, and domainFragmentation per
    rack), and a node they started is no longer a pristine island to break."""
    weights, problem = gm.weights, gm.problem
    out: list[cp_model.LinearExprT] = []
    for rep, gpu_used in gm.gpu_used.items():
        before = [e for e in earlier if rep in e.gpu_used]
        if not before:
            continue
        free = problem.node(rep).free_gpu_milli
        if weights["fragmentation"]:
            taken = model.new_int_var(0, free, f"taken_before[{rep}]")
            model.add(taken <= sum(_gpu_milli(e, rep) for e in before))
            model.add(taken <= free * gpu_used)
            out.append(weights["fragmentation"] * taken)
        if weights["islandsBroken"] and rep in gm.filled and problem.is_island(problem.node(rep)):
            started = model.new_bool_var(f"started_before[{rep}]")
            model.add(started <= sum(e.gpu_used[rep] for e in before))
            spared = model.new_bool_var(f"not_broken_again[{rep}]")
            model.add(spared <= started)
            model.add(spared <= gpu_used)
            model.add(spared <= 1 - gm.filled[rep])
            out.append(weights["islandsBroken"] * SCALE * spared)
    if weights["domainFragmentation"] and len(problem.levels) >= 2:
        out.extend(_rack_taken_before(model, gm, earlier))
    return out


def _rack_taken_before(model: cp_model.CpModel, gm: GangModel,
                       earlier: Sequence[GangModel]) -> list[cp_model.LinearExprT]:
    """domainFragmentation: the GPUs the earlier gangs take in a rack this gang touches."""
    problem = gm.problem
    level = len(problem.levels) - 2
    racks: dict[Domain, list[str]] = {}
    for rep in gm.used:
        domain = problem.paths[rep][level]
        if domain is not None:
            racks.setdefault(domain, []).append(rep)
    out: list[cp_model.LinearExprT] = []
    free = problem.domain_free_gpu_milli(level)
    for rack, reps in racks.items():
        before = [_gpu_milli(e, n) for e in earlier for n in e.by_unit
                  if e.problem.paths[n][level] == rack]
        if not before:
            continue
        touched = model.new_bool_var(f"touches[{rack}]")
        model.add(touched <= sum(gm.used[n] for n in reps))
        room = free.get(rack, 0)
        taken = model.new_int_var(0, room, f"rack_taken_before[{rack}]")
        model.add(taken <= sum(before))
        model.add(taken <= room * touched)
        out.append(gm.weights["domainFragmentation"] * taken)
    return out


def _share_nodes(model: cp_model.CpModel, gms: Sequence[GangModel]) -> None:
    """Each node's free capacity shared by every gang's pods on it (whole GPUs only)."""
    on_node: dict[str, list[tuple[GangModel, str]]] = {}
    for gm in gms:
        for rep in gm.by_unit:
            on_node.setdefault(rep, []).append((gm, rep))
    for name, users in on_node.items():
        if len(users) < 2:
            continue
        node = gms[0].problem.node(name)
        entries = [(ps, v) for gm, rep in users for ps, v in gm.by_unit[rep]]
        model.add(sum(ps.cpu_milli * v for ps, v in entries) <= node.free_cpu_milli)
        model.add(sum(ps.memory_mib * v for ps, v in entries) <= node.free_memory_mib)
        model.add(sum(v for _, v in entries) <= node.free_pods)
        model.add(sum(ps.whole_gpus * v for ps, v in entries) <= node.free_whole_gpus)


def _solver(seed: int, limit: float) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = limit
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    solver.parameters.linearization_level = 2
    return solver


def _bounds(members: Sequence[_Joined], terms: OrderTerms, seed: int) -> bool:
    """Each member's model objective at its one-by-one counts (its bound in the joint
    model): one model with every count fixed."""
    model = cp_model.CpModel()
    gms = _models(members, terms, model)
    for (gm, _), j in zip(gms, members, strict=True):
        assert j.counts is not None
        for key, var in gm.pods.items():
            model.add(var == j.counts.get(key, 0))
    solver = _solver(seed, 5.0)
    if solver.solve(model) != cp_model.OPTIMAL:
        return False
    for (_, objective), j in zip(gms, members, strict=True):
        j.bound = int(solver.value(objective))
    return True


def _solve_joint(
    work: ClusterSnapshot, gangs: Sequence[_Joined], terms: OrderTerms, seed: int,
    limit: float, *, each_gang: bool
) -> tuple[cp_model.CpSolverStatus, dict[int, list[Slot]] | None]:
    """(status, slots per entry realised in order) of one joint model; slots None when no
    solution was found or it could not be realised."""
    model = cp_model.CpModel()
    gms = _models(gangs, terms, model)
    bounded = [(objective, j.bound) for (_, objective), j in zip(gms, gangs, strict=True)
               if j.bound is not None]
    if each_gang:
        for objective, bound in bounded:
            model.add(objective <= bound)
    else:
        model.add(cp_model.LinearExpr.sum([o for o, _ in bounded])
                  <= sum(b for _, b in bounded))
    for (gm, _), j in zip(gms, gangs, strict=True):
        if j.counts is None:
            continue
        for key, var in gm.pods.items():
            model.add_hint(var, j.counts.get(key, 0))
        for rep, var in gm.used.items():
            model.add_hint(var, int(any(j.counts.get((ps.name, rep), 0)
                                        for ps in j.problem.gang.pod_sets)))
    solver = _solver(seed, limit)
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return status, None
    scratch = work.copy()
    out: dict[int, list[Slot]] = {}
    for (gm, _), j in zip(gms, gangs, strict=True):
        counts = {key: int(solver.value(v)) for key, v in gm.pods.items() if solver.value(v)}
        problem = prepare(scratch, j.problem.gang, j.problem.config)
        slots = slots_for(problem, counts)
        if isinstance(slots, str):
            return status, None  # GPUs or NUMA zones shared across gangs: not realisable
        apply_slots(scratch, j.problem.gang, slots)
        out[j.index] = slots
    return status, out


def _evaluate(snapshot: ClusterSnapshot, config: PlacementConfig, burst: Sequence[BurstEntry],
              slots: dict[int, list[Slot]], joined: Sequence[_Joined],
              workload: WorkloadDistribution) -> _Evaluated:
    """The burst in Kueue's order on `snapshot` (the capacity before any of its gangs): the
    gangs of the model on `slots`, the others on their one-by-one answers. Each gang placed
    one by one is charged its terms on the capacity the earlier gangs left, weighted as its
    objective weighs them (a term the gang's objective leaves out counts 0), summed; a gang
    that stayed out of the model counts too, since a joined gang before it that moves
    changes what it sees."""
    scratch = snapshot.copy()
    by_index = {j.index: j for j in joined}
    total: dict[str, float] = dict.fromkeys(TERMS, 0.0)
    objective = 0.0
    per_gang: dict[int, tuple[Problem, dict[str, tuple[float, int]]]] = {}
    for k, entry in enumerate(burst):
        if k in slots:
            gang, taken = by_index[k].problem.gang, slots[k]
        elif entry.placement.feasible and k not in by_index:
            gang, taken = entry.gang, entry.placement.slots
        else:
            continue  # not placed, or a joined gang left out of this answer
        problem = prepare(scratch, gang, config)
        order = OrderTerms(NodeMemo(), workload).values(problem, taken)
        if k in slots:
            per_gang[k] = (problem, order)
        if entry.placement.feasible:
            values = evaluate_terms(problem, taken)
            objective += weighted_objective(problem, values)
            weights = term_weights(problem)
            for name, value in values.items():
                total[name] += weights[name] * value
            for name, (value, weight) in order.items():
                objective += weight * value
                total[name] = total.get(name, 0.0) + weight * value
        apply_slots(scratch, gang, taken)
    return _Evaluated(slots, total, objective, per_gang)
