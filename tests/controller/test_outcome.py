"""Placement → check state, message and podSetUpdates (table-driven)."""

from __future__ import annotations

import pytest

from nexus_admit.controller.outcome import (
    CheckState,
    common_domain,
    passthrough,
    placed,
    rejected_input,
    retry_backoff_seconds,
    unplaced,
)
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import TranslationError
from nexus_admit.model import ClusterSnapshot, Gang, Placement, PodSet, Slot, SolveStatus
from tests.factories import LEVELS, RACK, gpu_node


def snapshot() -> ClusterSnapshot:
    return ClusterSnapshot(
        {
            "a": gpu_node("a", rack="r0"),
            "b": gpu_node("b", rack="r0"),
            "c": gpu_node("c", rack="r1"),
        }
    )


def placement(nodes: list[str]) -> Placement:
    slots = [Slot("main", i, n, (0,), 0) for i, n in enumerate(nodes)]
    return Placement("ns/w", "nexus", True, SolveStatus.OPTIMAL, slots, explanation=["why"])


GANG = Gang("ns/w", (PodSet("main", count=2, gpus=1),))


@pytest.mark.parametrize(
    ("nodes", "selector"),
    [
        pytest.param(["a", "b"], {RACK: "r0"}, id="one-rack"),
        pytest.param(["a", "c"], {"example.com/block": "b0"}, id="two-racks-one-block"),
        pytest.param(["a", "a"], {RACK: "r0"}, id="one-node-no-hostname-selector"),
    ],
)
def test_common_domain(nodes: list[str], selector: dict[str, str]) -> None:
    assert common_domain(placement(nodes), "main", snapshot(), LEVELS) == selector


def test_placed_is_ready_with_the_reservation_label_and_the_reason() -> None:
    out = placed(placement(["a", "b"]), GANG, "w-abc", snapshot(), LEVELS)
    assert out.state is CheckState.READY
    assert out.pod_set_updates[0]["labels"] == {L.LABEL_RESERVATION: "w-abc"}
    assert out.pod_set_updates[0]["nodeSelector"] == {RACK: "r0"}
    assert out.message.startswith("placed 2 pods on 2 nodes (reservation w-abc)")
    assert "why" in out.message


def test_placed_message_leads_with_where_and_tier_to_class_before_the_details() -> None:
    gang = Gang("ns/w", (PodSet("main", count=2, gpus=1),), tier="gold")
    out = placed(placement(["a", "c"]), gang, "w-abc", snapshot(), LEVELS)
    lead, details = out.message.split(" Why: ", 1)
    product = snapshot().nodes["a"].gpu_product
    assert lead == (
        f"placed 2 pods on 2 nodes (reservation w-abc) in block b0 › rack r0+r1; "
        f"tier gold → {product}."
    )
    assert details == "why"
    # with the config's classes the class is named
    named = placed(
        placement(["a", "b"]), gang, "w-abc", snapshot(), LEVELS, hardware_class=lambda p: "fast"
    )
    assert named.message.startswith(
        "placed 2 pods on 2 nodes (reservation w-abc) in block b0 › rack r0; tier gold → fast."
    )
    # a long explanation is clipped, the lead line is kept whole
    long = placement(["a", "b"])
    long.explanation[:] = ["terms: " + "x=1, " * 500]
    clipped = placed(long, gang, "w-abc", snapshot(), LEVELS).message
    assert clipped.startswith("placed 2 pods") and "tier gold →" in clipped
    assert clipped.endswith("…")


@pytest.mark.parametrize(
    ("status", "retry_after", "state", "requeue"),
    [
        pytest.param(SolveStatus.INFEASIBLE, None, CheckState.RETRY, 20, id="full-now-backoff"),
        pytest.param(SolveStatus.INFEASIBLE, 1234.4, CheckState.RETRY, 1234, id="locality-hold"),
        pytest.param(SolveStatus.IMPOSSIBLE, None, CheckState.REJECTED, None, id="never-fits"),
        pytest.param(SolveStatus.UNAVAILABLE, None, CheckState.PENDING, None,
                     id="no-usable-node-now-waits"),
    ],
)
def test_unplaced(status, retry_after, state, requeue) -> None:
    p = Placement("ns/w", "nexus", False, status, reason="no room", retry_after_seconds=retry_after)
    out = unplaced(p, retry_count=1, base_seconds=10)
    assert (out.state, out.requeue_after_seconds) == (state, requeue)
    assert "no room" in out.message


def test_backoff_doubles_and_is_capped() -> None:
    assert [retry_backoff_seconds(n, 15) for n in (0, 1, 2, 10)] == [15, 30, 60, 300]


def test_rejected_input_names_the_field_and_messages_are_clipped() -> None:
    err = TranslationError("Workload ns/w", "spec.podSets[0]...annotations[x]", "bad " * 500)
    out = rejected_input(err)
    assert out.state is CheckState.REJECTED and "spec.podSets[0]" in out.message
    assert len(out.message) <= 1024


def test_passthrough_is_ready_without_pinning() -> None:
    out = passthrough(["main"])
    assert out.state is CheckState.READY and not out.pod_set_updates
