"""The ungater pins each gated pod of a reservation to one slot, by rank, once: a pass that
runs again before the watch shows its patches hands out nothing twice; pods of a reservation
the store does not hold yet stay gated; a pod that is not part of the reservation's Workload
never gets a slot and is told why once (a unit test over `FakeApi`; the e2e tests pin real
pods on the real control plane)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from nexus_admit.controller.context import Context
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.ungating.slot_assignment import TERMINATION_MARGIN
from nexus_admit.controller.ungating.ungater import (
    UngaterState,
    node_name_terms,
    pin_patch,
    sync_ungating,
)
from nexus_admit.kube import labels as L
from nexus_admit.kube.reservations import ReservedSlot
from nexus_admit.placement.policies import make_policy
from tests.controller.fake_api import FakeApi
from tests.kube.kube_factories import node, pod, pod_set, reservation, workload

INDEX = "batch.kubernetes.io/job-completion-index"
EIGHT = list(range(8))


def gated_pod(
    name: str, rank: int, rr: str = "rr-1", uid: str | None = None, owner_uid: str = "u"
) -> dict[str, Any]:
    p = pod(
        name,
        None,
        gpus=8,
        labels={L.LABEL_RESERVATION: rr, INDEX: str(rank)},
        spec_extra={"schedulingGates": [{"name": L.GATE_PLACEMENT}]},
        phase="Pending",
    )
    p["metadata"]["uid"] = uid or f"uid-{name}"
    # the Job both the pod and Workload "w" belong to (kube_factories' owner uid)
    p["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": owner_uid, "controller": True}
    ]
    return p


def setup(*pods: dict[str, Any], with_rr: bool = True) -> tuple[Context, FakeApi]:
    api = FakeApi()
    for n in ("n0", "n1"):
        api.put(node(n))
    if with_rr:
        api.put(
            reservation(
                "rr-1",
                "w",
                [
                    {"index": 0, "node": "n0", "gpus": EIGHT},
                    {"index": 1, "node": "n1", "gpus": EIGHT},
                ],
            )
        )
    api.put(workload("w", [pod_set("main", 2, gpus=8)]))
    for p in pods:
        api.put(p)
    ctx = Context(options=RunOptions(webhook=False), api=api, engine=make_policy("nexus"))  # type: ignore[arg-type]
    for kind in ("Node", "Pod", "Workload", L.KIND_RESOURCE_RESERVATION):
        ctx.store.replace(kind, *api.list(kind))
    ctx.leadership.synced = True
    return ctx, api


def pinned(api: FakeApi, name: str) -> tuple[str | None, list[Any]]:
    p = api.get("Pod", name, "default")
    assert p is not None
    return p["spec"].get("nodeSelector", {}).get(L.HOSTNAME_LABEL), p["spec"]["schedulingGates"]


def test_each_gated_pod_gets_the_slot_of_its_rank_and_loses_the_gate() -> None:
    ctx, api = setup(gated_pod("p-1", 1), gated_pod("p-0", 0))
    asyncio.run(sync_ungating(ctx))
    assert pinned(api, "p-0") == ("n0", [])
    assert pinned(api, "p-1") == ("n1", [])
    assert api.count("patch", "Pod") == 2


def test_a_jobs_pods_are_proven_members_by_their_own_owner_without_reading_it() -> None:
    """The Job owns both the pod and the Workload, so reading the Job (a GET per Job in a
    burst) proves nothing more; a pod whose owner does not own the Workload is read up."""
    ctx, api = setup(gated_pod("p-0", 0), gated_pod("p-1", 1, owner_uid="another-job"))
    reads: list[tuple[str, str]] = []
    get = api.get

    def counting_get(kind: str, name: str, namespace: str | None = None) -> Any:
        reads.append((kind, name))
        return get(kind, name, namespace)

    api.get = counting_get  # type: ignore[method-assign]
    asyncio.run(sync_ungating(ctx))
    assert pinned(api, "p-0") == ("n0", [])
    assert pinned(api, "p-1") == (None, [{"name": L.GATE_PLACEMENT}])
    assert [r for r in reads if r[0] == "Job"] == [("Job", "j")]  # p-1's owner only


def test_a_pass_before_the_watch_shows_the_patches_pins_nothing_again() -> None:
    ctx, api = setup(gated_pod("p-0", 0), gated_pod("p-1", 1))
    asyncio.run(sync_ungating(ctx))
    asyncio.run(sync_ungating(ctx))  # the store still shows both pods gated
    assert api.count("patch", "Pod") == 2
    ctx.store.replace("Pod", *api.list("Pod"))  # the watch catches up
    asyncio.run(sync_ungating(ctx))
    assert api.count("patch", "Pod") == 2
    assert ctx.store.gated_pods() == []


def test_a_replacement_pod_takes_the_slot_its_predecessor_left() -> None:
    ctx, api = setup(gated_pod("p-0", 0), gated_pod("p-1", 1))
    asyncio.run(sync_ungating(ctx))
    ctx.store.replace("Pod", *api.list("Pod"))
    gone = api.get("Pod", "p-1", "default")
    assert gone is not None
    api.objects.pop(("Pod", "default/p-1"))
    ctx.store.delete("Pod", gone)
    api.put(gated_pod("p-1b", 1))
    ctx.store.replace("Pod", *api.list("Pod"))
    asyncio.run(sync_ungating(ctx))
    assert pinned(api, "p-1b") == ("n1", [])


def test_a_replacement_waits_gated_while_its_predecessor_terminates_on_the_slots_node() -> None:
    """Before: the old pod, being deleted, left its slot at once; the replacement was pinned
    beside it, kube-scheduler found it unschedulable, and 20 s later the gang went through
    Retry (issue 56 item 5). Now it waits, told once by an Event, and is pinned once the
    old pod is gone or its grace period and the margin have passed."""
    ctx, api = setup(gated_pod("p-0", 0), gated_pod("p-1", 1))
    asyncio.run(sync_ungating(ctx))
    now = ctx.clocks.wall()
    old = api.get("Pod", "p-1", "default")
    assert old is not None
    old["spec"]["nodeName"] = "n1"
    grace_end = now + timedelta(seconds=30)
    old["metadata"]["deletionTimestamp"] = grace_end.strftime("%Y-%m-%dT%H:%M:%SZ")
    api.put(old)
    api.put(gated_pod("p-1b", 1))
    ctx.store.replace("Pod", *api.list("Pod"))
    ctx.clocks.wall = lambda: now

    async def two_passes() -> None:
        await sync_ungating(ctx)
        await sync_ungating(ctx)
        await ctx.workers.background.drain()

    asyncio.run(two_passes())
    assert pinned(api, "p-1b") == (None, [{"name": L.GATE_PLACEMENT}])
    (event,) = api.list("Event")[0]  # told once
    assert (event["reason"], event["type"], event["regarding"]["name"]) == (
        "PlacementWaiting", "Normal", "p-1b")
    assert event["note"].startswith("waits for pod p-1, which still holds slot main/1 on node n1")
    ctx.clocks.wall = lambda: grace_end + TERMINATION_MARGIN
    asyncio.run(sync_ungating(ctx))
    assert pinned(api, "p-1b") == ("n1", [])


def test_pods_of_a_reservation_the_store_does_not_hold_stay_gated() -> None:
    ctx, api = setup(gated_pod("p-0", 0), with_rr=False)
    asyncio.run(sync_ungating(ctx))
    assert api.count("patch", "Pod") == 0
    assert pinned(api, "p-0") == (None, [{"name": L.GATE_PLACEMENT}])


def test_a_failed_patch_leaves_the_slot_free_for_the_next_pass() -> None:
    ctx, api = setup(gated_pod("p-0", 0))
    real = api.patch_pod
    calls = []

    def failing(*args: Any) -> Any:
        calls.append(args)
        if len(calls) == 1:
            raise OSError("connection reset")
        return real(*args)

    api.patch_pod = failing  # type: ignore[method-assign]
    asyncio.run(sync_ungating(ctx))
    assert pinned(api, "p-0")[0] is None
    assert ctx.component(UngaterState).claims == {}
    asyncio.run(sync_ungating(ctx))
    assert pinned(api, "p-0") == ("n0", [])


def test_a_pod_of_another_job_with_the_label_stays_gated_and_is_told_why_once() -> None:
    intruder = gated_pod("intruder", 0, owner_uid="other-job")
    # it even claims the first slot in its annotations: a refused pod holds no slot
    intruder["metadata"]["annotations"] = {L.ANN_SLOT: "main/0"}
    ctx, api = setup(intruder, gated_pod("p-0", 0))

    async def two_passes() -> None:
        await sync_ungating(ctx)
        await sync_ungating(ctx)
        await ctx.workers.background.drain()

    asyncio.run(two_passes())
    assert pinned(api, "intruder") == (None, [{"name": L.GATE_PLACEMENT}])
    assert pinned(api, "p-0") == ("n0", [])
    events, _ = api.list("Event")
    assert len(events) == 1
    (event,) = events
    assert event["type"] == "Warning" and event["reason"] == "PlacementDenied"
    assert event["regarding"]["name"] == "intruder"
    assert "not part of Workload default/w" in event["note"]


def test_pods_of_a_workload_that_is_gone_stay_gated() -> None:
    ctx, api = setup(gated_pod("p-0", 0))
    gone = ctx.store.get("Workload", "default/w")
    assert gone is not None
    ctx.store.delete("Workload", gone)
    asyncio.run(sync_ungating(ctx))
    assert pinned(api, "p-0") == (None, [{"name": L.GATE_PLACEMENT}])


def test_the_loops_passes_do_not_wait_for_patches_and_never_send_one_twice() -> None:
    """The ungater's loop starts the patches of a pass and goes on: a pass that runs while
    they are in flight (the store still shows the pods gated) sends nothing again, and a
    pod created meanwhile gets its own patch at once."""
    import threading

    ctx, api = setup(gated_pod("p-0", 0))
    gate = threading.Event()
    real = api.patch_pod

    def slow(*args: Any) -> Any:
        gate.wait(10)
        return real(*args)

    api.patch_pod = slow  # type: ignore[method-assign]

    async def scenario() -> None:
        await sync_ungating(ctx, wait=False)  # p-0's patch in flight
        api.put(gated_pod("p-1", 1))
        ctx.store.replace("Pod", *api.list("Pod"))
        await sync_ungating(ctx, wait=False)  # p-1 only
        assert set(ctx.component(UngaterState).claims.values()) == {"main/0", "main/1"}
        gate.set()
        await ctx.component(UngaterState).writes.drain()

    asyncio.run(scenario())
    assert api.count("patch", "Pod") == 2
    assert pinned(api, "p-0") == ("n0", [])
    assert pinned(api, "p-1") == ("n1", [])


# ---- one strange pod or reservation never stops the others (issue 28, item 2) ----


def second_gang(api: FakeApi, ctx: Context, *pods: dict[str, Any]) -> None:
    """Workload "w2" (owner Job uid "u2") with reservation "rr-2": one slot on n1."""
    w2 = workload("w2", [pod_set("main", 1, gpus=8)])
    w2["metadata"]["ownerReferences"][0]["uid"] = "u2"
    api.put(w2)
    api.put(reservation("rr-2", "w2", [{"index": 0, "node": "n1", "gpus": EIGHT}]))
    for p in pods:
        api.put(p)
    for kind in ("Pod", "Workload", L.KIND_RESOURCE_RESERVATION):
        ctx.store.replace(kind, *api.list(kind))


def events(api: FakeApi) -> list[dict[str, Any]]:
    return api.list("Event")[0]


def skipped_count(ctx: Context, kind: str) -> float:
    value = ctx.metrics.registry.get_sample_value(
        "nexus_admit_objects_skipped_total", {"kind": kind, "reason": "unreadable"}
    )
    return value or 0.0


def test_a_superscript_completion_index_is_no_rank_and_both_gangs_are_ungated() -> None:
    """Before: `_rank` took "²" for a digit, `int("²")` raised, and every ungating pass
    failed for every gang. Now the pod is unranked and takes the first free slot."""
    odd = gated_pod("odd-0", 0)
    odd["metadata"]["labels"].pop(INDEX)
    odd["metadata"]["annotations"] = {INDEX: "²"}  # a NonIndexed Job's template
    ctx, api = setup(odd)
    second_gang(api, ctx, gated_pod("gold-0", 0, rr="rr-2", owner_uid="u2"))
    asyncio.run(sync_ungating(ctx))
    assert pinned(api, "odd-0") == ("n0", [])
    assert pinned(api, "gold-0") == ("n1", [])


def test_a_reservation_that_fails_is_told_to_its_workload_and_the_others_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nexus_admit.controller.ungating import ungater

    real = ungater.assign_slots

    def fails_for_rr1(slots: Any, views: Any) -> Any:
        views = list(views)
        if any(v.name == "p-0" for v in views):
            raise ValueError("a strange reservation")
        return real(slots, views)

    monkeypatch.setattr(ungater, "assign_slots", fails_for_rr1)
    ctx, api = setup(gated_pod("p-0", 0))
    second_gang(api, ctx, gated_pod("gold-0", 0, rr="rr-2", owner_uid="u2"))

    async def two_passes() -> None:
        await sync_ungating(ctx)
        await sync_ungating(ctx)  # the same version: counted again, told once
        await ctx.workers.background.drain()

    asyncio.run(two_passes())
    assert pinned(api, "gold-0") == ("n1", [])
    assert pinned(api, "p-0") == (None, [{"name": L.GATE_PLACEMENT}])
    assert ctx.component(UngaterState).claims == {"uid-gold-0": "main/0"}  # no claim left on p-0
    (event,) = events(api)
    assert event["type"] == "Warning" and event["reason"] == "ObjectSkipped"
    assert event["regarding"]["kind"] == "Workload" and event["regarding"]["name"] == "w"
    assert "ResourceReservation default/rr-1 left out" in event["note"]
    assert "a strange reservation" in event["note"]
    assert skipped_count(ctx, "ResourceReservation") == 2


def test_a_gated_pod_that_cannot_be_read_is_told_and_its_gang_mates_are_ungated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nexus_admit.controller.ungating import ungater

    real = ungater.ranked_pod

    def fails_for_odd(pod: Any, *args: Any, **kwargs: Any) -> Any:
        if pod.name == "odd":
            raise KeyError("odd field")
        return real(pod, *args, **kwargs)

    monkeypatch.setattr(ungater, "ranked_pod", fails_for_odd)
    ctx, api = setup(gated_pod("odd", 0), gated_pod("p-1", 1))

    async def one_pass() -> None:
        await sync_ungating(ctx)
        await ctx.workers.background.drain()

    asyncio.run(one_pass())
    assert pinned(api, "p-1") == ("n1", [])
    assert pinned(api, "odd") == (None, [{"name": L.GATE_PLACEMENT}])
    (event,) = events(api)
    assert event["regarding"]["kind"] == "Pod" and event["regarding"]["name"] == "odd"
    assert "cannot be ungated: KeyError" in event["note"]
    assert skipped_count(ctx, "Pod") == 1


def test_a_failed_pass_takes_back_its_claims_and_the_next_pass_pins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: claims written before a crash were never patched nor cleared, so the pods
    stayed gated for good. Now a failed pass leaves no claim behind."""
    ctx, api = setup(gated_pod("p-0", 0))
    second_gang(api, ctx, gated_pod("gold-0", 0, rr="rr-2", owner_uid="u2"))
    store_class = type(ctx.store)
    real_get = store_class.get

    def broken(self: Any, kind: str, key: str) -> Any:
        if key == "default/rr-2":
            raise RuntimeError("store broken")
        return real_get(self, kind, key)

    monkeypatch.setattr(store_class, "get", broken)
    with pytest.raises(RuntimeError):
        asyncio.run(sync_ungating(ctx))
    assert ctx.component(UngaterState).claims == {}  # rr-1's claim on p-0 taken back
    assert api.count("patch", "Pod") == 0
    monkeypatch.setattr(store_class, "get", real_get)
    asyncio.run(sync_ungating(ctx))
    assert pinned(api, "p-0") == ("n0", [])
    assert pinned(api, "gold-0") == ("n1", [])


# ---- reservations cannot be ridden, and outlive their TTL only once bound (item 5) ----


def test_a_pod_naming_the_workload_by_label_alone_gets_no_slot() -> None:
    """Before: the `pod-group-name` label (or Kueue's workload annotation) was taken as
    proof of membership. Now only the owner chain is."""
    rider = gated_pod("rider", 0, owner_uid="someone-else")
    rider["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] = "w"
    rider["metadata"]["annotations"] = {"kueue.x-k8s.io/workload": "w"}
    ctx, api = setup(rider, gated_pod("p-0", 0))

    async def one_pass() -> None:
        await sync_ungating(ctx)
        await ctx.workers.background.drain()

    asyncio.run(one_pass())
    assert pinned(api, "rider") == (None, [{"name": L.GATE_PLACEMENT}])
    assert pinned(api, "p-0") == ("n0", [])
    (event,) = events(api)
    assert event["reason"] == "PlacementDenied" and event["regarding"]["name"] == "rider"


def test_a_tenant_set_slot_annotation_on_a_gated_pod_holds_nothing() -> None:
    """Before: a pod pre-annotated with `slot: main/0` held that slot and kept it from the
    pod of rank 0. Now a gated pod's annotation is ignored: each takes its own rank."""
    squatter = gated_pod("p-1", 1)
    squatter["metadata"]["annotations"] = {L.ANN_SLOT: "main/0"}
    ctx, api = setup(squatter, gated_pod("p-0", 0))
    asyncio.run(sync_ungating(ctx))
    assert pinned(api, "p-0") == ("n0", [])
    assert pinned(api, "p-1") == ("n1", [])
    p1 = api.get("Pod", "p-1", "default")
    assert p1 is not None and p1["metadata"]["annotations"][L.ANN_SLOT] == "main/1"


def expired_setup(*pods: dict[str, Any]) -> tuple[Context, FakeApi]:
    ctx, api = setup(*pods, with_rr=False)
    api.put(
        reservation(
            "rr-1",
            "w",
            [{"index": 0, "node": "n0", "gpus": EIGHT}, {"index": 1, "node": "n1", "gpus": EIGHT}],
            expires_at="2000-01-01T00:00:00Z",
        )
    )
    ctx.store.replace(L.KIND_RESOURCE_RESERVATION, *api.list(L.KIND_RESOURCE_RESERVATION))
    return ctx, api


def test_past_its_ttl_a_bound_gangs_restarted_pod_gets_its_slot_back() -> None:
    """The TTL applies only before binding: the snapshot keeps counting a reservation one
    of whose pods is bound (kube/test_cluster.py), and the ungater pins its restarted pod
    to the slot that is still held, the same rule on both sides."""
    bound = gated_pod("p-0", 0)
    bound["spec"] = {**bound["spec"], "nodeName": "n0", "schedulingGates": []}
    bound["metadata"]["annotations"] = {L.ANN_SLOT: "main/0"}
    ctx, api = expired_setup(bound, gated_pod("p-1b", 1))
    asyncio.run(sync_ungating(ctx))
    assert pinned(api, "p-1b") == ("n1", [])


def test_past_its_ttl_before_any_pod_bound_a_reservation_pins_nothing() -> None:
    ctx, api = expired_setup(gated_pod("p-0", 0), gated_pod("p-1", 1))
    asyncio.run(sync_ungating(ctx))
    assert api.count("patch", "Pod") == 0


def test_the_pin_names_the_node_in_the_required_affinity_so_the_scheduler_filters_it_alone(
) -> None:
    ctx, api = setup(gated_pod("p-0", 0))
    asyncio.run(sync_ungating(ctx))
    p = api.get("Pod", "p-0", "default")
    assert p is not None
    terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n0"]}]}]}


def test_a_pods_own_affinity_terms_each_keep_their_requirements_and_take_the_node() -> None:
    """A gated pod's terms may only grow, in place: the apiserver refuses anything else."""
    name = {"key": "metadata.name", "operator": "In", "values": ["n7"]}
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    theirs = {"key": "metadata.name", "operator": "NotIn", "values": ["n3"]}

    def with_terms(terms: Any) -> dict[str, Any]:
        return {"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}}}}

    assert node_name_terms({"spec": {}}, "n7") == [{"matchFields": [name]}]
    assert node_name_terms(with_terms([]), "n7") == [{"matchFields": [name]}]
    assert node_name_terms(with_terms([{"matchExpressions": [zone]}, {"matchFields": [theirs]}]),
                           "n7") == [{"matchExpressions": [zone], "matchFields": [name]},
                                     {"matchFields": [theirs, name]}]
    # an empty term cannot grow (it matches no node anyway); a malformed one is not ours to fix
    assert node_name_terms(with_terms([{"matchExpressions": [zone]}, {}]), "n7") is None
    assert node_name_terms(with_terms(["x"]), "n7") is None
    assert node_name_terms(with_terms({"x": 1}), "n7") is None
    assert node_name_terms({"spec": {"affinity": "x"}}, "n7") == [{"matchFields": [name]}]
    patch = pin_patch(ReservedSlot("ps", 0, "n7", (0,), None), "host-7", None)
    assert "affinity" not in patch["spec"]
    assert patch["spec"]["nodeSelector"] == {L.HOSTNAME_LABEL: "host-7"}
