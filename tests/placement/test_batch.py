"""A burst placed jointly (placement/batch.py): never worse on any term than one by one in
Kueue's order, never double-booked, never an earlier gang left out for a later one, and
strictly better where one by one the first gang takes what the second needed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nexus_admit.model import (
    ClusterSnapshot,
    Gang,
    Placement,
    PlacementConfig,
    PodSet,
    apply_slots,
)
from nexus_admit.placement.batch import MAX_BURST_GANGS, BatchEngine, BurstEntry, BurstOutcome
from nexus_admit.placement.objective import TERMS, evaluate_terms
from nexus_admit.placement.policies import make_policy
from nexus_admit.placement.problem import prepare
from nexus_admit.placement.sequence import OrderedPlacer
from nexus_admit.placement.validate import violations
from tests.factories import config, gpu_node, node_state, snapshot
from tests.strategies import CONFIG, gangs, snapshots

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def one_by_one(engine: BatchEngine, snap: ClusterSnapshot, burst: Sequence[Gang],
               cfg: PlacementConfig) -> list[BurstEntry]:
    """Today's path: each gang on the capacity the earlier ones left."""
    placer = OrderedPlacer(engine, snap.copy())
    return [BurstEntry(gang, placer.place(gang, cfg)) for gang in burst]


def ordered_terms(snap: ClusterSnapshot, burst: Sequence[Gang], answers: Sequence[Placement],
                  counted: set[int], cfg: PlacementConfig) -> dict[str, float]:
    """Each counted gang's terms on the capacity the earlier placed ones left, summed
    (written here from the definitions, not with the module's helpers)."""
    scratch = snap.copy()
    total = dict.fromkeys(TERMS, 0.0)
    for k, (gang, answer) in enumerate(zip(burst, answers, strict=True)):
        if not answer.feasible:
            continue
        if k in counted:
            for name, value in evaluate_terms(prepare(scratch, gang, cfg), answer.slots).items():
                total[name] += value
        apply_slots(scratch, gang, answer.slots)
    return total


def assert_no_double_booking(snap: ClusterSnapshot, burst: Sequence[Gang],
                             answers: Sequence[Placement], cfg: PlacementConfig) -> None:
    scratch = snap.copy()
    for gang, answer in zip(burst, answers, strict=True):
        if answer.feasible:
            assert violations(scratch, gang, answer, cfg) == []
            apply_slots(scratch, gang, answer.slots)
    for node in scratch:
        assert min(node.gpu_free, default=0) >= 0
        assert node.free_cpu_milli >= 0 and node.free_memory_mib >= 0 and node.free_pods >= 0


def burst_of(snap: ClusterSnapshot, burst: Sequence[Gang],
             cfg: PlacementConfig) -> tuple[list[BurstEntry], BurstOutcome]:
    engine = BatchEngine(seed=1)
    entries = one_by_one(engine, snap, burst, cfg)
    before = node_state(snap)
    outcome = engine.place_burst(snap, entries, cfg)
    assert node_state(snap) == before  # never mutates the snapshot
    return entries, outcome


# ---------------------------------------------------------------- hand-built
def eight_gpus(name: str, only: frozenset[str] | None = None) -> Gang:
    return Gang(name, (PodSet("w", 1, cpu_milli=1000, gpus=8, allowed_nodes=only),))


def test_joint_places_the_gang_whose_node_the_first_took() -> None:
    snap = snapshot(gpu_node("a"), gpu_node("b"))
    cfg = config()
    engine = BatchEngine(seed=1)
    first = eight_gpus("ns/first")
    taken = engine.place(snap, first, cfg).slots[0].node  # one by one: a tie, one node
    second = eight_gpus("ns/second", only=frozenset({taken}))
    entries, outcome = burst_of(snap, [first, second], cfg)
    assert entries[0].placement.feasible and not entries[1].placement.feasible
    assert outcome.joint, outcome.reason
    assert outcome.reason == "more gangs placed"
    assert (outcome.placed_one_by_one, outcome.placed_jointly) == (1, 2)
    first_answer, second_answer = outcome.placements
    assert second_answer.slots[0].node == taken
    assert first_answer.slots[0].node != taken
    for name, value in outcome.terms_joint.items():
        assert value <= outcome.terms_one_by_one[name] + 1e-9, name
    assert "jointly" in first_answer.explanation[-1]
    assert_no_double_booking(snap, [first, second], outcome.placements, cfg)


def test_an_earlier_waiting_gang_comes_before_a_later_one() -> None:
    snap = snapshot(gpu_node("a"), gpu_node("b"))
    cfg = config()
    first = eight_gpus("ns/first")
    taken = BatchEngine(seed=1).place(snap, first, cfg).slots[0].node
    earlier = eight_gpus("ns/earlier", only=frozenset({taken}))
    later = eight_gpus("ns/later", only=frozenset({taken}))
    _, outcome = burst_of(snap, [first, earlier, later], cfg)
    assert outcome.joint
    placed = [p.feasible for p in outcome.placements]
    assert placed == [True, True, False]


def test_no_gang_is_placed_jointly_at_the_cost_of_a_term() -> None:
    # one by one the first fills the half-used node; moving it to the pristine one would
    # let the second in, but break an island: the one-by-one answers stand
    snap = snapshot(gpu_node("a", used=range(4)), gpu_node("b"))
    cfg = config()
    first = Gang("ns/first", (PodSet("w", 1, cpu_milli=1000, gpus=4),))
    second = Gang("ns/second", (PodSet("w", 1, cpu_milli=1000, gpus=4,
                                       allowed_nodes=frozenset({"a"})),))
    entries, outcome = burst_of(snap, [first, second], cfg)
    assert entries[0].placement.slots[0].node == "a"
    assert not outcome.joint
    assert [p is e.placement for p, e in zip(outcome.placements, entries, strict=True)] == [
        True, True]


def test_a_burst_larger_than_the_cap_keeps_the_rest_one_by_one() -> None:
    nodes = [gpu_node(f"n{k}", rack=f"r{k % 3}") for k in range(MAX_BURST_GANGS + 3)]
    snap = snapshot(*nodes)
    cfg = config()
    burst = [eight_gpus(f"ns/g{k}") for k in range(MAX_BURST_GANGS + 2)]
    entries, outcome = burst_of(snap, burst, cfg)
    for k in range(MAX_BURST_GANGS, len(burst)):
        assert outcome.placements[k] is entries[k].placement
    assert_no_double_booking(snap, burst, outcome.placements, cfg)


def test_the_policy_is_registered() -> None:
    policy = make_policy("nexus-batch", seed=2)
    assert isinstance(policy, BatchEngine)
    assert policy.name == "nexus-batch"


# ---------------------------------------------------------------- properties
@SETTINGS
@given(snap=snapshots(max_nodes=4), burst=st.lists(gangs(max_count=2), min_size=2, max_size=4))
def test_joint_is_never_worse_than_one_by_one(snap: ClusterSnapshot, burst: list[Gang]) -> None:
    burst = [replace(g, name=f"ns/g{k}") for k, g in enumerate(burst)]
    entries, outcome = burst_of(snap, burst, CONFIG)
    answers = outcome.placements
    event(f"joint: {outcome.joint}, {outcome.reason}")
    placed_alone = {k for k, e in enumerate(entries) if e.placement.feasible}
    # every gang placed one by one is placed jointly too
    assert placed_alone <= {k for k, p in enumerate(answers) if p.feasible}
    assert_no_double_booking(snap, burst, answers, CONFIG)
    alone = ordered_terms(snap, burst, [e.placement for e in entries], placed_alone, CONFIG)
    joint = ordered_terms(snap, burst, answers, placed_alone, CONFIG)
    for name in TERMS:
        assert joint[name] <= alone[name] + 1e-6, name
    if not outcome.joint:
        assert all(p is e.placement for p, e in zip(answers, entries, strict=True))


@SETTINGS
@given(snap=snapshots(max_nodes=4), burst=st.lists(gangs(max_count=2), min_size=2, max_size=4))
def test_an_earlier_gang_placed_one_by_one_is_never_dropped(
    snap: ClusterSnapshot, burst: list[Gang]
) -> None:
    burst = [replace(g, name=f"ns/g{k}") for k, g in enumerate(burst)]
    entries, outcome = burst_of(snap, burst, CONFIG)
    extra = [k for k, (e, p) in enumerate(zip(entries, outcome.placements, strict=True))
             if p.feasible and not e.placement.feasible]
    if not extra:
        return
    event("a waiting gang placed jointly")
    # a waiting gang placed jointly: the gangs before it placed one by one stay placed,
    # and the waiting ones before it had their turn first (each in order, alone beside
    # the one-by-one gangs, would have needed the capacity it took to fit)
    for k in range(extra[0]):
        if entries[k].placement.feasible:
            assert outcome.placements[k].feasible
