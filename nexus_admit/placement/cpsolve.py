"""Solving the gang's model and realising the solution: solve, turn the counts into slots
(realise.py), and when the counts cannot be realised or leave more pods NUMA-unaligned than
the model charged, cut them and solve again (at most `_MAX_REALISATION_CUTS` times).

CP-SAT's solve releases the interpreter's lock, so while it runs the caller's other Python
work can use another core: `SolveSettings.alongside` is run in a thread of its own for the
length of each solve, then told to stop and joined before anything else here runs again
(so it never runs beside the engine's own Python code).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from nexus_admit.model import Placement, PlacementConfig, Slot, SolveStatus
from nexus_admit.placement.base import Alongside
from nexus_admit.placement.baselines.podbypod import finish, infeasible
from nexus_admit.placement.cpmodel import GangModel
from nexus_admit.placement.order_terms import SCALE, OrderTerms
from nexus_admit.placement.realise import node_counts, numa_shortfall, slots_for

__all__ = ["SolveSettings", "solve_model"]

log = logging.getLogger(__name__)

_MAX_REALISATION_CUTS = 5


@dataclass(frozen=True, slots=True)
class SolveSettings:
    """What the engine was built with: the solver's seed, a time limit overriding the
    config's, whether the candidates were reduced, and the caller's work beside a solve."""

    seed: int
    time_limit: float | None
    reduced: bool
    policy: str
    alongside: Alongside | None = None


@dataclass(slots=True)
class _Realised:
    """Slots realised from a solution, whether the model costed them exactly, and the
    model's objective and bound for them."""

    slots: list[Slot]
    exact_cost: bool
    model_value: float
    model_bound: float


def _configure(
    solver: cp_model.CpSolver,
    config: PlacementConfig,
    settings: SolveSettings,
    limit: float,
    started: float,
    nodes: int,
) -> None:
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
    solver.parameters.random_seed = settings.seed
    if not settings.reduced:
        # Thousands of interchangeable nodes left in the model send CP-SAT's symmetry
        # presolve into tens of seconds (measured: 1-pod gang on 5,000 nodes, 43 s with,
        # 1 s without); the reduced model has merged them already.
        solver.parameters.symmetry_level = 0
    if nodes > config.solver.exact_below_nodes:
        solver.parameters.relative_gap_limit = config.solver.relative_gap


def _same_counts(gm: GangModel, solver: cp_model.CpSolver, rep: str) -> list[cp_model.IntVar]:
    """Booleans, one per variable of unit `rep` (its pods per pod set and nodes used),
    true when it takes the value it has in the last solution."""
    unit_vars = [var for key, var in gm.pods.items() if key[1] == rep]
    if rep in gm.used:
        unit_vars.append(gm.used[rep])
    same = []
    for var in unit_vars:
        value = solver.value(var)
        equal = gm.model.new_bool_var(f"cut[{var.name}]")
        gm.model.add(var == value).only_enforce_if(equal)
        gm.model.add(var != value).only_enforce_if(~equal)
        same.append(equal)
    return same


def solve_model(
    gm: GangModel, settings: SolveSettings, terms: OrderTerms, started: float
) -> Placement:
    """Solve, realise, cut and solve again; the placement of the last realised solution."""
    problem, red = gm.problem, gm.red
    config = problem.config
    solver = cp_model.CpSolver()
    limit = settings.time_limit or config.solver.time_limit_seconds
    _configure(solver, config, settings, limit, started, len(red.nodes))
    realised: _Realised | None = None
    for _attempt in range(_MAX_REALISATION_CUTS + 1):
        status = _solve(solver, gm.model, settings.alongside)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if realised is not None:
                break  # keep the placement realised before the last cut
            reason = (
                "no placement satisfies every constraint now; will retry"
                if status == cp_model.INFEASIBLE
                else f"no placement found within {limit:g}s; will retry"
            )
            return infeasible(problem.gang, settings.policy, reason, started)
        found = _realise_or_cut(gm, solver)
        if found is not None:
            realised = found
            if found.exact_cost:
                break
        solver.parameters.max_time_in_seconds = max(0.01, limit - (time.perf_counter() - started))
    if realised is None:
        return infeasible(
            problem.gang,
            settings.policy,
            "solver counts could not be realised on GPUs; will retry",
            started,
        )
    bound = solver.best_objective_bound
    proven = (
        realised.exact_cost
        and status == cp_model.OPTIMAL
        and red.exact
        and solver.objective_value <= bound + 0.5
    )
    placement = finish(
        problem,
        settings.policy,
        realised.slots,
        started,
        SolveStatus.OPTIMAL if proven else SolveStatus.FEASIBLE,
        terms.values(problem, realised.slots),
    )
    placement.model_objective = (realised.model_value - gm.offset) / SCALE
    placement.explanation.extend(red.notes)
    placement.explanation.append(
        f"CP-SAT {solver.status_name(status).lower()} in {solver.wall_time:.3f}s over "
        f"{len(red.nodes)} nodes in {len(gm.units)} units; objective "
        f"{placement.model_objective:g}, bound {(realised.model_bound - gm.offset) / SCALE:g}"
    )
    return placement


def _solve(
    solver: cp_model.CpSolver, model: cp_model.CpModel, alongside: Alongside | None
) -> cp_model.CpSolverStatus:
    """`solver.solve(model)`, with `alongside` run in another thread until it returns."""
    if alongside is None:
        return solver.solve(model)
    done = threading.Event()
    helper = threading.Thread(target=_run_alongside, args=(alongside, done),
                              name="beside-solve", daemon=True)
    helper.start()
    try:
        return solver.solve(model)
    finally:
        done.set()
        helper.join()


def _run_alongside(alongside: Alongside, done: threading.Event) -> None:
    try:
        alongside(done)
    except Exception:  # the caller's extra work: never the decision's failure
        log.exception("work beside a solve failed")


def _realise_or_cut(gm: GangModel, solver: cp_model.CpSolver) -> _Realised | None:
    """The slots of the last solution, or None after cutting counts that cannot be
    realised. When realised slots leave more pods NUMA-unaligned than the model charged,
    the difference is charged from now on (`exact_cost` is then false)."""
    counts = node_counts(gm.red.caps, gm.units, solver, gm.pods, gm.used)
    slots = slots_for(gm.problem, counts)
    if isinstance(slots, str):
        # The aggregated model let through counts that GPU shares or NUMA zones
        # cannot hold on node `slots` (a single-node unit): forbid them, solve again.
        gm.model.add_bool_or([~equal for equal in _same_counts(gm, solver, slots)])
        return None
    short = numa_shortfall(gm.problem, gm.units, slots, solver, gm.unaligned)
    realised = _Realised(slots, not short, solver.objective_value, solver.best_objective_bound)
    if not short:
        return realised
    # Pod sets sharing a node's NUMA zones: the model counted each against the
    # zones alone, fewer unaligned pods than the realisation has. Charge the
    # difference whenever the unit takes these counts again, solve again.
    for rep, missing in short.items():
        charged = gm.model.new_bool_var(f"numa_shortfall[{rep}]")
        gm.model.add_bool_or([~equal for equal in _same_counts(gm, solver, rep)] + [charged])
        gm.objective.append(gm.weights["numaUnaligned"] * SCALE * missing * charged)
        gm.unaligned[rep].append(missing * charged)
    gm.minimize()
    return realised
