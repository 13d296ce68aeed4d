"""`decide` (placement/decide.py), request -> reply, one case per rung of the ladder:
requests are built from defaults and a few changes, the replies asserted by their kind and
what they carry. The same function decides in the controller and in the replay."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pytest

from nexus_admit.model import (
    ClusterSnapshot,
    Gang,
    PlacementConfig,
    PodSet,
    SolveStatus,
    WorkloadType,
)
from nexus_admit.placement.decide import (
    BACKFILL_REASON,
    Decision,
    DecisionRequest,
    Drain,
    KeepDraining,
    LiveDrain,
    MoveOffDrain,
    NodesKeptFree,
    Place,
    PlaceOverDrains,
    Preempt,
    Reject,
    Retry,
    decide,
)
from nexus_admit.placement.policies import make_policy
from nexus_admit.placement.preemption import RunningGang
from tests.factories import H100, L40S, LEVELS, RACK, gpu_node, snapshot
from tests.placement.test_preemption import run

ENGINE = make_policy("nexus", seed=1)


def config(**preemption: object) -> PlacementConfig:
    return PlacementConfig.model_validate({
        "topology": {"levels": list(LEVELS)},
        "preemption": {"enabled": True, "minRunSeconds": 0, **preemption},
    })


def gang(name: str = "ns/g", *, tier: str = "gold", pods: int = 1, gpus: int = 8,
         waited: float = 0.0, required: str | None = None) -> Gang:
    return Gang(name, (PodSet("w", pods, gpus=gpus, indexed=pods > 1),), tier=tier,
                workload_type=WorkloadType.TRAINING, waited_seconds=waited,
                required_level=required)


@dataclass
class Case:
    """A cluster (built fresh), what runs on it, and the request's changes."""

    nodes: Callable[[], ClusterSnapshot]
    gang: Gang = field(default_factory=gang)
    running: Sequence[tuple[str, str, int, str]] = ()  # (gang, node, GPUs, tier)
    config: PlacementConfig = field(default_factory=config)
    waiting: Sequence[tuple[str, int]] = ()
    drains: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)  # name -> tier
    own_drain: bool = False
    may_preempt: bool = True


def two_h100() -> ClusterSnapshot:
    return snapshot(gpu_node("h0", rack="r0"), gpu_node("h1", rack="r1"))


def h100_and_l40s() -> ClusterSnapshot:
    return snapshot(gpu_node("h0", gpu=H100), gpu_node("l0", gpu=L40S))


def rack_of_two() -> ClusterSnapshot:
    return snapshot(gpu_node("h0", rack="r0"), gpu_node("h1", rack="r0"),
                    gpu_node("h2", rack="r1"))


def two_h100_cordoned() -> ClusterSnapshot:
    snap = two_h100()
    for node in snap:
        node.schedulable = False
    return snap


def ask(case: Case) -> tuple[Decision, dict[str, RunningGang]]:
    snap = case.nodes()
    running = {name: run(snap, name, node, gpus, tier=tier)
               for name, node, gpus, tier in case.running}
    capacity = NodesKeptFree(snap, ENGINE, {n: nodes for n, (_, nodes) in case.drains.items()})
    drains = tuple(LiveDrain(n, tier, nodes) for n, (tier, nodes) in case.drains.items()
                   if n != case.gang.name)
    own = case.drains.get(case.gang.name)
    request = DecisionRequest(
        case.gang, case.config, waiting=case.waiting, running=lambda: list(running.values()),
        drains=drains,
        own_drain=LiveDrain(case.gang.name, own[0], own[1]) if case.own_drain and own else None,
        may_preempt=case.may_preempt,
    )
    return decide(request, capacity), running


CASES = {
    "place": (Case(two_h100), Place),
    "retry-no-room": (
        Case(two_h100, running=[("ns/a", "h0", 8, "gold"), ("ns/b", "h1", 8, "gold")]),
        Retry),
    "reject-never-fits": (Case(two_h100, gang=gang(gpus=16)), Reject),
    "reject-never-fits-whatever-is-cordoned": (
        Case(two_h100_cordoned, gang=gang(gpus=16)), Reject),
    "wait-while-every-node-is-cordoned": (Case(two_h100_cordoned), Retry),
    "backfill-kept-off-retries": (
        Case(h100_and_l40s, gang=gang("ns/b", tier="bronze"), waiting=[("gold", 8000)],
             running=[("ns/x", "l0", 8, "bronze")]),
        Retry),
    "backfill-places-off-the-owners-hardware": (
        Case(h100_and_l40s, gang=gang("ns/b", tier="bronze"), waiting=[("gold", 8000)]),
        Place),
    "over-a-lower-tiers-drain": (
        Case(two_h100, running=[("ns/a", "h0", 8, "bronze")],
             drains={"ns/s": ("silver", frozenset({"h1"}))}),
        PlaceOverDrains),
    "a-drain-holds-against-its-own-tier": (
        Case(two_h100, gang=gang(tier="silver"), running=[("ns/a", "h0", 8, "silver")],
             drains={"ns/s": ("silver", frozenset({"h1"}))}),
        Retry),
    "own-drain-moves-off-once-it-fits": (
        Case(two_h100, drains={"ns/g": ("gold", frozenset({"h0"}))}, own_drain=True),
        MoveOffDrain),
    "own-drain-keeps-draining": (
        Case(two_h100, running=[("ns/a", "h0", 8, "gold"), ("ns/b", "h1", 8, "gold")],
             drains={"ns/g": ("gold", frozenset({"h0"}))}, own_drain=True),
        KeepDraining),
    "preempt-a-borrowed-lower-tier": (
        Case(two_h100, running=[("ns/a", "h0", 8, "bronze"), ("ns/b", "h1", 8, "gold")]),
        Preempt),
    "no-preemption-this-cycle": (
        Case(two_h100, running=[("ns/a", "h0", 8, "bronze"), ("ns/b", "h1", 8, "gold")],
             may_preempt=False),
        Retry),
    "drain-when-no-victims": (
        Case(rack_of_two, gang=gang(pods=2, waited=7200.0, required=RACK),
             running=[("ns/a", "h0", 8, "gold")], config=config(drainAfterSeconds=3600)),
        Drain),
    "no-drain-before-drain-after": (
        Case(rack_of_two, gang=gang(pods=2, waited=60.0, required=RACK),
             running=[("ns/a", "h0", 8, "gold")], config=config(drainAfterSeconds=3600)),
        Retry),
    "preemption-off-just-retries": (
        Case(two_h100, running=[("ns/a", "h0", 8, "bronze"), ("ns/b", "h1", 8, "gold")],
             config=config(enabled=False)),
        Retry),
}


@pytest.mark.parametrize(("case", "kind"), CASES.values(), ids=CASES.keys())
def test_each_rung_of_the_ladder(case: Case, kind: type) -> None:
    decision, _ = ask(case)
    assert isinstance(decision, kind), decision


def test_a_placement_over_drains_withdraws_only_the_drains_it_crosses() -> None:
    case = Case(two_h100, running=[("ns/a", "h0", 8, "bronze")],
                drains={"ns/s": ("silver", frozenset({"h1"})),
                        "ns/t": ("bronze", frozenset({"elsewhere"}))})
    decision, _ = ask(case)
    assert isinstance(decision, PlaceOverDrains)
    assert [d.name for d in decision.withdrawn] == ["ns/s"]
    assert {s.node for s in decision.placement.slots} == {"h1"}
    assert "the drain was withdrawn" in decision.placement.explanation[-1]


def test_preemption_names_the_cheapest_victim_and_its_domain() -> None:
    decision, running = ask(CASES["preempt-a-borrowed-lower-tier"][0])
    assert isinstance(decision, Preempt)
    assert decision.plan.victim_names == ("ns/a",)
    assert {s.node for s in decision.plan.placement.slots} == {"h0"}
    assert "ns/a" in running


def test_a_backfill_retry_says_why_the_free_hardware_was_not_used() -> None:
    decision, _ = ask(CASES["backfill-kept-off-retries"][0])
    assert isinstance(decision, Retry)
    assert decision.reason.startswith(BACKFILL_REASON)


def test_a_drained_node_is_kept_from_others_but_not_from_its_own_gang() -> None:
    case = Case(two_h100, running=[("ns/a", "h1", 8, "gold")],
                drains={"ns/s": ("gold", frozenset({"h0"}))})
    decision, _ = ask(case)
    assert isinstance(decision, Retry)  # a gold drain holds against gold
    assert "drained for another gang" in decision.reason
    mine, _ = ask(replace(case, gang=gang("ns/s"), own_drain=True))
    assert isinstance(mine, MoveOffDrain)
    assert {s.node for s in mine.placement.slots} == {"h0"}


def test_decide_takes_no_capacity() -> None:
    """The caller applies a decision: deciding twice on the same capacity gives the same
    answer."""
    snap = two_h100()
    capacity = NodesKeptFree(snap, ENGINE)
    request = DecisionRequest(gang(), config())
    first, second = decide(request, capacity), decide(request, capacity)
    assert isinstance(first, Place) and isinstance(second, Place)
    assert first.placement.slots == second.placement.slots
    assert all(n.is_pristine() for n in snap)


def test_a_gang_no_schedulable_node_can_take_waits_and_preempts_no_one() -> None:
    """Every node cordoned (or tainted, NotReady): no victim would free a node it may use,
    so nothing is evicted; the Retry carries UNAVAILABLE, which the controller answers
    Pending (a wait, not a rejection)."""
    case = Case(two_h100_cordoned, running=[("ns/a", "h0", 8, "bronze")])
    decision, _ = ask(case)
    assert isinstance(decision, Retry)
    assert decision.placement.status is SolveStatus.UNAVAILABLE
    assert "2 unschedulable" in decision.reason


def test_a_gang_kept_off_the_only_nodes_it_fits_is_retried_not_kept_waiting() -> None:
    """Backfill keeps a bronze gang off the H100s a waiting gold gang could use: what it
    waits for is that gang, not a node, so it goes through Retry as before."""
    case = Case(two_h100, gang=gang("ns/b", tier="bronze"), waiting=[("gold", 8000)])
    decision, _ = ask(case)
    assert isinstance(decision, Retry)
    assert decision.placement.status is SolveStatus.INFEASIBLE
    assert decision.reason.startswith(BACKFILL_REASON)
