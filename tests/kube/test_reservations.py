"""Reservation names are deterministic per quota reservation; slots are numbered in
topology order so neighbouring ranks are neighbours."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_admit.kube.reservations import neighbour_order, parse_slot_key, reservation_name
from nexus_admit.model import ClusterSnapshot, Slot
from tests.factories import LEVELS, gpu_node


def wl(
    uid: str = "u1", qr: str = "2026-11-25T10:00:00Z", name: str = "job-train-abc"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": uid},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": qr}]
        },
    }


def test_same_attempt_same_name_new_attempt_new_name() -> None:
    assert reservation_name(wl()) == reservation_name(wl())
    assert reservation_name(wl()) != reservation_name(wl(qr="2026-11-25T10:05:00Z"))
    assert reservation_name(wl()) != reservation_name(wl(uid="u2"))


def test_name_is_a_valid_label_value_for_long_workload_names() -> None:
    name = reservation_name(wl(name="a" * 70 + "-" + "b" * 200))
    assert len(name) <= 63 and name[0].isalnum() and name[-1].isalnum()


def test_slot_keys_round_trip() -> None:
    assert parse_slot_key("main/12") == ("main", 12)
    assert parse_slot_key("garbage") is None and parse_slot_key(None) is None


def test_neighbour_order_groups_racks_and_nodes() -> None:
    snap = ClusterSnapshot(
        {
            "x": gpu_node("x", rack="r1"),
            "y": gpu_node("y", rack="r0"),
            "z": gpu_node("z", rack="r1"),
        }
    )
    slots = [
        Slot("main", 0, "z", (0,)),
        Slot("main", 1, "y", (0,)),
        Slot("main", 2, "x", (0,)),
        Slot("main", 3, "y", (1,)),
    ]
    out = neighbour_order(slots, snap, LEVELS)
    assert [s.node for s in out] == ["y", "y", "x", "z"]
    assert [s.index for s in out] == [0, 1, 2, 3]


def test_a_negative_device_index_in_a_slot_is_refused_not_an_index_error() -> None:
    """Found by the fuzz test: a bound pod's slot naming device -9 reached the node's list."""
    import pytest

    from nexus_admit.kube.cluster import build_snapshot
    from nexus_admit.kube.errors import TranslationError
    from tests.kube.kube_factories import node

    rr = {
        "kind": "ResourceReservation",
        "metadata": {"name": "w-1", "namespace": "default"},
        "spec": {
            "workloadRef": {"name": "w", "namespace": "default"},
            "podSets": [
                {
                    "name": "main",
                    "requests": {"cpu": "1", "memory": "1Gi"},
                    "slots": [{"index": 0, "node": "n0", "gpus": [-9, 1]}],
                }
            ],
        },
    }
    with pytest.raises(TranslationError, match="gpus"):
        build_snapshot([node("n0", gpus=2)], [], [rr])


def test_slots_of_one_reservation_version_are_read_once_and_a_new_version_again() -> None:
    from nexus_admit.kube.reservations import reservation_slots
    from tests.kube.kube_factories import reservation

    rr = reservation("rr-c", "w", [{"index": 0, "node": "n0", "gpus": [0]}])
    rr["metadata"].update(uid="uid-rr-c", resourceVersion="1")
    first = reservation_slots(rr)
    first.clear()  # a caller's list is its own
    assert [s.node for s in reservation_slots(rr)] == ["n0"]
    moved = {**rr, "metadata": {**rr["metadata"], "resourceVersion": "2"}}
    moved["spec"] = {**rr["spec"], "podSets": [{"name": "main", "slots": [{"node": "n1"}]}]}
    assert [s.node for s in reservation_slots(moved)] == ["n1"]
    assert [s.node for s in reservation_slots(rr)] == ["n0"]


@pytest.mark.parametrize("value", ["main/²", "main/٣", "main/1234567890", "main/", "/1", 3, None])
def test_a_slot_key_is_a_pod_set_and_ascii_digits_only(value: object) -> None:
    assert parse_slot_key(value) is None
