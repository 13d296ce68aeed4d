"""The replay's burst placed jointly (policy `nexus-batch`, placement/batch.py): after a
scheduling cycle has decided its gangs one by one, the gangs the plain Place rung placed and
those it found no room for are placed again in one model; the joint answer replaces the
one-by-one one only where `BatchEngine.place_burst` takes it (never worse on any term, more
placed or a lower objective). A gang that joins from the waiting ones must have room in
Kueue's quota besides every gang already started, in Kueue's order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from nexus_admit.model import Gang
from nexus_admit.placement import decide as decisions
from nexus_admit.placement.batch import BatchEngine, BurstEntry
from nexus_admit.placement.decide import Place, Retry
from nexus_admit.sim.replay_model import quota_room

if TYPE_CHECKING:
    from nexus_admit.sim.replay_run import ReplayRun

__all__ = ["BURST_KEYS", "place_jointly"]

# what ReplayResult.bursts sums over a run
BURST_KEYS = ("bursts", "joint_models", "joint_answers", "joint_taken", "more_placed",
              "extra_gangs", "gangs_in_models", "seconds", "max_seconds",
              "objective_one_by_one", "objective_joint")  # and "reason:<why>", "term:<name>"


def place_jointly(run: ReplayRun, attempts: Sequence[tuple[int, decisions.Decision]],
                  waiting: Sequence[tuple[str, int]]) -> None:
    """Re-place the cycle's plain decisions (`attempts`, in Kueue's order) as one burst."""
    policy = run.policy
    if not isinstance(policy, BatchEngine):
        return
    burst: list[tuple[int, Gang, BurstEntry]] = []
    for i, decision in attempts:
        if isinstance(decision, Place):
            solved = run.capacity().admit(decision.gang)
            burst.append((i, decision.gang, BurstEntry(solved, decision.placement)))
        elif isinstance(decision, Retry) and i in run.pending:
            gang = run.request(i, waiting, False).gang
            solved = run.capacity().admit(
                decisions.backfilled(run.snap, gang, run.config, waiting))
            burst.append((i, gang, BurstEntry(solved, decision.placement)))
    if sum(e.placement.feasible for _, _, e in burst) < 1 or len(burst) < 2:
        return
    tally = run.tally.bursts
    tally["bursts"] += 1
    members = [i for i, _, entry in burst if entry.placement.feasible]
    for _i, gang, entry in burst:  # the capacity before the burst, for the joint model
        if entry.placement.feasible:
            run.placer.undo(gang, entry.placement.slots)
    outcome = policy.place_burst(run.snap, [e for _, _, e in burst], run.config,
                                 admit=lambda extra: _quota_allows(run, members, extra))
    for _i, gang, entry in burst:
        if entry.placement.feasible:
            run.placer.hold(gang, entry.placement.slots)
    if outcome.joint:
        for (i, gang, _), placement in zip(burst, outcome.placements, strict=True):
            if i in members:
                run.restart(i, gang, placement.slots)
            elif placement.feasible:
                run.start_job(i, gang, placement.slots)
    if outcome.gangs:
        tally["joint_models"] += 1
        tally["gangs_in_models"] += outcome.gangs
        tally["seconds"] += outcome.solve_seconds
        tally["max_seconds"] = max(tally["max_seconds"], outcome.solve_seconds)
        tally[f"reason:{outcome.reason}"] += 1
        if outcome.objective_joint is not None:  # a joint answer found, taken or not
            tally["joint_answers"] += 1
            tally["objective_one_by_one"] += outcome.objective_one_by_one
            tally["objective_joint"] += outcome.objective_joint
    if outcome.joint:
        tally["joint_taken"] += 1
        extra = outcome.placed_jointly - outcome.placed_one_by_one
        tally["more_placed"] += extra > 0
        tally["extra_gangs"] += extra
        for name, value in outcome.terms_joint.items():
            delta = value - outcome.terms_one_by_one.get(name, 0.0)
            tally[f"term:{name}"] = tally.get(f"term:{name}", 0.0) + delta


def _quota_allows(run: ReplayRun, members: Sequence[int], extra: Sequence[Gang]) -> bool:
    """Whether Kueue's quota has room for these waiting gangs besides every gang started and
    the burst's one-by-one gangs (`members`), added in order."""
    index = {j.name: k for k, j in enumerate(run.jobs)}
    usage = dict(run.usage)
    for i in members:
        usage[run.jobs[i].tier] += run.jobs[i].gpu_milli_total
    for gang in extra:
        job = run.jobs[index[gang.name]]
        fits, borrow = quota_room(usage, run.quota, run.cohort, job.tier, job.gpu_milli_total)
        if not (fits or borrow):
            return False
        usage[job.tier] += job.gpu_milli_total
    return True
