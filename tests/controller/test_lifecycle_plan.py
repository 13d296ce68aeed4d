"""What the lifecycle step does with one reservation (`lifecycle_plan.plan_reservation`),
decided without a client, and the pure rules it reads: why a reservation is released, when
it lapses, when its status is worth a write."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from nexus_admit.controller.lifecycle_plan import (
    Quiet,
    ReservationStep,
    lapses_at,
    plan_reservation,
    release_reason,
    status_due,
)
from nexus_admit.kube.views import ReservationView, WorkloadView
from tests.controller.test_lifecycle import RR, pod, requeued, retried, view, views, wl

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
TICK = 1000.0


def ready_node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


NODES = {"n0": ready_node("n0"), "n1": ready_node("n1")}


def plan(
    rr: dict[str, Any] = RR,
    workload: dict[str, Any] | None = None,
    pods: list[dict[str, Any]] | None = None,
    nodes: dict[str, Any] = NODES,
    **memos: Any,
) -> ReservationStep:
    kwargs: dict[str, Any] = {"ttl_seconds": 600, "handed_over": False, "claims": {},
                              "quiet": None, "status_since": None, **memos}
    return plan_reservation(view(rr), view(wl() if workload is None else workload),
                            views(pods or []), nodes, ["nexus"], NOW, TICK, **kwargs)


def test_a_live_reservation_with_nothing_to_do_is_counted_and_found_quiet() -> None:
    workload, pods = wl(), [pod("p0", "main/0", "n0")]
    step = plan(workload=workload, pods=pods, status_since=TICK - 1)
    assert (step.phase, step.release, step.trim, step.stranded, step.status) == (
        "Reserved", None, None, (), None)
    assert isinstance(step.quiet, Quiet)
    assert step.status_since == TICK - 1  # its last write: the period runs on
    again = plan(workload=workload, pods=pods, quiet=step.quiet, status_since=TICK - 1)
    assert again == ReservationStep(view(RR), view(workload), "Reserved", quiet=step.quiet,
                                    status_since=TICK - 1), "the same objects: skipped"
    changed = plan(workload=wl(), pods=pods, quiet=step.quiet, status_since=TICK - 1)
    assert changed.quiet is not step.quiet, "its Workload changed: read again"


def test_a_reservation_being_deleted_is_left_alone_with_its_memos() -> None:
    deleting = {**RR, "metadata": {**RR["metadata"], "deletionTimestamp": "now"}}
    step = plan(deleting, status_since=5.0)
    assert (step.phase, step.release, step.status_since) == (None, None, 5.0)


def test_an_old_slices_reservation_handed_over_is_kept_and_not_counted() -> None:
    step = plan(workload=wl(Finished="True"), handed_over=True)
    assert (step.phase, step.release, step.quiet) == (None, None, None)


def test_an_attempt_that_is_over_is_released_without_a_retry() -> None:
    step = plan(workload=wl(Finished="True"))
    assert step.release is not None and "finished" in step.release and not step.retry


def test_a_reservation_that_lapsed_unbound_sends_its_gang_back_through_retry() -> None:
    admitted = wl()
    admitted["status"]["conditions"].append({
        "type": "Admitted", "status": "True", "lastTransitionTime": "2026-11-25T10:00:00Z"})
    step = plan(workload=admitted)
    assert step.retry and step.release is not None and "expired" in step.release


def test_surplus_slots_no_pod_holds_are_given_back_and_a_just_claimed_one_is_kept() -> None:
    shrunk = wl()
    shrunk["spec"]["podSets"] = [{"name": "main", "count": 1}]
    holder = pod("p0", "main/0", "n0")
    step = plan(workload=shrunk, pods=[holder])
    assert step.trim is not None
    assert [s["index"] for s in step.trim[0]["slots"]] == [0]
    replacement = pod("p1", "main/9", None)  # its pin to main/1 not seen by the watch yet
    kept = plan(workload=shrunk, pods=[holder, replacement], claims={"p1": "main/1"})
    assert kept.trim is None


def test_slots_on_a_failed_node_no_pod_holds_are_stranded_and_never_quiet() -> None:
    step = plan(pods=[pod("p0", "main/0", "n0")], nodes={"n0": NODES["n0"]})
    assert [(s.key, why) for s, why in step.stranded] == [("main/1", "was deleted")]
    assert step.quiet is None and step.release is None


def test_a_status_write_waits_a_period_after_the_first_claim() -> None:
    claimed = [pod("p0", "main/0", "n0")]
    first = plan(pods=claimed)
    assert first.status is None and first.status_since == TICK  # the period starts
    due = plan(pods=claimed, status_since=TICK - 11)
    assert due.status is not None and due.status["slots"][0]["slot"] == "main/0"
    assert due.status_since == TICK and due.quiet is None
    unclaimed = plan(status_since=TICK - 11)
    assert unclaimed.status is None and unclaimed.status_since is None


def test_a_bound_gang_is_written_at_once() -> None:
    step = plan(pods=[pod("p0", "main/0", "n0"), pod("p1", "main/1", "n1")])
    assert step.phase == "Bound" and step.status is not None and step.status_since == TICK


def test_a_pod_off_its_slot_sends_the_gang_back() -> None:
    off = pod("p0", "main/0", "n1")
    step = plan(pods=[off])
    assert step.retry and step.release is not None and "bound to n1" in step.release


@pytest.mark.parametrize(
    ("workload", "reason"),
    [
        pytest.param(wl(), None, id="live"),
        pytest.param(None, "deleted", id="deleted"),
        pytest.param(wl(Finished="True"), "finished", id="finished"),
        pytest.param(wl(Evicted="True"), "evicted", id="evicted"),
        pytest.param({**wl(), "spec": {"active": False}}, "deactivated", id="deactivated"),
        pytest.param(requeued(), "newer quota reservation", id="new-attempt"),
        pytest.param(retried(), "Retry", id="check-retry"),
    ],
)
def test_release_reason(workload, reason) -> None:
    got = release_reason(view(RR), None if workload is None else WorkloadView.of(workload),
                         ["nexus"])
    assert (got is None) if reason is None else (reason in got)



@pytest.mark.parametrize(
    ("have", "want", "last", "due"),
    [
        pytest.param({"phase": "Reserved"}, {"phase": "Bound", "slots": []}, 99.0, True,
                     id="phase-change-at-once"),
        pytest.param({"phase": "Reserved", "slots": []}, {"phase": "Reserved", "slots": []},
                     None, False, id="nothing-changed"),
        pytest.param({"phase": "Reserved", "slots": []},
                     {"phase": "Reserved", "slots": [{"slot": "main/0"}]}, None, True,
                     id="first-claims"),
        pytest.param({"phase": "Reserved", "slots": []},
                     {"phase": "Reserved", "slots": [{"slot": "main/0"}]}, 95.0, False,
                     id="claims-within-the-period"),
        pytest.param({"phase": "Reserved", "slots": []},
                     {"phase": "Reserved", "slots": [{"slot": "main/0"}]}, 89.0, True,
                     id="claims-after-the-period"),
        pytest.param({}, {"phase": "Bound", "slots": [{"slot": "main/0"}]}, 99.0, True,
                     id="never-written-bound-at-once"),
        pytest.param({}, {"phase": "Reserved", "slots": [{"slot": "main/0"}]}, 95.0, False,
                     id="never-written-reserved-waits"),
        pytest.param({}, {"phase": "Reserved", "slots": []}, 89.0, False,
                     id="never-written-unclaimed-not-written"),
        pytest.param({}, {"phase": "Reserved", "slots": [{"slot": "main/0"}]}, 89.0, True,
                     id="never-written-claims-after-the-period"),
        pytest.param({"phase": "Bound", "slots": [{"slot": "main/0"}, {"slot": "main/1"}]},
                     {"phase": "Bound", "slots": [{"slot": "main/1"}]}, 10.0, False,
                     id="bound-pods-leaving-not-written"),
        pytest.param({"phase": "Bound", "slots": [{"slot": "main/0"}]},
                     {"phase": "Bound", "slots": [{"slot": "main/0", "pod": "again"}]}, 10.0,
                     True, id="bound-slot-taken-again"),
        pytest.param({"phase": "Reserved", "slots": [{"slot": "main/0"}, {"slot": "main/1"}]},
                     {"phase": "Reserved", "slots": [{"slot": "main/1"}]}, 10.0, True,
                     id="reserved-pods-leaving-written"),
    ],
)
def test_status_is_written_on_a_phase_change_and_claims_at_most_every_period(
    have: dict[str, Any], want: dict[str, Any], last: float | None, due: bool
) -> None:
    assert status_due(have, want, last, now=100.0) is due


@pytest.mark.parametrize(
    ("spec", "conditions", "lapses"),
    [
        pytest.param({}, [], None, id="not-admitted"),
        pytest.param({}, [{"type": "Admitted", "status": "False"}], None, id="admitted-false"),
        pytest.param({}, [{"type": "Admitted", "status": "True",
                           "lastTransitionTime": "2026-11-25T10:05:00Z"}],
                     datetime(2026, 11, 25, 10, 15, tzinfo=UTC), id="ttl-from-admission"),
        pytest.param({}, [{"type": "Admitted", "status": "True", "lastTransitionTime": "x"}],
                     datetime(2026, 11, 25, 10, 10, tzinfo=UTC), id="unreadable-time"),
        pytest.param({"ttlSeconds": 60}, [{"type": "Admitted", "status": "True",
                                           "lastTransitionTime": "2026-11-25T10:05:00Z"}],
                     datetime(2026, 11, 25, 10, 6, tzinfo=UTC), id="its-own-ttl"),
        pytest.param({"expiresAt": "2026-11-25T10:01:00Z"}, [],
                     datetime(2026, 11, 25, 10, 1, tzinfo=UTC), id="an-earlier-versions"),
        pytest.param({"expiresAt": "soon"}, [], None, id="unreadable-expiry-is-live"),
    ],
)
def test_lapses_at(spec: dict[str, Any], conditions: list[Any], lapses: Any) -> None:
    rr = {"metadata": {"name": "r", "creationTimestamp": "2026-11-25T10:00:00Z"}, "spec": spec}
    workload = {"status": {"conditions": conditions}}
    assert lapses_at(ReservationView.of(rr), WorkloadView.of(workload), 600) == lapses
