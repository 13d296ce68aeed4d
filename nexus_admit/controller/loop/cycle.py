"""The controller's loop: one pass decides everything that changed, in a fixed order.

Who calls it: `operator.py` runs `run_loop` as a background task next to the watch streams.
Each pass is a short recipe of named steps:

1. `sync_checks`    our AdmissionChecks' Active condition and PlacementConfigs;
2. `sync_lifecycle` release reservations whose attempt is over, mark Bound, expire, Retry
                    gangs a bypassing pod displaced (released capacity is free for step 3);
                    then `move_stranded` moves slots whose node failed (`failed_nodes.py`)
                    or no longer fits what was bound there (`displaced.py`);
3. `place_pending`  Workloads waiting on our check, in Kueue's order (priority, creation),
                    each decided (`place.place_one`) against one snapshot that already
                    holds the earlier ones.

Gated pods get their slots from the ungater, a task of its own, so a pod never waits for
the solves of a pass. Check writes and Events go out in the background (`ctx.workers.background`);
the loop's next pass does not wait for them (a Workload whose answer is in flight is marked
answered, `writes.answer`).

Level-triggered: a pass reads only the store (the cluster as watched) and the ledger, so a
repeated or lost event changes nothing, and a restart resumes from the objects. The CP-SAT
solve, the snapshot and the translation run in worker threads so watches, the webhook and
health checks stay responsive. A pending Workload's reservation of its current attempt
counts in the snapshot like any other, so no Workload earlier in Kueue's order is placed on
its GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any

from nexus_admit.controller.check_config import sync_checks
from nexus_admit.controller.context import Context
from nexus_admit.controller.demand import pending_demands, pending_gpus_by_tier
from nexus_admit.controller.displaced import find_displaced
from nexus_admit.controller.failed_nodes import move_stranded
from nexus_admit.controller.inflight import WritePipeline
from nexus_admit.controller.lifecycle import sync_lifecycle
from nexus_admit.controller.loop.inputs import PassInputs, read_inputs, workload_views
from nexus_admit.controller.loop.place import (
    hold_for_provisioning,
    needs_decision,
    our_pending_check,
    place_one,
)
from nexus_admit.controller.loop.record import PassRecord
from nexus_admit.controller.owning_jobs import fetch_owner_jobs, prefetch_owner_jobs
from nexus_admit.controller.skipped import report_skipped, with_view_problems
from nexus_admit.controller.store import PerObject
from nexus_admit.controller.warm import (
    BUDGET_SECONDS,
    IDLE_BUDGET_SECONDS,
    REPLAN_SECONDS,
    WarmShapes,
)
from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.live import LivePlan, LiveSnapshot, WithoutReservations
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.errors import Skipped
from nexus_admit.kube.kueue import KueueIndex, provisioning_check_names
from nexus_admit.kube.views import WorkloadView
from nexus_admit.model import ClusterSnapshot, PlacementConfig
from nexus_admit.placement.base import SolvesBeside, Warms
from nexus_admit.placement.sequence import OrderedPlacer

__all__ = ["LIFECYCLE_EVERY_SECONDS", "place_pending", "reconcile", "run_loop"]

log = logging.getLogger(__name__)

# In a burst, events arrive faster than passes end and every pass would walk every
# reservation and its pods again; the placing step needs no fresher view of them than this
# (a released attempt's capacity waits at most this long)
LIFECYCLE_EVERY_SECONDS = 1.0
CAPACITY_EVERY_SECONDS = 15.0
WITHDRAWN_ROUNDS = 3
# how long a pass goes on deciding the Workloads that come to wait on our check while its
# creates are in flight (the lifecycle's cadence: what the pass holds back waits no longer)
ARRIVALS_SECONDS = 1.0


async def run_loop(ctx: Context) -> None:
    """Run a pass whenever something changed, and at least every tick (TTLs, holds)."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.signals.wake.wait(), timeout=ctx.options.tick_seconds)
        ctx.signals.wake.clear()
        if not ctx.leadership.synced or not ctx.acting():
            continue  # a follower keeps its store warm and decides nothing
        started = time.perf_counter()
        lifecycle = lifecycle_due(ctx)
        # a task of its own, so losing the lease can cancel the pass mid-way
        ctx.signals.pass_task = asyncio.create_task(
            reconcile(ctx, lifecycle=lifecycle, drain=False), name="reconcile-pass"
        )
        await asyncio.wait({ctx.signals.pass_task})
        task, ctx.signals.pass_task = ctx.signals.pass_task, None
        if task.cancelled():
            log.info("reconcile pass cancelled: this replica stopped leading")
            continue
        if task.exception() is not None:  # one bad pass must not stop the controller
            ctx.metrics.errors.labels("reconcile").inc()
            log.error(
                "reconcile pass failed; retrying on the next event or tick",
                exc_info=task.exception(),
            )
        ctx.metrics.pass_seconds.observe(time.perf_counter() - started)


@dataclass
class PassState:
    """The loop's own memos and timers (monotonic seconds); the Workload views are
    `inputs.Views`."""

    # each waiting Workload's (tier, GPU milli) demand (demand.pending_demands: the
    # backfill and the capacity metrics), kept while the store holds it
    demand_memo: PerObject[tuple[str, int] | None] = field(default_factory=PerObject)
    lifecycle_synced: float = float("-inf")  # the last lifecycle step
    lifecycle_wake_set: bool = False  # a pass is already due when the lifecycle is
    capacity_recorded: float = float("-inf")  # the last capacity metrics
    warm_planned: float = 0.0  # when a pass may plan its shapes again mid-way

    def reset(self) -> None:
        """The memo (the timers only say when work is due again)."""
        self.demand_memo = PerObject()


def lifecycle_due(ctx: Context) -> bool:
    """Does this pass include the reservation lifecycle? When not, a wake-up is set for
    when it is due, so a change that comes in between is still acted on then."""
    now, state = ctx.clocks.monotonic(), ctx.component(PassState)
    due = state.lifecycle_synced + LIFECYCLE_EVERY_SECONDS
    if now >= due:
        state.lifecycle_synced = now
        return True
    if not state.lifecycle_wake_set:
        state.lifecycle_wake_set = True

        def wake() -> None:
            state.lifecycle_wake_set = False
            ctx.signals.wake.set()

        asyncio.get_running_loop().call_later(due - now, wake)
    return False


async def reconcile(ctx: Context, *, lifecycle: bool = True, drain: bool = True) -> None:
    """One pass. `drain`: wait for the check writes and Events it started (tests, and
    anything that reads the cluster right after); the loop does not, so the next pass
    places the Workloads Kueue reserved meanwhile one round trip sooner."""
    try:
        await sync_checks(ctx)
        if lifecycle:
            stranded = await sync_lifecycle(ctx)
            # and slots whose node pods we do not place took (`displaced.py`)
            stranded += await find_displaced(ctx, {s.rr.key for s in stranded})
            if stranded:  # before placing, so no new gang takes the room they move to
                await move_stranded(ctx, stranded, await _snapshot_now(ctx))
        await place_pending(ctx)
        await record_capacity(ctx)
    finally:
        if drain:
            await ctx.workers.background.drain()


async def _snapshot_now(ctx: Context) -> ClusterSnapshot:
    """The passes' snapshot of the store as it is (every live reservation counted)."""
    skipped: list[Skipped] = []
    live = live_snapshot(ctx, "placing")
    plan = live.gather(ctx.store, now=ctx.clocks.wall(), epoch=_epoch(ctx))
    snapshot = await asyncio.to_thread(live.build, plan, skipped)
    report_skipped(ctx, skipped)
    return snapshot


async def record_capacity(ctx: Context) -> None:
    """GPUs free / held by reservations / taken by bound pods, and pristine 8-GPU nodes, at
    most every 15 s and in a thread (two snapshots of a large fleet are not free)."""
    tick, state = ctx.clocks.monotonic(), ctx.component(PassState)
    if tick - state.capacity_recorded < CAPACITY_EVERY_SECONDS:
        return
    state.capacity_recorded = tick
    # also where malformed objects are told while nothing waits for a placement
    skipped = await asyncio.to_thread(
        _record_capacity, ctx, ctx.store.dump(), capacity_plans(ctx)
    )
    report_skipped(ctx, with_view_problems(ctx, skipped), count=False)
    if ctx.live["placing"].renewed is not None:  # the passes' snapshot too
        ctx.component(WarmShapes).forget()


def capacity_plans(ctx: Context) -> tuple[LivePlan, LivePlan]:
    """What the two live snapshots of the capacity metrics (with and without reservations)
    re-read: what changed since they were last built (on the loop's thread)."""
    now = ctx.clocks.wall()
    placing, bound = live_snapshot(ctx, "placing"), live_snapshot(ctx, "bound")
    return (placing.gather(ctx.store, now=now, epoch=_epoch(ctx)),
            bound.gather(WithoutReservations(ctx.store), now=now))


def live_snapshot(ctx: Context, name: str) -> LiveSnapshot:
    """One of the context's live snapshots, subscribed to the store on first use."""
    live = ctx.live.get(name)
    if live is None:
        live = ctx.live[name] = LiveSnapshot(ctx.store.subscribe())
    return live


def _epoch(ctx: Context) -> object:
    """What else the engine's caches read between passes: our checks' placement configs."""
    return [(name, view.config) for name, view in sorted(ctx.checks.items())]


def _record_capacity(
    ctx: Context, dump: ClusterDump, plans: tuple[LivePlan, LivePlan]
) -> list[Skipped]:
    skipped: list[Skipped] = []
    with_rr = ctx.live["placing"].build(plans[0], skipped)
    count_renewal(ctx, ctx.live["placing"], len(with_rr))  # the passes' snapshot too
    pods_only = ctx.live["bound"].build(plans[1], [])
    free = sum(sum(n.gpu_free) for n in with_rr) / 1000
    after_pods = sum(sum(n.gpu_free) for n in pods_only) / 1000
    total = sum(n.gpu_count for n in with_rr)
    ctx.metrics.gpus.labels("free").set(free)
    ctx.metrics.gpus.labels("reserved").set(after_pods - free)
    ctx.metrics.gpus.labels("bound").set(total - after_pods)
    # only the tiers that wait now: a tier whose last Workload was admitted (or a tier no
    # longer configured) must not keep its last figure, nor a label set for ever
    ctx.metrics.pending_gpus.clear()
    demand_memo = ctx.component(PassState).demand_memo
    for tier, gpus in pending_gpus_by_tier(dump, ctx.checks, demand_memo).items():
        ctx.metrics.pending_gpus.labels(tier).set(gpus)
    ctx.metrics.pristine_islands.set(
        sum(1 for n in with_rr if n.gpu_count >= 8 and n.is_pristine())
    )
    return skipped


def count_renewal(ctx: Context, live: LiveSnapshot, nodes: int) -> None:
    """Count and log a build of the passes' snapshot that dropped the engine's facts about
    the fleet (its next solve derives them again); the capacity step builds it too."""
    if live.renewed is not None:
        ctx.metrics.snapshot_renewals.labels(live.renewed).inc()
        log.info("snapshot of %d nodes renewed (%s): the engine derives its facts again",
                 nodes, live.renewed)


async def place_pending(ctx: Context) -> None:
    """Every Workload waiting on one of our active checks, in Kueue's order, on one
    snapshot of the pass:

    1. `read_inputs`     the waiting Workloads and their Jobs, the ledger settled;
    2. `WarmShapes.plan` the shapes of those still waiting for quota (controller/warm.py);
    3. `_pass_snapshot`  the fleet as the store holds it, this pass's own holds left out;
    4. `_place_batch`    each decided in order on what the earlier left (warming beside the
                         solves), the writes pipelined;
    5. `WarmShapes.step` the shapes warmed in what is left of the budget.
    """
    active = {n for n, v in ctx.checks.items() if v.config is not None}
    if not active:
        return
    inputs = await read_inputs(ctx, active)
    warms = ctx.engine if isinstance(ctx.engine, Warms) else None
    shapes = ctx.component(WarmShapes)
    if warms is not None:
        shapes.plan(inputs.waiting, inputs.dump, active)
    warming = warms is not None and shapes.due(ctx.clocks.monotonic())
    if not inputs.deciding and not warming:
        # every one is answered already (the watch has not shown it) or waits for its Job:
        # a pass for each of their events would rebuild the snapshot of the whole fleet
        return
    now = ctx.clocks.wall()
    snapshot, renewed = await _pass_snapshot(ctx, inputs, now)
    if warms is not None and renewed:
        shapes.forget()  # translated against other nodes: warmed again
        shapes.plan(inputs.waiting, inputs.dump, active)
        warming = True
    kueue = await asyncio.to_thread(inputs.dump.kueue_index)
    configs = {name: view.config for name, view in ctx.checks.items()}
    if inputs.deciding:
        beside = _warm_beside_solves(ctx, warms, snapshot, inputs.dump, kueue, configs, now)
        # the Workloads Kueue creates while the pass decides are planned for between them
        between = partial(_plan_warming_again, ctx, active) if beside is not None else None
        try:
            await _place_batch(ctx, inputs.dump, kueue, snapshot, inputs.pending,
                               inputs.unread, inputs.unreserved, now, between,
                               frozenset(active))
        finally:
            if beside is not None:
                beside.work_beside_solves(None)
        warming = warming or (warms is not None and shapes.due(ctx.clocks.monotonic()))
    if warms is not None and warming:
        budget = BUDGET_SECONDS if inputs.deciding else IDLE_BUDGET_SECONDS
        warmed = await asyncio.get_running_loop().run_in_executor(
            ctx.workers.solver, shapes.step, warms, snapshot, inputs.dump, kueue, configs,
            now, budget)
        ctx.metrics.warmed_shapes.inc(warmed)


async def _pass_snapshot(
    ctx: Context, inputs: PassInputs, now: datetime
) -> tuple[ClusterSnapshot, bool]:
    """Step 3: the pass's snapshot, and whether it was renewed (the engine's facts about
    the fleet dropped). Kept from the store's changes: only the nodes an event (or the
    last pass's placements) touched are translated again, in a thread, so the webhook and
    the watches keep being served (what it reads is gathered here: the store changes on
    this thread); a malformed object is left out (never freer than the truth), counted
    and told once, with the fields the store's views could not read."""
    skipped: list[Skipped] = []
    live = live_snapshot(ctx, "placing")
    plan = live.gather(ctx.store, exclude_workloads=inputs.unreserved, now=now,
                       epoch=_epoch(ctx))
    snapshot = await asyncio.to_thread(live.build, plan, skipped)
    count_renewal(ctx, live, len(snapshot.nodes))
    report_skipped(ctx, with_view_problems(ctx, skipped))
    return snapshot, live.renewed is not None


def _warm_beside_solves(
    ctx: Context, warms: Warms | None, snapshot: ClusterSnapshot, dump: ClusterDump,
    kueue: KueueIndex, configs: Mapping[str, PlacementConfig | None], now: datetime,
) -> SolvesBeside | None:
    """Have the engine warm the waiting shapes beside its CP-SAT solves (the engine, or None
    when it cannot). Why: a burst's first gangs are solved while Kueue reserves the next
    Workloads; their shapes are warmed on the core CP-SAT leaves free, not after the gangs.
    New shapes only: after a burst's changes a warmed shape's sync costs tens of ms at 5,000
    nodes, its next decision syncs it anyway, and the syncs stay within the budget after
    the decisions."""
    beside = ctx.engine if isinstance(ctx.engine, SolvesBeside) else None
    if warms is None or beside is None:
        return None

    def warm_beside(done: threading.Event) -> None:
        shapes = ctx.component(WarmShapes)
        warmed = shapes.step(warms, snapshot, dump, kueue, configs, now, math.inf,
                             done.is_set, syncs=False, monotonic=ctx.clocks.monotonic)
        ctx.metrics.warmed_shapes.inc(warmed)

    beside.work_beside_solves(warm_beside)
    return beside


def _plan_warming_again(ctx: Context, active: set[str]) -> None:
    """The new shapes to warm from the Workloads waiting for quota now (on the loop's
    thread, which owns the store): those Kueue created while the pass decided, the next it
    reserves in a burst, are warmed beside the pass's solves. At most every
    `REPLAN_SECONDS`, and never more than a twentieth of the loop's time (6.8 ms a plan
    with 5,000 Workloads waiting, 0.3-0.7 ms with 300, offline)."""
    started, state = ctx.clocks.monotonic(), ctx.component(PassState)
    if started < state.warm_planned:
        return
    dump = ctx.store.dump()
    _, waiting = workload_views(ctx, dump, active)
    prefetch_owner_jobs(ctx, waiting)
    ctx.component(WarmShapes).plan_new(waiting, dump, active)
    done = ctx.clocks.monotonic()
    state.warm_planned = done + max(REPLAN_SECONDS, 20 * (done - started))


async def _place_batch(
    ctx: Context, dump: ClusterDump, kueue: KueueIndex, snapshot: ClusterSnapshot,
    pending: list[WorkloadView], unread: set[str], unreserved: frozenset[str],
    now: datetime, between: Callable[[], None] | None = None,
    active: frozenset[str] = frozenset(),
) -> None:
    """Place the pass's Workloads in Kueue's order, each on the capacity the earlier left,
    then those of our `active` checks that came to wait while its creates were in flight
    (`_decide_arrivals`); `between` is called before each decision."""
    # tracked, and the same object from pass to pass: the engine keeps what it derived of
    # each node and re-reads only the nodes that changed (events, placements, holds)
    placer = OrderedPlacer(ctx.engine, snapshot)
    ctx.ledger.hold_in(placer)
    demands = await asyncio.to_thread(pending_demands, dump, ctx.checks,
                                      ctx.component(PassState).demand_memo)
    writes = WritePipeline(ctx, placer, ctx.options.creates_in_flight)
    rec = PassRecord(ctx, dump, kueue, placer, now, demands, writes, unreserved)
    try:
        batch = [(wl, our_pending_check(wl, ctx)) for wl in pending if wl.key not in unread]
        seen = {wl.key for wl in pending}
        # placements withdrawn for an earlier reservation found on their nodes are placed
        # again on the pass's capacity (a few rounds at most: each needs another such find)
        for rounds in range(WITHDRAWN_ROUNDS):
            for wl, check in batch:
                if check is not None:
                    if between is not None:
                        between()
                    await _place_guarded(rec, wl, check)
            if rounds == 0 and active:
                await _decide_arrivals(rec, active, seen, between)
            await writes.flush(ctx.metrics)
            batch, writes.withdrawn = list(writes.withdrawn), []
            if not batch:
                break
    finally:
        await writes.flush(ctx.metrics)


async def _decide_arrivals(
    rec: PassRecord, active: frozenset[str], seen: set[str],
    between: Callable[[], None] | None,
) -> None:
    """While the pass's reservation creates are in flight, the Workloads that came to wait
    on our check meanwhile are decided on the pass's placer, for at most
    `ARRIVALS_SECONDS`, rather than by a next pass once every create is back.

    Why: Kueue reserves a burst's quota a few Workloads at a time, so a pass decided one to
    three of them and then waited out their creates' round trip: at 1,000 nodes the loop
    waited 24.8 s for creates against 8.7 s of solving (bench-e2e, 2026-11-30).

    The placer holds every decision of the pass, so these see what the earlier ones took;
    like the pass's last Workloads, they do not see what changed in the cluster since its
    snapshot. So a Workload whose reservation the store holds (one the watch brought since
    the snapshot, which does not count its GPUs) waits for the next pass."""
    ctx, writes = rec.ctx, rec.writes
    assert writes is not None
    deadline = ctx.clocks.monotonic() + ARRIVALS_SECONDS
    woke = False
    try:
        while writes.entries and (left := deadline - ctx.clocks.monotonic()) > 0:
            if not ctx.signals.wake.is_set():
                idle = time.perf_counter()
                await _first_of(writes.entries[0].task, ctx.signals.wake, left)
                writes.waited += time.perf_counter() - idle
            await writes.room(ctx.metrics)  # the answers back, taken in order
            if not ctx.signals.wake.is_set():
                continue
            ctx.signals.wake.clear()
            woke = True
            arrived, arrivals = await _arrivals(rec, active, seen)
            for wl, check in arrivals:
                if between is not None:
                    between()
                await _place_guarded(arrived, wl, check)
    finally:
        if woke:  # what else those events were about is the next pass's
            ctx.signals.wake.set()


async def _first_of(task: asyncio.Future[Any], event: asyncio.Event, timeout: float) -> None:
    """Wait until `task` is done or `event` is set, at most `timeout` seconds."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, waiter}, timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


async def _arrivals(
    rec: PassRecord, active: frozenset[str], seen: set[str]
) -> tuple[PassRecord, list[tuple[WorkloadView, str]]]:
    """The Workloads waiting on one of our `active` checks that the pass has not looked at
    and that have no reservation in the store, in Kueue's order (each marked seen), with
    the pass's record on the store as it is now (their Jobs are in it)."""
    ctx = rec.ctx
    dump = ctx.store.dump()
    pending, _ = workload_views(ctx, dump, set(active))
    new = [wl for wl in pending if wl.key not in seen]
    seen.update(wl.key for wl in new)
    new = [wl for wl in new if needs_decision(ctx, wl)
           and ctx.store.get(L.KIND_RESOURCE_RESERVATION, wl.reservation_key) is None]
    held = await hold_for_provisioning(
        ctx, new, provisioning_check_names(dump.kind("AdmissionCheck")))
    new = [wl for wl in new if wl.key not in held]
    if not new:
        return rec, []
    unread = await fetch_owner_jobs(ctx, new)  # those whose Job could not be read: next pass
    dump = ctx.store.dump()
    kueue = await asyncio.to_thread(dump.kueue_index)
    arrivals = [(wl, check) for wl in new if wl.key not in unread
                and (check := our_pending_check(wl, ctx)) is not None]
    return replace(rec, dump=dump, kueue=kueue), arrivals


async def _place_guarded(rec: PassRecord, wl: WorkloadView, check: str) -> None:
    try:
        await place_one(rec, wl, check)
    except Exception:  # this Workload waits for the next pass; the others go on
        rec.ctx.metrics.errors.labels("workload").inc()
        log.exception("Workload %s: placing failed; the next pass tries again", wl.key)
