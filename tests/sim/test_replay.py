"""The multi-tenant gang replay: cluster and workload generators, GPU conservation (no
double booking, everything released), the slowdown model, and the report."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nexus_admit.model import GPU_WHOLE, Gang, Placement, SolveStatus
from nexus_admit.placement import decide as decide_module
from nexus_admit.placement.decide import Capacity, Decision, DecisionRequest, PlaceOverDrains
from nexus_admit.placement.policies import make_policy
from nexus_admit.placement.preemption import PreemptionPlan
from nexus_admit.placement.tracking import TrackedSnapshot
from nexus_admit.sim import replay as rp
from nexus_admit.sim import replay_model
from nexus_admit.sim.stats import verdict

SMALL = rp.ReplayScenario(name="tiny", seed=3, hosts=16, jobs=40, time_limit=0.5)


def test_cluster_keeps_lingjun_tors_and_pools() -> None:
    nodes = rp.build_cluster(SMALL)
    assert len(nodes) == 16
    tors: dict[tuple[str, str], set[str]] = {}
    for n in nodes:
        key = (n.labels[rp.AGG_LABEL], n.labels[rp.TOR_LABEL])
        tors.setdefault(key, set()).add(n.gpu_product)
        assert len(n.numa_zones) == 2
    assert all(len(products) == 1 for products in tors.values())  # one pool per ToR
    assert len(tors) == 2
    assert rp.build_cluster(SMALL) == nodes  # seeded


def test_workload_mix_is_seeded_and_sane() -> None:
    jobs = rp.generate_jobs(SMALL, 128)
    assert jobs == rp.generate_jobs(SMALL, 128)
    assert [j.arrival for j in jobs] == sorted(j.arrival for j in jobs)
    for j in jobs:
        assert j.tier in rp.TIERS
        assert 0.1 <= j.duration <= 48
        if j.kind == "training":
            assert j.gpus == 8 and 8 <= j.pods * 8 <= 64
        if j.kind == "fractional":
            assert j.gpu_milli < GPU_WHOLE and j.pods == 1


def test_slowdown_model() -> None:
    assert rp.spread_factor(64, 1, 1, 1, False) == 1.0
    assert rp.spread_factor(64, 8, 2, 1, True) == 1.0  # one NVLink clique
    one_tor = rp.spread_factor(64, 8, 1, 1, False)
    one_agg = rp.spread_factor(64, 8, 2, 1, False)
    spread = rp.spread_factor(64, 8, 3, 2, False)
    assert 1.0 > one_tor > one_agg > spread == pytest.approx(0.30)
    assert rp.spread_factor(2, 2, 2, 2, False) == pytest.approx(0.50)


@pytest.mark.parametrize("policy", ["default", "tas-bestfit", "fgd", "nexus"])
def test_replay_conserves_gpus(policy: str) -> None:
    """Every admitted gang's slots are applied once and released once: after draining, the
    snapshot is back to fully free, and nothing was ever over-booked on the way."""
    snapshots: list[TrackedSnapshot] = []
    scn = rp.ReplayScenario(name="tiny", seed=5, hosts=16, jobs=30, load=1.5, time_limit=0.5)
    result = rp.run_replay(policy, scn, drain=True, snapshot_out=snapshots)
    assert result.admitted + result.rejected + result.pending_at_end == result.jobs
    assert 0 <= result.gpu_allocation <= 100
    assert 0 <= result.effective_throughput <= result.gpu_allocation + 1e-9
    snap = snapshots[-1]
    for n in snap:
        assert all(0 <= g <= GPU_WHOLE for g in n.gpu_free)
        assert n.free_cpu_milli <= n.cpu_milli
    if result.pending_at_end == 0:
        # everything admitted has departed by the end of the drain: all free again
        assert all(n.is_pristine() for n in snap)
        assert all(n.free_cpu_milli == n.cpu_milli for n in snap)


def test_replay_report(tmp_path: Path) -> None:
    from nexus_admit.sim.report import write_replay_report

    results = [rp.run_replay(p, SMALL) for p in ("default", "binpack")]
    comparison = rp.compare(results, ours="binpack")
    assert any(c["metric"] == "effective_throughput" for c in comparison)
    path = write_replay_report(results, comparison, tmp_path, {"policies": 2})
    assert path.exists()
    assert (tmp_path / "replay.json").exists()
    assert list(tmp_path.glob("replay_*.png"))


def test_compare_across_seeds_ranks_the_mean_of_each_metric() -> None:
    seeds = (SMALL, replace(SMALL, seed=SMALL.seed + 1))
    results = [rp.run_replay(p, scn) for scn in seeds for p in ("default", "binpack")]
    per_seed = rp.compare(results, ours="binpack")
    means = rp.compare(results, ours="binpack", across_seeds=True)
    assert {r["seed"] for r in means} == {-1}
    assert len(means) == len({r["metric"] for r in per_seed})
    row = next(r for r in means if r["metric"] == "effective_throughput")
    for policy in ("default", "binpack"):
        runs = [r.effective_throughput for r in results if r.policy == policy]
        assert row["values"][policy] == pytest.approx(sum(runs) / 2, abs=1e-3)
    best = max(row["values"].values())
    assert row["best"] == [p for p, v in sorted(row["values"].items()) if v == best]
    # the paired difference is taken seed by seed, ours against each other policy
    by = {(r.policy, r.seed): r.effective_throughput for r in results}
    diffs = [by[("binpack", s.seed)] - by[("default", s.seed)] for s in seeds]
    paired = row["paired"]["default"]
    assert set(row["paired"]) == {"default"}
    assert paired["seeds"] == 2
    assert paired["mean"] == pytest.approx(sum(diffs) / 2, abs=1e-3)
    assert paired["verdict"] == verdict(paired)
    assert all("paired" not in r for r in per_seed)


def test_policies_registered() -> None:
    for name in ("default", "binpack", "tas-bestfit", "gpu-packing", "fgd", "nexus"):
        assert make_policy(name, 0).name


def test_scenario_weights_override_the_replay_config() -> None:
    config = rp.replay_config(replace(SMALL, weights=(("tierMismatch", 0),)))
    assert config.weights.tier_mismatch == 0
    assert config.weights.gang_split == rp.REPLAY_GANG_SPLIT  # the others stay
    assert config.weights.vram_stranded == rp.REPLAY_VRAM_STRANDED
    assert rp.replay_config(SMALL).weights.tier_mismatch == 10


def test_standing_takes_the_worst_verdict_against_the_others() -> None:
    def row(*verdicts: str) -> dict[str, object]:
        return {"paired": {f"p{i}": {"verdict": v} for i, v in enumerate(verdicts)}}

    assert rp.standing(row("ahead", "ahead")) == "ahead of all"
    assert rp.standing(row("ahead", "tie")) == "ahead of all"
    assert rp.standing(row("ahead", "within noise")) == "within noise"
    assert rp.standing(row("ahead", "behind", "within noise")) == "behind"
    assert rp.standing(row("tie", "tie")) == "tie"
    assert rp.standing({}) == "n/a"


def test_the_replay_config_holds_gangs_for_locality_unless_turned_off() -> None:
    wait = rp.replay_config(SMALL).locality_wait
    assert wait is not None
    assert wait.level == rp.AGG_LABEL
    assert wait.max_wait_seconds == rp.REPLAY_LOCALITY_WAIT_SECONDS
    assert rp.replay_config(replace(SMALL, locality_wait_seconds=0)).locality_wait is None
    job = rp.Job("train-0", "gold", "training", 2, 8, GPU_WHOLE, 0, 1000, 1024, 1.0, 2.0)
    assert job.gang(waited_hours=0.5).waited_seconds == 1800.0


def test_a_held_gang_is_tried_again_when_its_hold_ends_even_if_nothing_else_happens() -> None:
    """The last arrival is held once for half an hour; no arrival or departure comes in
    that time, so only the hold's own wake-up can start it."""
    scn = rp.ReplayScenario(name="tiny", seed=3, hosts=16, jobs=3, load=0.2)
    last = max(rp.generate_jobs(scn, 128), key=lambda j: j.arrival).name
    calls: list[str] = []

    class HoldLastOnce:
        name = "hold-last-once"

        def __init__(self) -> None:
            self.inner = make_policy("binpack", 0)

        def place(self, snapshot: Any, gang: Any, config: Any) -> Placement:
            calls.append(gang.name)
            if gang.name == last and calls.count(last) == 1:
                return Placement(gang.name, self.name, False, SolveStatus.INFEASIBLE,
                                 reason="held", retry_after_seconds=1800.0)
            return self.inner.place(snapshot, gang, config)

    result = rp.run_replay("hold-last-once", scn, policy_factory=lambda *_: HoldLastOnce())
    assert calls.count(last) == 2
    assert result.pending_at_end == 0
    assert result.admitted == 3


@pytest.mark.parametrize("policy", ["fgd", "nexus"])
def test_only_slowed_down_gangs_hold_gpus_beyond_their_work(policy: str) -> None:
    """The split's parts (allocation = offered − work not done + GPU time held beyond the
    work, by definition) mean what the report says: no job does more than its full-speed
    work inside the window, a spreading policy on a gang-heavy mix holds GPUs beyond its
    work, and single-GPU jobs (always at full speed) never do."""
    gangs = replace(SMALL, mix=(1.0, 0.0, 0.0), load=2.0)
    r = rp.run_replay(policy, gangs)
    assert r.work_not_done >= 0 and r.slowdown_overhead >= 0
    if policy == "fgd":
        assert r.mean_factor_multinode < 1 and r.slowdown_overhead > 0
    single = rp.run_replay(policy, replace(SMALL, mix=(0.0, 1.0, 0.0)))
    assert single.slowdown_overhead == pytest.approx(0.0, abs=0.01)


def test_preemption_suffixes_name_the_mode() -> None:
    assert rp.preemption_mode("nexus") == ("nexus", None, False)
    assert rp.preemption_mode("nexus+preempt") == ("nexus", "placement", False)
    assert rp.preemption_mode("tas-bestfit+quota-preempt") == ("tas-bestfit", None, True)
    assert rp.preemption_mode("nexus+preempt+drain") == ("nexus", "drain", False)
    assert rp.preemption_mode("nexus+preempt+drain+quota-preempt") == ("nexus", "drain", True)


def test_kueue_quota_preemption_combines_with_placement_preemption() -> None:
    """`+quota-preempt` after `+preempt+drain`: both kinds evict (a cluster configures
    Kueue's ClusterQueue preemption and nexus's independently), so the combination evicts
    more runs than placement-level preemption alone on the same trace."""
    # a trace where both kinds evict (seed 1 stopped being one once a drain kept its quota)
    scn = rp.ReplayScenario(name="tiny", seed=13, hosts=16, jobs=60, load=1.6, time_limit=0.5)
    placement_only = rp.run_replay("nexus+preempt+drain", scn, drain=True)
    quota_only = rp.run_replay("nexus+quota-preempt", scn, drain=True)
    both = rp.run_replay("nexus+preempt+drain+quota-preempt", scn, drain=True)
    assert placement_only.evictions > 0 and quota_only.evictions > 0
    assert both.evictions > placement_only.evictions
    assert both.lost_gpu_hours > placement_only.lost_gpu_hours


@pytest.mark.parametrize(
    "policy", ["nexus+preempt", "tas-bestfit+quota-preempt", "nexus+preempt+drain+quota-preempt"])
def test_evictions_give_back_what_the_victims_held(policy: str) -> None:
    """An evicted run releases its slots and queues again: the cluster still drains to
    fully free, every job is accounted for once, and the lost work is reported."""
    snapshots: list[TrackedSnapshot] = []
    scn = rp.ReplayScenario(name="tiny", seed=1, hosts=16, jobs=60, load=1.6, time_limit=0.5)
    result = rp.run_replay(policy, scn, drain=True, snapshot_out=snapshots)
    assert result.evictions > 0 and result.lost_gpu_hours > 0
    assert result.admitted + result.rejected + result.pending_at_end == result.jobs
    assert result.pending_at_end == 0 and result.completed == result.admitted
    assert 0 <= result.effective_throughput <= result.gpu_allocation + 1e-9
    assert all(n.is_pristine() and n.free_cpu_milli == n.cpu_milli for n in snapshots[-1])
    plain = rp.run_replay(rp.preemption_mode(policy)[0], scn, drain=True)
    assert plain.evictions == 0 and plain.lost_gpu_hours == 0


@pytest.mark.parametrize(
    ("mode", "tier", "fits_quota", "cohort_room", "preempted", "may"),
    [
        ("placement", "gold", True, True, False, True),
        ("placement", "gold", False, True, False, True),
        ("placement", "silver", False, False, False, False),
        ("quota", "gold", True, True, False, True),
        ("quota", "gold", False, True, False, False),
        ("placement", "bronze", True, True, False, True),
        ("quota", "bronze", True, True, False, False),
        ("placement", "gold", True, True, True, False),
        (None, "gold", True, True, False, False),
    ],
    ids=["placement-nominal", "placement-borrowed", "placement-no-room", "quota-nominal",
         "quota-borrowed", "lowest-tier-by-config", "lowest-tier-quota", "one-per-cycle", "off"],
)
def test_placement_preemption_follows_the_reserved_quota_kueues_only_the_nominal(
        mode: str | None, tier: str, fits_quota: bool, cohort_room: bool, preempted: bool,
        may: bool) -> None:
    """Kueue reclaims only nominal quota; placement-level preemption, like the controller,
    acts for any gang Kueue reserved quota for, borrowed included (whom the lowest tier may
    evict, no one, is the PlacementConfig's rule, applied in `decide`)."""
    assert rp.may_preempt(mode, tier, fits_quota=fits_quota, cohort_room=cohort_room,
                          preempted=preempted) is may


def test_the_replay_drains_only_gangs_that_waited_and_have_no_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With +drain, `decide` starts a drain only for a multi-pod gang that waited
    drainAfterSeconds and has no place and no victims, as in the controller; the replay
    still gives back every GPU."""
    monkeypatch.setattr(replay_model, "REPLAY_DRAIN_AFTER", 600.0)
    planned: list[Gang] = []
    real = decide_module.plan_drain

    def recording(*args: Any) -> PreemptionPlan | None:
        found = real(*args)
        if found is not None:
            planned.append(args[2])
        return found

    monkeypatch.setattr(decide_module, "plan_drain", recording)
    snapshots: list[TrackedSnapshot] = []
    scn = rp.ReplayScenario(name="tiny", seed=1, hosts=16, jobs=60, load=1.6,
                            mix=(0.6, 0.2, 0.2), time_limit=0.5)
    result = rp.run_replay("nexus+preempt+drain", scn, drain=True, snapshot_out=snapshots)
    assert planned, "no drain in this scenario: the test no longer exercises drains"
    for gang in planned:
        assert gang.pod_count > 1 and gang.waited_seconds >= 600.0
    assert result.pending_at_end == 0
    assert all(n.is_pristine() for n in snapshots[-1])


@pytest.mark.parametrize("policy", ["tas-bestfit", "nexus"])
def test_wait_hours_split_every_delay_by_why_the_job_waited(policy: str) -> None:
    """Without evictions every hour a job waited before its start is counted once, under
    one reason; only nexus's localityWait holds gangs."""
    scn = replace(SMALL, mix=(0.6, 0.2, 0.2), load=1.6)
    r = rp.run_replay(policy, scn, drain=True)
    assert r.pending_at_end == 0 and r.evictions == 0
    for group, st in r.delay.items():
        if group == "all":
            continue
        assert set(r.wait_hours.get(group, {})) <= set(rp.WAIT_REASONS)
        total = sum(r.wait_hours.get(group, {}).values())
        assert total == pytest.approx(st["n"] * st["mean"], abs=0.01 * st["n"] + 0.02)
    holds = sum(w["hold"] for w in r.wait_hours.values())
    assert (holds > 0) if policy == "nexus" else holds == 0


def test_a_drain_never_makes_a_higher_tier_wait_that_has_no_place_off_its_nodes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A gang of a higher tier kept off a drain's nodes that then has no place is placed
    on them, and the drain is withdrawn; never for one of the drain's tier or below. The
    replay still gives back every GPU."""
    monkeypatch.setattr(replay_model, "REPLAY_DRAIN_AFTER", 600.0)
    over: list[PlaceOverDrains] = []
    real = decide_module.decide

    def recording(request: DecisionRequest, capacity: Capacity) -> Decision:
        decision = real(request, capacity)
        if isinstance(decision, PlaceOverDrains):
            over.append(decision)
        return decision

    monkeypatch.setattr(decide_module, "decide", recording)
    snapshots: list[TrackedSnapshot] = []
    found = None
    # a trace with a higher-tier gang that has no place off a lower tier's drain
    for seed in (23, 19, 1, 2, 3, 4, 5, 6, 7, 8):
        over.clear()
        scn = rp.ReplayScenario(name="tiny", seed=seed, hosts=16, jobs=60, load=1.6,
                                mix=(0.6, 0.2, 0.2), time_limit=0.5)
        result = rp.run_replay("nexus+preempt+drain", scn, drain=True, snapshot_out=snapshots)
        assert result.pending_at_end == 0
        assert all(n.is_pristine() for n in snapshots[-1])
        if over:
            found = over
            break
    assert found, "no gang needed a drain's nodes: the test no longer exercises yielding"
    rank = {"gold": 0, "silver": 1, "bronze": 2}
    for decision in found:
        for drain in decision.withdrawn:
            assert rank[decision.gang.tier] < rank[drain.tier]
            assert drain.nodes & {s.node for s in decision.placement.slots}


def test_a_draining_gang_keeps_its_quota() -> None:
    usage = {"gold": 0.0, "silver": 60.0, "bronze": 0.0}
    quota = {"gold": 40.0, "silver": 80.0, "bronze": 20.0}
    cohort = 140.0
    assert rp.quota_room(usage, quota, cohort, "silver", 16.0) == (True, True)
    # a Silver gang drains with 16 GPUs of Silver quota: another Silver gang must borrow
    assert rp.quota_room(usage, quota, cohort, "silver", 16.0, [("silver", 16.0)]) == (False, True)
    # a Gold drain takes Gold's quota, and the cohort's room from everyone
    assert rp.quota_room(usage, quota, cohort, "silver", 16.0, [("gold", 70.0)]) == (True, False)
