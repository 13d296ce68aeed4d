"""Property tests: every policy respects every hard constraint; the engine finds a
placement exactly when brute force does and reaches its optimum, judged by an oracle
written from the definitions (tests/placement/oracle.py), not by the engine's helpers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nexus_admit.model import (
    GPU_WHOLE,
    ClusterSnapshot,
    Gang,
    LocalityWait,
    Node,
    NumaPolicy,
    NumaZone,
    ObjectiveWeights,
    Placement,
    PlacementConfig,
    PodSet,
    SpreadWeights,
    WorkloadType,
)
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.fragmentation import PodShape, TypicalPod, WorkloadDistribution
from nexus_admit.placement.objective import evaluate_terms, term_weights, weighted_objective
from nexus_admit.placement.policies import make_policy, policy_names
from nexus_admit.placement.problem import prepare
from nexus_admit.placement.validate import violations
from tests.placement import oracle
from tests.strategies import BLOCK, CONFIG, RACK, gangs, snapshots

HOST = "kubernetes.io/hostname"

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("policy", policy_names())
@SETTINGS
@given(snapshot=snapshots(), gang=gangs())
def test_every_policy_respects_hard_constraints(
    policy: str, snapshot: ClusterSnapshot, gang: Gang
) -> None:
    before = snapshot.copy()
    placement = make_policy(policy, seed=1).place(snapshot, gang, CONFIG)
    assert violations(snapshot, gang, placement, CONFIG) == []
    # place() never mutates the snapshot it is given
    assert [n.gpu_free for n in snapshot] == [n.gpu_free for n in before]
    assert [n.free_cpu_milli for n in snapshot] == [n.free_cpu_milli for n in before]
    if placement.feasible:
        assert len(placement.slots) == gang.pod_count


# ---------------------------------------------------------------- the engine against an oracle
# Small clusters with what the placement decides on: pristine 8-GPU nodes and NVLink
# cliques, NUMA zones, shared GPUs, racks in blocks; gangs with required and preferred
# levels, Kueue flavors' allowed nodes; every weight on.
_PRODUCTS = (
    ("NVIDIA-H100-80GB-HBM3", 81920), ("NVIDIA-A100-SXM4-40GB", 40960), ("Tesla-T4", 15360)
)


@st.composite
def oracle_nodes(draw: st.DrawFn, name: str) -> Node:
    gpus = draw(st.sampled_from((8, 8, 8, 8, 8, 4, 0)))
    product, vram = draw(st.sampled_from(_PRODUCTS))
    pristine = draw(st.integers(0, 2)) > 0
    used = (GPU_WHOLE, GPU_WHOLE, GPU_WHOLE, 0, 500, 250)  # free share per GPU
    free = [GPU_WHOLE if pristine else draw(st.sampled_from(used)) for _ in range(gpus)]
    cpu = 64_000
    free_cpu = draw(st.sampled_from((32_000, 48_000, 64_000)))
    zones = []
    if gpus and draw(st.integers(0, 3)):
        half = gpus // 2
        zones = [NumaZone(0, tuple(range(half)), cpu // 2, free_cpu // 2),
                 NumaZone(1, tuple(range(half, gpus)), cpu // 2, free_cpu - free_cpu // 2)]
    return Node(
        name=name,
        labels={BLOCK: draw(st.sampled_from(("b0", "b1"))),
                RACK: draw(st.sampled_from(("r0", "r1")))},
        cpu_milli=cpu,
        memory_mib=262_144,
        gpu_product=product if gpus else "",
        gpu_memory_mib=vram if gpus else 0,
        gpu_free=free,
        free_cpu_milli=free_cpu,
        free_memory_mib=262_144,
        free_pods=draw(st.sampled_from((4, 8))),
        numa_zones=zones,
        clique=draw(st.sampled_from((None, "c0", "c0"))) if gpus else None,
    )


@st.composite
def oracle_cases(draw: st.DrawFn) -> tuple[ClusterSnapshot, Gang, PlacementConfig]:
    names = [f"n{i}" for i in range(draw(st.sampled_from((2, 3, 3))))]
    snap = ClusterSnapshot.of([draw(oracle_nodes(n)) for n in names])
    sets = []
    for i in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(("cpu", "whole", "whole", "share")))
        gpus, milli = 0, GPU_WHOLE
        if kind == "whole":
            gpus = draw(st.sampled_from((1, 1, 2, 2, 4, 8)))
        elif kind == "share":
            gpus, milli = 1, draw(st.sampled_from((250, 500)))
        allowed = None
        if draw(st.integers(0, 4)) == 0:  # the nodes of the flavors Kueue assigned
            allowed = frozenset({draw(st.sampled_from(names))} | {
                n for n in names if draw(st.booleans())})
        sets.append(PodSet(
            f"ps{i}", draw(st.integers(1, 2)),
            cpu_milli=draw(st.sampled_from((1000, 1000, 8000))),
            memory_mib=4096,
            gpus=gpus,
            gpu_milli=milli,
            vram_mib=draw(st.sampled_from((0, 0, 10_240, 20_480))) if kind == "whole" else 0,
            allowed_nodes=allowed,
            # a level of its own, Kueue's podset group (multi-pod-set gangs)
            required_level=draw(st.sampled_from((None, None, None, None, RACK, HOST))),
            group=draw(st.sampled_from((None, None, "g"))),
        ))
    if len(sets) == 2 and sets[0].group == sets[1].group == "g" and sets[0].required_level:
        # a group's members ask for one level (the translation refuses others)
        sets[1] = replace(sets[1], required_level=sets[0].required_level)
    gang = Gang(
        "ns/g",
        tuple(sets),
        tier=draw(st.sampled_from(("gold", "silver", "bronze"))),
        workload_type=draw(st.sampled_from(list(WorkloadType))),
        required_level=_gang_level(sets, draw(st.sampled_from(
            (None, None, None, None, RACK, BLOCK, HOST)))),
        preferred_level=draw(st.sampled_from((None, RACK, BLOCK))),
        numa_policy=draw(st.sampled_from((*NumaPolicy, NumaPolicy.PREFERRED, NumaPolicy.NONE))),
    )
    weights = {name: draw(st.integers(1, top)) for name, top in _WEIGHT_RANGES.items()}
    # a service's replicas already placed, and the spread term's weights
    siblings = {n: draw(st.integers(1, 2)) for n in names if draw(st.integers(0, 2)) == 0}
    gang = replace(gang, siblings=siblings)
    spread = SpreadWeights(node=draw(st.integers(0, 3000)), domain=draw(st.integers(0, 500)),
                           levels={RACK: draw(st.integers(0, 500))} if draw(st.booleans()) else {})
    config = CONFIG.model_copy(update={"weights": ObjectiveWeights(**weights), "spread": spread})
    return snap, gang, config


def _gang_level(sets: list[PodSet], drawn: str | None) -> str | None:
    """The gang's required level as the translation derives it (`kube/workload.py`): the
    narrowest its GPU pod sets state (every pod set's when none has GPUs); `drawn` when
    none states one (a gang whose pod sets all follow it)."""
    deciding = [p for p in sets if p.gpus] or sets
    stated = [p.required_level for p in deciding if p.required_level is not None]
    return max(stated, key=(BLOCK, RACK, HOST).index) if stated else drawn


# every weight on, in ranges that let each term matter against the others
_WEIGHT_RANGES = {
    "tier_mismatch": 10, "vram_stranded": 3, "island_broken": 2000, "domain_spread": 400,
    "gang_split": 400, "node_count": 50, "fragmentation": 20, "domain_fragmentation": 3,
    "numa_unaligned": 100, "spread": 300, "frag_gradient": 100, "fill_order": 100,
}
_MIX = WorkloadDistribution(tuple(
    TypicalPod(PodShape(m.cpu, m.share, m.gpus), m.popularity) for m in oracle.MIX))


def _judged_optimal(
    snap: ClusterSnapshot, gang: Gang, config: PlacementConfig, placement: Placement
) -> int | None:
    """Asserts the placement is feasible exactly when brute force finds one, sound, at the
    oracle's optimum and said `optimal`; returns that optimum (None when infeasible)."""
    judge = oracle.Oracle(snap, gang, config)
    best = judge.best()
    event("feasible" if best is not None else "infeasible")
    if best is None:
        assert not placement.feasible
        return None
    assert placement.feasible, placement.reason
    problems, value = judge.check(placement.slots)
    assert problems == []
    assert value == best
    assert placement.status == "optimal"
    return value


# 83-89 % of the examples are feasible and compared (1,666 of 2,000 with
# --hypothesis-seed=11, 268 of 300 with seed 5; `event` counts them, see
# pytest --hypothesis-show-statistics); the test takes ≈ 5-7 s
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=oracle_cases(), seed=st.integers(0, 3))
def test_engine_reaches_the_oracle_optimum_and_its_model_objective_is_the_oracles(
    case: tuple[ClusterSnapshot, Gang, PlacementConfig], seed: int
) -> None:
    """The engine places exactly when brute force can, soundly, at the brute-force optimum,
    says `optimal`, and the solver's own objective is the oracle's value of its slots."""
    snap, gang, config = case
    placement = CpSatEngine(seed, workload=_MIX).place(snap, gang, config)
    value = _judged_optimal(snap, gang, config, placement)
    if value is None:
        return
    assert placement.model_objective is not None
    assert round(placement.model_objective * 1000) == value
    # the reported terms are rounded per term, the model's coefficients per pod or node
    w = config.weights
    rounding = 0.001 * (w.vram_stranded + w.frag_gradient + w.fill_order)
    assert placement.objective == pytest.approx(value / 1000, abs=rounding)


@st.composite
def one_pod_cases(draw: st.DrawFn) -> tuple[ClusterSnapshot, Gang, PlacementConfig]:
    """Oracle cases cut to one pod, with fragGradient off: the gangs the engine places by
    costing every candidate node instead of solving a model (`CpSatEngine._scans`)."""
    snap, gang, config = draw(oracle_cases())
    one = Gang(gang.name, (replace(gang.pod_sets[0], count=1),), tier=gang.tier,
               workload_type=gang.workload_type, required_level=gang.required_level,
               preferred_level=gang.preferred_level, numa_policy=gang.numa_policy)
    weights = config.weights.model_copy(update={"frag_gradient": 0})
    return snap, one, config.model_copy(update={"weights": weights})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=one_pod_cases())
def test_one_pod_scan_reaches_the_oracle_optimum(
    case: tuple[ClusterSnapshot, Gang, PlacementConfig],
) -> None:
    snap, gang, config = case
    engine = CpSatEngine(0, workload=_MIX)
    assert engine._scans(prepare(snap, gang, config))
    placement = engine.place(snap, gang, config)
    if _judged_optimal(snap, gang, config, placement) is None:
        return
    assert placement.model_objective == placement.objective
    assert "costed exactly" in placement.explanation[-1]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=one_pod_cases())
def test_one_pod_scan_bound_never_exceeds_a_nodes_cost(
    case: tuple[ClusterSnapshot, Gang, PlacementConfig],
) -> None:
    """The scan stops at the first candidate whose lower bound cannot beat the best cost
    found: that is sound only if the bound is below every node's real cost."""
    snap, gang, config = case
    engine = CpSatEngine(0, workload=_MIX)
    problem = prepare(snap, gang, config)
    if problem.impossible:
        return
    weights = term_weights(problem)
    ps = gang.pod_sets[0]
    for name in problem.candidates[ps.name]:
        slots = engine._slots(problem, {(ps.name, name): 1})
        if isinstance(slots, str):
            continue
        cost = weighted_objective(problem, evaluate_terms(problem, slots)) + sum(
            w * v for v, w in engine._order_values(problem, slots).values())
        assert engine._scan_lower_bound(problem, name, weights) <= cost + 1e-9, name


LOCALITY_WAIT = CONFIG.model_copy(
    update={"locality_wait": LocalityWait(level=RACK, max_wait_seconds=600.0)})


# about 1 in 20 random cases is held and 1 in 7 kept inside one rack: more examples
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=snapshots(), gang=gangs(), waited=st.sampled_from((0.0, 599.0, 600.0)))
def test_locality_wait_holds_or_keeps_one_rack_and_never_breaks_a_constraint(
    snapshot: ClusterSnapshot, gang: Gang, waited: float
) -> None:
    """Under localityWait a gang's answer is sound, a hold carries no slots and says when
    to ask again, and while the wait runs a placed packing gang the rack level could hold
    stays inside one rack; once the wait is over, the answer is what it is without it."""
    gang = replace(gang, waited_seconds=waited)
    engine = make_policy("nexus", seed=0)
    placement = engine.place(snapshot, gang, LOCALITY_WAIT)
    assert violations(snapshot, gang, placement, LOCALITY_WAIT) == []
    if placement.retry_after_seconds is not None:
        assert not placement.feasible and not placement.slots and placement.retryable
        assert placement.retry_after_seconds == pytest.approx(600.0 - waited)
    problem = prepare(snapshot, gang, LOCALITY_WAIT)
    rack = problem.level_index(RACK)
    holds = (waited < 600.0 and gang.pod_count > 1 and gang.workload_type.packs
             and gang.required_level != RACK and not problem.impossible
             and max(problem.idle_room(rack).values(), default=0) >= 1)
    if holds and placement.feasible:
        # a GPU-less pod set beside GPU ones (a driver) does not follow the gang's domain
        following = {p.name for p in gang.pod_sets if gang.follows_gang(p)}
        assert len({problem.paths[s.node][rack]
                    for s in placement.slots if s.pod_set in following}) <= 1
    if not holds:
        assert placement.retry_after_seconds is None
        plain = make_policy("nexus", seed=0).place(snapshot, gang, CONFIG)
        assert plain.feasible == placement.feasible
        assert plain.objective == pytest.approx(placement.objective)
