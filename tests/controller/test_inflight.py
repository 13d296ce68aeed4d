"""Several reservation creates in flight (controller/inflight.py), driven through the
loop's pass over `FakeApi` with every create's outcome and its timing drawn by hypothesis:
success, AlreadyExists on the same slots (an earlier create of this attempt), AlreadyExists
on other slots (an earlier decision's reservation the store has not shown), refused (4xx),
timed out (not written), lost answer (written, the reply lost). After a pass, after the
watch catches up and another pass, and after a restart, the cluster never holds two live
reservations on one GPU, and no check is Ready without its reservation."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_admit.controller.api import ApiException
from nexus_admit.controller.context import Context
from nexus_admit.controller.loop.cycle import reconcile
from nexus_admit.controller.options import RunOptions
from nexus_admit.kube import labels as L
from nexus_admit.kube.reservations import reservation_name
from tests.controller.fake_api import FakeApi
from tests.controller.test_placing import CountingEngine, check_of, cluster, pending, watch

RR = L.KIND_RESOURCE_RESERVATION
NODES = ("n0", "n1", "n2")
OUTCOMES = ("ok", "same", "other", "refused", "timeout", "lost")


class ScriptedCreates:
    """The apiserver's answer to each Workload's first create, as drawn; later creates
    (the next pass, after a restart) succeed."""

    def __init__(self, api: FakeApi, script: dict[str, tuple[str, int]]) -> None:
        self.api = api
        self.script = dict(script)
        self.real = api.create

    def __call__(self, kind: str, body: Any) -> bool:
        if kind != RR:
            return self.real(kind, body)
        owner = body["spec"]["workloadRef"]["name"]
        outcome, delay_ms = self.script.pop(owner, ("ok", 0))
        time.sleep(delay_ms / 1000)  # only to vary which create comes back first
        if outcome == "same":
            self.real(kind, body)
            return False
        if outcome == "other":  # an earlier decision of this attempt, on the next node
            other = copy.deepcopy(body)
            for ps in other["spec"]["podSets"]:
                for s in ps["slots"]:
                    s["node"] = NODES[(NODES.index(s["node"]) + 1) % len(NODES)]
            self.real(kind, other)
            return False
        if outcome == "refused":
            raise ApiException(status=422, reason="Unprocessable Entity")
        if outcome == "timeout":
            raise TimeoutError("create timed out")
        if outcome == "lost":
            self.real(kind, body)
            raise ApiException(status=500, reason="connection reset after the write")
        return self.real(kind, body)


def start(api: FakeApi, depth: int) -> Context:
    ctx = Context(options=RunOptions(webhook=False, creates_in_flight=depth), api=api,  # type: ignore[arg-type]
                  engine=CountingEngine())
    watch(ctx, api)
    ctx.leadership.synced = True
    return ctx


def gpus_of(rr: dict[str, Any]) -> list[tuple[str, int]]:
    return [(s["node"], g) for ps in rr["spec"]["podSets"] for s in ps["slots"]
            for g in s.get("gpus") or []]


def assert_consistent(api: FakeApi, names: list[str]) -> None:
    live = [rr for rr in api.of_kind(RR) if (rr.get("status") or {}).get("phase") != "Released"]
    taken: dict[tuple[str, int], str] = {}
    for rr in live:
        for gpu in gpus_of(rr):
            assert gpu not in taken, (
                f"GPU {gpu} held by {taken[gpu]} and {rr['metadata']['name']}")
            taken[gpu] = rr["metadata"]["name"]
    present = {rr["metadata"]["name"] for rr in live}
    for name in names:
        wl = api.get("Workload", name, "default")
        assert wl is not None
        states = [c["state"] for c in wl["status"]["admissionChecks"] if c["name"] == "nexus"]
        assert len(states) == 1 and states[0] in ("Ready", "Retry", "Pending", "Rejected")
        if states[0] == "Ready":
            assert reservation_name(wl) in present, f"{name} Ready without its reservation"


burst = st.lists(
    st.tuples(st.sampled_from((2, 4, 8)), st.sampled_from(OUTCOMES), st.integers(0, 3)),
    min_size=2, max_size=7,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(burst=burst, depth=st.sampled_from((1, 2, 4, 8)))
def test_interleaved_create_outcomes_never_double_book_a_gpu(
    burst: list[tuple[int, str, int]], depth: int,
) -> None:
    names, workloads, script = drawn(burst)
    api = cluster(*workloads, nodes=NODES)
    api.create = ScriptedCreates(api, script)  # type: ignore[method-assign]
    ctx = start(api, depth)
    asyncio.run(reconcile(ctx))
    stays_consistent(api, ctx, names, depth)


def drawn(burst: list[tuple[int, str, int]]
          ) -> tuple[list[str], list[dict[str, Any]], dict[str, tuple[str, int]]]:
    """The burst's Workload names, Workloads (one pod of the drawn GPUs each, in order) and
    each one's scripted create (outcome, delay in ms)."""
    names = [f"w{i}" for i in range(len(burst))]
    workloads = [pending(n, pods=1, gpus=g, created=f"2026-11-25T10:00:{i:02d}Z")
                 for i, (n, (g, _, _)) in enumerate(zip(names, burst, strict=True))]
    script = {n: (outcome, delay) for n, (_, outcome, delay) in zip(names, burst, strict=True)}
    return names, workloads, script


def stays_consistent(api: FakeApi, ctx: Context, names: list[str], depth: int) -> None:
    """Consistent after the pass just run, after the watch catches up (withdrawn
    reservations gone, lost ones shown) and another pass, and after a restart (a fresh
    controller on the same objects)."""
    assert_consistent(api, names)
    watch(ctx, api)
    asyncio.run(reconcile(ctx))
    assert_consistent(api, names)
    restarted = start(api, depth)
    asyncio.run(reconcile(restarted))
    assert_consistent(api, names)


def test_a_later_placement_on_an_earlier_reservations_node_is_withdrawn_and_placed_again(
) -> None:
    """w's create finds its attempt's reservation on n1 while v, solved onto n1 meanwhile,
    is already created: v's reservation is deleted before any check is written from it,
    and v is placed again in the same pass, on a node of its own."""
    api = cluster(pending("w", pods=1, gpus=8),
                  pending("v", pods=1, gpus=8, created="2026-11-25T10:00:01Z"),
                  nodes=("n0", "n1"))
    real = api.create
    seen: list[str] = []

    def create(kind: str, body: Any) -> bool:
        name = body["spec"]["workloadRef"]["name"]
        seen.append(name)
        if kind == RR and name == "w" and seen.count("w") == 1:
            other = copy.deepcopy(body)
            for ps in other["spec"]["podSets"]:
                for s in ps["slots"]:
                    s["node"] = {"n0": "n1", "n1": "n0"}[s["node"]]
            while "v" not in seen:  # v's create is on the wire before w's comes back
                time.sleep(0.001)
            real(kind, other)
            return False
        return real(kind, body)

    api.create = create  # type: ignore[method-assign]
    ctx = start(api, 4)
    asyncio.run(reconcile(ctx))
    assert api.count("delete", RR) == 1
    assert seen.count("v") == 2  # created, withdrawn, created again
    by_owner = {rr["spec"]["workloadRef"]["name"]: rr for rr in api.of_kind(RR)}
    assert {s for s, _ in gpus_of(by_owner["w"])} == {"n1"}
    assert {s for s, _ in gpus_of(by_owner["v"])} == {"n0"}
    assert_consistent(api, ["w", "v"])
    for name in ("w", "v"):
        wl = api.get("Workload", name, "default")
        assert wl is not None
        assert [c["state"] for c in wl["status"]["admissionChecks"]] == ["Ready"]


def test_a_reservation_left_overlapping_by_a_crash_is_deleted_not_answered() -> None:
    """A crash fell between a withdrawal and its delete: after the restart the store shows
    two unanswered plain reservations on the same GPUs. The first answered keeps its GPUs;
    the other is moved off them (a displaced slot, `controller/displaced.py`) or deleted
    and its Workload placed again, never Ready on them."""
    api = cluster(pending("w", pods=1, gpus=8),
                  pending("v", pods=1, gpus=8, created="2026-11-25T10:00:01Z"),
                  nodes=("n0", "n1"))
    ctx = start(api, 1)
    asyncio.run(reconcile(ctx))
    rrs = {rr["spec"]["workloadRef"]["name"]: rr for rr in api.of_kind(RR)}
    # back to before the answers, with v's reservation moved onto w's node
    for name in ("w", "v"):
        api.put(pending(name, pods=1, gpus=8) | {"metadata": {
            **api.get("Workload", name, "default")["metadata"]}})  # type: ignore[index]
    moved = rrs["v"]
    for ps in moved["spec"]["podSets"]:
        for s in ps["slots"]:
            s["node"] = next(s2["node"] for p2 in rrs["w"]["spec"]["podSets"]
                             for s2 in p2["slots"])
    api.put(moved)
    restarted = start(api, 4)
    asyncio.run(reconcile(restarted))
    # deleted, or one of the two moved off the other's GPUs (never both on them)
    assert api.count("delete", RR) == 1 or api.count("patch", RR) >= 1
    assert_consistent(api, ["w", "v"])


def test_a_withdrawn_reservation_the_store_still_shows_is_not_answered_from() -> None:
    """The watch brought v's withdrawn reservation but not its deletion: v is not answered
    from it in this pass; once the watch catches up, v is placed on a node of its own."""
    api = cluster(pending("w", pods=1, gpus=8),
                  pending("v", pods=1, gpus=8, created="2026-11-25T10:00:01Z"),
                  nodes=("n0", "n1"))
    real_create, real_delete = api.create, api.delete
    created: list[str] = []

    def create(kind: str, body: Any) -> bool:
        name = body["spec"]["workloadRef"]["name"]
        created.append(name)
        if kind == RR and name == "w" and created.count("w") == 1:
            other = copy.deepcopy(body)
            for ps in other["spec"]["podSets"]:
                for s in ps["slots"]:
                    s["node"] = {"n0": "n1", "n1": "n0"}[s["node"]]
            while "v" not in created:
                time.sleep(0.001)
            real_create(kind, other)
            return False
        return real_create(kind, body)

    ctx = start(api, 4)

    def delete(kind: str, name: str, namespace: str | None = None) -> bool:
        stale = api.get(kind, name, namespace)
        assert stale is not None
        ctx.store.upsert(RR, stale)  # its creation watched, its deletion not yet
        return real_delete(kind, name, namespace)

    api.create = create  # type: ignore[method-assign]
    api.delete = delete  # type: ignore[method-assign]
    asyncio.run(reconcile(ctx))
    assert created.count("v") == 1
    assert_consistent(api, ["w", "v"])
    wl = api.get("Workload", "v", "default")
    assert wl is not None and wl["status"]["admissionChecks"][0]["state"] == "Pending"
    watch(ctx, api)
    asyncio.run(reconcile(ctx))
    assert_consistent(api, ["w", "v"])
    by_owner = {rr["spec"]["workloadRef"]["name"]: rr for rr in api.of_kind(RR)}
    assert {n for n, _ in gpus_of(by_owner["v"])} == {"n0"}


class Arrivals:
    """Creates that bring more Workloads: during the first reservation create, `later`
    (and the reservations `stored` gives for that create's nodes) are created in the API,
    the watch shows them and the loop is woken, before that create comes back (after
    `hold` seconds). Every reservation create is recorded: owner, started, returned."""

    def __init__(
        self, api: FakeApi, later: list[dict[str, Any]], hold: float = 0.2,
        stored: Callable[[set[str]], list[dict[str, Any]]] = lambda nodes: [],
    ) -> None:
        self.api, self.later, self.hold, self.stored = api, later, hold, stored
        self.real = api.create
        self.ctx: Context | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.creates: list[tuple[str, float, float]] = []

    def __call__(self, kind: str, body: Any) -> bool:
        if kind != RR:
            return self.real(kind, body)
        started = time.monotonic()
        if self.later and self.loop is not None:
            nodes = {s["node"] for ps in body["spec"]["podSets"] for s in ps["slots"]}
            for obj in (*self.later, *self.stored(nodes)):
                self.api.put(obj)
            self.later = []
            self.loop.call_soon_threadsafe(self._arrive)
            time.sleep(self.hold)
        created = self.real(kind, body)
        self.creates.append((body["spec"]["workloadRef"]["name"], started, time.monotonic()))
        return created

    def _arrive(self) -> None:
        assert self.ctx is not None
        watch(self.ctx, self.api, ("Workload", RR))
        self.ctx.signals.wake.set()

    async def reconcile(self, ctx: Context) -> None:
        self.ctx, self.loop = ctx, asyncio.get_running_loop()
        await reconcile(ctx)


def test_a_workload_that_arrives_while_the_creates_are_in_flight_is_placed_in_that_pass(
) -> None:
    """v comes to wait on our check while w's create is on the wire: the same pass decides
    v on the capacity w took, before w's create is back, and answers both."""
    api = cluster(pending("w", pods=1, gpus=8), nodes=("n0", "n1"))
    arrivals = Arrivals(api, [pending("v", pods=1, gpus=8, created="2026-11-25T10:00:01Z")])
    api.create = arrivals  # type: ignore[method-assign]
    ctx = start(api, 4)
    asyncio.run(arrivals.reconcile(ctx))
    (w, _, w_back), (v, v_started, _) = sorted(arrivals.creates, key=lambda c: c[1])
    assert (w, v) == ("w", "v") and v_started < w_back
    assert_consistent(api, ["w", "v"])  # v on the node w left
    assert [check_of(api, n)["state"] for n in ("w", "v")] == ["Ready", "Ready"]
    assert ctx.signals.wake.is_set()  # the events it took in are looked at again by the next pass


def _reservation_of(workload: dict[str, Any], node: str) -> dict[str, Any]:
    """The reservation a run before this one made for `workload` on `node`."""
    api = cluster(copy.deepcopy(workload), nodes=(node,))
    asyncio.run(reconcile(start(api, 1)))
    [rr] = api.of_kind(RR)
    return rr


def test_an_arrival_whose_reservation_the_store_holds_waits_for_the_next_pass() -> None:
    """v arrives with a reservation of its attempt, on the node w did not take, that the
    pass's snapshot does not count: v is left to the next pass, which answers from that
    reservation (no solve, no create)."""
    api = cluster(pending("w", pods=1, gpus=8), nodes=("n0", "n1", "n2"))
    v = pending("v", pods=1, gpus=8, created="2026-11-25T10:00:01Z")
    made = {n: _reservation_of(v, n) for n in ("n0", "n1")}
    arrivals = Arrivals(api, [v], stored=lambda nodes: [made["n1" if "n0" in nodes else "n0"]])
    api.create = arrivals  # type: ignore[method-assign]
    ctx = start(api, 4)
    asyncio.run(arrivals.reconcile(ctx))
    assert [c[0] for c in arrivals.creates] == ["w"]
    assert check_of(api, "v")["state"] == "Pending"
    watch(ctx, api)
    asyncio.run(reconcile(ctx))
    assert [c[0] for c in arrivals.creates] == ["w"]
    assert [check_of(api, n)["state"] for n in ("w", "v")] == ["Ready", "Ready"]
    assert_consistent(api, ["w", "v"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(burst=burst, depth=st.sampled_from((1, 2, 4)), arriving=st.integers(1, 3))
def test_workloads_arriving_while_creates_are_in_flight_never_double_book_a_gpu(
    burst: list[tuple[int, str, int]], depth: int, arriving: int,
) -> None:
    """The last `arriving` Workloads of the burst come to wait on our check during the
    first create, whose outcome, like every other, is drawn: the pass decides them while
    the creates are in flight, and nothing is double-booked, then or after a restart."""
    names, workloads, script = drawn(burst)
    cut = max(1, len(workloads) - arriving)
    api = cluster(*workloads[:cut], nodes=NODES)
    arrivals = Arrivals(api, workloads[cut:], hold=0.02)
    arrivals.real = ScriptedCreates(api, script)  # type: ignore[assignment]
    api.create = arrivals  # type: ignore[method-assign]
    ctx = start(api, depth)
    asyncio.run(arrivals.reconcile(ctx))
    stays_consistent(api, ctx, names, depth)
