"""The replay's burst placed jointly (policy nexus-batch, sim/replay_burst.py): it runs and
conserves GPUs, and when the joint answer is taken the replay moves the gangs started one
by one and starts the ones that join, its accounts kept."""

from __future__ import annotations

import pytest

from nexus_admit.model import GPU_WHOLE, Placement, SolveStatus, apply_slots, release_slots
from nexus_admit.placement.batch import BatchEngine, BurstEntry, BurstOutcome
from nexus_admit.placement.decide import Place, Retry
from nexus_admit.placement.tracking import TrackedSnapshot
from nexus_admit.sim import replay as rp
from nexus_admit.sim.openb import DEFAULT_DATA
from nexus_admit.sim.replay_burst import place_jointly
from nexus_admit.sim.replay_run import ReplayRun

SCN = rp.ReplayScenario(name="tiny", seed=5, hosts=16, jobs=60, load=1.6, time_limit=0.5)


def test_nexus_batch_runs_and_conserves_gpus() -> None:
    snapshots: list[TrackedSnapshot] = []
    result = rp.run_replay("nexus-batch", SCN, drain=True, snapshot_out=snapshots)
    assert result.policy == "nexus-batch"
    assert result.admitted + result.rejected + result.pending_at_end == result.jobs
    assert result.bursts["joint_models"] >= 1  # some cycle had a burst to place jointly
    for n in snapshots[-1]:
        assert all(0 <= g <= GPU_WHOLE for g in n.gpu_free)
    if result.pending_at_end == 0:
        assert all(n.is_pristine() for n in snapshots[-1])


def test_nexus_has_no_bursts() -> None:
    assert rp.run_replay("nexus", SCN).bursts == {}


def test_a_joint_answer_moves_and_starts_gangs(monkeypatch: pytest.MonkeyPatch) -> None:
    run = ReplayRun.start("nexus-batch", SCN, DEFAULT_DATA, None, None)
    engine = run.policy
    assert isinstance(engine, BatchEngine)
    first, second = [i for i, j in enumerate(run.jobs) if j.kind != "fractional"][:2]
    run.pending += [first, second]
    gangs = {i: run.jobs[i].gang() for i in (first, second)}
    before = [list(n.gpu_free) for n in run.snap]
    alone = engine.place(run.snap, gangs[first], run.config)
    assert alone.feasible
    run.start_job(first, gangs[first], alone.slots)
    waiting = Placement(gangs[second].name, engine.name, False, SolveStatus.INFEASIBLE,
                        reason="no room")
    # the joint answer, stubbed: the second gang first, the first gang around it
    scratch = run.snap.copy()
    release_slots(scratch, gangs[first], alone.slots)  # the capacity before the burst
    second_alone = engine.place(scratch, gangs[second], run.config)
    apply_slots(scratch, gangs[second], second_alone.slots)
    joint_first = engine.place(scratch, gangs[first], run.config)
    assert second_alone.feasible and joint_first.feasible

    def joint(snapshot: object, burst: list[BurstEntry], config: object,
              admit: object = None) -> BurstOutcome:
        assert [e.placement for e in burst] == [alone, waiting]
        # the snapshot handed over is the capacity before the burst
        assert [list(n.gpu_free) for n in run.snap] == before
        return BurstOutcome([joint_first, second_alone], True, "more gangs placed",
                            gangs=2, placed_one_by_one=1, placed_jointly=2)

    monkeypatch.setattr(engine, "place_burst", joint)
    place_jointly(run, [(first, Place(gangs[first], alone)), (second, Retry(waiting))], [])
    assert run.running[first][1] == joint_first.slots
    assert run.running[second][1] == second_alone.slots
    assert first not in run.pending and second not in run.pending
    need = sum(run.jobs[i].gpu_milli_total for i in (first, second))
    assert sum(run.usage.values()) == pytest.approx(need)
    taken = sum(sum(b) - sum(n.gpu_free) for b, n in zip(before, run.snap, strict=True))
    assert taken == need
    assert run.tally.bursts["joint_taken"] == 1 and run.tally.bursts["extra_gangs"] == 1
    # one departure queued per started gang, none twice
    departures = [e for e in run.events if e[2] == "depart" and e[3] in (first, second)]
    assert len({(e[0], e[3]) for e in departures}) == len(departures)
