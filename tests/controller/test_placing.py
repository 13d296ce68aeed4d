"""The loop's decisions under repeated, stale and lost events, and across restarts: one
reservation per quota reservation, whatever the order of events (a unit test of the loop's
logic over `FakeApi`; e2e/tests/test_faults.py proves the same on the real control plane).
"""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nexus_admit.controller.api import ApiException
from nexus_admit.controller.context import Context
from nexus_admit.controller.loop import cycle
from nexus_admit.controller.loop.cycle import reconcile
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.runtime.informer import apply_events
from nexus_admit.controller.store import WATCHED_KINDS
from nexus_admit.controller.writes import Answered
from nexus_admit.kube import labels as L
from nexus_admit.placement.policies import make_policy
from tests.controller.fake_api import FakeApi
from tests.kube.kube_factories import (
    admission_check,
    cluster_queue,
    flavor,
    node,
    pod,
    pod_set,
    tas_pod,
    tas_workload,
    workload,
)

QR = "2026-11-25T10:00:00Z"
RR = L.KIND_RESOURCE_RESERVATION


class CountingEngine:
    def __init__(self) -> None:
        self.inner = make_policy("nexus")
        self.name = self.inner.name
        self.calls = 0

    def place(self, *args: Any) -> Any:
        self.calls += 1
        return self.inner.place(*args)


def pending(name: str, pods: int = 2, gpus: int = 4, created: str = QR) -> dict[str, Any]:
    w = workload(name, [pod_set(count=pods, gpus=gpus)], created=created)
    w["status"]["conditions"][0]["lastTransitionTime"] = QR
    return w


def cluster(*workloads: dict[str, Any], nodes: tuple[str, ...] = ("n0", "n1", "n2")) -> FakeApi:
    api = FakeApi()
    for n in nodes:
        api.put(node(n))
    api.put(cluster_queue("cq", "gold"))
    api.put(admission_check("nexus"))
    for w in workloads:
        api.put(w)
    return api


def controller(api: FakeApi) -> tuple[Context, CountingEngine]:
    """A freshly started controller: the store filled by a full list."""
    engine = CountingEngine()
    ctx = Context(options=RunOptions(webhook=False), api=api, engine=engine)  # type: ignore[arg-type]
    watch(ctx, api)
    ctx.leadership.synced = True
    return ctx, engine


def watch(ctx: Context, api: FakeApi, kinds: tuple[str, ...] = WATCHED_KINDS) -> None:
    """The watch catches up on `kinds`."""
    for kind in kinds:
        ctx.store.replace(kind, *api.list(kind))


def run(ctx: Context) -> None:
    asyncio.run(reconcile(ctx))


def check_of(api: FakeApi, name: str) -> dict[str, Any]:
    wl = api.get("Workload", name, "default")
    assert wl is not None
    return next(c for c in wl["status"]["admissionChecks"] if c["name"] == "nexus")


def test_a_repeated_event_and_passes_before_the_watch_catches_up_reserve_once() -> None:
    api = cluster(pending("w"))
    ctx, engine = controller(api)
    run(ctx)
    assert api.count("create", RR) == 1 and check_of(api, "w")["state"] == "Ready"
    # the same (old, Pending) Workload event delivered again, and more passes, before the
    # watch shows our reservation or our Ready
    ctx.store.upsert(
        "Workload", pending("w") | {"metadata": api.get("Workload", "w", "default")["metadata"]}
    )  # type: ignore[index]
    run(ctx)
    run(ctx)
    watch(ctx, api)
    run(ctx)
    assert api.count("create", RR) == 1
    assert api.count("apply", "Workload") == 1
    assert engine.calls == 1


def test_passes_before_the_watch_shows_the_answer_build_no_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between our answer and the watch showing it, each event of the Workload runs a pass;
    with nothing left to decide, none of them rebuilds the snapshot of the fleet. Once a new
    Workload needs a decision, the next pass builds one again."""
    from nexus_admit.kube.dump import ClusterDump

    builds: list[int] = []
    real = ClusterDump.snapshot

    def counting(self: ClusterDump, *args: Any, **kwargs: Any) -> Any:
        builds.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ClusterDump, "snapshot", counting)
    # the pass's snapshot is kept from the store's changes: its builds count too
    from nexus_admit.kube.cluster.live import LiveSnapshot

    real_live = LiveSnapshot.build

    def counting_live(self: LiveSnapshot, *args: Any, **kwargs: Any) -> Any:
        builds.append(1)
        return real_live(self, *args, **kwargs)

    monkeypatch.setattr(LiveSnapshot, "build", counting_live)
    api = cluster(pending("w"))
    ctx, _ = controller(api)
    run(ctx)
    assert check_of(api, "w")["state"] == "Ready"
    before = len(builds)
    watch(ctx, api, (RR,))  # the reservation is seen, the Ready not yet
    run(ctx)
    run(ctx)
    assert len(builds) == before
    api.put(pending("v", created="2026-11-25T10:00:01Z"))
    watch(ctx, api, ("Workload",))
    run(ctx)
    assert len(builds) == before + 1 and check_of(api, "v")["state"] == "Ready"


def test_a_stale_pending_event_after_ready_changes_nothing_after_a_restart() -> None:
    api = cluster(pending("w"))
    old = api.get("Workload", "w", "default")
    first, _ = controller(api)
    run(first)
    restarted, engine = controller(api)
    assert restarted.store.upsert("Workload", old) is False  # older resourceVersion
    run(restarted)
    assert api.count("create", RR) == 1 and engine.calls == 0
    assert api.count("apply", "Workload") == 1


def test_killed_between_reservation_and_ready_the_restart_answers_from_the_reservation() -> None:
    api = cluster(pending("w"))
    api.fail[("apply", "Workload")] = 1  # the Ready write is lost (the process died there)
    first, _ = controller(api)
    run(first)
    (rr,) = api.of_kind(RR)
    restarted, engine = controller(api)
    run(restarted)
    entry = check_of(api, "w")
    assert entry["state"] == "Ready"
    assert entry["podSetUpdates"][0]["labels"][L.LABEL_RESERVATION] == rr["metadata"]["name"]
    assert engine.calls == 0, "a reservation of this attempt exists: never solve again"
    assert api.count("create", RR) == 1


def test_a_failed_check_write_is_written_again_in_the_same_run() -> None:
    api = cluster(pending("w"))
    api.fail[("apply", "Workload")] = 1
    ctx, engine = controller(api)
    run(ctx)
    assert check_of(api, "w")["state"] == "Pending"
    watch(ctx, api, (RR,))  # the reservation arrives; the Workload is still Pending
    run(ctx)
    assert check_of(api, "w")["state"] == "Ready"
    assert api.count("create", RR) == 1 and engine.calls == 1


def test_a_create_whose_answer_was_lost_keeps_its_gpus_and_is_answered_from_it() -> None:
    """The create was made but its answer lost (a 504): the rest of the pass must not hand
    its GPUs to another gang, and the next pass, its store still without the reservation,
    finds AlreadyExists and answers from what was written."""
    api = cluster(
        pending("w", pods=1, gpus=8), pending("v", pods=3, gpus=8, created="2026-11-25T10:00:01Z")
    )
    real_create = api.create

    def create_then_lose_the_answer(kind: str, body: Any) -> bool:
        made = real_create(kind, body)
        if kind == RR and body["metadata"]["name"].startswith("w-") and made:
            raise ApiException(status=504, reason="timeout")
        return made

    api.create = create_then_lose_the_answer  # type: ignore[method-assign]
    ctx, _ = controller(api)
    run(ctx)  # w: made, answer lost; v needs all three nodes: one is w's
    assert check_of(api, "v")["state"] == "Retry"
    assert len(api.of_kind(RR)) == 1
    run(ctx)  # w again, its reservation not watched yet: AlreadyExists → that one
    (rr,) = api.of_kind(RR)
    entry = check_of(api, "w")
    assert entry["state"] == "Ready"
    assert entry["podSetUpdates"][0]["labels"][L.LABEL_RESERVATION] == rr["metadata"]["name"]
    held = ctx.ledger.assumed[f"default/{rr['metadata']['name']}"]
    assert [s.node for s in held.slots] == [rr["spec"]["podSets"][0]["slots"][0]["node"]]


def test_a_refused_reservation_create_is_answered_retry_with_the_apiservers_reason() -> None:
    """Before: a 4xx on the create forgot the assumption and answered nothing, so every
    pass solved again, silently (a missing permission, a ResourceQuota). Now the Workload
    goes through Retry with the apiserver's message, and its GPUs are free for the next."""
    api = cluster(pending("w", pods=1, gpus=8),
                  pending("v", pods=3, gpus=8, created="2026-11-25T10:00:01Z"))
    real_create = api.create

    def refuse_w(kind: str, body: Any) -> bool:
        if kind == RR and body["metadata"]["name"].startswith("w-"):
            raise ApiException(status=403, reason="Forbidden", http_resp=None) from None
        return real_create(kind, body)

    api.create = refuse_w  # type: ignore[method-assign]
    ctx, _ = controller(api)
    run(ctx)
    entry = check_of(api, "w")
    assert entry["state"] == "Retry"
    assert "refused its ResourceReservation (403 Forbidden" in entry["message"]
    assert not any(k.startswith("default/w-") for k in ctx.ledger.assumed)
    # w's GPUs were given back: v (decided while w's create was in flight) fits once
    # Kueue asks again
    again = pending("v", pods=3, gpus=8, created="2026-11-25T10:00:01Z")
    again["status"]["conditions"][0]["lastTransitionTime"] = "2026-11-25T10:05:00Z"
    api.put(again)
    watch(ctx, api)
    run(ctx)
    assert check_of(api, "v")["state"] == "Ready"


def test_a_reservation_too_large_for_an_object_is_rejected_with_the_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from nexus_admit.controller import writes

    monkeypatch.setattr(writes, "MAX_RESERVATION_BYTES", 200)
    api = cluster(pending("w", pods=1, gpus=8))
    ctx, _ = controller(api)
    run(ctx)
    assert api.count("create", RR) == 0
    entry = check_of(api, "w")
    assert entry["state"] == "Rejected"
    assert "over the 200 bytes an object may hold" in entry["message"]


def test_a_gang_over_the_reservation_slot_limit_is_rejected_with_the_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from nexus_admit.controller import writes

    monkeypatch.setattr(writes, "MAX_RESERVATION_SLOTS", 1)
    api = cluster(pending("w", pods=2, gpus=4))
    ctx, _ = controller(api)
    run(ctx)
    assert api.count("create", RR) == 0
    entry = check_of(api, "w")
    assert entry["state"] == "Rejected" and "over the 1 a ResourceReservation" in entry["message"]


def test_a_pending_workloads_own_reservation_holds_against_higher_priority_work() -> None:
    """Restarted after w's reservation was written but before its Ready: u, ahead of w in
    Kueue's order, must not be placed on w's GPUs."""
    api = cluster(pending("w", pods=1, gpus=8))
    api.fail[("apply", "Workload")] = 1
    first, _ = controller(api)
    run(first)
    (rr,) = api.of_kind(RR)
    u = pending("u", pods=3, gpus=8)
    u["spec"]["priority"] = 100
    api.put(u)
    restarted, _ = controller(api)
    run(restarted)
    assert check_of(api, "u")["state"] == "Retry", "u needs all three nodes; one is w's"
    assert check_of(api, "w")["state"] == "Ready"
    assert [r["metadata"]["name"] for r in api.of_kind(RR)] == [rr["metadata"]["name"]]


def test_a_reservation_deleted_by_hand_sends_its_ready_workload_back_through_retry() -> None:
    api = cluster(pending("w"))
    ctx, _ = controller(api)
    t0 = datetime(2026, 11, 25, 10, 0, 0, tzinfo=UTC)
    ctx.clocks.wall = lambda: t0
    run(ctx)
    (rr,) = api.of_kind(RR)
    watch(ctx, api)
    run(ctx)  # every watch event runs a pass
    api.delete(RR, rr["metadata"]["name"], "default")
    watch(ctx, api)
    ctx.clocks.wall = lambda: t0 + timedelta(seconds=5)  # the watch of reservations may lag
    run(ctx)
    assert check_of(api, "w")["state"] == "Ready"
    ctx.clocks.wall = lambda: t0 + timedelta(seconds=30)
    run(ctx)
    entry = check_of(api, "w")
    assert entry["state"] == "Retry"
    assert f"reservation {rr['metadata']['name']} was deleted" in entry["message"]
    (event,) = [e for e in api.of_kind("Event") if e["reason"] == "PlacementRetry"]
    assert event["regarding"]["name"] == "w"
    assert api.count("create", RR) == 1


def test_a_cordoned_node_under_an_unanswered_reservation_moves_its_slot_before_the_answer(
) -> None:
    """Killed after the reservation, before its Ready; a node of it is cordoned meanwhile:
    the restart moves that slot to a node with room (the same reservation, patched, with a
    SlotMoved Event) and answers Ready from it, never from the cordoned node."""
    api = cluster(pending("w", pods=1, gpus=8))
    api.fail[("apply", "Workload")] = 1
    first, _ = controller(api)
    run(first)
    (rr,) = api.of_kind(RR)
    node_name = rr["spec"]["podSets"][0]["slots"][0]["node"]
    cordoned = api.get("Node", node_name)
    assert cordoned is not None
    cordoned["spec"]["unschedulable"] = True
    api.put(cordoned)
    restarted, _ = controller(api)
    run(restarted)
    entry = check_of(api, "w")
    assert entry["state"] == "Ready", entry
    (moved,) = api.of_kind(RR)
    assert moved["metadata"]["name"] == rr["metadata"]["name"] and api.count("create", RR) == 1
    (slot,) = moved["spec"]["podSets"][0]["slots"]
    assert slot["node"] != node_name and len(slot["gpus"]) == 8
    (event,) = [e for e in api.of_kind("Event") if e["reason"] == "SlotMoved"]
    assert f"slot main/0 moved from node {node_name}, which was cordoned" in event["note"]


def test_a_tier_claimed_by_the_tenant_is_ignored_with_an_event() -> None:
    w = pending("w")
    w["metadata"]["annotations"] = {L.LABEL_TIER: "platinum"}
    w["spec"]["podSets"][0]["template"]["metadata"]["labels"] = {L.LABEL_TIER: "gold"}
    api = cluster(w)
    api.put(cluster_queue("cq", "bronze"))  # the admin's word
    ctx, _ = controller(api)
    run(ctx)
    assert check_of(api, "w")["state"] == "Ready"
    (event,) = [e for e in api.of_kind("Event") if e["reason"] == "TierClaimIgnored"]
    assert "metadata.annotations[scheduling.kubenexus.io/tier]=platinum" in event["note"]
    assert "spec.podSets[0].template.metadata.labels" in event["note"]
    assert "placed as tier bronze" in event["note"]


def test_a_create_lost_to_a_client_error_does_not_stall_the_workload() -> None:
    """In an apiserver outage urllib3 raises its own MaxRetryError (neither ApiException nor
    OSError); it escaped the loop and left an assumption that made every later pass skip
    the Workload for good."""
    from urllib3.exceptions import MaxRetryError

    api = cluster(pending("w"))
    real_create = api.create
    outage = {"on": True}

    def create(kind: str, body: Any) -> bool:
        if kind == RR and outage["on"]:
            raise MaxRetryError(None, "/resourcereservations", "connection refused")  # type: ignore[arg-type]
        return real_create(kind, body)

    api.create = create  # type: ignore[method-assign]
    ctx, _ = controller(api)
    run(ctx)
    assert api.of_kind(RR) == [] and check_of(api, "w")["state"] == "Pending"
    outage["on"] = False
    run(ctx)
    assert check_of(api, "w")["state"] == "Ready"
    assert len(api.of_kind(RR)) == 1


def deliver(ctx: Context, kind: str, obj: dict[str, Any], event_type: str = "MODIFIED") -> None:
    """One watch event as the informer applies it (controller/runtime/informer.py)."""
    apply_events(ctx, kind, [(event_type, copy.deepcopy(obj))])


def test_the_same_workload_event_delivered_twice_through_the_watch_reserves_once() -> None:
    api = cluster()
    ctx, engine = controller(api)
    w = api.put(pending("w"))
    deliver(ctx, "Workload", w, "ADDED")
    run(ctx)
    deliver(ctx, "Workload", w, "ADDED")  # the same event again, before our Ready is seen
    run(ctx)
    assert api.count("create", RR) == 1 and engine.calls == 1
    assert api.count("apply", "Workload") == 1


def test_an_old_pending_event_after_the_ready_one_in_the_same_run_reserves_nothing() -> None:
    """The watch delivered our Ready (the answer guard is dropped); then an event with an
    older resourceVersion, still Pending, arrives: it must not make a second reservation."""
    api = cluster(pending("w"))
    ctx, engine = controller(api)
    old = api.get("Workload", "w", "default")
    run(ctx)
    watch(ctx, api)  # our reservation and Ready are in the store
    run(ctx)
    assert ctx.component(Answered).attempts == {}, "the guard ends once the watch shows it"
    deliver(ctx, "Workload", old)  # type: ignore[arg-type]
    run(ctx)
    assert check_of(api, "w")["state"] == "Ready"
    assert api.count("create", RR) == 1 and engine.calls == 1
    assert api.count("apply", "Workload") == 1


def test_a_stale_deleted_event_of_a_reservation_does_not_free_its_gpus() -> None:
    """A DELETED event older than the reservation the store holds (out of order) must not
    drop it: its GPUs would look free and the next gang would get them."""
    api = cluster(pending("w", pods=3, gpus=8))
    ctx, _ = controller(api)
    run(ctx)
    watch(ctx, api)
    (rr,) = api.of_kind(RR)
    stale = copy.deepcopy(rr)
    stale["metadata"]["resourceVersion"] = str(int(rr["metadata"]["resourceVersion"]) - 1)
    deliver(ctx, RR, stale, "DELETED")
    assert ctx.store.get(RR, f"default/{rr['metadata']['name']}") is not None
    u = api.put(pending("u", pods=1, gpus=8))
    deliver(ctx, "Workload", u, "ADDED")
    run(ctx)
    assert check_of(api, "u")["state"] == "Retry", "w holds all three nodes"
    assert len(api.of_kind(RR)) == 1


def two_nodes(*workloads: dict[str, Any]) -> FakeApi:
    return cluster(*workloads, nodes=("n0", "n1"))


def slot_nodes(rr: dict[str, Any]) -> set[str]:
    return {s["node"] for ps in rr["spec"]["podSets"] for s in ps["slots"]}


def test_a_reservation_write_overlaps_the_next_workloads_solve() -> None:
    """w's reservation create cannot finish until v's solve has started: with the writes
    awaited in turn this pass would never get there (the create gives up after 5 s)."""
    import threading

    api = two_nodes(
        pending("w", pods=1, gpus=8), pending("v", pods=1, gpus=8, created="2026-11-25T10:00:01Z")
    )
    second_solve = threading.Event()
    real_create = api.create
    overlapped: list[bool] = []

    def create(kind: str, body: Any) -> bool:
        if kind == RR and body["metadata"]["name"].startswith("w-"):
            overlapped.append(second_solve.wait(timeout=5))
        return real_create(kind, body)

    api.create = create  # type: ignore[method-assign]
    ctx, engine = controller(api)
    inner = engine.place

    def place(*args: Any) -> Any:
        if engine.calls == 1:
            second_solve.set()
        return inner(*args)

    engine.place = place  # type: ignore[method-assign]
    run(ctx)
    assert overlapped == [True]
    assert check_of(api, "w")["state"] == "Ready" and check_of(api, "v")["state"] == "Ready"
    w_rr, v_rr = sorted(api.of_kind(RR), key=lambda r: r["metadata"]["name"], reverse=True)
    assert slot_nodes(w_rr).isdisjoint(slot_nodes(v_rr))


def test_the_wait_for_a_reservation_create_the_solve_did_not_hide_is_measured() -> None:
    """What an operator reads to tell a slow apiserver from a slow engine: w's create takes
    0.3 s, far longer than v's solve, and the loop's wait for it shows in
    nexus_admit_reservation_wait_seconds (v's own create is waited for at the pass's end)."""
    import time as _time

    api = two_nodes(
        pending("w", pods=1, gpus=8), pending("v", pods=1, gpus=8, created="2026-11-25T10:00:01Z")
    )
    real_create = api.create

    def create(kind: str, body: Any) -> bool:
        if kind == RR and body["metadata"]["name"].startswith("w-"):
            _time.sleep(0.3)
        return real_create(kind, body)

    api.create = create  # type: ignore[method-assign]
    ctx, _ = controller(api)
    run(ctx)
    samples = {s.name: s.value for m in ctx.metrics.reservation_wait_seconds.collect()
               for s in m.samples}
    assert samples["nexus_admit_reservation_wait_seconds_count"] == 2
    assert samples["nexus_admit_reservation_wait_seconds_sum"] >= 0.2
    assert check_of(api, "w")["state"] == "Ready" and check_of(api, "v")["state"] == "Ready"


def test_an_earlier_reservation_found_on_other_nodes_makes_the_next_solve_run_again() -> None:
    """w's create finds a reservation of its attempt on the other node (written earlier, not
    watched yet). v was solved meanwhile, against w's solved node: it is solved again, so the
    two never share a node."""
    api = two_nodes(
        pending("w", pods=1, gpus=8), pending("v", pods=1, gpus=8, created="2026-11-25T10:00:01Z")
    )
    real_create = api.create

    def create_elsewhere(kind: str, body: Any) -> bool:
        if kind == RR and body["metadata"]["name"].startswith("w-"):
            other = copy.deepcopy(body)
            for ps in other["spec"]["podSets"]:
                for s in ps["slots"]:
                    s["node"] = {"n0": "n1", "n1": "n0"}[s["node"]]
            real_create(kind, other)
            return False  # AlreadyExists
        return real_create(kind, body)

    api.create = create_elsewhere  # type: ignore[method-assign]
    ctx, engine = controller(api)
    run(ctx)
    assert check_of(api, "w")["state"] == "Ready" and check_of(api, "v")["state"] == "Ready"
    by_name = {r["metadata"]["name"][0]: r for r in api.of_kind(RR)}
    assert slot_nodes(by_name["w"]).isdisjoint(slot_nodes(by_name["v"]))
    assert engine.calls == 3  # w, v, and v again


def test_the_lifecycle_runs_at_most_once_a_second_and_a_skipped_one_wakes_the_loop() -> None:
    """Back-to-back passes in a burst skip the walk over every reservation, and the loop is
    woken when it is due, so a change seen in between is acted on then, not at the tick."""
    ctx, _ = controller(cluster())
    tick = [1000.0]
    ctx.clocks.monotonic = lambda: tick[0]

    async def scenario() -> tuple[bool, bool, bool, bool]:
        first = cycle.lifecycle_due(ctx)
        tick[0] += cycle.LIFECYCLE_EVERY_SECONDS - 0.01  # due in 10 ms
        second = cycle.lifecycle_due(ctx)
        ctx.signals.wake.clear()
        await asyncio.wait_for(ctx.signals.wake.wait(), timeout=5)
        still_set = ctx.component(cycle.PassState).lifecycle_wake_set
        tick[0] += 0.01
        return first, second, still_set, cycle.lifecycle_due(ctx)

    first, second, still_set, after = asyncio.run(scenario())
    assert first and not second
    assert not still_set and after


def test_a_pass_without_the_lifecycle_still_places() -> None:
    api = cluster(pending("w1"))
    ctx, engine = controller(api)
    asyncio.run(reconcile(ctx, lifecycle=False))
    assert engine.calls == 1 and check_of(api, "w1")["state"] == "Ready"


def test_a_pass_that_starts_while_a_check_write_is_in_flight_does_not_answer_again() -> None:
    """The loop does not wait for a pass's check writes: the Workload is marked answered
    before its write goes out, so the next pass neither writes nor posts its Event twice;
    a write that fails gives the mark back, and the pass after answers."""
    import threading

    api = cluster(pending("w1"))
    ctx, _ = controller(api)
    gate = threading.Event()
    real = api.apply_status
    applies: list[str] = []
    fail = [True]

    def slow(kind: str, body: dict[str, Any]) -> dict[str, Any]:
        if kind != "Workload":  # the AdmissionCheck's Active condition
            return real(kind, body)
        applies.append(kind)
        gate.wait(10)
        if fail[0]:
            raise ApiException(status=500, reason="etcd leader changed")
        return real(kind, body)

    api.apply_status = slow  # type: ignore[method-assign]

    async def scenario() -> None:
        await reconcile(ctx, drain=False)
        for _ in range(500):  # until the write is in flight (its thread is started)
            if applies:
                break
            await asyncio.sleep(0.01)
        watch(ctx, api)  # the reservation is seen, the check is still Pending
        await reconcile(ctx, drain=False)
        assert applies == ["Workload"]
        gate.set()
        await ctx.workers.background.drain()
        fail[0] = False
        await reconcile(ctx)  # the failed answer is written again, from the reservation

    asyncio.run(scenario())
    assert applies == ["Workload", "Workload"]
    assert check_of(api, "w1")["state"] == "Ready"
    assert len(api.list(RR)[0]) == 1


def test_a_workload_whose_step_fails_unexpectedly_stops_no_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever breaks while one Workload is placed (a bug, an object no check foresaw),
    the pass goes on with the next ones; that Workload is tried again next pass."""
    from nexus_admit.kube.dump import ClusterDump

    real = ClusterDump.gang

    def gang(self: ClusterDump, workload: dict[str, Any], *args: Any, **kw: Any) -> Any:
        if workload["metadata"]["name"] == "odd":
            raise RuntimeError("unforeseen")
        return real(self, workload, *args, **kw)

    monkeypatch.setattr(ClusterDump, "gang", gang)
    api = cluster(pending("odd", pods=1, gpus=8),
                  pending("w", pods=1, gpus=8, created="2026-11-25T10:00:01Z"))
    ctx, _ = controller(api)
    run(ctx)
    assert check_of(api, "w")["state"] == "Ready"
    assert check_of(api, "odd")["state"] == "Pending"
    errors = {s.labels["step"]: s.value for m in ctx.metrics.errors.collect()
              for s in m.samples if s.name.endswith("_total")}
    assert errors.get("workload") == 1


def _replica(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Deployment's replica as Kueue v0.19 makes it: its Pod (owned by the ReplicaSet)
    and a single-pod Workload owned by the Pod, pending on our check."""
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f",
             "uid": "rs", "controller": True}
    p = pod(f"web-{i}", None, gpus=1, labels={"pod-template-hash": "7d9f"})
    p["metadata"]["ownerReferences"] = [owner]
    wl = pending(f"pod-web-{i}", pods=1, gpus=1)
    wl["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": f"web-{i}", "uid": f"p{i}",
         "controller": True}
    ]
    return p, wl


def _reserved_nodes(api: FakeApi) -> list[str]:
    rrs, _ = api.list(RR)
    return [s["node"] for rr in rrs for ps in rr["spec"]["podSets"] for s in ps["slots"]]


def test_a_deployments_replicas_placed_in_one_pass_take_a_node_each() -> None:
    """Each replica is its own Workload: the ones placed earlier in the pass (the ledger's)
    are its siblings, so four replicas take four nodes instead of piling onto one."""
    api = cluster(nodes=("n0", "n1", "n2", "n3"))
    for i in range(4):
        for obj in _replica(i):
            api.put(obj)
    ctx, _ = controller(api)
    run(ctx)
    nodes = _reserved_nodes(api)
    assert len(nodes) == 4 and len(set(nodes)) == 4, nodes
    # a replica added later (scale-up) is placed against the reservations of the others
    watch(ctx, api)
    for obj in _replica(4):
        api.put(obj)
    watch(ctx, api)
    run(ctx)
    assert check_of(api, "pod-web-4")["state"] == "Ready"
    assert len(set(_reserved_nodes(api))) == 4  # every node holds one already: any is fine


def test_each_pass_places_on_the_snapshot_a_full_build_gives() -> None:
    """The pass's snapshot is kept from the store's changes (kube/cluster/live.py): after
    the pass's own placements, a reservation seen, a pod bound and another Workload, it is
    what a full build of the store gives, and the next Workload goes where that leaves room."""
    api = cluster(pending("w", pods=2, gpus=8))
    ctx, _ = controller(api)
    run(ctx)
    assert check_of(api, "w")["state"] == "Ready"
    watch(ctx, api, (RR, "Workload"))
    rr = api.list(RR)[0][0]
    taken = {s["node"] for s in rr["spec"]["podSets"][0]["slots"]}
    bound = pod("w-0", sorted(taken)[0], gpus=8, labels={
        L.LABEL_RESERVATION: rr["metadata"]["name"]}, annotations={L.ANN_SLOT: "main/0"})
    bound["metadata"] |= {"uid": "u-w0", "resourceVersion": "900"}
    ctx.store.upsert("Pod", bound)  # the watch shows its first pod bound
    api.put(pending("v", pods=1, gpus=8, created="2026-11-25T10:00:01Z"))
    watch(ctx, api, ("Workload",))
    run(ctx)
    assert check_of(api, "v")["state"] == "Ready"
    watch(ctx, api, (RR, "Workload"))
    placed = {s["node"] for r in api.list(RR)[0] if r["metadata"]["name"] != rr["metadata"]["name"]
              for s in r["spec"]["podSets"][0]["slots"]}
    assert placed and not placed & taken
    live = ctx.live["placing"]
    kept = live.build(live.gather(ctx.store, now=ctx.clocks.wall()), [])
    full = ctx.store.dump().snapshot(now=ctx.clocks.wall(), skipped=[])
    assert list(kept.nodes.items()) == list(full.nodes.items())


def test_two_compute_domains_placed_in_one_pass_take_two_cliques() -> None:
    """The second ComputeDomain gang is placed before the watch shows the first one's
    reservation: the ledger closes the first one's clique to it (its free node there would
    otherwise be the tighter fit, keeping clique B whole)."""
    clique = "nvidia.com/gpu.clique"
    channel = {"name": "channel",
               "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"}}
    gpus = {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8}}

    def template(name: str, request: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"spec": {"devices": {"requests": [request]}}}}

    def cd_workload(name: str, created: str) -> dict[str, Any]:
        claims = [{"name": "gpu", "resourceClaimTemplateName": "eight"},
                  {"name": "channel", "resourceClaimTemplateName": f"{name}-channel"}]
        w = workload(name, [pod_set(count=1, gpus=0, spec_extra={"resourceClaims": claims})],
                     created=created)
        w["status"]["conditions"][0]["lastTransitionTime"] = QR
        return w

    api = FakeApi()
    for name, c in (("a0", "A"), ("a1", "A"), ("b0", "B"), ("b1", "B")):
        api.put(node(name, gpus=0, labels={clique: c}))
        devices = [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}},
                    "capacity": {"memory": {"value": "80Gi"}}} for i in range(8)]
        api.put({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                 "metadata": {"name": f"{name}-gpus"},
                 "spec": {"driver": "gpu.nvidia.com", "nodeName": name,
                          "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                          "devices": devices}})
    for obj in (cluster_queue("cq", "gold"), admission_check("nexus"), template("eight", gpus),
                template("one-channel", channel), template("two-channel", channel),
                cd_workload("one", QR), cd_workload("two", "2026-11-25T10:00:01Z")):
        api.put(obj)
    ctx, _ = controller(api)
    run(ctx)
    assert check_of(api, "one")["state"] == "Ready", check_of(api, "one")
    assert check_of(api, "two")["state"] == "Ready", check_of(api, "two")
    by_name = {rr["metadata"]["name"].split("-")[0]: rr for rr in api.of_kind(RR)}
    cliques = {k: {n[0] for n in slot_nodes(rr)} for k, rr in by_name.items()}
    assert cliques["one"] != cliques["two"], cliques
    assert by_name["one"]["metadata"]["annotations"][L.ANN_COMPUTE_DOMAIN] == (
        "default/one-channel")


def test_the_solve_metric_tells_one_pod_decisions_from_gangs() -> None:
    """A one-pod decision's time is its own series (what should not grow with the fleet),
    and so is a decision that reused the engine's kept facts (`facts="kept"`) rather than
    deriving them over the fleet, as the first decision of each pod shape does."""
    api = two_nodes(
        pending("w", pods=1, gpus=2),
        pending("v", pods=2, gpus=4, created="2026-11-25T10:00:01Z"),
        pending("u", pods=1, gpus=2, created="2026-11-25T10:00:02Z"),
    )
    ctx, _ = controller(api)
    run(ctx)
    counts = {(s.labels["outcome"], s.labels["pods"], s.labels["facts"]): s.value
              for m in ctx.metrics.solve_seconds.collect() for s in m.samples
              if s.name.endswith("_count")}
    assert counts == {("feasible", "1", "fleet"): 1, ("feasible", "several", "fleet"): 1,
                      ("feasible", "1", "kept"): 1}, counts
    cpu = {(s.labels["pods"], s.labels["facts"]): s.value
           for m in ctx.metrics.solve_cpu_seconds.collect() for s in m.samples
           if s.name.endswith("_count")}
    assert cpu == {("1", "fleet"): 1, ("several", "fleet"): 1, ("1", "kept"): 1}, cpu


def tas_flavor() -> dict[str, Any]:
    rf = flavor("tas-gpus")
    rf["spec"]["topologyName"] = "hosts"
    return rf


def test_a_tas_assignment_whose_pods_are_not_bound_yet_keeps_the_gang_off_its_node() -> None:
    """Kueue TAS reserved n0 for another queue's Workload; its pod is gated until its
    other check is Ready: a gang that needs both nodes must wait, not take n0 too."""
    held = tas_workload("tas", {"n0": 1}, gpus=8)
    api = cluster(pending("w", pods=2, gpus=8), held, nodes=("n0", "n1"))
    ctx, _ = controller(api)
    run(ctx)
    assert check_of(api, "w")["state"] == "Retry"
    assert api.count("create", RR) == 0
    # the TAS pod binds to n0: counted once (as the pod), a one-node gang fits on n1
    api.put(tas_pod("tas-0", "n0", "tas", gpus=8))
    api.put(pending("v", pods=1, gpus=8))
    watch(ctx, api)
    run(ctx)
    (rr,) = api.of_kind(RR)
    assert [s["node"] for s in rr["spec"]["podSets"][0]["slots"]] == ["n1"]


def test_a_mixed_workloads_other_pod_sets_are_placed_and_pinned_beside_its_tas_ones() -> None:
    """One pod set on a TAS flavor (Kueue chose n0), one without: the second is ours to
    place (not on n0, which TAS holds) and pin; the first gets no update from us."""
    w = tas_workload("w", {"n0": 1}, gpus=8, pod_set_name="launcher",
                     others=[pod_set("workers", 2, gpus=8)])
    w["status"]["admissionChecks"][0]["name"] = "nexus"
    w["status"]["conditions"][0]["lastTransitionTime"] = QR
    w["status"]["admission"]["podSetAssignments"][0]["flavors"] = {"nvidia.com/gpu": "tas-gpus"}
    api = cluster(w)
    api.put(tas_flavor())
    ctx, _ = controller(api)
    run(ctx)
    entry = check_of(api, "w")
    assert entry["state"] == "Ready"
    assert [u["name"] for u in entry["podSetUpdates"]] == ["workers"]
    (rr,) = api.of_kind(RR)
    assert [ps["name"] for ps in rr["spec"]["podSets"]] == ["workers"]
    assert sorted(s["node"] for s in rr["spec"]["podSets"][0]["slots"]) == ["n1", "n2"]


def test_a_workload_all_on_tas_flavors_is_passed_through() -> None:
    w = tas_workload("w", {"n0": 1}, gpus=8)
    w["status"]["admissionChecks"][0]["name"] = "nexus"
    w["status"]["conditions"][0]["lastTransitionTime"] = QR
    w["status"]["admission"]["podSetAssignments"][0]["flavors"] = {"nvidia.com/gpu": "tas-gpus"}
    api = cluster(w)
    api.put(tas_flavor())
    ctx, _ = controller(api)
    run(ctx)
    entry = check_of(api, "w")
    assert entry["state"] == "Ready" and "topology-aware flavor" in entry["message"]
    assert api.count("create", RR) == 0
