"""The controller's side of preemption (controller/preemption/ and controller/loop/) over
`FakeApi`: what is written, in which order, and what a later pass or a restart does with
it. e2e/tests/test_preemption.py proves the same through Kueue on the real control plane.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.loop import place
from nexus_admit.controller.preemption.victims import PreemptedVictim, preempted_victims
from nexus_admit.kube import labels as L
from nexus_admit.kube.views import ReservationView
from tests.controller.fake_api import FakeApi
from tests.controller.test_placing import check_of, controller, run, watch
from tests.kube.kube_factories import (
    admission_check,
    cluster_queue,
    node,
    pod,
    pod_set,
    reservation,
    workload,
)

RR = L.KIND_RESOURCE_RESERVATION
NOW = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
T = "2026-11-25T09:00:00Z"  # an hour before NOW: victims have run long enough


def preemption_config(**extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": L.GROUP_VERSION,
        "kind": L.KIND_PLACEMENT_CONFIG,
        "metadata": {"name": "pc"},
        "spec": {"preemption": {"enabled": True, "minRunSeconds": 0, **extra}},
    }


def admitted_bronze(name: str, node_name: str) -> list[dict[str, Any]]:
    """A Bronze 1 x 8-GPU Workload admitted through our check, its reservation on
    `node_name` and its bound pod."""
    wl = workload(name, [pod_set(count=1, gpus=8)], cluster_queue="bronze", check_state="Ready",
                  conditions={"QuotaReserved": "True", "Admitted": "True"}, created=T)
    for c in wl["status"]["conditions"]:
        c["lastTransitionTime"] = T
    wl["status"]["admissionChecks"][0]["podSetUpdates"] = [
        {"name": "main", "labels": {L.LABEL_RESERVATION: f"rr-{name}"}}]
    rr = reservation(f"rr-{name}", name, [{"index": 0, "node": node_name,
                                           "gpus": list(range(8))}])
    rr["spec"]["workloadRef"]["uid"] = f"uid-{name}"
    p = pod(f"{name}-0", node_name, gpus=8, labels={L.LABEL_RESERVATION: f"rr-{name}"},
            annotations={L.ANN_SLOT: "main/0"})
    return [wl, rr, p]


def cluster(**extra: Any) -> FakeApi:
    api = FakeApi()
    for n in ("h0", "h1"):
        api.put(node(n))
    api.put(node("t0", product="Tesla-T4", gpu_memory=15360))
    api.put(cluster_queue("gold", "gold"))
    api.put(cluster_queue("bronze", "bronze"))
    ac = admission_check("nexus")
    ac["spec"]["parameters"] = {"apiGroup": L.API_GROUP, "kind": L.KIND_PLACEMENT_CONFIG,
                                "name": "pc"}
    api.put(ac)
    api.put(preemption_config(**extra))
    for obj in admitted_bronze("b0", "h0") + admitted_bronze("b1", "h1"):
        api.put(obj)
    # Bronze on its own (economy) hardware: never a victim by default (not borrowed)
    for obj in admitted_bronze("own", "t0"):
        api.put(obj)
    gold = workload("gold", [pod_set(count=1, gpus=8)], cluster_queue="gold", created=T)
    gold["status"]["conditions"][0]["lastTransitionTime"] = T
    api.put(gold)
    return api


def start(api: FakeApi) -> Context:
    ctx, _ = controller(api)
    ctx.clocks.wall = lambda: NOW  # type: ignore[method-assign]
    return ctx


def test_the_preemptor_reserves_first_then_its_victim_is_sent_through_retry() -> None:
    api = cluster()
    ctx = start(api)
    run(ctx)
    (rr,) = [r for r in api.of_kind(RR) if r["spec"]["workloadRef"]["name"] == "gold"]
    victims = preempted_victims(ReservationView.of(rr))
    assert victims is not None and len(victims) == 1
    assert rr["spec"]["decision"]["mode"] == "preempting"
    victim = victims[0].workload.split("/")[1]
    assert victim in ("b0", "b1")
    node_of = {"b0": "h0", "b1": "h1"}
    assert {s["node"] for s in rr["spec"]["podSets"][0]["slots"]} == {node_of[victim]}
    # the reservation was written before the eviction, so the capacity is never up for grabs
    verbs = [(verb, kind) for verb, kind, _ in api.writes]
    assert verbs.index(("create", RR)) < verbs.index(("apply", "Workload"))
    assert check_of(api, victim)["state"] == "Retry"
    assert "preempted by default/gold" in check_of(api, victim)["message"]
    assert check_of(api, "own")["state"] == "Ready"  # on its own hardware
    other = "b1" if victim == "b0" else "b0"
    assert check_of(api, other)["state"] == "Ready"
    gold = check_of(api, "gold")
    assert gold["state"] == "Pending" and gold["message"].startswith("preempting")
    reasons = [e["reason"] for e in api.of_kind("Event")]
    assert "PlacementPreempted" in reasons and "Preempting" in reasons


def test_ready_only_once_the_victim_left_and_a_restart_carries_on() -> None:
    api = cluster()
    ctx = start(api)
    run(ctx)
    (rr,) = [r for r in api.of_kind(RR) if r["spec"]["workloadRef"]["name"] == "gold"]
    victim = preempted_victims(ReservationView.of(rr))[0]  # type: ignore[index]
    vname = victim.workload.split("/")[1]
    # a restarted controller while the victim's pod is still there: still waiting
    restarted = start(api)
    run(restarted)
    assert check_of(api, "gold")["state"] == "Pending"
    assert len([r for r in api.of_kind(RR) if r["spec"]["workloadRef"]["name"] == "gold"]) == 1
    # Kueue evicted it: pod gone; the next pass releases its reservation, then Ready
    api.delete("Pod", f"{vname}-0", "default")
    wl = api.get("Workload", vname, "default")
    assert wl is not None
    wl["status"]["conditions"].append({"type": "Evicted", "status": "True", "reason": "x"})
    api.put(wl)
    watch(restarted, api)
    run(restarted)
    watch(restarted, api)
    run(restarted)
    gold = check_of(api, "gold")
    assert gold["state"] == "Ready", gold["message"]
    assert "evict 1 in" in gold["message"]
    assert api.get(RR, victim.reservation.split("/")[1], "default") is None


def test_a_victim_that_never_leaves_makes_the_preemptor_give_up_after_the_grace() -> None:
    api = cluster(gracePeriodSeconds=30)
    ctx = start(api)
    run(ctx)
    (rr,) = [r for r in api.of_kind(RR) if r["spec"]["workloadRef"]["name"] == "gold"]
    rr["metadata"]["creationTimestamp"] = (NOW - timedelta(seconds=31)).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    api.put(rr)
    watch(ctx, api)
    run(ctx)
    gold = check_of(api, "gold")
    assert gold["state"] == "Retry" and "preemption given up" in gold["message"]
    assert not [r for r in api.of_kind(RR) if r["spec"]["workloadRef"]["name"] == "gold"]


def test_nothing_is_evicted_while_preemption_is_off_or_only_silver_may_go() -> None:
    for extra in ({"enabled": False}, {"mayEvict": {"gold": ["silver"]}}):
        api = cluster(**extra)
        ctx = start(api)
        run(ctx)
        assert check_of(api, "gold")["state"] == "Retry"
        assert check_of(api, "b0")["state"] == check_of(api, "b1")["state"] == "Ready"
        assert not [r for r in api.of_kind(RR) if r["spec"]["workloadRef"]["name"] == "gold"]


def test_a_malformed_preempts_annotation_names_no_victims() -> None:
    def victims(annotations: dict[str, str] | None) -> list[PreemptedVictim] | None:
        meta = {} if annotations is None else {"annotations": annotations}
        return preempted_victims(ReservationView.of({"metadata": meta}))

    assert victims(None) is None
    assert victims({L.ANN_PREEMPTS: "{"}) == []
    good = json.dumps([{"workload": "ns/a", "reservation": "ns/rr-a"}, {"bogus": 1}])
    (v,) = victims({L.ANN_PREEMPTS: good}) or []
    assert (v.workload, v.reservation) == ("ns/a", "ns/rr-a")


def test_a_gang_that_waited_past_drain_after_holds_the_nodes_as_they_free_up() -> None:
    api = cluster(mayEvict={"gold": []}, drainAfterSeconds=600)
    gold = api.get("Workload", "gold", "default")
    assert gold is not None
    gold["spec"]["podSets"] = [pod_set(count=2, gpus=8)]
    gold["status"]["admission"]["podSetAssignments"][0]["count"] = 2
    api.put(gold)
    ctx = start(api)
    run(ctx)
    (rr,) = [r for r in api.of_kind(RR) if r["spec"]["workloadRef"]["name"] == "gold"]
    assert rr["metadata"]["annotations"][L.ANN_DRAIN] == "true"
    assert rr["spec"]["decision"]["mode"] == "draining"
    assert {s["node"] for s in rr["spec"]["podSets"][0]["slots"]} == {"h0", "h1"}
    # nothing evicted: the Workloads waited for keep running
    assert check_of(api, "b0")["state"] == check_of(api, "b1")["state"] == "Ready"
    assert check_of(api, "gold")["state"] == "Pending"
    assert "draining" in check_of(api, "gold")["message"]
    # they finish: pods gone, Workloads finished; then Ready on those nodes
    for name in ("b0", "b1"):
        api.delete("Pod", f"{name}-0", "default")
        wl = api.get("Workload", name, "default")
        assert wl is not None
        wl["status"]["conditions"].append({"type": "Finished", "status": "True"})
        api.put(wl)
    watch(ctx, api)
    run(ctx)
    watch(ctx, api)
    run(ctx)
    assert check_of(api, "gold")["state"] == "Ready"


def draining_silver(api: FakeApi) -> Context:
    """A Silver 2 x 8 gang drains h0 and h1 (b0 and b1 run there); then b0 finishes, and
    h0 is free but held by the drain."""
    api.put(cluster_queue("silver", "silver"))
    silver = workload("silver", [pod_set(count=2, gpus=8)], cluster_queue="silver", created=T)
    silver["status"]["conditions"][0]["lastTransitionTime"] = T
    api.put(silver)
    api.delete("Workload", "gold", "default")
    ctx = start(api)
    run(ctx)
    (rr,) = [r for r in api.of_kind(RR) if r["spec"]["workloadRef"]["name"] == "silver"]
    assert rr["metadata"]["annotations"][L.ANN_DRAIN] == "true"
    api.delete("Pod", "b0-0", "default")
    b0 = api.get("Workload", "b0", "default")
    assert b0 is not None
    b0["status"]["conditions"].append({"type": "Finished", "status": "True"})
    api.put(b0)
    watch(ctx, api)
    run(ctx)
    assert check_of(api, "silver")["state"] == "Pending"  # b1 still runs on h1
    return ctx


def late(api: FakeApi, queue: str) -> None:
    """A later 1 x 8 Workload: the only free GPUs are the drained h0's."""
    api.put(workload("late", [pod_set(count=1, gpus=8)], cluster_queue=queue,
                     created="2026-11-25T09:30:00Z"))


def draining(api: FakeApi) -> list[dict[str, Any]]:
    return [r for r in api.of_kind(RR) if r["spec"]["workloadRef"]["name"] == "silver"]


def test_a_drain_yields_to_a_higher_tier_that_has_no_place_off_its_nodes() -> None:
    api = cluster(mayEvict={"gold": [], "silver": []}, drainAfterSeconds=600)
    ctx = draining_silver(api)
    late(api, "gold")
    watch(ctx, api)
    run(ctx)
    assert check_of(api, "late")["state"] == "Ready"
    (rr,) = [r for r in api.of_kind(RR) if r["spec"]["workloadRef"]["name"] == "late"]
    assert [s["node"] for s in rr["spec"]["podSets"][0]["slots"]] == ["h0"]
    assert "the drain was withdrawn" in check_of(api, "late")["message"]
    # the drain's reservation is gone, and its Workload is told why
    assert not draining(api)
    notes = [e["note"] for e in api.of_kind("Event") if e["regarding"]["name"] == "silver"]
    assert any("drain withdrawn: Workload default/late (tier gold)" in n for n in notes)
    # the next pass drains again, off late's slot: nothing is over-booked
    watch(ctx, api)
    run(ctx)
    (rr,) = draining(api)
    assert rr["metadata"]["annotations"][L.ANN_DRAIN] == "true"
    assert "h0" not in {s["node"] for s in rr["spec"]["podSets"][0]["slots"]}
    waited = {v["workload"] for v in json.loads(rr["metadata"]["annotations"][L.ANN_PREEMPTS])}
    assert "default/b1" in waited
    assert check_of(api, "silver")["state"] == "Pending"


def test_a_drain_holds_against_its_own_tier_and_below() -> None:
    for queue in ("silver", "bronze"):
        api = cluster(mayEvict={"gold": [], "silver": []}, drainAfterSeconds=600)
        ctx = draining_silver(api)
        (before,) = draining(api)
        late(api, queue)
        watch(ctx, api)
        run(ctx)
        assert check_of(api, "late")["state"] == "Retry", queue
        assert draining(api) == [before], queue
        assert "h0" in {s["node"] for s in before["spec"]["podSets"][0]["slots"]}


def test_a_workload_with_a_place_off_the_drain_leaves_the_drain_alone() -> None:
    api = cluster(mayEvict={"gold": [], "silver": []}, drainAfterSeconds=600)
    ctx = draining_silver(api)
    (before,) = draining(api)
    api.put(node("h2", gpus=4))  # room for a 4-GPU job, not for a Silver pod
    api.put(workload("late", [pod_set(count=1, gpus=4)], cluster_queue="gold",
                     created="2026-11-25T09:30:00Z"))
    watch(ctx, api)
    run(ctx)
    (rr,) = [r for r in api.of_kind(RR) if r["spec"]["workloadRef"]["name"] == "late"]
    assert [s["node"] for s in rr["spec"]["podSets"][0]["slots"]] == ["h2"]
    assert draining(api) == [before]


def test_a_draining_gang_that_fits_elsewhere_runs_there_at_once() -> None:
    """A drain waits only while its gang fits nowhere else: once it does (here two new
    nodes), its reservation is released and one for the new place written, Ready. The
    solve without the drain runs at most once per DRAIN_RECHECK_SECONDS."""
    api = cluster(mayEvict={"gold": [], "silver": []}, drainAfterSeconds=600)
    ctx = draining_silver(api)  # its last pass solved the gang without its drain
    tick = [ctx.clocks.monotonic()]
    ctx.clocks.monotonic = lambda: tick[0]
    (before,) = draining(api)
    for n in ("h2", "h3"):
        api.put(node(n))
    watch(ctx, api)
    run(ctx)
    assert check_of(api, "silver")["state"] == "Pending"  # checked moments ago
    assert draining(api) == [before]
    tick[0] += place.DRAIN_RECHECK_SECONDS
    watch(ctx, api)
    run(ctx)
    assert check_of(api, "silver")["state"] == "Ready"
    (rr,) = [r for r in api.of_kind(RR) if r["spec"]["workloadRef"]["name"] == "silver"]
    assert rr["metadata"]["name"] == before["metadata"]["name"]  # the attempt's name
    assert L.ANN_DRAIN not in (rr["metadata"].get("annotations") or {})
    assert rr["spec"]["decision"]["mode"] != "draining"
    nodes = {s["node"] for s in rr["spec"]["podSets"][0]["slots"]}
    assert "h1" not in nodes  # b1 still runs there
    assert "placed before its drain ended" in check_of(api, "silver")["message"]
    notes = [e["note"] for e in api.of_kind("Event") if e["regarding"]["name"] == "silver"]
    assert any("drain ended: the gang fits now without it" in n for n in notes)
