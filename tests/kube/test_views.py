"""The typed views hold what the controller reads, each value derived by the one function
that derives it; a malformed object gets a view that names its problem, never an error."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexus_admit.kube import labels as L
from nexus_admit.kube.kueue import admission_order_key, check_entry_of, is_pending_on_check
from nexus_admit.kube.reservations import (
    attempt_key,
    reservation_is_live,
    reservation_key,
    reservation_name,
    reservation_slots,
)
from nexus_admit.kube.views import UNREADABLE, PodView, ReservationView, WorkloadView, view_of

QR = "2026-11-25T10:00:00Z"


def workload(**status: Any) -> dict[str, Any]:
    return {
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "t", "uid": "u1",
                     "creationTimestamp": "2026-11-25T09:00:00Z",
                     "labels": {L.KUEUE_QUEUE_NAME_LABEL: "q"}},
        "spec": {"priority": 5},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True",
                            "lastTransitionTime": QR}],
            "admissionChecks": [{"name": "nexus", "state": "Pending"},
                                {"name": "other", "state": "Ready"}],
            **status,
        },
    }


RR = {
    "kind": L.KIND_RESOURCE_RESERVATION,
    "metadata": {"name": "w-1", "namespace": "t", "uid": "r1", "resourceVersion": "3",
                 "creationTimestamp": "2026-11-25T10:00:01Z",
                 "annotations": {L.ANN_ATTEMPT: QR}},
    "spec": {"workloadRef": {"name": "w", "namespace": "t", "uid": "u1"}, "ttlSeconds": 60,
             "podSets": [{"name": "main", "slots": [{"index": 0, "node": "n0", "gpus": [1]}]}]},
    "status": {"phase": "Bound"},
}


def test_a_workloads_view_derives_through_the_one_function_of_each_value() -> None:
    obj = workload()
    v = WorkloadView.of(obj)
    assert (v.key, v.uid, v.queue, v.active, v.deleting) == ("t/w", "u1", "q", True, False)
    assert v.attempt == attempt_key(obj) == QR
    assert v.reservation_name == reservation_name(obj)
    assert v.reservation_key == reservation_key(obj)
    assert v.order == admission_order_key(obj)
    assert v.check("nexus") == check_entry_of(obj, "nexus") and v.check("none") == {}
    assert v.condition("QuotaReserved") == "True" and v.condition("Admitted") == ""
    assert v.pending_on({"nexus"}) is is_pending_on_check(obj, {"nexus"}) is True
    assert v.pending_on({"other"}) is is_pending_on_check(obj, {"other"}) is False
    assert v.raw is obj and v.problem is None


def test_a_reservations_view() -> None:
    v = ReservationView.of(RR)
    assert (v.key, v.workload_key, v.workload_uid, v.attempt, v.pod_label) == (
        "t/w-1", "t/w", "u1", QR, "w-1")
    assert v.slots == tuple(reservation_slots(RR))
    assert (v.phase, v.ttl_seconds, v.expires_at, v.expiry_readable) == ("Bound", 60, None, True)
    assert v.created == datetime(2026, 11, 25, 10, 0, 1, tzinfo=UTC)
    assert v.pod_sets == ("main",)


@pytest.mark.parametrize(
    ("phase", "expires", "bound"),
    [("Bound", None, False), ("Released", None, True), ("Reserved", "2026-11-25T10:00:00Z", False),
     ("Reserved", "2026-11-25T12:00:00Z", False), ("Reserved", "2026-11-25T10:00:00Z", True),
     ("", None, False)],
)
def test_a_reservations_liveness_is_reservation_is_live(
    phase: str, expires: str | None, bound: bool
) -> None:
    now = datetime(2026, 11, 25, 11, 0, tzinfo=UTC)
    rr = {**RR, "spec": {**RR["spec"], "expiresAt": expires}, "status": {"phase": phase}}
    live = reservation_is_live(rr, now, bound=bound)
    assert ReservationView.of(rr).live(now, bound=bound) is live


def test_an_unreadable_expiry_raises_where_reservation_is_live_does() -> None:
    now = datetime(2026, 11, 25, 11, 0, tzinfo=UTC)
    rr = {**RR, "spec": {**RR["spec"], "expiresAt": "soon"}, "status": {}}
    with pytest.raises(ValueError, match=r"spec\.expiresAt"):
        ReservationView.of(rr).live(now)
    assert ReservationView.of(rr).live(now, bound=True)


def test_a_pods_view() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "t", "uid": "p1",
                     "labels": {L.LABEL_RESERVATION: "w-1"},
                     "annotations": {L.ANN_SLOT: "main/0"}},
        "spec": {"nodeSelector": {L.HOSTNAME_LABEL: "n0"},
                 "schedulingGates": [{"name": L.GATE_PLACEMENT}],
                 "resourceClaims": [{"name": "gpu"}]},
        "status": {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes", "lastTransitionTime": QR}]},
    }
    v = PodView.of(pod)
    assert (v.key, v.node, v.pinned, v.reservation, v.slot, v.gated, v.claims) == (
        "t/p", None, "n0", "w-1", ("main", 0), True, True)
    assert v.gates == (L.GATE_PLACEMENT,)
    assert v.unschedulable_since == datetime(2026, 11, 25, 10, tzinfo=UTC)
    assert v.unschedulable_message == "0/3 nodes" and v.live and not v.terminated


@pytest.mark.parametrize(
    ("kind", "obj", "field"),
    [
        pytest.param(L.KIND_RESOURCE_RESERVATION,
                     {**RR, "spec": {**RR["spec"], "expiresAt": "soon"}}, "spec.expiresAt",
                     id="reservation-expiry"),
        pytest.param("Pod", {"metadata": {"name": "p", "namespace": "t"}, "status": {
            "conditions": [{"type": "PodScheduled", "status": "False",
                            "reason": "Unschedulable", "lastTransitionTime": "later"}]}},
                     "status.conditions", id="pod-scheduled-time"),
        pytest.param("Workload", {"metadata": {"name": "w", "namespace": "t"},
                                  "spec": ["not", "an", "object"]}, "spec",
                     id="workload-spec"),
        pytest.param("Pod", {"metadata": {"name": "p", "namespace": "t",
                                          "annotations": {L.ANN_SLOT: ["main", 0]}},
                             "spec": "broken", "status": 7}, None, id="pod-all-wrong"),
    ],
)
def test_a_malformed_object_gets_a_view_naming_its_problem(
    kind: str, obj: dict[str, Any], field: str | None
) -> None:
    """Untrusted input: what can be read is read, the rest left empty and named."""
    v = view_of(kind, obj)
    assert v is not None and v.raw is obj and v.key.endswith(obj["metadata"]["name"])
    if field is None:
        assert v.problem is None  # lenient reads: nothing the controller needs was there
    else:
        assert v.problem is not None and (v.problem.field, v.problem.reason) == (
            field, UNREADABLE)


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["metadata", "spec", "status", "name", "namespace", "labels",
                         "annotations", "conditions", "admissionChecks", "podSets", "slots",
                         "node", "type", "status", "phase", "nodeName", "workloadRef"]),
        inner, max_size=4),
    max_leaves=20))
def test_building_a_view_never_raises(obj: Any) -> None:
    for kind in ("Workload", L.KIND_RESOURCE_RESERVATION, "Pod"):
        v = view_of(kind, obj if isinstance(obj, dict) else {"spec": obj})
        assert v is not None


def test_other_kinds_have_no_view() -> None:
    assert view_of("Node", {"metadata": {"name": "n"}}) is None
