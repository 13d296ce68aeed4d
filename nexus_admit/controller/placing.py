"""The controller's loop: one pass decides everything that changed, in a fixed order.

Who calls it: `operator.py` runs `run_loop` as a background task next to kopf's watches.
Each pass is a short recipe of named steps:

1. `sync_checks`   our AdmissionChecks' Active condition and PlacementConfigs;
2. `sync_lifecycle` release reservations whose attempt is over, mark Bound, expire, Retry
                    gangs a bypassing pod displaced (released capacity is free for step 3);
3. `place_pending` Workloads waiting on our check, in Kueue's order (priority, creation),
                    each solved against one snapshot that already holds the earlier ones.

Gated pods get their slots from the ungater (`ungater.run_ungater`), a task of its own, so a
pod never waits for the solves of a pass. Check writes and Events go out in the background
(`ctx.background`); the loop's next pass does not wait for them (a Workload whose answer is
in flight is marked answered, `_answer`).

Level-triggered: a pass reads only the store (the cluster as watched) and the ledger, so a
repeated or lost event changes nothing, and a restart resumes from the objects. The CP-SAT
solve, the snapshot and the translation run in worker threads so watches, the webhook and
health checks stay responsive.

Per Workload (`place_one`), the order of writes follows ARCHITECTURE §2.7: assume in the
ledger, create the ResourceReservation, then apply the check entry. A refused create (4xx)
forgets the assumption and frees its GPUs; a create whose answer was lost (timeout, 5xx)
keeps its GPUs taken for the rest of the pass, since it may have been made. A failed check
write keeps the assumption: the reservation exists, and the next pass finds it by its
deterministic name and answers from it. A pending Workload's reservation of its current
attempt counts in the snapshot like any other, so no Workload earlier in Kueue's order is
placed on its GPUs; AlreadyExists on create means the reservation in the cluster is the
answer, with its slots, not the ones just solved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from nexus_admit.controller.admissioncheck import sync_checks
from nexus_admit.controller.api import ApiException
from nexus_admit.controller.checks import current_entry, write_check
from nexus_admit.controller.context import Context
from nexus_admit.controller.demand import pending_demands, pending_gpus_by_tier, waiting_workloads
from nexus_admit.controller.events import post_event
from nexus_admit.controller.lifecycle import release, sync_lifecycle
from nexus_admit.controller.metrics import Metrics
from nexus_admit.controller.outcome import (
    CheckState,
    Outcome,
    clip,
    passthrough,
    placed,
    rejected_input,
    unplaced,
)
from nexus_admit.controller.owners import (
    OWNER_KIND,
    fetch_owner_jobs,
    prefetch_owner_jobs,
    prune_owner_jobs,
)
from nexus_admit.controller.preemption import (
    PreemptedVictim,
    announce,
    evict,
    is_drain,
    preempted_victims,
    preempts_annotation,
    progress,
    running_gangs,
    victim_message,
    waiting_message,
)
from nexus_admit.kube import labels as L
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.errors import TranslationError, child, meta, object_key
from nexus_admit.kube.kueue import KueueIndex, tas_pod_sets, tier_claims, workload_tier
from nexus_admit.kube.reservations import (
    attempt_key,
    neighbour_order,
    reservation_is_live,
    reservation_name,
    reservation_object,
    reservation_slots,
    reservation_workload_key,
)
from nexus_admit.model import (
    ClusterSnapshot,
    Gang,
    Placement,
    PlacementConfig,
    Slot,
    SolveStatus,
)
from nexus_admit.placement.preemption import (
    is_borrowed,
    kept_off_is_not_never,
    owners_waiting,
    plan_drain,
    plan_preemption,
    restrict_borrowing,
)
from nexus_admit.placement.sequence import OrderedPlacer
from nexus_admit.placement.tracking import TrackedSnapshot

__all__ = ["place_pending", "reconcile", "run_loop"]

log = logging.getLogger("nexus_admit.placing")

DRAIN_RECHECK_SECONDS = 10.0  # how often a draining gang is solved as if it did not drain


async def run_loop(ctx: Context) -> None:
    """Run a pass whenever something changed, and at least every tick (TTLs, holds)."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.wake.wait(), timeout=ctx.options.tick_seconds)
        ctx.wake.clear()
        if not ctx.synced or not ctx.acting():
            continue  # a follower keeps its store warm and decides nothing
        started = time.perf_counter()
        lifecycle = _lifecycle_due(ctx)
        # a task of its own, so losing the lease can cancel the pass mid-way
        ctx.pass_task = asyncio.create_task(
            reconcile(ctx, lifecycle=lifecycle, drain=False), name="reconcile-pass"
        )
        await asyncio.wait({ctx.pass_task})
        task, ctx.pass_task = ctx.pass_task, None
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


# In a burst, events arrive faster than passes end and every pass would walk every
# reservation and its pods again; the placing step needs no fresher view of them than this
# (a released attempt's capacity waits at most this long)
LIFECYCLE_EVERY_SECONDS = 1.0


def _lifecycle_due(ctx: Context) -> bool:
    """Does this pass include the reservation lifecycle? When not, a wake-up is set for
    when it is due, so a change that comes in between is still acted on then."""
    now = time.monotonic()
    due = ctx.lifecycle_synced + LIFECYCLE_EVERY_SECONDS
    if now >= due:
        ctx.lifecycle_synced = now
        return True
    if not ctx.lifecycle_wake_set:
        ctx.lifecycle_wake_set = True

        def wake() -> None:
            ctx.lifecycle_wake_set = False
            ctx.wake.set()

        asyncio.get_running_loop().call_later(due - now, wake)
    return False


async def reconcile(ctx: Context, *, lifecycle: bool = True, drain: bool = True) -> None:
    """One pass. `drain`: wait for the check writes and Events it started (tests, and
    anything that reads the cluster right after); the loop does not, so the next pass
    places the Workloads Kueue reserved meanwhile one round trip sooner."""
    try:
        await sync_checks(ctx)
        if lifecycle:
            await sync_lifecycle(ctx)
        await place_pending(ctx)
        await record_capacity(ctx)
    finally:
        if drain:
            await ctx.background.drain()


CAPACITY_EVERY_SECONDS = 15.0


async def record_capacity(ctx: Context) -> None:
    """GPUs free / held by reservations / taken by bound pods, and pristine 8-GPU nodes, at
    most every 15 s and in a thread (two snapshots of a large fleet are not free)."""
    tick = time.monotonic()
    if tick - ctx.capacity_recorded < CAPACITY_EVERY_SECONDS:
        return
    ctx.capacity_recorded = tick
    await asyncio.to_thread(_record_capacity, ctx, ctx.store.dump())


def _record_capacity(ctx: Context, dump: ClusterDump) -> None:
    try:
        with_rr = dump.snapshot(now=ctx.clock())
        pods_only = ClusterDump(
            by_kind={k: v for k, v in dump.by_kind.items() if k != L.KIND_RESOURCE_RESERVATION}
        ).snapshot(now=ctx.clock())
    except TranslationError:
        return  # reported by place_pending when it matters
    free = sum(sum(n.gpu_free) for n in with_rr) / 1000
    after_pods = sum(sum(n.gpu_free) for n in pods_only) / 1000
    total = sum(n.gpu_count for n in with_rr)
    ctx.metrics.gpus.labels("free").set(free)
    ctx.metrics.gpus.labels("reserved").set(after_pods - free)
    ctx.metrics.gpus.labels("bound").set(total - after_pods)
    for tier, gpus in pending_gpus_by_tier(dump, ctx.checks).items():
        ctx.metrics.pending_gpus.labels(tier).set(gpus)
    ctx.metrics.pristine_islands.set(
        sum(1 for n in with_rr if n.gpu_count >= 8 and n.is_pristine())
    )


def _our_pending_check(workload: Mapping[str, Any], ctx: Context) -> str | None:
    """The name of our check this Workload waits on (Pending), if any."""
    status = child(workload, "status")
    for entry in status.get("admissionChecks") or []:
        if (
            isinstance(entry, Mapping)
            and entry.get("name") in ctx.checks
            and entry.get("state") == "Pending"
        ):
            return str(entry["name"])
    return None


async def place_pending(ctx: Context) -> None:
    active = {n for n, v in ctx.checks.items() if v.config is not None}
    if not active:
        return
    prune_owner_jobs(ctx)
    dump = ctx.store.dump()
    pending = dump.pending_workloads(active)
    # the Jobs of Workloads still waiting for quota in our queues are read ahead
    placing_now = {object_key(w) for w in pending}
    prefetch_owner_jobs(
        ctx,
        (w for w, _ in waiting_workloads(dump, active) if object_key(w) not in placing_now),
    )
    # their Jobs, read on demand (not watched); a Workload whose Job could not be read waits
    unread = await fetch_owner_jobs(ctx, pending)
    if ctx.store.items(OWNER_KIND) != dump.kind(OWNER_KIND):
        dump = ctx.store.dump()
    # answers the watch has shown (the check left Pending, or a new attempt) need no guard
    waiting = {str(meta(w).get("uid")): attempt_key(w) for w in pending}
    ctx.answered = {u: a for u, a in ctx.answered.items() if waiting.get(u) == a}
    stored = {object_key(r) for r in ctx.store.items(L.KIND_RESOURCE_RESERVATION)}
    tick = time.monotonic()
    ctx.drain_checked = {k: t for k, t in ctx.drain_checked.items() if k in stored}
    ctx.ledger.new_pass()
    # an assumption ends once the snapshot counts its reservation, or when two full
    # re-lists have not brought it (released, or never made: a failed pass must not leave
    # its Workload waiting on it for ever)
    ctx.ledger.settle(
        lambda a: a.reservation in stored or tick - a.since > 2 * ctx.options.resync_seconds
    )
    if not any(
        _our_pending_check(w, ctx) is not None and _needs_decision(ctx, w)
        for w in pending
        if object_key(w) not in unread
    ):
        # every one is answered already (the watch has not shown it) or waits for its Job:
        # a pass for each of their events would rebuild the snapshot of the whole fleet
        return
    now = ctx.clock()
    # a pending Workload's reservation of this very attempt (we died or failed before its
    # Ready) holds capacity for every Workload of the pass, also those earlier in order;
    # older attempts' reservations are released by lifecycle before this step
    unreserved = frozenset(
        object_key(w)
        for w in pending
        if f"{meta(w).get('namespace') or 'default'}/{reservation_name(w)}" not in stored
    )
    # the translation of a large fleet takes a while: in a thread, so the webhook and the
    # watches keep being served (the store's objects are replaced, never changed in place)
    try:
        snapshot = await asyncio.to_thread(dump.snapshot, exclude_workloads=unreserved, now=now)
    except TranslationError as e:
        # a malformed Node or reservation: nothing can be placed safely until it is fixed
        ctx.metrics.errors.labels("snapshot").inc()
        log.error("cannot build the cluster snapshot, no placement this pass: %s", e)
        return
    # tracked: the engine keeps what it derived of each node between this pass's Workloads
    # and re-reads only the nodes the pass's own placements changed
    placer = OrderedPlacer(ctx.engine, TrackedSnapshot(snapshot.nodes, snapshot.kueue_topologies))
    ctx.ledger.hold_in(placer)
    kueue = await asyncio.to_thread(dump.kueue_index)
    demands = await asyncio.to_thread(pending_demands, dump, ctx.checks)
    writes = WritePipeline(placer)
    try:
        for wl in pending:
            check = _our_pending_check(wl, ctx)
            if check is None or object_key(wl) in unread:
                continue
            await place_one(ctx, dump, kueue, placer, wl, check, now, demands, writes,
                            unreserved)
    finally:
        await writes.flush(ctx.metrics)


def _needs_decision(ctx: Context, workload: Mapping[str, Any]) -> bool:
    """Is there anything to decide for this pending Workload? Not when its answer is
    written (or going out), nor when its reservation was created in this run and the watch
    has not brought it yet (its check is written again once it does). `place_pending` asks
    before it builds the snapshot, `place_one` before anything else."""
    if _already_answered(ctx, workload):
        return False
    rr_key = f"{meta(workload).get('namespace') or 'default'}/{reservation_name(workload)}"
    return not (
        rr_key in ctx.ledger.assumed
        and ctx.store.get(L.KIND_RESOURCE_RESERVATION, rr_key) is None
    )


def _already_answered(ctx: Context, workload: Mapping[str, Any]) -> bool:
    uid = str(meta(workload).get("uid") or "")
    return bool(uid) and ctx.answered.get(uid) == attempt_key(workload)


def _levels(config: PlacementConfig, snapshot: ClusterSnapshot) -> tuple[str, ...]:
    return config.resolve_levels(snapshot.kueue_topologies)


async def place_one(
    ctx: Context,
    dump: ClusterDump,
    kueue: KueueIndex,
    placer: OrderedPlacer,
    workload: dict[str, Any],
    check: str,
    now: datetime,
    demands: Sequence[tuple[str, int]] = (),
    writes: WritePipeline | None = None,
    unreserved: frozenset[str] = frozenset(),
) -> None:
    """Decide and write the answer for one Workload (steps 1-5 below). `demands`: (tier,
    GPU milli) of every waiting Workload, for backfill. `writes`: where the reservation and
    check writes of a feasible placement go, to overlap the next Workload's solve (awaited
    here when None). `unreserved`: the Workloads whose reservations the pass's snapshot
    leaves out (see `place_pending`)."""
    snapshot = placer.snapshot
    if not _needs_decision(ctx, workload):
        return
    ns = str(meta(workload).get("namespace") or "default")
    name = reservation_name(workload)
    existing = ctx.store.get(L.KIND_RESOURCE_RESERVATION, f"{ns}/{name}")
    config = ctx.checks[check].config
    assert config is not None  # only active checks reach here

    # 1. translate; malformed input is the user's to fix
    try:
        gang = await asyncio.to_thread(dump.gang, workload, config, snapshot, kueue, now=now)
    except TranslationError as e:
        await _answer(ctx, workload, check, rejected_input(e))
        return
    claims = tier_claims(workload)
    if claims:  # tenants cannot pick their tier: say so once per quota reservation
        await asyncio.to_thread(
            post_event,
            ctx.api,
            workload,
            "TierClaimIgnored",
            f"ignored {', '.join(claims)}: the tier comes only from the ClusterQueue label "
            f"{L.LABEL_TIER}; this Workload is placed as tier {gang.tier}",
            event_type="Warning",
            now=now,
        )
    # 2. Kueue TAS flavors: Kueue chose the hosts already
    tas = tas_pod_sets(workload, kueue)
    if tas:
        await _answer(ctx, workload, check, passthrough(tas))
        return
    levels = _levels(config, snapshot)
    # 3. a reservation of this attempt exists (we crashed, or the check write failed):
    #    hold its capacity and answer from it, never solve twice
    if existing is not None:  # the snapshot counts it already (see place_pending)
        victims = preempted_victims(existing)
        if (
            victims
            and is_drain(existing)
            and config.preemption.enabled
            and _drain_check_due(ctx, existing)
            and not (await progress(ctx, existing, victims, config, now)).done
        ):
            # a drain waits only while the gang fits nowhere else
            kept = _backfilled(snapshot, gang, config, demands)
            moved = await _off_the_drain(ctx, dump, placer, workload, kept, existing, config,
                                         now, unreserved)
            if moved is not None:
                await _answer(ctx, workload, check, placed(moved, kept, name, snapshot, levels))
                return
        if victims and not await _preemption_done(ctx, workload, check, existing, victims,
                                                  config, now):
            return
        placement = _placement_of(existing, gang)
        await _answer(ctx, workload, check, placed(placement, gang, name, snapshot, levels))
        return
    # 4. solve off the event loop; a feasible answer takes its capacity in the snapshot.
    #    Backfill: a lower tier keeps off hardware whose owning tier has a Workload waiting
    #    that it could hold
    asked = gang
    gang = _backfilled(snapshot, gang, config, demands)
    placement = await _solve(ctx, placer, gang, config)
    if writes is not None and await writes.flush(ctx.metrics) and placement.feasible:
        # the previous Workload's write found an earlier reservation of its own, on other
        # slots than solved: this solve may have used those; solve again with them held
        placer.undo(gang, tuple(placement.slots))
        placement = await _solve(ctx, placer, gang, config)
    if gang is not asked:
        placement = kept_off_is_not_never(
            snapshot, asked, placement, config,
            "kept off the hardware a waiting higher tier owns (preemption.backfill)",
        )
    if not placement.feasible and placement.retryable and config.preemption.enabled:
        through = await _through_drains(ctx, dump, kueue, placer, workload, gang, config, now,
                                        unreserved)
        if through is not None:
            # held clamped over the drain's hold: written at once, never given back this pass
            reserved = await _reserve(ctx, placer, workload, gang, through, config, now,
                                      over=True)
            if reserved is not None:
                await _answer(ctx, workload, check, placed(reserved, gang, name, snapshot, levels))
            return
    if not placement.feasible:
        if placement.retryable and await _preempt(
            ctx, dump, kueue, placer, workload, check, gang, config, now
        ):
            return
        retries = int(current_entry(workload, check).get("retryCount") or 0)
        await _answer(ctx, workload, check, unplaced(placement, retries, ctx.options.retry_seconds))
        return
    ctx.faults.hit("kill-after-solve")
    # 5. assume, reserve, answer: the writes overlap the next Workload's solve
    body = _assume(ctx, placer, workload, gang, placement, config, now)
    commit = _commit(ctx, snapshot, workload, check, gang, placement, body, levels)
    if writes is None:
        _settle(placer, await commit)
    else:
        writes.start(commit)


def _backfilled(
    snapshot: ClusterSnapshot,
    gang: Gang,
    config: PlacementConfig,
    demands: Sequence[tuple[str, int]],
) -> Gang:
    """`gang` kept off the hardware whose owning tier has a Workload waiting that it could
    hold (backfill; only with preemption on)."""
    if not config.preemption.enabled:
        return gang
    return restrict_borrowing(snapshot, gang, config, owners_waiting(snapshot, config, demands))


async def _commit(
    ctx: Context,
    snapshot: ClusterSnapshot,
    workload: Mapping[str, Any],
    check: str,
    gang: Gang,
    placement: Placement,
    body: dict[str, Any],
    levels: Sequence[str],
) -> Reserved:
    """Create the reservation, then write the check Ready from what it holds. The check
    write goes out in the background (not awaited by the loop): only the create
    settles capacity, so the next decision waits for one round trip, not two. A check
    write that fails is written again from the reservation by the next pass."""
    reserved = await _create_reservation(ctx, snapshot, workload, gang, placement, body)
    if reserved.placement is not None:
        ctx.faults.hit("kill-after-reservation")
        name = reservation_name(workload)
        outcome = placed(reserved.placement, gang, name, snapshot, levels)
        ctx.background.spawn(_answer(ctx, workload, check, outcome), name="check-write")
    return reserved


@dataclass(slots=True)
class Reserved:
    """What a reservation write came back with. The placer's snapshot is settled from it
    by the loop (`_settle`), never by the write itself: a solve may be reading it then."""

    gang: Gang
    solved: tuple[Slot, ...]  # the slots the placer holds for it
    over: bool  # held clamped on top of what runs there: never given back in this pass
    placement: Placement | None  # what the reservation holds; None: no answer this pass
    give_back: bool = False  # nothing holds the solved slots: they are free again
    found: tuple[Slot, ...] | None = None  # an earlier decision's reservation holds these


def _settle(placer: OrderedPlacer, reserved: Reserved) -> bool:
    """Make the placer's snapshot hold what the write found; True when it now holds slots
    that a solve made since the write started did not see as taken."""
    if reserved.give_back and not reserved.over:
        placer.undo(reserved.gang, reserved.solved)
    if reserved.found is None:
        return False
    if not reserved.over:
        placer.undo(reserved.gang, reserved.solved)
    placer.hold(reserved.gang, reserved.found, over=reserved.over)
    return True


class WritePipeline:
    """At most one feasible placement's writes in flight while the next Workload is solved
    (two apiserver round trips hidden behind each solve). The placer's capacity is settled
    from the finished write before the next decision is used (`flush`), so Kueue's order
    and the one-snapshot rule hold as if the writes had been awaited in turn."""

    def __init__(self, placer: OrderedPlacer) -> None:
        self.placer = placer
        self.task: asyncio.Task[Reserved] | None = None

    def start(self, commit: Coroutine[Any, Any, Reserved]) -> None:
        assert self.task is None, "flush() before starting the next write"
        self.task = asyncio.create_task(commit, name="reservation-write")

    async def flush(self, metrics: Metrics | None = None) -> bool:
        """Wait for the write in flight, if any, and settle the placer from it; True when
        the solves made meanwhile may have used capacity it turned out to hold. `metrics`:
        record how long the wait was (the part of the create's round trip the solve did
        not hide)."""
        task, self.task = self.task, None
        if task is None:
            return False
        started = time.perf_counter()
        reserved = await task
        if metrics is not None:
            metrics.reservation_wait_seconds.observe(time.perf_counter() - started)
        return _settle(self.placer, reserved)


def _assume(
    ctx: Context,
    placer: OrderedPlacer,
    workload: Mapping[str, Any],
    gang: Gang,
    placement: Placement,
    config: PlacementConfig,
    now: datetime,
    annotations: Mapping[str, str] | None = None,
    mode: str | None = None,
) -> dict[str, Any]:
    """Assume the placement in the ledger (its capacity is taken in `placer` already) and
    return its reservation's body."""
    snapshot = placer.snapshot
    key = object_key(workload)
    ns = str(meta(workload).get("namespace") or "default")
    name = reservation_name(workload)
    rr_key = f"{ns}/{name}"
    levels = _levels(config, snapshot)
    placement.slots = neighbour_order(placement.slots, snapshot, levels)
    slots = tuple(placement.slots)
    borrowed = config.preemption.enabled and is_borrowed(snapshot, gang, slots, config)
    if borrowed:
        placement.explanation.append(
            f"borrowed: runs on hardware a tier above {gang.tier} owns, and may be preempted "
            "when that tier needs it"
        )
    ctx.ledger.assume(rr_key, key, gang, slots, time.monotonic())
    expires = now + timedelta(seconds=config.reservation_ttl_seconds)
    body = reservation_object(
        name=name, workload=workload, gang=gang, placement=placement, expires_at=expires
    )
    body["metadata"]["annotations"].update(annotations or {})
    # what `kubectl get rr` shows in its Mode column
    body["spec"]["decision"]["mode"] = mode or ("borrowed" if borrowed else "placed")
    if borrowed:
        body["metadata"]["labels"] = {L.LABEL_BORROWED: "true"}
    return body


async def _create_reservation(
    ctx: Context,
    snapshot: ClusterSnapshot,
    workload: Mapping[str, Any],
    gang: Gang,
    placement: Placement,
    body: Mapping[str, Any],
    over: bool = False,
) -> Reserved:
    """Create the reservation `_assume` made; what it holds, for `_settle`."""
    key = object_key(workload)
    ns = str(meta(workload).get("namespace") or "default")
    name = reservation_name(workload)
    rr_key = f"{ns}/{name}"
    slots = tuple(placement.slots)
    try:
        created = await asyncio.to_thread(ctx.api.create, L.KIND_RESOURCE_RESERVATION, body)
    except Exception as e:  # urllib3 raises its own errors (MaxRetryError) in an outage
        if _refused(e):
            ctx.ledger.forget(rr_key)
        else:
            ctx.ledger.lost(rr_key)
        ctx.metrics.errors.labels("reserve").inc()
        log.warning("Workload %s: could not create reservation %s: %s", key, rr_key, e)
        # refused: nothing was written, the capacity is free again; else the answer was
        # lost (timeout, 5xx, dropped connection) and the reservation may exist: its slots
        # stay taken for the rest of this pass, and the next pass finds it (or
        # AlreadyExists) and answers from it
        return Reserved(gang, slots, over, None, give_back=_refused(e))
    if created:
        return Reserved(gang, slots, over, placement)
    # a decision of this attempt was written before (a create that timed out, a store that
    # lags): that reservation is the answer, and its slots are what it holds
    log.info("Workload %s: reservation %s already existed (a repeated decision)", key, rr_key)
    try:
        found = await asyncio.to_thread(ctx.api.get, L.KIND_RESOURCE_RESERVATION, name, ns)
    except Exception as e:  # what it holds is unknown: the solved slots stay taken
        ctx.ledger.lost(rr_key)
        log.warning("Workload %s: could not read reservation %s: %s", key, rr_key, e)
        return Reserved(gang, slots, over, None)
    ctx.ledger.forget(rr_key)
    if found is None:  # deleted meanwhile: the next pass decides afresh
        return Reserved(gang, slots, over, None, give_back=True)
    held = _placement_of(found, gang)
    kept = tuple(s for s in held.slots if s.node in snapshot.nodes)
    ctx.ledger.assume(rr_key, key, gang, kept, time.monotonic())
    return Reserved(gang, slots, over, held, found=kept)


async def _reserve(
    ctx: Context,
    placer: OrderedPlacer,
    workload: Mapping[str, Any],
    gang: Gang,
    placement: Placement,
    config: PlacementConfig,
    now: datetime,
    annotations: Mapping[str, str] | None = None,
    over: bool = False,
    mode: str | None = None,
) -> Placement | None:
    """Assume the placement (its capacity is taken in `placer` already), create its
    reservation, and return what the reservation holds (the placement, or the one an earlier
    decision of this attempt wrote); None when nothing can be answered this pass. `over`:
    the capacity was held on top of what still runs there (a drain), so it is never given
    back in this pass: a clamped hold cannot be undone exactly."""
    body = _assume(ctx, placer, workload, gang, placement, config, now, annotations, mode)
    reserved = await _create_reservation(ctx, placer.snapshot, workload, gang, placement, body,
                                         over)
    _settle(placer, reserved)
    return reserved.placement


async def _preempt(
    ctx: Context,
    dump: ClusterDump,
    kueue: KueueIndex,
    placer: OrderedPlacer,
    workload: Mapping[str, Any],
    check: str,
    gang: Gang,
    config: PlacementConfig,
    now: datetime,
) -> bool:
    """Evict the cheapest allowed victims in one domain so that `gang` fits there (see
    controller/preemption.py); True when the preemption was started (the reservation holds
    the capacity, the victims are sent through Retry, the check says so)."""
    if not config.preemption.enabled:
        return False
    if not config.evictable_tiers(gang.tier):
        return await _drain(ctx, dump, kueue, placer, workload, check, gang, config, now)
    running, reservations = running_gangs(ctx, dump, placer.snapshot, kueue, config, now)
    running = [r for r in running if r.name != gang.name]
    if not running:
        return False
    loop = asyncio.get_running_loop()
    plan = await loop.run_in_executor(
        ctx.solver, plan_preemption, ctx.engine, placer.snapshot, gang, running, config
    )
    if plan is None:
        return await _drain(ctx, dump, kueue, placer, workload, check, gang, config, now)
    victims = [PreemptedVictim(v.name, reservations[v.name]) for v in plan.victims]
    by_name = {r.name: r for r in running}
    # the victims' capacity goes to the preemptor for the rest of this pass
    for v in plan.victims:
        placer.undo(by_name[v.name].gang, by_name[v.name].slots)
    placer.hold(gang, tuple(plan.placement.slots))
    reserved = await _reserve(
        ctx, placer, workload, gang, plan.placement, config, now,
        annotations={L.ANN_PREEMPTS: preempts_annotation(victims)},
        mode="preempting",
    )
    if reserved is None:
        # they keep running; a create whose answer was lost keeps the preemptor's slots
        # taken too, so theirs come back clamped on top
        for v in plan.victims:
            placer.hold(by_name[v.name].gang, by_name[v.name].slots, over=True)
        return True  # the next pass decides again; nothing was evicted
    ctx.metrics.preemptions.labels("preemptor").inc()
    message = victim_message(gang, plan)
    for preempted in victims:
        victim = ctx.store.get("Workload", preempted.workload)
        if victim is not None:
            await evict(ctx, victim, message, now)
    rr_key = f"{meta(workload).get('namespace') or 'default'}/{reservation_name(workload)}"
    await announce(ctx, workload, f"{plan.describe()}; reservation {rr_key}", now)
    await _pending(ctx, workload, check, waiting_message(rr_key, plan.describe(), len(victims)))
    return True


async def _drain(
    ctx: Context,
    dump: ClusterDump,
    kueue: KueueIndex,
    placer: OrderedPlacer,
    workload: Mapping[str, Any],
    check: str,
    gang: Gang,
    config: PlacementConfig,
    now: datetime,
) -> bool:
    """Drain-to-fit (`preemption.drainAfterSeconds`): a gang that has waited that long gets
    the domain freest now on the nodes it needs; its reservation, written at once, holds
    those GPUs as the Workloads there finish (nothing is evicted), so new placements avoid
    them. True when a drain was started."""
    after = config.preemption.drain_after_seconds
    if after is None or gang.waited_seconds < after:
        return False
    running, reservations = running_gangs(ctx, dump, placer.snapshot, kueue, config, now)
    running = [r for r in running if r.name != gang.name]
    loop = asyncio.get_running_loop()
    plan = await loop.run_in_executor(
        ctx.solver, plan_drain, ctx.engine, placer.snapshot, gang, running, config
    )
    if plan is None:
        return False
    waited_for = [PreemptedVictim(v.name, reservations[v.name]) for v in plan.victims]
    # the Workloads waited for keep running: the drain's slots come on top of theirs
    placer.hold(gang, tuple(plan.placement.slots), over=True)
    reserved = await _reserve(
        ctx, placer, workload, gang, plan.placement, config, now,
        annotations={L.ANN_PREEMPTS: preempts_annotation(waited_for), L.ANN_DRAIN: "true"},
        over=True,
        mode="draining",
    )
    if reserved is None:
        return True
    ctx.metrics.preemptions.labels("drain").inc()
    rr_key = f"{meta(workload).get('namespace') or 'default'}/{reservation_name(workload)}"
    text = plan.placement.explanation[-1]
    await announce(ctx, workload, f"{text}; reservation {rr_key}", now)
    await _pending(ctx, workload, check, waiting_message(rr_key, text, len(waited_for)))
    return True


async def _through_drains(
    ctx: Context,
    dump: ClusterDump,
    kueue: KueueIndex,
    placer: OrderedPlacer,
    workload: Mapping[str, Any],
    gang: Gang,
    config: PlacementConfig,
    now: datetime,
    unreserved: frozenset[str],
) -> Placement | None:
    """A drain never makes a Workload of a higher tier wait that has no place off the
    drain's slots (the drained gang would hold up a higher priority): solve again as if
    no such drain held capacity. When that places the gang on a drain's slots the drain
    is withdrawn (its reservation released, with an Event; its Workload drains again on
    its next pass) and the placement returned, its capacity held in `placer`; None
    otherwise. The second snapshot is the pass's one rebuilt without those drains, with
    everything this run has promised held again, so it is never freer than the pass's
    snapshot anywhere else."""
    own = object_key(workload)
    drains = {
        object_key(rr): rr
        for rr in ctx.store.items(L.KIND_RESOURCE_RESERVATION)
        if is_drain(rr)
        and reservation_is_live(rr, now)
        and reservation_workload_key(rr) != own
        and _yields_to(ctx, kueue, rr, gang, config)
    }
    if not drains:
        return None
    draining = frozenset(reservation_workload_key(rr) for rr in drains.values())
    placement = await _solve_without(ctx, dump, gang, config, now, unreserved | draining,
                                     frozenset(drains))
    if placement is None:
        return None
    used = {s.node for s in placement.slots}
    crossed = [rr for rr in drains.values() if any(s.node in used for s in reservation_slots(rr))]
    if not crossed:
        return None  # its lack of room was not the drains'
    for rr in crossed:
        drained = ctx.store.get("Workload", reservation_workload_key(rr))
        reason = (
            f"drain withdrawn: Workload {own} (tier {gang.tier}) had no place off its "
            "nodes and is placed there; this Workload drains again on its next pass"
        )
        if not await release(ctx, rr, drained, reason, now):
            return None
        ctx.ledger.forget(object_key(rr))
        ctx.metrics.preemptions.labels("drain-yielded").inc()
    placer.hold(gang, tuple(placement.slots), over=True)
    names = ", ".join(reservation_workload_key(rr) for rr in crossed)
    placement.explanation.append(
        f"placed on nodes drained for {names}: no place off them; the drain was withdrawn"
    )
    return placement


async def _solve_without(
    ctx: Context,
    dump: ClusterDump,
    gang: Gang,
    config: PlacementConfig,
    now: datetime,
    workloads: frozenset[str],
    reservations: frozenset[str],
) -> Placement | None:
    """Solve `gang` on a second snapshot of the pass: the pass's objects without the
    reservations of `workloads`, with everything this run has promised held again but
    `reservations`. Never freer than the pass's snapshot but where those reservations
    were. The feasible placement (taking nothing in the pass's placer), else None."""
    try:
        bare = await asyncio.to_thread(dump.snapshot, exclude_workloads=workloads, now=now)
    except TranslationError:
        return None  # the pass's snapshot was built from the same objects: not reached
    side = OrderedPlacer(ctx.engine, TrackedSnapshot(bare.nodes, bare.kueue_topologies))
    ctx.ledger.hold_in(side, skip=reservations)
    placement = await _solve(ctx, side, gang, config)
    return placement if placement.feasible else None


def _drain_check_due(ctx: Context, rr: Mapping[str, Any]) -> bool:
    """At most one solve without a drain per DRAIN_RECHECK_SECONDS: each rebuilds the
    fleet's snapshot, and passes come on every event; a drain waits minutes to hours."""
    key, tick = object_key(rr), time.monotonic()
    if tick - ctx.drain_checked.get(key, float("-inf")) < DRAIN_RECHECK_SECONDS:
        return False
    ctx.drain_checked[key] = tick
    return True


async def _off_the_drain(
    ctx: Context,
    dump: ClusterDump,
    placer: OrderedPlacer,
    workload: Mapping[str, Any],
    gang: Gang,
    rr: Mapping[str, Any],
    config: PlacementConfig,
    now: datetime,
    unreserved: frozenset[str],
) -> Placement | None:
    """A draining gang that fits now without its drain (elsewhere, or where Workloads it
    waited for have left) is placed at once: the draining reservation is released and one
    with the new placement written under the same name. What the new reservation holds,
    or None when it still has to wait (or a write failed: the next pass looks again)."""
    rr_key = object_key(rr)
    placement = await _solve_without(
        ctx, dump, gang, config, now, unreserved | {object_key(workload)}, frozenset({rr_key})
    )
    if placement is None:
        return None
    if not await release(ctx, rr, workload, "drain ended: the gang fits now without it", now):
        return None
    ctx.ledger.forget(rr_key)
    ctx.metrics.preemptions.labels("drain-moved").inc()
    # the pass's placer still holds the drain's slots, clamped: this comes on top
    placer.hold(gang, tuple(placement.slots), over=True)
    placement.explanation.append(
        "placed before its drain ended: it fits now without waiting for the Workloads the "
        "drain waited for"
    )
    return await _reserve(ctx, placer, workload, gang, placement, config, now, over=True)


def _yields_to(
    ctx: Context, kueue: KueueIndex, rr: Mapping[str, Any], gang: Gang, config: PlacementConfig
) -> bool:
    """Whether the drain `rr` gives way to `gang`: its Workload still waits on our check in
    the attempt the reservation is for, unanswered (a drain that ended in a Ready answer,
    also one the watch has not shown yet, holds a running gang's slots), and `gang` is of
    a higher tier. A drain is kept against its own and lower tiers, so a stream of their
    small jobs cannot starve the gang it drains for."""
    drained = ctx.store.get("Workload", reservation_workload_key(rr))
    if (
        drained is None
        or _our_pending_check(drained, ctx) is None
        or _already_answered(ctx, drained)
        or meta(rr).get("name") != reservation_name(drained)
    ):
        return False
    try:
        tier = workload_tier(drained, kueue, config)
    except TranslationError:
        return False
    return config.tier_rank(gang.tier) < config.tier_rank(tier)


async def _preemption_done(
    ctx: Context,
    workload: Mapping[str, Any],
    check: str,
    rr: Mapping[str, Any],
    victims: list[PreemptedVictim],
    config: PlacementConfig,
    now: datetime,
) -> bool:
    """True once every victim has left (answer Ready from the reservation); meanwhile the
    check stays Pending with how many are left, and after the grace period the preemption is
    given up (reservation released, Retry)."""
    state = await progress(ctx, rr, victims, config, now)
    if state.done:
        return True
    rr_key = object_key(rr)
    if state.expired:
        try:
            ns, _, name = rr_key.partition("/")
            await asyncio.to_thread(ctx.api.delete, L.KIND_RESOURCE_RESERVATION, name, ns)
        except Exception as e:
            ctx.metrics.errors.labels("release").inc()
            log.warning("could not release reservation %s: %s", rr_key, e)
            return False
        ctx.store.delete(L.KIND_RESOURCE_RESERVATION, rr)
        ctx.metrics.preemptions.labels("given-up").inc()
        grace = config.preemption.grace_period_seconds
        await _answer(ctx, workload, check, Outcome(
            CheckState.RETRY,
            clip(f"preemption given up: {state.left} evicted Workload(s) still held capacity "
                 f"after gracePeriodSeconds {grace:.0f}; reservation {rr_key} released"),
            "PlacementRetry",
            "Warning",
            requeue_after_seconds=ctx.options.retry_seconds,
        ))
        return False
    explanation = child(child(rr, "spec"), "decision").get("explanation")
    plan_text = str(explanation[-1]) if isinstance(explanation, list) and explanation else ""
    await _pending(ctx, workload, check, waiting_message(rr_key, plan_text, state.left))
    return False


async def _pending(ctx: Context, workload: Mapping[str, Any], check: str, message: str) -> None:
    """Keep the check Pending with `message` (written only when it changes); the Workload is
    not marked answered, so the next pass looks at it again."""
    if current_entry(workload, check).get("message") == message:
        return
    outcome = Outcome(CheckState.PENDING, message, "Preempting")
    try:
        await write_check(ctx, workload, check, outcome)
    except Exception as e:
        ctx.metrics.errors.labels("check").inc()
        log.warning("Workload %s: could not write check %s: %s", object_key(workload), check, e)


def _refused(e: BaseException) -> bool:
    """The apiserver answered 4xx: the write certainly did not happen."""
    status = getattr(e, "status", None)
    return isinstance(e, ApiException) and isinstance(status, int) and 400 <= status < 500


async def _solve(
    ctx: Context, placer: OrderedPlacer, gang: Gang, config: PlacementConfig
) -> Placement:
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    placement = await loop.run_in_executor(ctx.solver, placer.place, gang, config)
    outcome = "feasible" if placement.feasible else placement.status.value
    ctx.metrics.solve_seconds.labels(outcome).observe(time.perf_counter() - started)
    return placement


async def _answer(ctx: Context, workload: Mapping[str, Any], check: str, outcome: Outcome) -> None:
    # claimed before the write: a pass that starts while it is in flight (the loop does not
    # wait for the writes of the pass before) must not answer, nor post its Event, again
    uid = str(meta(workload).get("uid") or "")
    attempt = attempt_key(workload)
    if uid:
        ctx.answered[uid] = attempt
    try:
        await write_check(ctx, workload, check, outcome)
    except Exception as e:  # ApiException, OSError, urllib3's own: written again next pass
        if uid and ctx.answered.get(uid) == attempt:
            del ctx.answered[uid]
        ctx.metrics.errors.labels("check").inc()
        log.warning("Workload %s: could not write check %s: %s", object_key(workload), check, e)


def _placement_of(rr: Mapping[str, Any], gang: Gang) -> Placement:
    """The decision a reservation records, as a Placement (for re-writing its check)."""
    spec = child(rr, "spec")
    decision = child(spec, "decision")
    explanation = decision.get("explanation")
    slots = [Slot(s.pod_set, s.index, s.node, s.gpus, s.numa_zone) for s in reservation_slots(rr)]
    return Placement(
        gang=gang.name,
        policy=str(decision.get("policy") or "nexus"),
        feasible=True,
        status=SolveStatus.FEASIBLE,
        slots=slots,
        explanation=[str(x) for x in explanation] if isinstance(explanation, list) else [],
    )
