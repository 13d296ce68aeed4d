"""Preemption and backfill (placement/preemption.py): the victims are the cheapest allowed
set, brute-forced on small instances; never an equal or higher tier, never part of a gang,
never more than allowed; lower tiers borrow a higher tier's hardware only while it waits
for nothing."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from nexus_admit.model import (
    ClusterSnapshot,
    Gang,
    Node,
    PlacementConfig,
    PodSet,
    Slot,
    WorkloadType,
    apply_slots,
    domain_at,
    fit_pod,
    release_slots,
)
from nexus_admit.placement.policies import make_policy
from nexus_admit.placement.preemption import (
    RunningGang,
    answer_when_kept_off,
    is_borrowed,
    owners_waiting,
    plan_drain,
    plan_preemption,
    restrict_borrowing,
    victim_cost,
)
from nexus_admit.placement.validate import violations
from tests.factories import BLOCK, H100, HOST, L40S, LEVELS, RACK, T4, gpu_node, snapshot

ENGINE = make_policy("nexus", seed=1)


def config(**preemption: object) -> PlacementConfig:
    return PlacementConfig.model_validate({
        "topology": {"levels": list(LEVELS)},
        "preemption": {"enabled": True, "minRunSeconds": 0, **preemption},
    })


def run(snap: ClusterSnapshot, name: str, node: str, gpus: int, *, tier: str = "bronze",
        hours: float = 1.0, pods: int = 1, priority: int = 0) -> RunningGang:
    """A gang of `pods` pods of `gpus` GPUs each on `node`, taken from `snap`."""
    gang = Gang(name, (PodSet("w", pods, gpus=gpus),), tier=tier)
    slots = []
    for i in range(pods):
        fit = fit_pod(snap.nodes[node], gang.pod_sets[0])
        assert fit is not None, f"{name} does not fit on {node}"
        slot = Slot("w", i, node, fit.gpu_indices, fit.numa_zone)
        apply_slots(snap, gang, [slot])
        slots.append(slot)
    return RunningGang(gang, tuple(slots), ran_seconds=3600.0 * hours, priority=priority)


def gold_gang(pods: int = 4, gpus: int = 8, tier: str = "gold") -> Gang:
    return Gang("ns/preemptor", (PodSet("w", pods, gpus=gpus, indexed=True),), tier=tier,
                workload_type=WorkloadType.TRAINING, preferred_level=RACK)


def h100_racks(racks: int = 2, per_rack: int = 4) -> ClusterSnapshot:
    return snapshot(*(gpu_node(f"h{r}{i}", rack=f"r{r}") for r in range(racks)
                      for i in range(per_rack)))


def nodes_of(plan_slots: Sequence[Slot]) -> set[str]:
    return {s.node for s in plan_slots}


# ---------------------------------------------------------------- scenarios


def test_gold_gang_gets_the_rack_whose_bronze_work_is_cheapest_to_lose() -> None:
    snap = h100_racks()
    running = [run(snap, f"ns/b{r}{i}", f"h{r}{i}", 2, hours=1.0 + r) for r in range(2)
               for i in range(4)]
    cfg = config()
    assert not ENGINE.place(snap, gold_gang(), cfg).feasible
    plan = plan_preemption(ENGINE, snap, gold_gang(), running, cfg)
    assert plan is not None
    # rack r0's Bronze gangs ran 1 h each, rack r1's 2 h: r0 is cheaper to drain
    assert set(plan.victim_names) == {f"ns/b0{i}" for i in range(4)}
    assert plan.level == RACK and plan.domain == ("b0", "r0")
    assert nodes_of(plan.placement.slots) == {f"h0{i}" for i in range(4)}
    assert plan.lost_gpu_hours == pytest.approx(8.0)
    assert "evict 4 in example.com/rack=b0/r0" in plan.placement.explanation[-1]


def test_fewest_victims_beat_less_lost_work() -> None:
    # rack r0: one 8-GPU Bronze gang per node (4 victims); rack r1: one 4-pod gang over all
    # four nodes, which ran longer, but is a single victim
    snap = h100_racks()
    running = [run(snap, f"ns/small{i}", f"h0{i}", 8, hours=0.5) for i in range(4)]
    big_slots: list[Slot] = []
    big = Gang("ns/big", (PodSet("w", 4, gpus=8),), tier="bronze")
    for i in range(4):
        slot = Slot("w", i, f"h1{i}", tuple(range(8)), None)
        apply_slots(snap, big, [slot])
        big_slots.append(slot)
    running.append(RunningGang(big, tuple(big_slots), ran_seconds=3600.0))
    plan = plan_preemption(ENGINE, snap, gold_gang(), running, config())
    assert plan is not None and plan.victim_names == ("ns/big",)


def test_equal_or_higher_tiers_and_protected_gangs_are_never_evicted() -> None:
    snap = h100_racks(racks=1)
    running = [run(snap, "ns/silver", "h00", 8, tier="silver"),
               run(snap, "ns/gold", "h01", 8, tier="gold"),
               run(snap, "ns/outside", "h02", 8)]
    running[2] = RunningGang(running[2].gang, running[2].slots, 3600.0, evictable=False)
    running.append(run(snap, "ns/bronze", "h03", 8))
    cfg = config(mayEvict={"gold": ["bronze"]})
    assert plan_preemption(ENGINE, snap, gold_gang(pods=1), running, cfg) is not None
    # four nodes needed, but only one holds an evictable gang
    assert plan_preemption(ENGINE, snap, gold_gang(pods=2), running, cfg) is None
    # Silver may evict Bronze but never Gold or Silver
    plan = plan_preemption(ENGINE, snap, gold_gang(pods=1, tier="silver"), running, config())
    assert plan is not None and plan.victim_names == ("ns/bronze",)
    # Bronze, the lowest tier, evicts nothing
    assert plan_preemption(ENGINE, snap, gold_gang(pods=1, tier="bronze"), running,
                           config()) is None


def test_limits_min_run_time_max_victims_and_switch() -> None:
    snap = h100_racks(racks=1)
    running = [run(snap, f"ns/b{i}", f"h0{i}", 8, hours=0.05) for i in range(4)]
    assert plan_preemption(ENGINE, snap, gold_gang(), running, config()) is not None
    # 3 minutes run is below a 5 minute minimum
    assert plan_preemption(ENGINE, snap, gold_gang(), running,
                           config(minRunSeconds=300)) is None
    assert plan_preemption(ENGINE, snap, gold_gang(), running,
                           config(maxVictimsPerGang=3)) is None
    assert plan_preemption(ENGINE, snap, gold_gang(), running, config(enabled=False)) is None


def test_only_borrowed_placements_are_victims_by_default() -> None:
    # Bronze on its own economy hardware stays; on premium it is borrowed and may go
    snap = snapshot(gpu_node("t0", gpu=T4, rack="r0"), gpu_node("h0", rack="r1"))
    on_own = run(snap, "ns/own", "t0", 8)
    borrowed = run(snap, "ns/borrowed", "h0", 8)
    cfg = config()
    assert not is_borrowed(snap, on_own.gang, on_own.slots, cfg)
    assert is_borrowed(snap, borrowed.gang, borrowed.slots, cfg)
    anywhere = Gang("ns/g", (PodSet("w", 1, gpus=8),), tier="gold")
    plan = plan_preemption(ENGINE, snap, anywhere, [on_own, borrowed], cfg)
    assert plan is not None and plan.victim_names == ("ns/borrowed",)
    only_economy = Gang("ns/g", (PodSet("w", 1, gpus=8, allowed_nodes=frozenset({"t0"})),),
                        tier="gold")
    assert plan_preemption(ENGINE, snap, only_economy, [on_own, borrowed], cfg) is None
    assert plan_preemption(ENGINE, snap, only_economy, [on_own, borrowed],
                           config(victims="any")) is not None


def test_required_level_is_kept() -> None:
    # two free nodes in different racks, a 2-pod gang that must stay in one rack
    snap = h100_racks(racks=2, per_rack=2)
    running = [run(snap, "ns/b00", "h00", 8), run(snap, "ns/b11", "h11", 8, hours=0.1)]
    gang = Gang("ns/g", (PodSet("w", 2, gpus=8),), tier="gold", required_level=RACK)
    plan = plan_preemption(ENGINE, snap, gang, running, config())
    assert plan is not None and plan.victim_names == ("ns/b11",)
    assert nodes_of(plan.placement.slots) == {"h10", "h11"}


def test_backfill_keeps_lower_tiers_off_hardware_whose_owner_waits() -> None:
    snap = snapshot(gpu_node("h0"), gpu_node("a0", gpu=L40S), gpu_node("t0", gpu=T4))
    bronze = Gang("ns/b", (PodSet("w", 1, gpus=8),), tier="bronze")
    cfg = config()
    assert restrict_borrowing(snap, bronze, cfg, []) == bronze
    kept = restrict_borrowing(snap, bronze, cfg, ["gold"])
    assert kept.pod_sets[0].allowed_nodes == frozenset({"a0", "t0"})
    kept = restrict_borrowing(snap, bronze, cfg, ["gold", "silver", "bronze"])
    assert kept.pod_sets[0].allowed_nodes == frozenset({"t0"})
    # a waiting lower tier, or backfill off, changes nothing
    silver = Gang("ns/s", (PodSet("w", 1, gpus=8),), tier="silver")
    assert restrict_borrowing(snap, silver, cfg, ["bronze"]) == silver
    assert restrict_borrowing(snap, bronze, config(backfill=False), ["gold"]) == bronze
    assert restrict_borrowing(snap, bronze, config(enabled=False), ["gold"]) == bronze


WHY = "kept off the hardware a waiting higher tier owns (preemption.backfill)"


def test_a_gang_kept_off_that_does_not_fit_now_says_why() -> None:
    """Bronze kept off the free H100 while Gold waits, with its own L40S taken: Retry,
    and the reason names backfill first, so the user knows why the free H100 was not used."""
    snap = snapshot(gpu_node("h0"), gpu_node("l0", gpu=L40S))
    run(snap, "other", "l0", 8)
    bronze = Gang("ns/b", (PodSet("w", 1, gpus=8),), tier="bronze")
    cfg = config()
    kept = restrict_borrowing(snap, bronze, cfg, ["gold"])
    placement = answer_when_kept_off(snap, bronze, ENGINE.place(snap, kept, cfg), cfg, WHY)
    assert not placement.feasible and placement.retryable
    assert placement.reason.startswith(WHY + "; "), placement.reason


def test_a_gang_kept_off_everything_that_fits_waits_but_one_that_never_fits_is_rejected() -> None:
    """Kept off the only node with room of its kind: only waiting (Retry). A gang that could
    not fit even as asked stays Rejected, without the backfill note."""
    snap = snapshot(gpu_node("h0"), gpu_node("l0", gpu=L40S, gpus=4))
    cfg = config()
    bronze = Gang("ns/b", (PodSet("w", 1, gpus=8),), tier="bronze")
    kept = restrict_borrowing(snap, bronze, cfg, ["gold"])
    placement = answer_when_kept_off(snap, bronze, ENGINE.place(snap, kept, cfg), cfg, WHY)
    assert placement.retryable and placement.reason.startswith(WHY)
    huge = Gang("ns/h", (PodSet("w", 1, gpus=16),), tier="bronze")
    never = answer_when_kept_off(
        snap, huge, ENGINE.place(snap, restrict_borrowing(snap, huge, cfg, ["gold"]), cfg),
        cfg, WHY)
    assert not never.retryable and WHY not in never.reason
    fits = answer_when_kept_off(snap, bronze, ENGINE.place(snap, bronze, cfg), cfg, WHY)
    assert fits.feasible and not fits.reason


def test_config_refuses_eviction_upwards_and_unknown_tiers() -> None:
    with pytest.raises(ValidationError, match="does not rank below"):
        config(mayEvict={"bronze": ["gold"]})
    with pytest.raises(ValidationError, match="unknown tier 'platinum'"):
        config(mayEvict={"platinum": ["bronze"]})
    with pytest.raises(ValidationError, match="does not rank below"):
        config(mayEvict={"gold": ["gold"]})
    assert config().evictable_tiers("gold") == {"silver", "bronze"}
    assert config(mayEvict={"gold": ["bronze"]}).evictable_tiers("silver") == frozenset()


def test_victim_cost_weighs_count_work_tier_and_priority() -> None:
    snap = h100_racks(racks=1)
    cfg = config()
    bronze = victim_cost(run(snap, "ns/b", "h00", 4, hours=2.0), cfg)
    silver = victim_cost(run(snap, "ns/s", "h01", 4, hours=2.0, tier="silver", priority=7), cfg)
    assert bronze.lost_gpu_hours == 8.0 and bronze.cost == 1000 + 800
    assert silver.cost == 1000 + 800 + 500 + 7


# ---------------------------------------------------------------- against brute force


def _levels_for(gang: Gang) -> list[str | None]:
    levels: list[str | None] = [RACK, BLOCK, None]
    return [HOST, *levels] if gang.pod_count == 1 else levels


def _brute_force(snap: ClusterSnapshot, gang: Gang, running: Sequence[RunningGang],
                 cfg: PlacementConfig) -> tuple[str | None, int] | None:
    """(level, cost) of the cheapest allowed victim set, from the definitions: the first
    level (the gang's own, then upwards) where some set of at most maxVictimsPerGang
    evictable gangs, each with a pod in one domain, lets the engine place the gang inside
    that domain."""
    pre = cfg.preemption
    allowed = [r for r in running if r.gang.tier in cfg.evictable_tiers(gang.tier)
               and r.ran_seconds >= pre.min_run_seconds]
    for level in _levels_for(gang):
        if level is None:
            domains = {(): set(snap.nodes)}
        else:
            domains = {}
            for node in snap:
                domains.setdefault(domain_at(node, LEVELS, level), set()).add(node.name)
        best: int | None = None
        for members in domains.values():
            cands = [r for r in allowed if any(s.node in members for s in r.slots)]
            for k in range(1, pre.max_victims_per_gang + 1):
                for subset in itertools.combinations(cands, k):
                    cost = sum(victim_cost(r, cfg).cost for r in subset)
                    if best is not None and cost >= best:
                        continue
                    sub = ClusterSnapshot({n: snap.nodes[n].copy() for n in members})
                    for r in subset:
                        release_slots(sub, r.gang, [s for s in r.slots if s.node in members])
                    no_hold = cfg.model_copy(update={"locality_wait": None})
                    if ENGINE.place(sub, gang, no_hold).feasible:
                        best = cost
        if best is not None:
            return level, best
    return None


@st.composite
def instances(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[RunningGang], Gang]:
    nodes = []
    for b in range(2):
        for r in range(draw(st.integers(1, 2))):
            for i in range(2):
                gpus = draw(st.sampled_from((4, 8)))
                product = draw(st.sampled_from((H100, H100, L40S)))
                nodes.append(gpu_node(f"n{b}{r}{i}", gpu=product, gpus=gpus, rack=f"r{r}",
                                      block=f"b{b}"))
    snap = snapshot(*nodes)
    # most GPUs busy with small gangs of every tier, so the preemptor rarely fits as is
    running: list[RunningGang] = []
    for node in sorted(snap.nodes):
        for _ in range(draw(st.integers(1, 3))):
            gpus = draw(st.sampled_from((2, 4, 4)))
            if snap.nodes[node].free_whole_gpus < gpus or len(running) >= 8:
                continue
            running.append(run(snap, f"ns/r{len(running)}", node, gpus,
                               tier=draw(st.sampled_from(("gold", "silver", "bronze", "bronze"))),
                               hours=draw(st.sampled_from((0.0, 0.5, 1.0, 3.0))),
                               priority=draw(st.integers(0, 3))))
    pods = draw(st.integers(1, 3))
    gang = gold_gang(pods=pods, gpus=draw(st.sampled_from((4, 8))),
                     tier=draw(st.sampled_from(("gold", "silver"))))
    return snap, running, gang


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=instances(), max_victims=st.integers(1, 3),
       min_run_hours=st.sampled_from((0.0, 0.75)))
def test_victims_are_the_cheapest_allowed_set(
    instance: tuple[ClusterSnapshot, list[RunningGang], Gang], max_victims: int,
    min_run_hours: float,
) -> None:
    snap, running, gang = instance
    cfg = config(victims="any", maxVictimsPerGang=max_victims,
                 minRunSeconds=3600.0 * min_run_hours)
    plan = plan_preemption(ENGINE, snap, gang, running, cfg)
    expected = _brute_force(snap, gang, running, cfg)
    if expected is None:
        assert plan is None
        return
    assert plan is not None
    assert (plan.level, plan.cost) == expected
    # whole gangs of evictable tiers only, within the limits
    by_name = {r.name: r for r in running}
    victims = [by_name[name] for name in plan.victim_names]
    assert len(victims) <= max_victims
    assert all(cfg.tier_rank(v.gang.tier) > cfg.tier_rank(gang.tier) for v in victims)
    assert all(v.ran_seconds >= cfg.preemption.min_run_seconds for v in victims)
    # the placement is sound on the cluster with exactly the victims' slots given back
    freed = snap.copy()
    for v in victims:
        release_slots(freed, v.gang, v.slots)
    assert violations(freed, gang, plan.placement, cfg) == []
    assert plan.placement.feasible and len(plan.placement.slots) == gang.pod_count


def test_owners_waiting_counts_only_gangs_their_free_hardware_could_hold() -> None:
    snap = snapshot(gpu_node("h0", used=range(6)), gpu_node("a0", gpu=L40S))
    cfg = config()
    # Gold owns premium: 2 H100s free; Silver owns standard: 8 L40S free
    assert owners_waiting(snap, cfg, [("gold", 2000), ("silver", 8000)]) == {"gold", "silver"}
    assert owners_waiting(snap, cfg, [("gold", 4000), ("silver", 16000)]) == frozenset()
    assert owners_waiting(snap, cfg, [("bronze", 1000)]) == frozenset()  # owns no hardware here


def test_a_gang_that_waited_long_enough_gets_the_domain_freest_now_to_drain() -> None:
    snap = h100_racks()
    # rack r0: two nodes free and two half busy; rack r1: every node busy with Gold work
    running = [run(snap, "ns/a", "h02", 4, tier="gold"), run(snap, "ns/b", "h03", 4),
               *(run(snap, f"ns/g{i}", f"h1{i}", 8, tier="gold") for i in range(4))]
    gang = gold_gang()
    cfg = config(drainAfterSeconds=600)
    assert plan_drain(ENGINE, snap, gang, running, cfg) is None  # has not waited yet
    waited = Gang(gang.name, gang.pod_sets, tier="gold", workload_type=gang.workload_type,
                  preferred_level=RACK, waited_seconds=601)
    plan = plan_drain(ENGINE, snap, waited, running, cfg)
    assert plan is not None and plan.domain == ("b0", "r0")
    # waited for, whatever their tier; nothing is evicted
    assert set(plan.victim_names) == {"ns/a", "ns/b"} and plan.cost == 8
    assert nodes_of(plan.placement.slots) == {f"h0{i}" for i in range(4)}
    assert "draining example.com/rack=b0/r0" in plan.placement.explanation[-1]
    assert plan_drain(ENGINE, snap, waited, running, config()) is None  # drain off


def test_a_compute_domain_gang_preempts_inside_one_open_nvlink_clique() -> None:
    """Bronze work fills cliques A and B and a rack in no clique (the cheapest to lose): a
    gold ComputeDomain gang evicts inside one clique, never the clique-less rack, and never
    in a clique another ComputeDomain holds."""
    clique = "nvidia.com/gpu.clique"

    def node(name: str, c: str | None, rack: str) -> Node:
        return gpu_node(name, rack=rack, clique=c, labels={clique: c} if c else {})

    snap = snapshot(node("a0", "A", "r0"), node("a1", "A", "r0"), node("b0", "B", "r1"),
                    node("b1", "B", "r1"), node("c0", None, "r2"), node("c1", None, "r2"))
    hours = {"a": 1.0, "b": 2.0, "c": 0.1}
    running = [run(snap, f"ns/{n}", n, 8, hours=hours[n[0]]) for n in snap.nodes]
    ps = PodSet("w", 2, gpus=8, required_level=clique, compute_domain="ns/cd-channel")
    gang = Gang("ns/cd", (ps,), tier="gold", required_level=clique)
    plan = plan_preemption(ENGINE, snap, gang, running, config())
    assert plan is not None and set(plan.victim_names) == {"ns/a0", "ns/a1"}
    assert nodes_of(plan.placement.slots) == {"a0", "a1"}
    held = plan_preemption(ENGINE, snap, replace(gang, closed_cliques=frozenset({"A"})),
                           running, config())
    assert held is not None and nodes_of(held.placement.slots) == {"b0", "b1"}
