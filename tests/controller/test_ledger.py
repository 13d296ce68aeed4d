"""The ledger holds promised capacity until the cluster's objects show it."""

from __future__ import annotations

from nexus_admit.controller.ledger import Ledger
from nexus_admit.model import ClusterSnapshot, Gang, PodSet, Slot
from nexus_admit.placement.policies import make_policy
from nexus_admit.placement.sequence import OrderedPlacer
from tests.factories import gpu_node


def placer_for(*names: str) -> OrderedPlacer:
    return OrderedPlacer(make_policy("nexus"), ClusterSnapshot({n: gpu_node(n) for n in names}))


def test_assumed_slots_are_taken_until_settled() -> None:
    gang = Gang("ns/w", (PodSet("main", count=1, gpus=8),))
    ledger = Ledger()
    ledger.assume("ns/rr", "ns/w", gang, (Slot("main", 0, "n1", tuple(range(8)), 0),), 0.0)
    placer = placer_for("n1")
    ledger.hold_in(placer)
    assert placer.snapshot.nodes["n1"].free_whole_gpus == 0
    assert not placer.place(gang, _config()).feasible  # the next gang cannot get them
    ledger.settle(lambda a: a.reservation == "ns/rr")
    fresh = placer_for("n1")
    ledger.hold_in(fresh)
    assert fresh.snapshot.nodes["n1"].free_whole_gpus == 8


def test_forget_gives_capacity_back_and_a_gone_node_is_skipped() -> None:
    gang = Gang("ns/w", (PodSet("main", count=1, gpus=1),))
    ledger = Ledger()
    ledger.assume("ns/rr", "ns/w", gang, (Slot("main", 0, "gone", (0,), None),), 0.0)
    ledger.hold_in(placer_for("n1"))  # no KeyError for a node that left
    ledger.forget("ns/rr")
    assert not ledger.assumed


def test_a_lost_create_holds_its_slots_until_the_watch_shows_it_or_it_expires() -> None:
    """A create whose answer was lost may have been made: every snapshot holds it (a
    second one of the same pass, the next passes'), until the watch shows the reservation
    (the snapshot counts it then) or as long as an assumption has gone by without it.
    Before: the next pass forgot it and could promise its GPUs again."""
    gang = Gang("ns/w", (PodSet("main", count=1, gpus=8),))
    ledger = Ledger()
    ledger.assume("ns/rr", "ns/w", gang, (Slot("main", 0, "n1", tuple(range(8)), 0),), 0.0)
    ledger.assume("ns/drain", "ns/d", gang, (Slot("main", 0, "n2", tuple(range(8)), 0),), 0.0)
    ledger.lost("ns/rr")
    assert "ns/rr" not in ledger.assumed  # the next pass decides it afresh
    same_pass = placer_for("n1", "n2")
    ledger.hold_in(same_pass, skip=frozenset({"ns/drain"}))
    assert same_pass.snapshot.nodes["n1"].free_whole_gpus == 0
    assert same_pass.snapshot.nodes["n2"].free_whole_gpus == 8  # skipped
    next_pass = placer_for("n1")
    ledger.hold_in(next_pass)
    assert next_pass.snapshot.nodes["n1"].free_whole_gpus == 0
    ledger.settle(lambda a: a.reservation == "ns/rr")  # the watch brought it
    assert "ns/rr" not in ledger.unsure
    after = placer_for("n1")
    ledger.hold_in(after)
    assert after.snapshot.nodes["n1"].free_whole_gpus == 8


def _config():  # type: ignore[no-untyped-def]
    from nexus_admit.model import PlacementConfig

    return PlacementConfig()
