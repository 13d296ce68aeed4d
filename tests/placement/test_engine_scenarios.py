"""The nexus CP-SAT engine on small hand-built clusters: each scenario is a decision a
platform engineer relies on (tier → hardware, VRAM, islands, racks, NUMA, spread vs pack,
taints and selectors, rank order, shared GPUs) and the shape of the answer (status, reason,
terms, explanation)."""

from __future__ import annotations

from collections import Counter

import pytest

from nexus_admit.bench.fleet import bench_config, bench_gang, generate_fleet
from nexus_admit.model import (
    ClusterSnapshot,
    Gang,
    LocalityWait,
    NumaPolicy,
    Placement,
    PlacementConfig,
    PodSet,
    SolveStatus,
    Taint,
    Toleration,
    WorkloadType,
)
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.objective import TERMS, evaluate_terms, term_weights, weighted_objective
from nexus_admit.placement.problem import prepare
from nexus_admit.placement.validate import violations
from tests.factories import (
    A100,
    BLOCK,
    H100,
    HOST,
    RACK,
    T4,
    config,
    gpu_node,
    node_state,
    snapshot,
)

CONFIG = config()
TRAINING = WorkloadType.TRAINING
INFERENCE = WorkloadType.INFERENCE


def place(snap: ClusterSnapshot, gang: Gang, cfg: PlacementConfig = CONFIG) -> Placement:
    placement = CpSatEngine(seed=0).place(snap, gang, cfg)
    assert violations(snap, gang, placement, cfg) == []
    return placement


def placed(snap: ClusterSnapshot, gang: Gang, cfg: PlacementConfig = CONFIG) -> Placement:
    """Place and insist it worked, proven optimal (every scenario here is tiny)."""
    placement = place(snap, gang, cfg)
    assert placement.feasible, placement.reason
    assert placement.status is SolveStatus.OPTIMAL
    assert len(placement.slots) == gang.pod_count
    return placement


def nodes_of(placement: Placement) -> set[str]:
    return set(placement.pods_per_node())


def racks_of(snap: ClusterSnapshot, placement: Placement) -> set[str]:
    return {snap.nodes[n].labels[RACK] for n in nodes_of(placement)}


def gang(
    *pod_sets: PodSet,
    tier: str = "bronze",
    kind: WorkloadType = TRAINING,
    **kwargs: object,
) -> Gang:
    return Gang("ns/job", pod_sets, tier=tier, workload_type=kind, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- tier → hardware class


def test_gold_goes_to_premium_h100_not_a100() -> None:
    snap = snapshot(gpu_node("a100", gpu=A100), gpu_node("h100", gpu=H100))
    g = gang(PodSet("w", 2, cpu_milli=8000, gpus=4), tier="gold")
    p = placed(snap, g)
    assert nodes_of(p) == {"h100"}
    assert p.terms["tierMismatch"] == 0


def test_bronze_prefers_economy() -> None:
    snap = snapshot(
        gpu_node("h100", gpu=H100), gpu_node("a100", gpu=A100), gpu_node("t4", gpu=T4)
    )
    p = placed(snap, gang(PodSet("w", 1, gpus=8), tier="bronze"))
    assert nodes_of(p) == {"t4"}
    assert p.terms["tierMismatch"] == 0
    # an 8-GPU pod can never sit in one 4-GPU NUMA zone: not counted as unaligned
    assert p.terms["numaUnaligned"] == 0


def test_small_vram_need_goes_to_the_smaller_gpu_of_the_same_class() -> None:
    # silver wants 50 % of each GPU's VRAM used: 20 GiB on an 80 GiB A100 strands 20 GiB
    a100_40 = ("NVIDIA-A100-SXM4-40GB", 40960)
    snap = snapshot(gpu_node("a100-80", gpu=A100), gpu_node("a100-40", gpu=a100_40))
    p = placed(snap, gang(PodSet("w", 1, gpus=8, vram_mib=20 * 1024), tier="silver"))
    assert nodes_of(p) == {"a100-40"}
    assert p.terms["vramStrandedGiB"] == 0
    on_80 = placed(snapshot(gpu_node("a100-80", gpu=A100)),
                   gang(PodSet("w", 1, gpus=8, vram_mib=20 * 1024), tier="silver"))
    assert on_80.terms["vramStrandedGiB"] == pytest.approx(8 * 20.0)


def test_shared_gpu_tier_mismatch_is_proportional_to_the_share() -> None:
    snap = snapshot(gpu_node("a100", gpu=A100, gpus=1, numa=False))
    p = placed(snap, gang(PodSet("s", 1, gpus=1, gpu_milli=250), tier="gold"))
    assert p.terms["tierMismatch"] == pytest.approx(0.25 * 40)


def test_bronze_on_premium_when_nothing_else_fits_reports_the_mismatch() -> None:
    # the T4 has too little VRAM for this pod; A100 (standard, 30) beats H100 (premium, 80)
    snap = snapshot(
        gpu_node("h100", gpu=H100), gpu_node("a100", gpu=A100), gpu_node("t4", gpu=T4)
    )
    p = placed(snap, gang(PodSet("w", 1, gpus=8, vram_mib=40 * 1024), tier="bronze"))
    assert nodes_of(p) == {"a100"}
    assert p.terms["tierMismatch"] == 8 * 30


# ---------------------------------------------------------------- never vs not now


def test_vram_above_every_gpu_is_impossible_with_a_message_in_gib() -> None:
    snap = snapshot(gpu_node("h100", gpu=H100), gpu_node("a100", gpu=A100))
    g = gang(PodSet("w", 2, gpus=1, vram_mib=141 * 1024))
    p = place(snap, g)
    assert not p.feasible
    assert p.status is SolveStatus.IMPOSSIBLE
    assert not p.retryable
    assert p.slots == []
    assert "141 GiB" in p.reason
    assert "80 GiB" in p.reason  # the largest GPU there is


def test_capacity_shortfall_is_infeasible_and_retryable() -> None:
    # 4 GPUs free in the whole cluster, 6 asked
    snap = snapshot(gpu_node("a", used=range(6)), gpu_node("b", used=range(6)))
    p = place(snap, gang(PodSet("w", 3, gpus=2)))
    assert not p.feasible
    assert p.status is SolveStatus.INFEASIBLE
    assert p.retryable
    assert "retry" in p.reason
    assert p.slots == []
    assert p.explanation == [p.reason]


def test_pod_sets_competing_for_one_node_are_infeasible_together() -> None:
    snap = snapshot(gpu_node("a", used=range(4)))  # 4 free GPUs
    g = gang(PodSet("a", 1, gpus=4), PodSet("b", 1, gpus=2))  # each fits alone
    p = place(snap, g)
    assert not p.feasible
    assert p.status is SolveStatus.INFEASIBLE and p.retryable


def test_pod_set_whose_pool_is_not_there_yet_waits_for_nodes() -> None:
    snap = snapshot(gpu_node("a"), gpu_node("b"))
    p = place(snap, gang(PodSet("w", 1, gpus=1, node_selector={"pool": "missing"})))
    assert p.status is SolveStatus.UNAVAILABLE and p.retryable
    assert "fits no node now (2 selector/affinity)" in p.reason and "added" in p.reason


@pytest.mark.parametrize(
    "unusable",
    [
        pytest.param(lambda n: setattr(n, "schedulable", False), id="cordoned-or-not-ready"),
        pytest.param(lambda n: setattr(n, "taints", (Taint("maint", "", "NoSchedule"),)),
                     id="tainted"),
    ],
)
def test_a_gang_whose_every_node_is_unusable_now_waits_for_nodes(unusable) -> None:
    snap = snapshot(gpu_node("a"), gpu_node("b"))
    for n in snap:
        unusable(n)
    p = place(snap, gang(PodSet("w", 2, gpus=8)))
    assert p.status is SolveStatus.UNAVAILABLE and p.slots == []
    assert "fits no node now (2 " in p.reason


def test_more_gpus_per_pod_than_any_node_is_impossible_even_when_nodes_are_cordoned() -> None:
    snap = snapshot(gpu_node("a"), gpu_node("b"))
    snap.nodes["a"].schedulable = False
    p = place(snap, gang(PodSet("w", 1, gpus=16)))
    assert p.status is SolveStatus.IMPOSSIBLE
    assert "fits no node in the cluster" in p.reason


def test_unknown_tier_is_impossible() -> None:
    p = place(snapshot(gpu_node("a")), gang(PodSet("w", 1, gpus=1), tier="platinum"))
    assert p.status is SolveStatus.IMPOSSIBLE
    assert "platinum" in p.reason


def test_required_level_that_is_not_configured_is_impossible() -> None:
    p = place(snapshot(gpu_node("a")),
              gang(PodSet("w", 1, gpus=1), required_level="example.com/pod"))
    assert p.status is SolveStatus.IMPOSSIBLE
    assert "example.com/pod" in p.reason and "not a configured topology level" in p.reason


# ---------------------------------------------------------------- GPU islands


def test_small_inference_pod_does_not_break_a_pristine_island() -> None:
    snap = snapshot(gpu_node("pristine"), gpu_node("partly", used=range(4)))
    p = placed(snap, gang(PodSet("server", 1, cpu_milli=4000, gpus=2), kind=INFERENCE))
    assert nodes_of(p) == {"partly"}
    assert p.terms["islandsBroken"] == 0
    assert snap.nodes["pristine"].is_pristine()


def test_small_training_gang_completes_partly_used_nodes_first() -> None:
    snap = snapshot(
        gpu_node("pristine-1"), gpu_node("pristine-2"), gpu_node("partly", used=range(4))
    )
    p = placed(snap, gang(PodSet("w", 2, gpus=2)))
    assert nodes_of(p) == {"partly"}
    assert p.terms["islandsBroken"] == 0


def test_node_sized_gang_fills_a_pristine_node_entirely() -> None:
    snap = snapshot(gpu_node("p1"), gpu_node("p2"))
    p = placed(snap, gang(PodSet("w", 8, cpu_milli=8000, gpus=1)))
    assert len(nodes_of(p)) == 1
    assert p.pods_per_node() == {next(iter(nodes_of(p))): 8}
    assert p.terms["islandsBroken"] == 0  # taking a whole island is what it is kept for
    assert p.terms["fragmentation"] == 0


def test_breaking_an_island_is_counted_when_unavoidable() -> None:
    snap = snapshot(gpu_node("p1"))
    p = placed(snap, gang(PodSet("w", 1, gpus=2)))
    assert p.terms["islandsBroken"] == 1


def test_nvlink_clique_is_not_broken_for_a_small_pod() -> None:
    snap = snapshot(
        gpu_node("c1", clique="nvl-0", rack="r0"),
        gpu_node("c2", clique="nvl-0", rack="r0"),
        gpu_node("partly", used=range(6), rack="r0"),
    )
    p = placed(snap, gang(PodSet("w", 1, gpus=2)))
    assert nodes_of(p) == {"partly"}
    assert p.terms["islandsBroken"] == 0


# ---------------------------------------------------------------- topology


def _two_racks() -> ClusterSnapshot:
    # r0: two A100 nodes with 4 free GPUs each; r1: one H100 node with 4 free GPUs.
    return snapshot(
        gpu_node("a100-1", gpu=A100, used=range(4), rack="r0"),
        gpu_node("a100-2", gpu=A100, used=range(4), rack="r0"),
        gpu_node("h100-1", gpu=H100, used=range(4), rack="r1"),
    )


def test_without_topology_request_gold_splits_racks_for_premium_gpus() -> None:
    """The control for the next tests: cost alone would span two racks."""
    snap = _two_racks()
    p = placed(snap, gang(PodSet("w", 4, gpus=2), tier="gold"))
    assert "h100-1" in nodes_of(p)
    assert len(racks_of(snap, p)) == 2
    assert p.terms["gangSplit"] == 1  # reported even while its weight is 0 (the default)


def _with_gang_split(weight: int) -> PlacementConfig:
    return CONFIG.model_copy(
        update={"weights": CONFIG.weights.model_copy(update={"gang_split": weight})}
    )


def test_gang_split_keeps_a_gold_gang_in_one_rack_over_premium_gpus() -> None:
    """Leaving a rack slows every GPU of the gang: weighed per GPU, a split of these 8 GPUs
    (8 × 400) costs more than 4 of them on the standard class (4 × 40 × 10)."""
    snap = _two_racks()
    p = placed(snap, gang(PodSet("w", 4, gpus=2), tier="gold"), _with_gang_split(400))
    assert racks_of(snap, p) == {"r0"}
    assert p.terms["gangSplit"] == 0
    assert p.terms["tierMismatch"] == 8 * 40


def test_gang_split_weight_scales_with_the_gangs_gpus() -> None:
    snap = _two_racks()
    cfg = _with_gang_split(400)
    for pods, gpus in ((4, 2), (2, 1), (1, 1)):
        problem = prepare(snap, gang(PodSet("w", pods, gpus=gpus), tier="gold"), cfg)
        assert term_weights(problem)["gangSplit"] == 400 * pods * gpus
        assert term_weights(problem)["domainSpread"] == 400  # per gang, whatever its size
    shares = prepare(snap, gang(PodSet("w", 3, gpus=1, gpu_milli=500)), cfg)
    assert term_weights(shares)["gangSplit"] == 400 * 2  # 1.5 GPUs round up


def _locality_wait(seconds: float = 600.0) -> PlacementConfig:
    return CONFIG.model_copy(
        update={"locality_wait": LocalityWait(level=RACK, max_wait_seconds=seconds)}
    )


def test_locality_wait_holds_a_gang_one_idle_rack_could_hold_rather_than_split_it() -> None:
    """12 GPUs: free only across both racks now, but r0 holds 16 when idle. Within the wait
    the gang is held back (a retryable answer that says when to ask again); after it, split."""
    snap = _two_racks()
    held = place(snap, gang(PodSet("w", 6, gpus=2), waited_seconds=100.0), _locality_wait())
    assert not held.feasible
    assert held.retryable
    assert held.retry_after_seconds == pytest.approx(500.0)
    assert "held for locality" in held.reason
    assert "waited 100 of 600 s" in held.reason
    late = placed(snap, gang(PodSet("w", 6, gpus=2), waited_seconds=600.0), _locality_wait())
    assert len(racks_of(snap, late)) == 2
    problem = prepare(snap, gang(PodSet("w", 6, gpus=2)), CONFIG)
    assert problem.idle_room(problem.level_index(RACK)) == {("b0", "r0"): 1, ("b0", "r1"): 0}


def test_locality_wait_keeps_the_gang_in_one_rack_when_one_has_room_now() -> None:
    """Tier cost alone would split this gold gang for the H100 (the control test above)."""
    snap = _two_racks()
    p = placed(snap, gang(PodSet("w", 4, gpus=2), tier="gold"), _locality_wait())
    assert racks_of(snap, p) == {"r0"}
    assert any("kept inside one example.com/rack domain" in line for line in p.explanation)


def test_locality_wait_leaves_alone_what_waiting_cannot_help() -> None:
    snap = _two_racks()
    cfg = _locality_wait()
    # spreading workloads without a preferred level
    spread = placed(snap, gang(PodSet("svc", 6, gpus=2), kind=INFERENCE), cfg)
    assert len(racks_of(snap, spread)) == 2
    # a gang no rack could hold even idle
    big = snapshot(*(gpu_node(f"n{r}{i}", rack=f"r{r}") for r in range(2) for i in range(2)))
    assert len(racks_of(big, placed(big, gang(PodSet("w", 12, gpus=2)), cfg))) == 2
    # a gang that already requires one rack: the requirement answers, not the hold
    required = place(snap, gang(PodSet("w", 6, gpus=2), required_level=RACK), cfg)
    assert required.retryable
    assert required.retry_after_seconds is None
    assert "held for locality" not in required.reason


def test_locality_wait_level_must_be_a_topology_level_above_the_host() -> None:
    for level in (HOST, "example.com/unknown"):
        with pytest.raises(ValueError, match=r"localityWait\.level"):
            PlacementConfig.model_validate({
                "topology": {"levels": list(CONFIG.topology.levels or ())},
                "localityWait": {"level": level},
            })


def test_pod_sets_on_one_node_are_fitted_in_the_order_that_keeps_numa_aligned() -> None:
    """Found by hypothesis: GPU pods first would take a little CPU from both zones and
    leave the CPU-only pod that needs a whole zone straddling them; that pod goes first."""
    snap = snapshot(gpu_node("n0", used=[3], cpu_milli=16_000))
    g = gang(
        PodSet("driver", 1, cpu_milli=8000),
        PodSet("workers", 2, cpu_milli=1000, gpus=2),
        tier="gold",
    )
    p = placed(snap, g)
    assert p.terms["numaUnaligned"] == 0
    assert all(slot.numa_zone is not None for slot in p.slots)


def test_a_gang_goes_to_the_tightest_rack_that_holds_it() -> None:
    """Kueue TAS's BestFit over racks: the rack left with the fewest free GPUs wins, so the
    roomier rack stays whole for a later gang (domainFragmentation)."""
    snap = snapshot(
        gpu_node("roomy-1", rack="r0"),
        gpu_node("roomy-2", rack="r0"),
        gpu_node("roomy-3", rack="r0"),
        gpu_node("tight-1", rack="r1"),
        gpu_node("tight-2", rack="r1"),
        gpu_node("tight-busy", used=range(4), rack="r1"),
    )
    p = placed(snap, gang(PodSet("w", 2, gpus=8)))
    assert racks_of(snap, p) == {"r1"}
    assert p.terms["domainFragmentation"] == 4  # the busy node's four free GPUs
    single = placed(snap, gang(PodSet("one", 1, gpus=8), kind=INFERENCE))
    assert racks_of(snap, single) == {"r1"}  # one pod: nothing to spread, so it fits tightly
    spread = placed(snap, gang(PodSet("svc", 2, gpus=8), kind=INFERENCE))
    assert spread.terms["domainFragmentation"] > 0
    problem = prepare(snap, gang(PodSet("svc", 2, gpus=8), kind=INFERENCE), CONFIG)
    assert term_weights(problem)["domainFragmentation"] == 0  # spreading types are exempt


def test_required_topology_keeps_all_pods_in_one_rack() -> None:
    snap = _two_racks()
    p = placed(snap, gang(PodSet("w", 4, gpus=2), tier="gold", required_level=RACK))
    assert racks_of(snap, p) == {"r0"}
    assert p.terms["domainSpread"] == 0


def test_required_topology_with_no_rack_big_enough_is_infeasible() -> None:
    snap = _two_racks()  # 12 GPUs free in all, at most 8 in one rack
    p = place(snap, gang(PodSet("w", 6, gpus=2), tier="gold", required_level=RACK))
    assert not p.feasible
    assert p.status is SolveStatus.INFEASIBLE
    assert p.retryable
    assert RACK in p.reason
    # and without the requirement the same gang fits
    assert placed(snap, gang(PodSet("w", 6, gpus=2), tier="gold")).feasible


def test_required_topology_on_multiple_pod_sets_shares_one_domain() -> None:
    snap = snapshot(
        gpu_node("r0-a", used=range(6), rack="r0"),
        gpu_node("r1-a", used=range(4), rack="r1"),
        gpu_node("r1-b", used=range(4), rack="r1"),
        gpu_node("r2-a", used=range(6), rack="r2"),
    )
    g = gang(PodSet("driver", 1, gpus=2), PodSet("workers", 3, gpus=2), required_level=RACK)
    p = placed(snap, g)
    assert racks_of(snap, p) == {"r1"}


def test_preferred_topology_minimises_racks() -> None:
    snap = snapshot(
        gpu_node("r0-a", used=range(4), rack="r0"),
        gpu_node("r1-a", used=range(4), rack="r1"),
        gpu_node("r1-b", used=range(4), rack="r1"),
        gpu_node("r2-a", used=range(4), rack="r2"),
    )
    p = placed(snap, gang(PodSet("w", 4, gpus=2), preferred_level=RACK))
    assert racks_of(snap, p) == {"r1"}


def test_preferred_topology_spans_racks_before_blocks() -> None:
    # No rack holds the gang; two racks of b0 do, and so do racks of b0 and b1 (listed
    # first): spanning a block costs more than spanning a rack.
    snap = snapshot(
        gpu_node("p", used=range(4), rack="r0", block="b0"),
        gpu_node("q", used=range(4), rack="r1", block="b1"),
        gpu_node("r", used=range(4), rack="r2", block="b0"),
    )
    p = placed(snap, gang(PodSet("w", 4, gpus=2), preferred_level=BLOCK))
    assert nodes_of(p) == {"p", "r"}
    assert p.terms["domainSpread"] == 1  # one extra rack, no extra block


def test_preferred_topology_keeps_an_inference_gang_in_one_rack() -> None:
    """Spreading across nodes for availability should not ignore an explicit
    preferred-topology request: one rack with two nodes serves both."""
    snap = snapshot(
        gpu_node("r0-a", used=range(4), rack="r0"),
        gpu_node("r1-a", used=range(4), rack="r1"),
        gpu_node("r1-b", used=range(4), rack="r1"),
    )
    p = placed(snap, gang(PodSet("server", 2, gpus=1), kind=INFERENCE, preferred_level=RACK))
    assert p.terms["maxPodsPerNode"] == 1
    assert racks_of(snap, p) == {"r1"}


def test_required_topology_binds_inference_gangs_too() -> None:
    snap = snapshot(
        gpu_node("r0-a", used=range(4), rack="r0"),
        gpu_node("r1-a", used=range(4), rack="r1"),
        gpu_node("r1-b", used=range(4), rack="r1"),
    )
    p = placed(snap, gang(PodSet("server", 2, gpus=1), kind=INFERENCE, required_level=RACK))
    assert racks_of(snap, p) == {"r1"}
    assert p.terms["maxPodsPerNode"] == 1


def test_required_hostname_puts_the_whole_gang_on_one_node() -> None:
    """`kubernetes.io/hostname` is a configured level (always the last one), so requiring
    it means one node, even for a gang that would otherwise spread."""
    snap = snapshot(
        gpu_node("r0-a", used=range(4), rack="r0"),
        gpu_node("r1-a", used=range(4), rack="r1"),
        gpu_node("r1-b", used=range(4), rack="r1"),
    )
    p = place(snap, gang(PodSet("server", 3, gpus=1), kind=INFERENCE, required_level=HOST))
    assert p.feasible, p.reason
    assert len(nodes_of(p)) == 1


# ---------------------------------------------------------------- pack vs spread


def _four_partly_used() -> ClusterSnapshot:
    return snapshot(*(gpu_node(f"n{i}", used=range(4)) for i in range(4)))


def test_inference_spreads_across_nodes() -> None:
    p = placed(_four_partly_used(), gang(PodSet("server", 4, gpus=1), kind=INFERENCE))
    assert len(nodes_of(p)) == 4
    assert p.terms["maxPodsPerNode"] == 1


def test_service_spreads_across_nodes() -> None:
    p = placed(_four_partly_used(), gang(PodSet("api", 3, gpus=1), kind=WorkloadType.SERVICE))
    assert p.terms["maxPodsPerNode"] == 1


def test_training_packs_onto_one_node() -> None:
    p = placed(_four_partly_used(), gang(PodSet("w", 4, gpus=1), kind=TRAINING))
    assert len(nodes_of(p)) == 1
    assert p.terms["nodesUsed"] == 1
    assert p.terms["maxPodsPerNode"] == 4


# ---------------------------------------------------------------- NUMA


def test_single_numa_node_gives_each_pod_gpus_from_one_zone() -> None:
    # two free GPUs per zone on each node
    snap = snapshot(gpu_node("a", used=[0, 1, 4, 5]), gpu_node("b", used=[0, 1, 4, 5]))
    g = gang(PodSet("w", 3, cpu_milli=4000, gpus=2),
             numa_policy=NumaPolicy.SINGLE_NUMA_NODE)
    p = placed(snap, g)
    for slot in p.slots:
        node = snap.nodes[slot.node]
        assert slot.numa_zone is not None
        zone = next(z for z in node.numa_zones if z.id == slot.numa_zone)
        assert set(slot.gpu_indices) <= set(zone.gpu_indices)
    assert p.terms["numaUnaligned"] == 0


def test_single_numa_node_refuses_pods_that_would_straddle_zones() -> None:
    snap = snapshot(gpu_node("a", used=[0, 1, 4, 5]))  # 4 free GPUs, 2 per zone
    four = PodSet("w", 1, gpus=4)
    strict = place(snap, gang(four, numa_policy=NumaPolicy.SINGLE_NUMA_NODE))
    assert not strict.feasible and strict.retryable
    relaxed = placed(snap, gang(four, numa_policy=NumaPolicy.PREFERRED))
    assert relaxed.slots[0].numa_zone is None
    assert relaxed.terms["numaUnaligned"] == 1


def test_preferred_numa_picks_the_node_where_the_pod_is_aligned() -> None:
    snap = snapshot(
        gpu_node("split", used=[0, 1, 4, 5]),  # 2 + 2 free
        gpu_node("whole", used=[0, 1, 2, 3]),  # 0 + 4 free
    )
    p = placed(snap, gang(PodSet("w", 1, gpus=4), numa_policy=NumaPolicy.PREFERRED))
    assert nodes_of(p) == {"whole"}
    assert p.slots[0].numa_zone == 1
    assert p.terms["numaUnaligned"] == 0


# ---------------------------------------------------------------- eligibility


def test_taint_excludes_node_unless_tolerated() -> None:
    taint = Taint("dedicated", "infer", "NoSchedule")
    snap = snapshot(gpu_node("h100", gpu=H100, taints=(taint,)), gpu_node("a100", gpu=A100))
    plain = PodSet("w", 1, gpus=8)
    assert nodes_of(placed(snap, gang(plain, tier="gold"))) == {"a100"}
    tolerant = PodSet("w", 1, gpus=8, tolerations=(Toleration("dedicated", "Exists"),))
    assert nodes_of(placed(snap, gang(tolerant, tier="gold"))) == {"h100"}


def test_node_selector_is_respected_even_when_it_costs() -> None:
    snap = snapshot(
        gpu_node("h100", gpu=H100, labels={"pool": "premium"}),
        gpu_node("a100", gpu=A100, labels={"pool": "standard"}),
    )
    g = gang(PodSet("w", 1, gpus=8, node_selector={"pool": "standard"}), tier="gold")
    p = placed(snap, g)
    assert nodes_of(p) == {"a100"}
    assert p.terms["tierMismatch"] == 8 * 40


def test_allowed_nodes_of_the_kueue_flavor_are_respected() -> None:
    snap = snapshot(gpu_node("h100", gpu=H100), gpu_node("a100", gpu=A100), gpu_node("t4", gpu=T4))
    g = gang(PodSet("w", 1, gpus=8, allowed_nodes=frozenset({"a100", "t4"})), tier="gold")
    assert nodes_of(placed(snap, g)) == {"a100"}


def test_unschedulable_node_is_never_used() -> None:
    snap = snapshot(gpu_node("h100", gpu=H100), gpu_node("a100", gpu=A100))
    snap.nodes["h100"].schedulable = False
    assert nodes_of(placed(snap, gang(PodSet("w", 1, gpus=8), tier="gold"))) == {"a100"}


# ---------------------------------------------------------------- indexed pods


def test_consecutive_indices_are_on_the_same_or_neighbouring_nodes() -> None:
    # names deliberately out of topology order; 4 free GPUs each
    snap = snapshot(
        gpu_node("zz", used=range(4), rack="r0"),
        gpu_node("aa", used=range(4), rack="r1"),
        gpu_node("mm", used=range(4), rack="r0"),
        gpu_node("bb", used=range(4), rack="r1"),
    )
    p = placed(snap, gang(PodSet("w", 8, gpus=2, indexed=True)))
    by_index = sorted(p.slots, key=lambda s: s.index)
    assert [s.index for s in by_index] == list(range(8))
    node_seq = [s.node for s in by_index]
    rack_seq = [snap.nodes[n].labels[RACK] for n in node_seq]
    # every node and every rack holds one contiguous run of indices
    node_runs = [n for i, n in enumerate(node_seq) if i == 0 or n != node_seq[i - 1]]
    rack_runs = [r for i, r in enumerate(rack_seq) if i == 0 or r != rack_seq[i - 1]]
    assert len(node_runs) == len(set(node_seq)) == 4
    assert len(rack_runs) == len(set(rack_seq)) == 2
    # slot order follows the topology path (rack, then host)
    assert node_runs == ["mm", "zz", "aa", "bb"]


def test_slots_of_each_pod_set_are_numbered_from_zero() -> None:
    snap = snapshot(gpu_node("a"), gpu_node("b", used=range(4)))
    g = gang(PodSet("driver", 1, cpu_milli=2000), PodSet("workers", 5, gpus=1, indexed=True))
    p = placed(snap, g)
    assert sorted(s.index for s in p.slots if s.pod_set == "driver") == [0]
    assert sorted(s.index for s in p.slots if s.pod_set == "workers") == list(range(5))


# ---------------------------------------------------------------- shared GPUs


def test_fractional_pods_share_gpus_within_their_free_share() -> None:
    snap = snapshot(gpu_node("a", gpus=2, numa=False, shares={0: 500}))
    p = placed(snap, gang(PodSet("s", 3, gpus=1, gpu_milli=500), kind=INFERENCE))
    per_gpu = Counter(g for s in p.slots for g in s.gpu_indices)
    assert per_gpu == {0: 1, 1: 2}


def test_fractional_pods_beyond_the_free_share_are_infeasible() -> None:
    snap = snapshot(gpu_node("a", gpus=2, numa=False, shares={0: 500}))
    p = place(snap, gang(PodSet("s", 4, gpus=1, gpu_milli=500)))
    assert not p.feasible and p.retryable


def test_whole_and_shared_gpu_pods_do_not_overlap_on_one_node() -> None:
    snap = snapshot(gpu_node("a", gpus=2, numa=False))
    g = gang(PodSet("trainer", 1, gpus=1), PodSet("sidecar", 2, gpus=1, gpu_milli=500))
    p = placed(snap, g)
    trainer = {gi for s in p.slots if s.pod_set == "trainer" for gi in s.gpu_indices}
    shared = {gi for s in p.slots if s.pod_set == "sidecar" for gi in s.gpu_indices}
    assert len(trainer) == 1 and len(shared) == 1
    assert trainer.isdisjoint(shared)


def test_two_shared_pod_sets_can_share_one_gpu() -> None:
    """Half + quarter + quarter is exactly one GPU; every baseline finds it."""
    snap = snapshot(gpu_node("a", gpus=1, numa=False))
    g = gang(PodSet("half", 1, gpus=1, gpu_milli=500), PodSet("quarter", 2, gpus=1, gpu_milli=250))
    p = place(snap, g)
    assert p.feasible, p.reason
    assert {s.gpu_indices for s in p.slots} == {(0,)}


def test_mixed_shares_that_pack_exactly_are_placed() -> None:
    """2 × 0.4 + 2 × 0.6 GPU on two free GPUs: each GPU takes one of each. Listing the
    small pods first must not make the engine give up."""
    snap = snapshot(gpu_node("a", gpus=2, numa=False))
    g = gang(PodSet("small", 2, gpus=1, gpu_milli=400), PodSet("big", 2, gpus=1, gpu_milli=600))
    p = place(snap, g)
    assert p.feasible, p.reason
    per_gpu = Counter(g for s in p.slots for g in s.gpu_indices)
    assert per_gpu == {0: 2, 1: 2}


def test_shared_pods_go_to_partly_used_gpus_before_opening_whole_ones() -> None:
    snap = snapshot(
        gpu_node("partly", gpus=4, numa=False, shares={0: 750, 1: 0, 2: 0, 3: 0}),
        gpu_node("fresh", gpus=4, numa=False),
    )
    p = placed(snap, gang(PodSet("s", 1, gpus=1, gpu_milli=250)))
    assert p.slots[0].node == "partly" and p.slots[0].gpu_indices == (0,)


# ---------------------------------------------------------------- the answer itself


def test_objective_is_the_weighted_sum_of_the_reported_terms() -> None:
    snap = snapshot(
        gpu_node("h", gpu=H100, used=range(2), rack="r0"),
        gpu_node("a", gpu=A100, rack="r1"),
        gpu_node("t", gpu=T4, used=[0], shares={1: 500}, rack="r1"),
    )
    g = gang(PodSet("w", 3, cpu_milli=8000, gpus=2, vram_mib=10 * 1024),
             PodSet("s", 2, gpus=1, gpu_milli=500), tier="silver")
    p = placed(snap, g)
    problem = prepare(snap, g, CONFIG)
    terms = evaluate_terms(problem, p.slots)
    assert set(p.terms) == set(TERMS)
    assert p.terms == terms
    assert p.objective == pytest.approx(weighted_objective(problem, terms))
    # the solver's own objective is the same number (domainSpread's constant taken off),
    # and the explanation's two objective lines agree
    assert p.model_objective == pytest.approx(p.objective, abs=0.01)
    assert f"objective {p.model_objective:g}," in p.explanation[-1]


def test_explanation_first_line_names_pods_nodes_and_tier() -> None:
    snap = snapshot(gpu_node("h100", gpu=H100), gpu_node("a100", gpu=A100))
    p = placed(snap, gang(PodSet("w", 2, gpus=4), tier="gold"))
    first = p.explanation[0]
    assert "2 pods" in first
    assert "1 premium node" in first
    assert "tier gold" in first
    assert any("CP-SAT" in line for line in p.explanation)


def test_place_does_not_mutate_the_snapshot() -> None:
    snap = snapshot(
        gpu_node("a", used=[0], shares={1: 500}), gpu_node("b"), gpu_node("c", gpu=A100)
    )
    before = node_state(snap)
    g = gang(PodSet("w", 3, cpu_milli=4000, memory_mib=4096, gpus=2),
             PodSet("s", 2, cpu_milli=1000, gpus=1, gpu_milli=250))
    placed(snap, g)
    assert node_state(snap) == before


def test_single_numa_pods_of_two_sets_share_both_zones() -> None:
    """Each zone holds one CPU-heavy pod and one 2-GPU pod; fitting the 2-GPU pods first
    packs both into one zone and strands a CPU-heavy pod (a hypothesis counterexample:
    the engine used to give up on this node)."""
    node = gpu_node("n0", cpu_milli=18_000)
    g = gang(
        PodSet("heavy", 2, cpu_milli=8000, memory_mib=1024, gpus=1),
        PodSet("wide", 2, cpu_milli=1000, memory_mib=1024, gpus=2),
        numa_policy=NumaPolicy.SINGLE_NUMA_NODE,
    )
    p = placed(snapshot(node), g)
    zones = Counter((s.pod_set, s.numa_zone) for s in p.slots)
    assert zones == {("heavy", 0): 1, ("heavy", 1): 1, ("wide", 0): 1, ("wide", 1): 1}


def test_repeated_solves_agree_on_the_objective() -> None:
    snap = _four_partly_used()
    g = gang(PodSet("w", 3, gpus=2, indexed=True))
    first = placed(snap, g)
    second = placed(snap, g)
    assert first.objective == second.objective


def test_pruned_large_fleet_placement_is_sound_and_does_not_claim_optimality() -> None:
    """A 40-node budget on 300 nodes makes the engine prune to a few domains (a heuristic):
    the placement is still sound, and it says `feasible`, never `optimal`."""
    fleet = generate_fleet(300, seed=4)
    cfg = bench_config(time_limit=2.0)
    cfg = cfg.model_copy(
        update={"solver": cfg.solver.model_copy(update={"max_candidate_nodes": 40})}
    )
    g = bench_gang(64)
    assert g.required_level is None  # a required level kept whole may stay exact
    p = CpSatEngine(seed=0).place(fleet, g, cfg)
    assert p.feasible, p.reason
    assert any("pruned" in line for line in p.explanation), p.explanation
    assert p.status is SolveStatus.FEASIBLE
    assert violations(fleet, g, p, cfg) == []
    assert len(p.slots) == 64


@pytest.mark.parametrize("seed", [1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14])
def test_pruning_never_loses_the_best_greedy_domain_fill(seed: int) -> None:
    """With a small node budget the engine solves inside a few domains only; the one whose
    greedy fill is best must be among them, so the result is never worse than that fill
    (a regression: ties on the lower bound used to be broken by domain name)."""
    fleet = generate_fleet(400, seed=seed)
    cfg = bench_config(time_limit=2.0)
    cfg = cfg.model_copy(
        update={"solver": cfg.solver.model_copy(update={"max_candidate_nodes": 40})}
    )
    g = bench_gang(64)
    engine = CpSatEngine(seed=0)
    p = engine.place(fleet, g, cfg)
    assert p.feasible, p.reason
    assert any("pruned" in line for line in p.explanation)
    problem = prepare(fleet, g, cfg)
    red = engine._candidates(problem)
    level = problem.levels.index(g.preferred_level or "")
    fills = []
    for block in {problem.paths[n][level] for n in red.nodes}:
        members = [n for n in red.nodes if problem.paths[n][level] == block]
        found = engine._greedy(problem, red, members)
        if found is not None:
            fills.append(found[0])
    assert fills, "the fleet should have blocks that hold the gang"
    assert p.objective <= min(fills) + 1e-6


# ---------------------------------------------------------------- Kueue Topology objects


def test_kueue_topology_name_resolves_levels_from_the_snapshot() -> None:
    cfg = PlacementConfig.from_spec({"topology": {"topologyName": "gpu-fabric"}})
    snap = snapshot(
        gpu_node("r0-a", used=range(4), rack="r0"),
        gpu_node("r1-a", used=range(4), rack="r1"),
        gpu_node("r1-b", used=range(4), rack="r1"),
        **{"gpu-fabric": (BLOCK, RACK)},
    )
    p = placed(snap, gang(PodSet("w", 4, gpus=2), required_level=RACK), cfg)
    assert racks_of(snap, p) == {"r1"}


def test_unknown_kueue_topology_name_is_impossible_with_a_clear_reason() -> None:
    cfg = PlacementConfig.from_spec({"topology": {"topologyName": "gpu-fabric"}})
    snap = snapshot(gpu_node("a"), **{"other": (RACK,)})
    p = place(snap, gang(PodSet("w", 1, gpus=1)), cfg)
    assert not p.feasible
    assert p.status is SolveStatus.IMPOSSIBLE
    assert "gpu-fabric" in p.reason
    assert "no Kueue Topology" in p.reason


def test_rack_budget_leads_with_the_parent_whose_racks_cover_the_gang_in_fewest_racks() -> None:
    """When spreading may pay, the racks kept beside the best single domains come from one
    parent domain: the one whose racks cover the gang in the fewest racks, even when the
    single densest rack lies elsewhere (a gang spread inside one parent spans fewer
    domains above the rack)."""
    scattered = [gpu_node(f"s0-{i}", rack="s0", block="b-scatter") for i in range(4)]
    scattered += [gpu_node(f"s{r}-0", rack=f"s{r}", block="b-scatter") for r in range(1, 5)]
    dense = [
        gpu_node(f"d{r}-{i}", rack=f"d{r}", block="b-dense")
        for r, count in enumerate((3, 3, 2))
        for i in range(count)
    ]
    snap = snapshot(*scattered, *dense)
    g = gang(PodSet("w", 8, gpus=8), tier="gold")
    engine = CpSatEngine(seed=0)
    problem = prepare(snap, g, CONFIG)
    red = engine._candidates(problem)
    weights = term_weights(problem)
    room = {n: red.caps[("w", n)] for n in red.nodes}
    pod_cost = {n: engine._pod_cost(problem, n, weights) for n in red.nodes}
    order = engine._dense_racks(problem, red, room, pod_cost, 0, weights)
    assert sorted(order[:8]) == sorted(n.name for n in dense)
    assert order[8:12] == [f"s0-{i}" for i in range(4)]  # then the densest rack overall
    assert sorted(order) == sorted(n.name for n in (*scattered, *dense))


def test_kept_fraction_raises_the_node_budget_on_large_candidate_sets() -> None:
    fleet = generate_fleet(400, seed=4)
    g = bench_gang(64)

    def kept(fraction: float) -> int:
        cfg = bench_config(time_limit=2.0)
        update = {"max_candidate_nodes": 40, "kept_fraction": fraction}
        solver = cfg.solver.model_copy(update=update)
        cfg = cfg.model_copy(update={"solver": solver})
        p = CpSatEngine(seed=0).place(fleet, g, cfg)
        assert p.feasible, p.reason
        assert violations(fleet, g, p, cfg) == []
        (note,) = [line for line in p.explanation if line.startswith("pruned to ")]
        return int(note.split()[2])

    assert kept(0.0) <= 40
    assert kept(0.5) > 40


def test_locality_wait_on_a_level_the_kueue_topology_lacks_is_ignored_with_a_note() -> None:
    """With topologyName the levels are known only at placement time, so a wrong level
    cannot be refused when the config is read: the explanation says it was ignored."""
    snap = snapshot(*_two_racks(), gpu=(BLOCK, RACK, HOST))
    cfg = PlacementConfig.model_validate({
        "topology": {"topologyName": "gpu"},
        "localityWait": {"level": "example.com/unknown"},
        "solver": {"timeLimitSeconds": 10},
    })
    p = placed(snap, gang(PodSet("w", 6, gpus=2)), cfg)
    assert any("localityWait.level 'example.com/unknown' is not a topology level" in line
               for line in p.explanation)


def test_locality_wait_leaves_an_impossible_gang_to_its_message() -> None:
    p = place(_two_racks(), gang(PodSet("w", 2, gpus=2), required_level="example.com/nope"),
              _locality_wait())
    assert p.status is SolveStatus.IMPOSSIBLE
    assert "required-topology level 'example.com/nope'" in p.reason


def test_pod_sets_sharing_numa_zones_are_costed_as_realised() -> None:
    """Found by hypothesis: each pod set alone fits the two 12-CPU zones aligned, together
    the three 8-CPU pods do not, so all on the GPU node costs an unaligned pod (100) more
    than the model first counted; one pod on the CPU node next door (a node, 50) is
    cheaper, and the answer is still proven optimal."""
    cpu_node = gpu_node("cpu", gpus=0, cpu_milli=16_000)
    cpu_node.taints = (Taint("dedicated", "infer"),)
    cpu_node.free_cpu_milli = 8000
    busy = gpu_node("gpu", gpus=2, cpu_milli=64_000)
    busy.free_cpu_milli = 24_000
    for zone in busy.numa_zones:
        zone.free_cpu_milli = 12_000
    snap = snapshot(cpu_node, busy)
    g = gang(PodSet("ps0", 1, cpu_milli=8000),
             PodSet("ps1", 2, cpu_milli=8000,
                    tolerations=(Toleration("dedicated", operator="Exists"),)),
             tier="gold")
    p = placed(snap, g)
    assert p.terms["numaUnaligned"] == 0
    assert p.pods_per_node() == {"gpu": 2, "cpu": 1}
    # without the CPU node the unaligned pod is unavoidable: charged once, still optimal
    alone = placed(snapshot(busy.copy()), g)
    assert alone.terms["numaUnaligned"] == 1


def test_a_node_without_a_level_label_is_placed_beside_labelled_ones() -> None:
    """Slots are ordered by topology path; a node lacking the block label has no path
    (a malformed-dump fuzz found the sort failing on it with a TypeError)."""
    bare = gpu_node("bare")
    del bare.labels[BLOCK]
    snap = snapshot(gpu_node("labelled"), bare)
    g = gang(PodSet("w", 2, cpu_milli=1000, gpus=8))
    p = placed(snap, g)
    assert nodes_of(p) == {"labelled", "bare"}
