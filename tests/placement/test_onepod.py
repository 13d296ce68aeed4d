"""The one-pod scan over every candidate (`scan_candidates`) against the scan over the
symmetry reduction it replaces: the same node, GPUs and objective on random fleets full
of interchangeable nodes, with and without siblings and spread rules."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_admit.model import ClusterSnapshot, Gang, Node, Placement, SpreadRule
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.fragmentation import WorkloadDistribution
from nexus_admit.placement.memo import NodeMemo
from nexus_admit.placement.objective import evaluate_terms, term_weights, weighted_objective
from nexus_admit.placement.onepod import (
    Ranking,
    lower_bounds,
    rank_order,
    scan_lower_bound,
    scan_ranked,
    scans,
    scans_with_gradient,
)
from nexus_admit.placement.order_terms import SCALE, OrderTerms
from nexus_admit.placement.problem import prepare
from nexus_admit.placement.realise import slots_for
from nexus_admit.placement.reduction import candidates, reduce_symmetry, shortfall
from nexus_admit.placement.spread import one_pod_allowed
from tests.placement.test_live_reduction import fleets
from tests.strategies import CONFIG, RACK, gangs

HOST = "kubernetes.io/hostname"


def _scan_over_the_reduction(snapshot: ClusterSnapshot, gang: Gang) -> Placement | None:
    """The one-pod path as it was: the symmetry reduction over every candidate, then every
    kept node ranked and costed (None when the gang takes another path)."""
    problem = prepare(snapshot, gang, CONFIG)
    if problem.impossible or not scans(problem):
        return None
    memo = NodeMemo()
    memo.sync(snapshot, CONFIG)
    red = candidates(problem, memo)
    if shortfall(problem, red):
        return None
    red = reduce_symmetry(problem, red, memo)
    bounds = lower_bounds(problem, red.nodes, term_weights(problem))
    ranked = sorted(zip(bounds, range(len(red.nodes)), red.nodes, strict=True))
    terms = OrderTerms(memo, WorkloadDistribution.default())
    ranking = Ranking(ranked, len(red.nodes), red.notes, red.exact)
    return scan_ranked(problem, ranking, 0.0, terms, "nexus")


@st.composite
def one_pod_gangs(draw: st.DrawFn, names: list[str]) -> Gang:
    """A gang of one pod, now and then with siblings of its service on some nodes and a
    spread rule per rack or per node."""
    gang = draw(gangs(max_sets=1, max_count=1))
    if draw(st.booleans()):
        siblings = {n: draw(st.integers(1, 2)) for n in draw(st.lists(st.sampled_from(names)))}
        rules = draw(st.sampled_from(((), (SpreadRule(RACK, max_skew=1),),
                                      (SpreadRule(HOST, max_per_domain=2),))))
        gang = replace(gang, service="svc", siblings=siblings, spread_rules=rules)
    return gang


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), fleet=fleets())
def test_the_scan_over_every_candidate_places_as_the_scan_over_the_reduction(
    data: st.DataObject, fleet: list[Node]
) -> None:
    snapshot = ClusterSnapshot.of(fleet)
    gang = data.draw(one_pod_gangs([n.name for n in fleet]))
    expected = _scan_over_the_reduction(snapshot, gang)
    if expected is None:
        return
    placed = CpSatEngine(0).place(snapshot, gang, CONFIG)
    assert placed.feasible == expected.feasible
    assert [(s.node, s.gpu_indices, s.numa_zone) for s in placed.slots] == [
        (s.node, s.gpu_indices, s.numa_zone) for s in expected.slots
    ]
    assert (placed.objective, placed.status, placed.terms) == (
        expected.objective, expected.status, expected.terms
    )
    if placed.feasible:  # as many nodes costed: the skipped ones are the reduction's
        assert placed.explanation[-1].split(" costed")[0].split(", ")[-1] == (
            expected.explanation[-1].split(" costed")[0].split(", ")[-1]
        )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), fleet=fleets())
def test_the_bounds_added_up_from_remembered_parts_are_each_nodes_bound(
    data: st.DataObject, fleet: list[Node]
) -> None:
    """Bit for bit: the ranking's order (and so its ties) is the bound's."""
    snapshot = ClusterSnapshot.of(fleet)
    gang = data.draw(one_pod_gangs([n.name for n in fleet]))
    problem = prepare(snapshot, gang, CONFIG)
    if problem.impossible:
        return
    names = problem.candidates[gang.pod_sets[0].name]
    weights = term_weights(problem)
    assert lower_bounds(problem, names, weights) == [
        scan_lower_bound(problem, name, weights) for name in names
    ]


@given(st.lists(st.sampled_from((0.0, -0.0, 1.5, 300.0, 300.25, 1e-9, 2.0**60)), max_size=40))
def test_the_scan_reads_candidates_in_the_order_of_their_bound_then_their_place(
    bounds: list[float],
) -> None:
    names = [f"n{i}" for i in range(len(bounds))]
    expected = sorted(zip(bounds, range(len(names)), names, strict=True))
    assert list(rank_order(bounds, names)) == expected


GRADIENT = CONFIG.model_copy(update={"weights": CONFIG.weights.model_copy(
    update={"frag_gradient": 1000, "fill_order": 700})})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), fleet=fleets())
def test_a_one_pod_gang_under_frag_gradient_gets_the_cheapest_node_without_a_model(
    data: st.DataObject, fleet: list[Node]
) -> None:
    """Under fragGradient (negative where a pod fits a node's leftover well) the scan
    still finds the cheapest of every candidate node, costed as the model it replaces
    charges it, and the model's optimum is the same."""
    snapshot = ClusterSnapshot.of(fleet)
    gang = data.draw(one_pod_gangs([n.name for n in fleet]))
    engine = CpSatEngine(0)
    placed = engine.place(snapshot, gang, GRADIENT)
    problem = prepare(snapshot, gang, GRADIENT)
    if problem.impossible or problem.unavailable or not scans_with_gradient(problem):
        return
    memo = NodeMemo()
    memo.sync(snapshot, GRADIENT)
    red = candidates(problem, memo)
    terms = OrderTerms(memo, WorkloadDistribution.default())
    allowed = one_pod_allowed(problem)
    ps = gang.pod_sets[0]
    costs = []
    for name in red.nodes:
        slots = slots_for(problem, {(ps.name, name): 1})
        if isinstance(slots, str) or not allowed(name):
            continue
        costs.append(weighted_objective(problem, evaluate_terms(problem, slots))
                     + terms.one_pod_costs(problem, [name], ps)[0] / SCALE)
    assert placed.feasible == bool(costs) or shortfall(problem, red)
    if not costs:
        return
    assert placed.model_objective == pytest.approx(min(costs), abs=1e-6)
    model = CpSatEngine(0)._reduced(
        problem, reduce_symmetry(problem, red, memo), time.perf_counter()
    )
    assert model.status == "optimal"
    assert round(model.model_objective * SCALE) == round(placed.model_objective * SCALE)
