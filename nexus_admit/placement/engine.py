"""The nexus placement engine: the whole gang as one CP-SAT problem.

`CpSatEngine.place` is the public entry; the steps live beside it:
- reduction.py: the candidate nodes, then the exact symmetry reduction (nodes that are
  interchangeable for this gang are kept only as many times as the gang could use them);
- pruning.py: domain-first pruning, only when still above `solver.maxCandidateNodes` (a
  heuristic: placements found after it report `feasible`, not `optimal`); when the symmetry
  reduction would keep every candidate (a gang of more pods than any rack has candidates,
  `keeps_every_candidate`), pruning goes first and the twins are found among the kept
  nodes only: the same reduction, without a class key per candidate of the fleet;
- onepod.py: a one-pod gang needs no model, every node left is costed (exact);
  fleet_scan.py finds its candidates with room and their bounds on columns (columns.py);
- live_reduction.py: on a `TrackedSnapshot`, the candidates, the reduction and the one-pod
  ranking of a gang of one pod set kept from its change log (the same answers; a plain
  snapshot takes the steps above every time);
- cpmodel.py: the CP-SAT model of the gang (its variables and objective);
- cpsolve.py and realise.py: solve, turn the solution into slots, cut what cannot be
  realised and solve again;
- order_terms.py: the engine's own fragGradient and fillOrder terms.

The objective the placement reports as `model_objective` equals the weighted terms of the
returned slots (up to the per-coefficient rounding of the real-valued terms: stranded
VRAM, fragGradient, fillOrder) whenever the status is `optimal`. Nodes merged into one
unit (twins) are charged fillOrder at the first twin's rank.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from threading import Event

from nexus_admit.model import ClusterSnapshot, Gang, Placement, PlacementConfig, Slot, SolveStatus
from nexus_admit.placement.base import Alongside
from nexus_admit.placement.baselines.podbypod import infeasible
from nexus_admit.placement.cpmodel import add_hint, build_model
from nexus_admit.placement.cpsolve import SolveSettings, solve_model
from nexus_admit.placement.fleet_scan import fleet_scan
from nexus_admit.placement.fragmentation import WorkloadDistribution
from nexus_admit.placement.live_reduction import live_reduction
from nexus_admit.placement.memo import NodeMemo
from nexus_admit.placement.onepod import (
    gradient_scan,
    scan_candidates,
    scan_lower_bound,
    scan_ranked,
    scans,
    scans_with_gradient,
)
from nexus_admit.placement.order_terms import OrderTerms
from nexus_admit.placement.problem import Problem, prepare
from nexus_admit.placement.pruning import dense_racks, greedy, pod_cost, prune_domains
from nexus_admit.placement.realise import slots_for
from nexus_admit.placement.reduction import (
    Reduction,
    candidates,
    keeps_every_candidate,
    reduce_symmetry,
    shortfall,
    with_twins,
)

__all__ = ["CpSatEngine", "Reduction", "nexus_policy"]


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
        # node views and pod capacities, kept between solves on a TrackedSnapshot
        self._memo = NodeMemo()
        # the decisions' derivations over every candidate node (Placement.fleet_scan)
        self._fleet_scans = 0
        self._terms = OrderTerms(self._memo, workload or WorkloadDistribution.default())
        self._alongside: Alongside | None = None

    @property
    def workload(self) -> WorkloadDistribution:
        """Target workload for the fragmentation-gradient term (weights.fragGradient)."""
        return self._terms.workload

    def set_workload(self, dist: WorkloadDistribution) -> None:
        self._terms.workload = dist

    # ------------------------------------------------------------------ public
    def place(self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig) -> Placement:
        scans_before = self._fleet_scans
        placement = self._decide(snapshot, gang, config)
        placement.fleet_scan = self._fleet_scans > scans_before
        return placement

    def _decide(self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig) -> Placement:
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

    def warm(self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig) -> bool:
        """Derive now what `place(snapshot, gang, config)` reads first, without placing: the
        gang's tracker on a `TrackedSnapshot` and, for one pod, its ranking (one build over
        the candidates, O(fleet), the first time a shape is seen). A later `place` of that
        shape syncs them from the change log. False: nothing kept (no tracked snapshot, a
        gang the trackers do not serve, or one that cannot be placed as asked)."""
        if not self._reduce:
            return False
        self._memo.sync(snapshot, config)
        try:
            problem = prepare(snapshot, gang, config)
        except ValueError:
            return False
        if problem.impossible:
            return False
        live = live_reduction(problem, self._memo)
        if live is None:
            return False
        if scans(problem) and not live.shortfall(problem):
            live.ranking(problem)
        return True

    def work_beside_solves(self, work: Alongside | None) -> None:
        """Run `work` in another thread while CP-SAT solves (it releases the interpreter's
        lock): the controller warms the shapes of waiting Workloads there (`warm`), on a
        core the solver's thread leaves idle. Each solve waits for `work` to return once
        told the solve is done (placement/cpsolve.py). None: nothing beside."""
        self._alongside = work

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
        gang = problem.gang
        if problem.impossible:
            return infeasible(gang, self.name, problem.impossible, started, impossible=True)
        if problem.unavailable:
            waits = infeasible(gang, self.name, problem.unavailable, started)
            waits.status = SolveStatus.UNAVAILABLE
            return waits
        live = live_reduction(problem, self._memo) if self._reduce else None
        if live is not None:  # kept on the snapshot from its change log: the same answers
            if live.fresh:
                self._fleet_scans += 1
            short = live.shortfall(problem)
            if short:
                return infeasible(gang, self.name, short, started)
            if scans(problem):
                ranking = live.ranking(problem)
                if ranking.fresh:
                    self._fleet_scans += 1
                return scan_ranked(problem, ranking, started, self._terms, self.name)
            if scans_with_gradient(problem):  # gradient_scan's ranking, kept the same way
                ranking = live.ranking(problem, self._terms)
                return scan_ranked(
                    problem, ranking, started, self._terms, self.name, model_costs=True
                )
            return self._reduced(problem, live.reduction(problem), started)
        self._fleet_scans += 1
        if self._reduce and scans(problem):  # on columns: the same scan, bit for bit
            scanned = fleet_scan(problem, self._memo, started, self._terms, self.name)
            if scanned is not None:
                return scanned
        reduction = candidates(problem, self._memo)
        short = shortfall(problem, reduction)
        if short:
            return infeasible(gang, self.name, short, started)
        if self._reduce:
            if scans(problem):  # the symmetry reduction's answer, met lazily while costing
                return scan_candidates(
                    problem, reduction, self._memo, started, self._terms, self.name
                )
            if self._prunes(problem, reduction) and keeps_every_candidate(problem, reduction):
                # the symmetry reduction would keep every node (a gang of more pods than
                # any rack has candidates): prune first, find the twins among the kept
                # nodes only (the same reduction, without a class key per candidate)
                pruned = prune_domains(problem, reduction)
                twinned = with_twins(problem, pruned, self._memo, reduction.nodes)
                return self._solve(problem, twinned, started)
            reduction = reduce_symmetry(problem, reduction, self._memo)
            if scans_with_gradient(problem):
                return gradient_scan(problem, reduction, started, self._terms, self.name)
            return self._reduced(problem, reduction, started)
        return self._solve(problem, reduction, started)

    @staticmethod
    def _prunes(problem: Problem, reduction: Reduction) -> bool:
        """Whether more nodes are left than the model takes (then pruning cuts them)."""
        return len(reduction.nodes) > problem.config.solver.max_candidate_nodes

    def _reduced(self, problem: Problem, reduction: Reduction, started: float) -> Placement:
        """Solve after the symmetry reduction (pruned first when still too many nodes)."""
        if self._prunes(problem, reduction):
            reduction = prune_domains(problem, reduction)
        return self._solve(problem, reduction, started)

    # ------------------------------------------------------------- the steps
    def _candidates(self, problem: Problem) -> Reduction:
        return candidates(problem, self._memo)

    def _order_values(
        self, problem: Problem, slots: Sequence[Slot]
    ) -> dict[str, tuple[float, int]]:
        return self._terms.values(problem, slots)

    def _solve(self, problem: Problem, red: Reduction, started: float) -> Placement:
        model = build_model(problem, red, self._terms)
        add_hint(model)
        settings = SolveSettings(self._seed, self._time_limit, self._reduce, self.name,
                                 self._beside(problem))
        return solve_model(model, settings, self._terms, started)

    def _beside(self, problem: Problem) -> Alongside | None:
        """The work beside this problem's solves; it may `warm` (and so sync the node memo
        to another config): the memo is synced back before the decision goes on."""
        work = self._alongside
        if work is None:
            return None

        def beside(done: Event) -> None:
            try:
                work(done)
            finally:
                self._memo.sync(problem.snapshot, problem.config)

        return beside

    # the steps' pure parts, under the names tests and tools use
    _scans = staticmethod(scans)
    _scan_lower_bound = staticmethod(scan_lower_bound)
    _slots = staticmethod(slots_for)
    _pod_cost = staticmethod(pod_cost)
    _greedy = staticmethod(greedy)
    _dense_racks = staticmethod(dense_racks)


def nexus_policy(seed: int) -> CpSatEngine:
    return CpSatEngine(seed)
