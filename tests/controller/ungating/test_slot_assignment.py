"""Slot assignment: ranks take their own slot, the rest the first free one, slots held by
live pods are never handed out twice, slots of finished pods are reused."""

from __future__ import annotations

import pytest

from nexus_admit.controller.ungating.slot_assignment import PodView, assign_slots, pod_view
from nexus_admit.kube import labels as L
from nexus_admit.kube.reservations import ReservedSlot


def slots(n: int, pod_set: str = "main") -> list[ReservedSlot]:
    return [ReservedSlot(pod_set, i, f"node-{i // 2}", (i % 2,), 0) for i in range(n)]


def pod(
    name: str,
    rank: int | None = None,
    *,
    gated: bool = True,
    slot: int | None = None,
    active: bool = True,
    pod_set: str = "main",
) -> PodView:
    return PodView(
        name, pod_set, rank, gated, (pod_set, slot) if slot is not None else None, active
    )


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([pod("a", 2), pod("b", 0)], {"a": 2, "b": 0}, id="ranks-take-their-index"),
        pytest.param([pod("a"), pod("b")], {"a": 0, "b": 1}, id="unranked-first-free"),
        pytest.param([pod("x", slot=0, gated=False), pod("a", 0)], {"a": 1}, id="rank-slot-held"),
        pytest.param(
            [pod("x", slot=1, gated=False, active=False), pod("a", 1)],
            {"a": 1},
            id="finished-pod-slot-reused",
        ),
        pytest.param(
            [pod("a"), pod("b"), pod("c"), pod("d"), pod("e")],
            {"a": 0, "b": 1, "c": 2, "d": 3},
            id="more-pods-than-slots",
        ),
        pytest.param([pod("a", 9)], {"a": 0}, id="rank-out-of-range-first-free"),
        pytest.param([pod("a", 0, gated=False)], {}, id="ungated-pods-untouched"),
        pytest.param([pod("a", 0, pod_set="other")], {}, id="other-pod-set-has-no-slots"),
    ],
)
def test_assign_slots(pods: list[PodView], expected: dict[str, int]) -> None:
    got = assign_slots(slots(4), pods)
    assert {k: v.index for k, v in got.items()} == expected


def test_pod_view_reads_gate_rank_slot_and_pod_set() -> None:
    p = {
        "metadata": {
            "name": "w-3",
            "labels": {"batch.kubernetes.io/job-completion-index": "3"},
            "annotations": {L.ANN_SLOT: "main/3"},
        },
        "spec": {"schedulingGates": [{"name": L.GATE_PLACEMENT}]},
        "status": {"phase": "Pending"},
    }
    v = pod_view(p, ["main"])
    # a gated pod's slot annotation is not ours (our pin lifts the gate with it): ignored
    assert (v.rank, v.gated, v.slot, v.pod_set, v.active) == (3, True, None, "main", True)
    p["spec"] = {"nodeName": "n"}  # pinned: the annotation is the slot it holds
    assert pod_view(p, ["main"]).slot == ("main", 3)


def test_a_pod_asking_for_more_gpus_than_a_slot_holds_gets_none() -> None:
    """Before: the ungater never compared the pod's requests with the slot's, so a pod of
    the gang asking for 8 GPUs could take a 1-GPU slot and 7 devices nobody reserved."""
    big = PodView("big", "main", 0, True, None, True, gpus=8)
    fits = PodView("fits", "main", None, True, None, True, gpus=2)
    got = assign_slots(slots(2), [big, fits])  # each slot holds one device
    assert got == {}
    two = [ReservedSlot("main", i, "n", (0, 1), 0) for i in range(2)]
    assert {k: v.index for k, v in assign_slots(two, [big, fits]).items()} == {"fits": 0}


def test_kueue_pod_index_label_wins() -> None:
    p = {
        "metadata": {
            "name": "p",
            "labels": {"my/rank": "5", "batch.kubernetes.io/job-completion-index": "1"},
        }
    }
    assert pod_view(p, ["main"], "my/rank").rank == 5


@pytest.mark.parametrize(
    ("value", "rank"),
    [
        pytest.param("3", 3, id="ascii"),
        pytest.param("007", 7, id="leading-zeros"),
        pytest.param("²", None, id="superscript-isdigit-but-no-int"),
        pytest.param("٣", None, id="arabic-indic-digit"),
        pytest.param("1234567890", None, id="ten-digits-too-long"),
        pytest.param("-1", None, id="negative"),
        pytest.param(" 1", None, id="space"),
        pytest.param("", None, id="empty"),
    ],
)
def test_a_rank_is_ascii_digits_of_bounded_length_anything_else_no_rank(
    value: str, rank: int | None
) -> None:
    """`"²".isdigit()` is True and `int("²")` raises: the rank parser crashed every
    ungating pass on it. Now a strange index is no rank (the pod takes the first free slot)."""
    p = {
        "metadata": {
            "name": "odd",
            "annotations": {"batch.kubernetes.io/job-completion-index": value},
        },
        "spec": {"schedulingGates": [{"name": L.GATE_PLACEMENT}]},
    }
    assert pod_view(p, ["main"]).rank == rank
    p["metadata"]["labels"] = {"batch.kubernetes.io/job-completion-index": value}
    assert pod_view(p, ["main"]).rank == rank
