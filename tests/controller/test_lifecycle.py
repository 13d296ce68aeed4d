"""When a reservation stops holding capacity, and what its status says (table-driven)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nexus_admit.controller.lifecycle import LifecycleState, missing_reservation
from nexus_admit.controller.reservation_pods import (
    lost_node,
    reservation_status,
    stranded_slots,
    unpinned_pod,
    unschedulable_message,
    unschedulable_pin,
)
from nexus_admit.kube import labels as L
from nexus_admit.kube.views import PodView, ReservationView, WorkloadView

QR_TIME = "2026-11-25T10:00:00Z"


def wl(**conds: str) -> dict[str, Any]:
    conditions = [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": QR_TIME}]
    conditions += [{"type": k, "status": v, "reason": "Because"} for k, v in conds.items()]
    return {
        "metadata": {"name": "w", "namespace": "t", "uid": "u1"},
        "spec": {},
        "status": {
            "conditions": conditions,
            "admissionChecks": [{"name": "nexus", "state": "Ready"}],
        },
    }


RR = {
    "metadata": {"name": "w-1", "namespace": "t", "annotations": {L.ANN_ATTEMPT: QR_TIME}},
    "spec": {
        "workloadRef": {"name": "w", "namespace": "t", "uid": "u1"},
        "podSets": [
            {"name": "main", "slots": [{"index": 0, "node": "n0"}, {"index": 1, "node": "n1"}]}
        ],
    },
}


def requeued() -> dict[str, Any]:
    w = wl()
    w["status"]["conditions"][0]["lastTransitionTime"] = "2026-11-25T11:00:00Z"
    return w


def retried() -> dict[str, Any]:
    w = wl()
    w["status"]["admissionChecks"][0]["state"] = "Retry"
    return w


def pod(name: str, slot: str, node: str | None, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": name, "annotations": {L.ANN_SLOT: slot}},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


_VIEWS: dict[int, tuple[Any, Any]] = {}


def view(obj: Any) -> Any:
    """The view of a test object, built once per object as the store builds it (a Quiet
    answer holds while the step sees the very same views)."""
    kept = _VIEWS.get(id(obj))
    if kept is None or kept[0] is not obj:
        if "workloadRef" in (obj.get("spec") or {}):
            made: Any = ReservationView.of(obj)
        elif "admissionChecks" in (obj.get("status") or {}) or obj.get("kind") == "Workload":
            made = WorkloadView.of(obj)
        else:
            made = PodView.of(obj)
        kept = _VIEWS[id(obj)] = (obj, made)
    return kept[1]


def views(objs: list[dict[str, Any]]) -> list[Any]:
    return [view(o) for o in objs]


def test_status_is_bound_only_when_every_slot_is_bound() -> None:
    half = reservation_status(view(RR), views([pod("a", "main/0", "n0"), pod("b", "main/1", None)]))
    assert half["phase"] == "Reserved"
    assert [r["state"] for r in half["slots"]] == ["Bound", "Claimed"]
    full = reservation_status(view(RR), views([pod("a", "main/0", "n0"), pod("b", "main/1", "n1")]))
    assert full["phase"] == "Bound"
    done = reservation_status(
        view(RR), views([pod("a", "main/0", "n0", "Succeeded"), pod("b", "main/1", "n1")]))
    assert done["phase"] == "Reserved" and len(done["slots"]) == 1


def test_a_bound_reservation_stays_bound_while_its_pods_restart() -> None:
    bound = {**RR, "status": {"phase": "Bound"}}
    gone = reservation_status(view(bound), views([]))
    assert gone["phase"] == "Bound" and gone["slots"] == []
    again = reservation_status(
        view(bound), views([pod("a2", "main/0", None), pod("b", "main/1", "n1")]))
    assert again["phase"] == "Bound"
    assert [r["state"] for r in again["slots"]] == ["Claimed", "Bound"]
    # never bound: the TTL applies
    assert reservation_status(view(RR), views([]))["phase"] == "Reserved"


def test_unschedulable_pin_waits_for_the_grace() -> None:
    now = datetime(2026, 11, 25, 10, 0, 30, tzinfo=UTC)

    def p(since: datetime) -> dict[str, Any]:
        return {
            "spec": {},
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/64 nodes are available",
                        "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }
                ]
            },
        }

    assert unschedulable_pin(view(p(now - timedelta(seconds=5))), now) is None
    assert "0/64" in unschedulable_pin(view(p(now - timedelta(seconds=60))), now)


def test_an_allocator_that_cannot_allocate_the_claims_is_named_in_the_retry_message() -> None:
    pinned = {"metadata": {"name": "gang-0"},
              "spec": {"nodeSelector": {L.HOSTNAME_LABEL: "dra-ra-1"},
                       "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}}
    why = ("0/40 nodes are available: 1 cannot allocate all claims, 39 node(s) didn't match "
           "Pod's node affinity/selector.")
    message = unschedulable_message(view(pinned), why)
    assert "pod gang-0 pinned to node dra-ra-1" in message
    assert "DRA allocator cannot allocate its ResourceClaims" in message
    assert why in message and "placed again" in message
    # a pod without claims, or a message about something else: the capacity was taken
    plain = {"metadata": {"name": "p"}, "spec": {"nodeSelector": {L.HOSTNAME_LABEL: "n"}}}
    assert "bypassed Kueue" in unschedulable_message(view(plain), why)
    cpu = "0/40 nodes are available: 1 Insufficient cpu."
    assert "bypassed Kueue" in unschedulable_message(view(pinned), cpu)


def ready(since: str = "2026-11-25T10:00:05Z", **conds: str) -> dict[str, Any]:
    w = wl(**conds)
    w["status"]["admissionChecks"] = [
        {
            "name": "nexus",
            "state": "Ready",
            "lastTransitionTime": since,
            "podSetUpdates": [{"name": "main", "labels": {L.LABEL_RESERVATION: "w-1"}}],
        }
    ]
    return w


NOW = datetime(2026, 11, 25, 10, 1, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("workload", "reservations", "now", "missing"),
    [
        pytest.param(ready(), {"t/w-1"}, NOW, None, id="present"),
        pytest.param(ready(), set(), NOW, "w-1", id="deleted"),
        pytest.param(
            ready(), set(), datetime(2026, 11, 25, 10, 0, 8, tzinfo=UTC), None, id="watch-may-lag"
        ),
        pytest.param(ready(Finished="True"), set(), NOW, None, id="finished-released"),
        pytest.param(ready(Evicted="True"), set(), NOW, None, id="evicted"),
        pytest.param(wl(), set(), NOW, None, id="check-not-ready"),
    ],
)
def test_missing_reservation(workload, reservations, now, missing) -> None:
    assert missing_reservation(WorkloadView.of(workload), "nexus", reservations, now) == missing


def node_obj(name: str, cordoned: bool = False, ready: str | None = None) -> dict[str, Any]:
    status = {"conditions": [{"type": "Ready", "status": ready}]} if ready else {}
    return {"metadata": {"name": name}, "spec": {"unschedulable": True} if cordoned else {},
            "status": status}


def pinned(name: str, slot: str, node: str) -> dict[str, Any]:
    """A pod pinned to `node` (our hostname nodeSelector) and not bound yet."""
    p = pod(name, slot, None, "Pending")
    p["spec"]["nodeSelector"] = {L.HOSTNAME_LABEL: node}
    return p


def terminating(p: dict[str, Any]) -> dict[str, Any]:
    p["metadata"]["deletionTimestamp"] = "2026-11-25T10:00:30Z"
    return p


@pytest.mark.parametrize(
    ("nodes", "pods", "says"),
    [
        pytest.param({"n0": node_obj("n0"), "n1": node_obj("n1")},
                     [pinned("b", "main/1", "n1")], None, id="all-there"),
        pytest.param({"n0": node_obj("n0")}, [], None, id="deleted-unclaimed-moves-instead"),
        pytest.param(
            {"n0": node_obj("n0"), "n1": node_obj("n1", cordoned=True)},
            [pinned("b", "main/1", "n1")],
            "node n1 of slot main/1 was cordoned while pod b was pinned there but not bound",
            id="cordoned-under-a-pinned-pod",
        ),
        pytest.param(
            {"n0": node_obj("n0"), "n1": node_obj("n1", cordoned=True)},
            [pod("b", "main/1", "n1")],
            None,
            id="cordoned-under-a-bound-pod",
        ),
        pytest.param(
            {"n0": node_obj("n0"), "n1": node_obj("n1", ready="Unknown")},
            [pinned("b", "main/1", "n1")],
            "node n1 of slot main/1 is NotReady (Ready Unknown) while pod b was pinned there "
            "but not bound",
            id="not-ready-under-a-pinned-pod",
        ),
        pytest.param(
            {"n0": node_obj("n0"), "n1": node_obj("n1", ready="False")},
            [pod("b", "main/1", "n1")],
            None,
            id="not-ready-under-a-bound-pod",
        ),
        pytest.param(
            {"n0": node_obj("n0"), "n1": node_obj("n1", ready="maybe")},
            [pinned("b", "main/1", "n1")],
            None,
            id="a-malformed-condition-is-left-to-the-snapshot",
        ),
        pytest.param(
            {"n0": node_obj("n0")},
            [pinned("b", "main/1", "n1")],
            "node n1 of slot main/1 was deleted while pod b was pinned there but not bound",
            id="deleted-under-a-pinned-pod",
        ),
        pytest.param(
            {"n0": node_obj("n0")},
            [pod("b", "main/1", "n1")],
            "node n1 of slot main/1 was deleted with its pod b",
            id="deleted-under-a-bound-pod",
        ),
    ],
)
def test_lost_node(nodes, pods, says) -> None:
    """Only a pod pinned and not bound to a failed node loses the gang its reservation:
    its pin cannot change. A slot no pod holds moves (`stranded_slots`); a bound pod is
    not nexus's to delete."""
    assert lost_node(view(RR), views(pods), nodes) == says


@pytest.mark.parametrize(
    ("nodes", "pods", "stranded"),
    [
        pytest.param({"n0": node_obj("n0"), "n1": node_obj("n1")}, [], [], id="all-there"),
        pytest.param({"n0": node_obj("n0")}, [], [("main/1", "was deleted")], id="deleted"),
        pytest.param({"n0": node_obj("n0"), "n1": node_obj("n1", cordoned=True)}, [],
                     [("main/1", "was cordoned")], id="cordoned"),
        pytest.param({"n0": node_obj("n0"), "n1": node_obj("n1", ready="False")}, [],
                     [("main/1", "is NotReady (Ready False)")], id="not-ready-unclaimed"),
        pytest.param({"n0": node_obj("n0"), "n1": node_obj("n1", ready="False")},
                     [pod("b", "main/1", "n1")], [], id="a-bound-pod-keeps-its-slot"),
        pytest.param({"n0": node_obj("n0"), "n1": node_obj("n1", ready="False")},
                     [pinned("b", "main/1", "n1")], [], id="a-pinned-pod-is-lost-not-moved"),
        pytest.param({"n0": node_obj("n0"), "n1": node_obj("n1", ready="False")},
                     [terminating(pod("b", "main/1", "n1"))],
                     [("main/1", "is NotReady (Ready False)")], id="its-pod-being-deleted"),
        pytest.param({"n0": node_obj("n0"), "n1": node_obj("n1", ready="Unknown")},
                     [pod("b", "main/1", "n1", "Failed")],
                     [("main/1", "is NotReady (Ready Unknown)")], id="its-pod-failed"),
        pytest.param({"n0": node_obj("n0"), "n1": node_obj("n1", ready="maybe")}, [], [],
                     id="a-malformed-condition-is-left-to-the-snapshot"),
        pytest.param({"n0": node_obj("n0", ready="False"), "n1": node_obj("n1")},
                     [pod("a", "main/0", "n0", "Succeeded")],
                     [("main/0", "is NotReady (Ready False)")], id="its-pod-succeeded"),
    ],
)
def test_stranded_slots(nodes, pods, stranded) -> None:
    """A slot whose node failed and that no live pod holds moves: nothing of the gang
    runs there, and a replacement pod must not be pinned there."""
    got = stranded_slots(view(RR), views(pods), nodes)
    assert [(s.key, why) for s, why in got] == stranded


def tenant_pod(
    slot: str | None = None,
    node: str | None = None,
    pinned: str | None = None,
    gated: bool = False,
    phase: str = "Running",
) -> dict[str, Any]:
    """A pod of reservation w-1 as a tenant may leave it."""
    spec: dict[str, Any] = {}
    if node:
        spec["nodeName"] = node
    if pinned:
        spec["nodeSelector"] = {L.HOSTNAME_LABEL: pinned}
    if gated:
        spec["schedulingGates"] = [{"name": L.GATE_PLACEMENT}]
    return {
        "metadata": {"name": "p", "annotations": {L.ANN_SLOT: slot} if slot else {}},
        "spec": spec,
        "status": {"phase": phase},
    }


@pytest.mark.parametrize(
    ("the_pod", "says"),
    [
        pytest.param(tenant_pod(gated=True), None, id="still-gated"),
        pytest.param(tenant_pod("main/0", "n0", "n0"), None, id="bound-on-its-slot"),
        pytest.param(tenant_pod("main/1", None, "n1"), None, id="pinned-not-yet-bound"),
        pytest.param(
            tenant_pod(None, "n7"),
            "pod p lost its scheduling gate scheduling.kubenexus.io/placement before "
            "nexus-admit gave it a slot (bound to node n7)",
            id="gate-lifted-by-tenant-then-bound",
        ),
        pytest.param(
            tenant_pod(None),
            "pod p lost its scheduling gate",
            id="gate-lifted-by-tenant-not-bound-yet",
        ),
        pytest.param(
            tenant_pod("main/9", "n0"), "pod p lost its scheduling gate", id="claims-no-such-slot"
        ),
        pytest.param(
            tenant_pod("main/0", "n1", "n1"),
            "pod p claims slot main/0 on node n0 but is bound to n1",
            id="claims-another-slot",
        ),
        pytest.param(
            tenant_pod("main/0"), "pod p claims slot main/0 but is not pinned", id="not-pinned"
        ),
        pytest.param(tenant_pod(None, "n7", phase="Succeeded"), None, id="finished-pod"),
    ],
)
def test_unpinned_pod(the_pod, says) -> None:
    got = unpinned_pod(view(RR), [view(the_pod)])
    assert (got is None) if says is None else (got is not None and says in got), got


# ---- the step on a controller: a quiet reservation is not read again ----


def _placed(api: Any, clock: datetime) -> tuple[Any, dict[str, Any]]:
    """A controller that placed one 1-pod Workload; its context and the reservation."""
    from tests.controller.test_placing import controller, run, watch

    ctx, _ = controller(api)
    ctx.clocks.wall = lambda: clock
    run(ctx)
    watch(ctx, api)
    (rr,) = api.of_kind(L.KIND_RESOURCE_RESERVATION)
    return ctx, rr


def _lifecycle(ctx: Any) -> list[Any]:
    import asyncio

    from nexus_admit.controller.lifecycle import sync_lifecycle

    return asyncio.run(sync_lifecycle(ctx))


def _counting_retry_reason(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    import nexus_admit.controller.lifecycle_plan as plan

    read: list[str] = []
    real = plan.retry_reason

    def counting(rr, pods, nodes, now, lapses=None):  # type: ignore[no-untyped-def]
        read.append(rr.name)
        return real(rr, pods, nodes, now, lapses)

    monkeypatch.setattr(plan, "retry_reason", counting)
    return read


def test_a_quiet_reservation_is_read_again_only_when_an_object_it_read_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.controller.test_placing import cluster, pending, watch
    from tests.kube.kube_factories import pod as make_pod

    api = cluster(pending("w", pods=1, gpus=8))
    ctx, rr = _placed(api, datetime(2026, 11, 25, 10, 0, tzinfo=UTC))
    slot = rr["spec"]["podSets"][0]["slots"][0]
    bound = make_pod(
        "w-0", slot["node"], gpus=8,
        labels={L.LABEL_RESERVATION: rr["metadata"]["name"]},
        annotations={L.ANN_SLOT: f"main/{slot['index']}"},
        spec_extra={"nodeSelector": {L.HOSTNAME_LABEL: slot["node"]}},
    )
    api.put(bound)
    watch(ctx, api)
    read = _counting_retry_reason(monkeypatch)
    _lifecycle(ctx)  # its pod came: read, Bound written
    watch(ctx, api)
    _lifecycle(ctx)  # its status changed: read again, now quiet
    assert len(read) == 2
    _lifecycle(ctx)
    _lifecycle(ctx)
    assert len(read) == 2, "nothing changed: not read again"
    assert ctx.metrics.reservations.labels("Bound")._value.get() == 1  # still counted
    bound["status"]["phase"] = "Failed"  # its pod changed
    api.put(bound)
    watch(ctx, api)
    _lifecycle(ctx)
    assert len(read) == 3
    api.delete("Node", slot["node"])  # the node of its slot went
    watch(ctx, api)
    (stranded,) = _lifecycle(ctx)  # its pod failed: the slot is the mover's
    assert len(read) == 4
    assert [(s.key, why) for s, why in stranded.slots] == [("main/0", "was deleted")]
    _lifecycle(ctx)
    assert len(read) == 5, "a stranded slot is never quiet: looked at until it moved"


def test_a_quiet_unbound_reservation_still_expires_and_a_failed_retry_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.controller.test_placing import cluster, pending, watch

    api = cluster(pending("w", pods=1, gpus=8))
    t0 = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
    ctx, _ = _placed(api, t0)
    _admit(api, "w", t0)
    watch(ctx, api)
    read = _counting_retry_reason(monkeypatch)
    _lifecycle(ctx)
    _lifecycle(ctx)
    assert len(read) == 1, "quiet: no pod yet, not expired"
    expires = t0 + timedelta(seconds=600)  # reservationTtlSeconds after the admission
    ctx.clocks.wall = lambda: expires
    api.fail[("apply", "Workload")] = 1  # the Retry write fails once
    _lifecycle(ctx)
    assert len(read) == 2, "its deadline passed: read again"
    assert api.of_kind(L.KIND_RESOURCE_RESERVATION), "not released while Retry failed"
    watch(ctx, api)
    _lifecycle(ctx)  # the same objects: tried again, not taken for quiet
    entry = api.get("Workload", "w", "default")["status"]["admissionChecks"][0]
    assert entry["state"] == "Retry" and "expired" in entry["message"], entry
    assert api.of_kind(L.KIND_RESOURCE_RESERVATION) == []


def _admit(api: Any, name: str, at: datetime) -> None:
    """Kueue admitted the Workload at `at`: quota and every check Ready."""
    wl = api.get("Workload", name, "default")
    wl["status"]["conditions"].append({
        "type": "Admitted", "status": "True",
        "lastTransitionTime": at.strftime("%Y-%m-%dT%H:%M:%SZ")})
    api.put(wl)


def test_a_sibling_check_answered_after_the_ttl_keeps_the_reservation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Our check Ready, another check of the ClusterQueue still Pending: Kueue holds the
    quota and admits nothing, no pod can come, so the reservation holds however long
    that takes. Once Kueue admits the Workload, the TTL counts from then."""
    from tests.controller.test_placing import cluster, pending, watch

    wl = pending("w", pods=1, gpus=8)
    wl["status"]["admissionChecks"].append({"name": "budget", "state": "Pending"})
    api = cluster(wl)
    t0 = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
    ctx, rr = _placed(api, t0)
    assert "expiresAt" not in rr["spec"] and rr["spec"]["ttlSeconds"] == 600
    later = t0 + timedelta(hours=2)
    ctx.clocks.wall = lambda: later
    _lifecycle(ctx)
    entry = api.get("Workload", "w", "default")["status"]["admissionChecks"]
    assert [e["state"] for e in entry if e["name"] == "nexus"] == ["Ready"]
    assert api.of_kind(L.KIND_RESOURCE_RESERVATION), "held while the sibling is Pending"
    _admit(api, "w", later)  # the sibling said Ready two hours on
    watch(ctx, api)
    ctx.clocks.wall = lambda: later + timedelta(seconds=599)
    _lifecycle(ctx)
    assert api.of_kind(L.KIND_RESOURCE_RESERVATION), "within the TTL of the admission"
    ctx.clocks.wall = lambda: later + timedelta(seconds=600)
    _lifecycle(ctx)
    assert api.of_kind(L.KIND_RESOURCE_RESERVATION) == [], "no pod came within the TTL"


def test_a_pinned_pod_unschedulable_in_a_quiet_reservation_retries_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nexus_admit.controller.reservation_pods import UNSCHEDULABLE_GRACE
    from tests.controller.test_placing import cluster, pending, watch
    from tests.kube.kube_factories import pod as make_pod

    api = cluster(pending("w", pods=1, gpus=8))
    t0 = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
    ctx, rr = _placed(api, t0)
    slot = rr["spec"]["podSets"][0]["slots"][0]
    stuck = make_pod(
        "w-0", None, gpus=8, phase="Pending",
        labels={L.LABEL_RESERVATION: rr["metadata"]["name"]},
        annotations={L.ANN_SLOT: f"main/{slot['index']}"},
        spec_extra={"nodeSelector": {L.HOSTNAME_LABEL: slot["node"]}},
    )
    stuck["status"]["conditions"] = [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available", "lastTransitionTime": "2026-11-25T10:00:00Z"}]
    api.put(stuck)
    watch(ctx, api)
    read = _counting_retry_reason(monkeypatch)
    _lifecycle(ctx)
    _lifecycle(ctx)
    assert len(read) == 1, "within the grace: quiet"
    ctx.clocks.wall = lambda: t0 + UNSCHEDULABLE_GRACE
    _lifecycle(ctx)
    entry = api.get("Workload", "w", "default")["status"]["admissionChecks"][0]
    assert entry["state"] == "Retry" and "cannot be scheduled" in entry["message"], entry


def test_a_new_reservation_is_first_written_a_period_after_its_first_claim() -> None:
    import nexus_admit.controller.lifecycle_plan as lifecycle_plan
    from tests.controller.test_placing import cluster, pending, watch
    from tests.kube.kube_factories import pod as make_pod

    tick = [1000.0]
    api = cluster(pending("w", pods=1, gpus=8))
    ctx, rr = _placed(api, datetime(2026, 11, 25, 10, 0, tzinfo=UTC))
    ctx.clocks.monotonic = lambda: tick[0]
    ns, name = rr["metadata"]["namespace"], rr["metadata"]["name"]

    def status() -> dict[str, Any]:
        return dict(api.get(L.KIND_RESOURCE_RESERVATION, name, ns).get("status") or {})

    _lifecycle(ctx)
    tick[0] += 3 * lifecycle_plan.STATUS_SLOTS_EVERY_SECONDS  # its Job waits for Kueue
    _lifecycle(ctx)
    assert status() == {}, "no pod has claimed a slot: nothing to write"
    slot = rr["spec"]["podSets"][0]["slots"][0]
    pinned = make_pod(
        "w-0", None, gpus=8, phase="Pending",
        labels={L.LABEL_RESERVATION: name},
        annotations={L.ANN_SLOT: f"main/{slot['index']}"},
        spec_extra={"nodeSelector": {L.HOSTNAME_LABEL: slot["node"]}},
    )
    api.put(pinned)
    watch(ctx, api)
    _lifecycle(ctx)
    assert status() == {}, "the period starts at the first claim"
    pinned["spec"]["nodeName"] = slot["node"]
    api.put(pinned)
    watch(ctx, api)
    tick[0] += 1.0
    _lifecycle(ctx)
    assert status()["phase"] == "Bound", "bound within the period: one write, Bound"


def test_a_reservation_deleted_under_a_workload_that_did_not_change_is_found() -> None:
    """What a Workload's Ready check promises is kept while the Workload is the same object;
    whether the reservation still exists is asked at every step, so its deletion is found
    without any event of the Workload's."""
    from tests.controller.test_placing import cluster, pending, run, watch

    clock = datetime(2026, 11, 25, 10, 0, 0, tzinfo=UTC)
    api = cluster(pending("w", pods=1, gpus=8))
    ctx, rr = _placed(api, clock)
    run(ctx)  # the pass sees the reservation: the ledger's assumption of it ends
    assert not ctx.ledger.assumed
    _lifecycle(ctx)  # the promise is read and kept
    assert len(ctx.component(LifecycleState).promised) > 0
    entry = next(c for c in api.get("Workload", "w", "default")["status"]["admissionChecks"])
    assert entry["state"] == "Ready"
    api.delete(L.KIND_RESOURCE_RESERVATION, rr["metadata"]["name"], "default")
    ctx.store.delete(L.KIND_RESOURCE_RESERVATION, rr)
    ctx.clocks.wall = lambda: clock + timedelta(minutes=5)  # past the watch's grace
    _lifecycle(ctx)
    watch(ctx, api)
    entry = next(c for c in api.get("Workload", "w", "default")["status"]["admissionChecks"])
    assert entry["state"] == "Retry", entry
    assert "was deleted while the Workload was admitted on it" in entry["message"]
