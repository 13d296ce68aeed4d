"""A malformed object anywhere never stops a pass (issue 28, item 1): the pass places the
Workload beside it, counts the object in nexus_admit_objects_skipped_total and tells it once
per version with an Event on the object, or on the Workload of a reservation (a unit test
over `FakeApi`; e2e/tests/test_hardening.py does the same on the real control plane)."""

from __future__ import annotations

import asyncio
from typing import Any

from nexus_admit.controller.loop.cycle import reconcile
from nexus_admit.kube import labels as L
from tests.controller.test_placing import check_of, cluster, controller, pending, watch
from tests.kube.kube_factories import pod, reservation


def skipped_total(ctx: object, kind: str, reason: str) -> float:
    value = ctx.metrics.registry.get_sample_value(  # type: ignore[attr-defined]
        "nexus_admit_objects_skipped_total", {"kind": kind, "reason": reason}
    )
    return value or 0.0


def passes(ctx: object, n: int) -> None:
    async def run() -> None:
        for _ in range(n):
            await reconcile(ctx)  # type: ignore[arg-type]
        await ctx.workers.background.drain()  # type: ignore[attr-defined]

    asyncio.run(run())


def test_a_poisoned_pod_in_another_namespace_stops_no_placement_and_is_told_once() -> None:
    """Before: `gpu-fraction: lol` on any bound pod aborted the snapshot of every pass
    ("cannot build the cluster snapshot, no placement this pass") and nobody was told."""
    api = cluster(pending("w", pods=2, gpus=8))
    odd = pod("odd", "n0", namespace="tenant-b", annotations={L.ANN_GPU_FRACTION: "lol"})
    odd["metadata"]["uid"] = "uid-odd"
    api.put(odd)
    ctx, _ = controller(api)
    passes(ctx, 1)
    assert check_of(api, "w")["state"] == "Ready"
    api.put(pending("w2", pods=1, gpus=8))  # a second pass, the same pod version
    watch(ctx, api)
    passes(ctx, 1)
    assert check_of(api, "w2")["state"] == "Ready"
    events = [e for e in api.list("Event")[0] if e["reason"] == "ObjectSkipped"]
    assert len(events) == 1, events
    (e,) = events
    assert e["type"] == "Warning"
    assert e["regarding"]["kind"] == "Pod" and e["regarding"]["name"] == "odd"
    assert e["metadata"]["namespace"] == "tenant-b"
    assert f"field metadata.annotations[{L.ANN_GPU_FRACTION}]" in e["note"]
    assert skipped_total(ctx, "Pod", "counted-whole") == 2


def _beside_a_ready_gang_whose_reservation_has(**fields: str) -> tuple[Any, Any]:
    """A pending 2-pod gang `w` beside a Ready gang `other` whose reservation on n0 carries
    `fields` (a malformed one), after one pass; `w` is placed all the same."""
    api = cluster(pending("w", pods=2, gpus=8))
    other = pending("other", pods=1, gpus=8)
    other["status"]["admissionChecks"][0]["state"] = "Ready"
    api.put(other)
    api.put(reservation("other-rr", "other", [{"index": 0, "node": "n0"}], **fields))
    ctx, _ = controller(api)
    passes(ctx, 1)
    assert check_of(api, "w")["state"] == "Ready"
    return api, ctx


def test_a_broken_reservation_is_told_on_its_workload_and_its_node_left_out() -> None:
    api, _ = _beside_a_ready_gang_whose_reservation_has(gpu_share="lots")
    (rr,) = [
        r for r in api.list(L.KIND_RESOURCE_RESERVATION)[0] if r["metadata"]["name"] != "other-rr"
    ]
    assert {s["node"] for ps in rr["spec"]["podSets"] for s in ps["slots"]} == {"n1", "n2"}
    (e,) = [e for e in api.list("Event")[0] if e["reason"] == "ObjectSkipped"]
    assert e["regarding"]["kind"] == "Workload" and e["regarding"]["name"] == "other"
    assert "ResourceReservation default/other-rr left out" in e["note"]
    assert "spec.podSets[0].gpuShare" in e["note"]


def unschedulable_since(when: str) -> dict[str, object]:
    return {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "lastTransitionTime": when}]}


def skipped_events(api: object) -> list[dict[str, object]]:
    return [e for e in api.list("Event")[0]  # type: ignore[attr-defined]
            if e["reason"] == "ObjectSkipped"]


def test_a_field_the_stores_views_cannot_read_is_told_once_per_version() -> None:
    """A Workload, a reservation and a pod read leniently by their views (`view.problem`):
    before, nobody was told. Each gets one Event per version, where its owner looks; the
    Workload beside them is placed; a fixed one is told no more."""
    api = cluster(pending("w", pods=2, gpus=8))
    api.put({**pending("lost"), "status": "lost"})
    other = pending("other", pods=1, gpus=8)
    other["status"]["admissionChecks"][0]["state"] = "Ready"
    api.put(other)
    # Bound: the snapshot does not read its expiry; only its view does
    api.put(reservation("other-rr", "other", [{"index": 0, "node": "n0"}], phase="Bound",
                        expires_at="soon"))
    waiting = pod("waiting", None, namespace="tenant-b")
    waiting["status"] = unschedulable_since("yesterday")
    api.put(waiting)
    ctx, _ = controller(api)
    passes(ctx, 2)
    assert check_of(api, "w")["state"] == "Ready"
    told = {(e["regarding"]["kind"], e["regarding"]["name"]): e  # type: ignore[index]
            for e in skipped_events(api)}
    assert len(skipped_events(api)) == 3 and set(told) == {
        ("Workload", "lost"), ("Workload", "other"), ("Pod", "waiting")}
    assert "field status: expected an object" in told[("Workload", "lost")]["note"]
    assert "ResourceReservation default/other-rr left out: field spec.expiresAt" in told[
        ("Workload", "other")]["note"]
    assert "field status.conditions" in told[("Pod", "waiting")]["note"]
    assert skipped_total(ctx, "Pod", "unreadable") == 1, "once per placing pass"
    # the pod fixed, the Workload broken anew: only the new version is told
    waiting["status"] = unschedulable_since("2026-01-01T00:00:00Z")
    api.put(waiting)
    api.put({**pending("lost"), "status": ["lost", "again"]})
    api.put(pending("w2", pods=1, gpus=8))
    watch(ctx, api)
    passes(ctx, 1)
    assert check_of(api, "w2")["state"] == "Ready"
    assert [(p.kind, p.name) for p in ctx.store.view_problems()] == [
        ("Workload", "lost"), (L.KIND_RESOURCE_RESERVATION, "other-rr")]
    assert len(skipped_events(api)) == 4
    assert [e["regarding"]["name"] for e in skipped_events(api)].count("lost") == 2


def test_a_field_the_snapshot_and_a_view_both_cannot_read_is_counted_and_told_once() -> None:
    """An unbound reservation's unreadable expiry: the snapshot counts it live and says so;
    its view's problem names the same field of the same version and is not told again."""
    api, ctx = _beside_a_ready_gang_whose_reservation_has(expires_at="soon")
    (e,) = skipped_events(api)
    assert "field spec.expiresAt" in e["note"] and "counted as live" in e["note"]  # type: ignore[operator]
    assert skipped_total(ctx, L.KIND_RESOURCE_RESERVATION, "counted-live") == 1
    assert skipped_total(ctx, L.KIND_RESOURCE_RESERVATION, "unreadable") == 0
