"""Property tests: every policy respects every hard constraint; the engine finds a
placement whenever brute force does, and reaches the brute-force optimum."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_admit.model import (
    ClusterSnapshot,
    Gang,
    LocalityWait,
    PlacementConfig,
    Slot,
    apply_slots,
    fit_pod,
)
from nexus_admit.placement.objective import evaluate_terms, weighted_objective
from nexus_admit.placement.policies import make_policy, policy_names
from nexus_admit.placement.problem import prepare
from nexus_admit.placement.validate import violations
from tests.strategies import CONFIG, RACK, gangs, snapshots

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


def brute_force(
    snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig = CONFIG
) -> float | None:
    """Best objective over every node assignment of every pod (pods fitted in index order)."""
    problem = prepare(snapshot, gang, config)
    if problem.impossible:
        return None
    pods = [(ps, i) for ps in gang.pod_sets for i in range(ps.count)]
    choices = [problem.candidates[ps.name] for ps, _ in pods]
    best: float | None = None
    for combo in itertools.product(*choices):
        scratch = snapshot.copy()
        slots: list[Slot] = []
        for (ps, i), node in zip(pods, combo, strict=True):
            fit = fit_pod(scratch.nodes[node], ps, gang.numa_policy)
            if fit is None:
                break
            slot = Slot(ps.name, i, node, fit.gpu_indices, fit.numa_zone)
            apply_slots(scratch, Gang(gang.name, (ps,)), [slot])
            slots.append(slot)
        else:
            placement_gang = gang
            if gang.required_level is not None:
                li = problem.levels.index(gang.required_level)
                if len({problem.paths[s.node][li] for s in slots}) != 1:
                    continue
            value = weighted_objective(problem, evaluate_terms(problem, slots))
            if best is None or value < best:
                best = value
            del placement_gang
    return best


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=snapshots(max_nodes=3), gang=gangs(max_sets=2, max_count=2), seed=st.integers(0, 3))
def test_engine_matches_brute_force(snapshot: ClusterSnapshot, gang: Gang, seed: int) -> None:
    best = brute_force(snapshot, gang)
    placement = make_policy("nexus", seed=seed).place(snapshot, gang, CONFIG)
    if best is None:
        return  # brute force found nothing; the engine may still (it fits pods smarter)
    assert placement.feasible, placement.reason
    assert placement.objective <= best + 1e-6
    assert placement.status == "optimal"


# every weight on, gangSplit included (off by default), so its encoding is checked too
ALL_TERMS = CONFIG.model_copy(
    update={"weights": CONFIG.weights.model_copy(update={"gang_split": 400})}
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=snapshots(max_nodes=3), gang=gangs(max_sets=2, max_count=2), seed=st.integers(0, 3))
def test_engine_matches_brute_force_with_gang_split(
    snapshot: ClusterSnapshot, gang: Gang, seed: int
) -> None:
    best = brute_force(snapshot, gang, ALL_TERMS)
    placement = make_policy("nexus", seed=seed).place(snapshot, gang, ALL_TERMS)
    if best is None:
        return
    assert placement.feasible, placement.reason
    assert placement.objective <= best + 1e-6
    assert placement.status == "optimal"


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
        assert len({problem.paths[s.node][rack] for s in placement.slots}) == 1
    if not holds:
        assert placement.retry_after_seconds is None
        plain = make_policy("nexus", seed=0).place(snapshot, gang, CONFIG)
        assert plain.feasible == placement.feasible
        assert plain.objective == pytest.approx(placement.objective)
