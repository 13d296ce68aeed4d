"""The ledger holds promised capacity until the cluster's objects show it."""

from __future__ import annotations

from nexus_admit.controller.ledger import Ledger
from nexus_admit.model import ClusterSnapshot, Gang, PodSet, Slot
from tests.factories import gpu_node


def test_assumed_slots_are_taken_until_settled() -> None:
    gang = Gang("ns/w", (PodSet("main", count=1, gpus=8),))
    ledger = Ledger()
    ledger.assume("ns/rr", "ns/w", gang, (Slot("main", 0, "n1", tuple(range(8)), 0),), 0.0)
    snap = ClusterSnapshot({"n1": gpu_node("n1")})
    ledger.apply_to(snap)
    assert snap.nodes["n1"].free_whole_gpus == 0
    ledger.settle(lambda a: a.reservation == "ns/rr")
    fresh = ClusterSnapshot({"n1": gpu_node("n1")})
    ledger.apply_to(fresh)
    assert fresh.nodes["n1"].free_whole_gpus == 8


def test_forget_gives_capacity_back_and_a_gone_node_is_skipped() -> None:
    gang = Gang("ns/w", (PodSet("main", count=1, gpus=1),))
    ledger = Ledger()
    ledger.assume("ns/rr", "ns/w", gang, (Slot("main", 0, "gone", (0,), None),), 0.0)
    snap = ClusterSnapshot({"n1": gpu_node("n1")})
    ledger.apply_to(snap)  # no KeyError for a node that left
    ledger.forget("ns/rr")
    assert not ledger.assumed
