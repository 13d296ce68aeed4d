"""The writes of a decision, in ARCHITECTURE's order: assume in the ledger, create the
ResourceReservation, then apply the check entry.

A refused create (4xx) forgets the assumption, frees its GPUs and answers the Workload
Retry with the apiserver's reason (a missing permission, a quota, an object too large:
an admin fixes it, Kueue requeues with backoff); a create whose answer was lost (timeout,
5xx) keeps its GPUs taken for the rest of the pass, since it may have been made. A failed
check write keeps the assumption: the reservation exists, and the next pass finds it by its
deterministic name and answers from it. AlreadyExists on create means the reservation in
the cluster is the answer, with its slots, not the ones just solved.

The Workload comes as its view (`kube/views.py`: key, uid, attempt, reservation name, check
entries); its object (`raw`) is read only to translate it into the reservation's body.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nexus_admit.controller.api import ApiException
from nexus_admit.controller.context import Context
from nexus_admit.controller.outcome import (
    CheckState,
    Outcome,
    clip,
    placed,
    retry,
    retry_backoff_seconds,
)
from nexus_admit.controller.workload_check import write_check
from nexus_admit.kube import labels as L
from nexus_admit.kube.crds import MAX_RESERVATION_SLOTS
from nexus_admit.kube.errors import child
from nexus_admit.kube.kueue import entry_retry_count
from nexus_admit.kube.reservations import (
    neighbour_order,
    reservation_object,
    reservation_slots,
)
from nexus_admit.kube.views import WorkloadView
from nexus_admit.model import ClusterSnapshot, Gang, Placement, PlacementConfig, Slot, SolveStatus
from nexus_admit.placement.preemption import is_borrowed
from nexus_admit.placement.sequence import OrderedPlacer

__all__ = [
    "MAX_RESERVATION_BYTES",
    "Answered",
    "Reserved",
    "answer",
    "answer_refused",
    "assume",
    "commit",
    "create_reservation",
    "keep_pending",
    "placement_of",
    "reserve",
    "settle",
]

log = logging.getLogger(__name__)

# etcd refuses objects over 1.5 MiB; leave room for metadata the apiserver adds
MAX_RESERVATION_BYTES = 1_400_000


@dataclass(slots=True)
class Reserved:
    """What a reservation write came back with. The placer's snapshot is settled from it
    by the loop (`settle`), never by the write itself: a solve may be reading it then."""

    gang: Gang
    solved: tuple[Slot, ...]  # the slots the placer holds for it
    over: bool  # held clamped on top of what runs there: never given back in this pass
    placement: Placement | None  # what the reservation holds; None: no answer this pass
    give_back: bool = False  # nothing holds the solved slots: they are free again
    found: tuple[Slot, ...] | None = None  # an earlier decision's reservation holds these
    refusal: str | None = None  # the apiserver refused the create: why (answered Retry)
    never: bool = False  # the refusal holds for any placement of this gang: Rejected


def settle(placer: OrderedPlacer, reserved: Reserved) -> bool:
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


def assume(
    ctx: Context,
    placer: OrderedPlacer,
    workload: WorkloadView,
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
    levels = config.resolve_levels(snapshot.kueue_topologies)
    placement.slots = neighbour_order(placement.slots, snapshot, levels)
    slots = tuple(placement.slots)
    borrowed = config.preemption.enabled and is_borrowed(snapshot, gang, slots, config)
    if borrowed:
        placement.explanation.append(
            f"borrowed: runs on hardware a tier above {gang.tier} owns, and may be preempted "
            "when that tier needs it"
        )
    ctx.ledger.assume(workload.reservation_key, workload.key, gang, slots,
                      ctx.clocks.monotonic())
    # no spec.expiresAt: the TTL counts from Kueue's admission, not from now (a sibling
    # check may answer long after ours), so the lifecycle times it (`lifecycle.lapses_at`)
    body = reservation_object(
        name=workload.reservation_name, workload=workload.raw, gang=gang, placement=placement,
        ttl_seconds=config.reservation_ttl_seconds,
    )
    body["metadata"]["annotations"].update(annotations or {})
    # what `kubectl get rr` shows in its Mode column
    body["spec"]["decision"]["mode"] = mode or ("borrowed" if borrowed else "placed")
    if borrowed:
        body["metadata"]["labels"] = {L.LABEL_BORROWED: "true"}
    return body


def _too_large(body: Mapping[str, Any], slots: int) -> str | None:
    """Why no reservation of this gang can be stored, or None: the CRD's slot limit, or
    the bytes one object may hold."""
    if slots > MAX_RESERVATION_SLOTS:
        return (f"its reservation would hold {slots:,} pods, over the {MAX_RESERVATION_SLOTS:,} "
                "a ResourceReservation may hold; split the workload into smaller gangs")
    size = len(json.dumps(body, separators=(",", ":")))
    if size > MAX_RESERVATION_BYTES:
        return (f"its reservation would be {size:,} bytes, over the {MAX_RESERVATION_BYTES:,} "
                "bytes an object may hold; split the workload into smaller gangs")
    return None


def _refusal(e: BaseException) -> str | None:
    """The apiserver answered 4xx (the write certainly did not happen): its reason."""
    status = getattr(e, "status", None)
    if not (isinstance(e, ApiException) and isinstance(status, int) and 400 <= status < 500):
        return None
    reason = str(getattr(e, "reason", "") or status)
    try:
        body = json.loads(getattr(e, "body", None) or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, Mapping) else None
    return f"{status} {reason}: {message}" if message else f"{status} {reason}"


async def create_reservation(
    ctx: Context,
    snapshot: ClusterSnapshot,
    workload: WorkloadView,
    gang: Gang,
    placement: Placement,
    body: Mapping[str, Any],
    over: bool = False,
) -> Reserved:
    """Create the reservation `assume` made; what it holds, for `settle`."""
    key = workload.key
    rr_key = workload.reservation_key
    slots = tuple(placement.slots)
    too_large = _too_large(body, len(slots))
    if too_large is not None:
        ctx.ledger.forget(rr_key)
        return Reserved(gang, slots, over, None, give_back=True, refusal=too_large, never=True)
    try:
        created = await asyncio.to_thread(ctx.api.create, L.KIND_RESOURCE_RESERVATION, body)
    except Exception as e:  # urllib3 raises its own errors (MaxRetryError) in an outage
        refusal = _refusal(e)
        if refusal is not None:
            ctx.ledger.forget(rr_key)
        else:
            ctx.ledger.lost(rr_key)
        ctx.metrics.errors.labels("reserve").inc()
        log.warning("Workload %s: could not create reservation %s: %s", key, rr_key, e)
        # refused: nothing was written, the capacity is free again; else the answer was
        # lost (timeout, 5xx, dropped connection) and the reservation may exist: its slots
        # stay taken for the rest of this pass, and the next pass finds it (or
        # AlreadyExists) and answers from it
        return Reserved(gang, slots, over, None, give_back=refusal is not None,
                        refusal=refusal)
    if created:
        return Reserved(gang, slots, over, placement)
    return await _found_earlier(ctx, snapshot, workload, gang, slots, over)


async def _found_earlier(
    ctx: Context,
    snapshot: ClusterSnapshot,
    workload: WorkloadView,
    gang: Gang,
    slots: tuple[Slot, ...],
    over: bool,
) -> Reserved:
    """AlreadyExists: a decision of this attempt was written before (a create that timed
    out, a store that lags); that reservation is the answer, and its slots what it holds."""
    key, rr_key = workload.key, workload.reservation_key
    log.info("Workload %s: reservation %s already existed (a repeated decision)", key, rr_key)
    ns, _, name = rr_key.partition("/")
    try:
        found = await asyncio.to_thread(ctx.api.get, L.KIND_RESOURCE_RESERVATION, name, ns)
    except Exception as e:  # what it holds is unknown: the solved slots stay taken
        ctx.ledger.lost(rr_key)
        log.warning("Workload %s: could not read reservation %s: %s", key, rr_key, e)
        return Reserved(gang, slots, over, None)
    ctx.ledger.forget(rr_key)
    if found is None:  # deleted meanwhile: the next pass decides afresh
        return Reserved(gang, slots, over, None, give_back=True)
    held = placement_of(found, gang)
    kept = tuple(s for s in held.slots if s.node in snapshot.nodes)
    ctx.ledger.assume(rr_key, key, gang, kept, ctx.clocks.monotonic())
    return Reserved(gang, slots, over, held, found=kept)


async def commit(
    ctx: Context,
    snapshot: ClusterSnapshot,
    workload: WorkloadView,
    check: str,
    gang: Gang,
    placement: Placement,
    body: dict[str, Any],
    levels: Sequence[str],
    hardware_class: Callable[[str], str | None] | None = None,
) -> Reserved:
    """Create the reservation, then write the check Ready from what it holds. The check
    write goes out in the background (not awaited by the loop): only the create
    settles capacity, so the next decision waits for one round trip, not two. A check
    write that fails is written again from the reservation by the next pass."""
    reserved = await create_reservation(ctx, snapshot, workload, gang, placement, body)
    if reserved.placement is not None:
        ctx.faults.hit("kill-after-reservation")
        outcome = placed(reserved.placement, gang, workload.reservation_name, snapshot, levels,
                         hardware_class=hardware_class)
        ctx.workers.background.spawn(answer(ctx, workload, check, outcome), name="check-write")
    elif reserved.refusal is not None:
        ctx.workers.background.spawn(
            answer_refused(ctx, workload, check, reserved.refusal, never=reserved.never),
            name="check-write")
    return reserved


async def reserve(
    ctx: Context,
    placer: OrderedPlacer,
    workload: WorkloadView,
    check: str,
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
    decision of this attempt wrote); None when nothing can be answered this pass (a refused
    create is answered Retry here). `over`: the capacity was held on top of what still runs
    there (a drain), so it is never given back in this pass: a clamped hold cannot be undone
    exactly."""
    body = assume(ctx, placer, workload, gang, placement, config, now, annotations, mode)
    reserved = await create_reservation(ctx, placer.snapshot, workload, gang, placement, body,
                                        over)
    settle(placer, reserved)
    if reserved.refusal is not None:
        await answer_refused(ctx, workload, check, reserved.refusal, never=reserved.never)
    return reserved.placement


@dataclass
class Answered:
    """Workload uid → the attempt whose answer is written but not yet seen through the
    watch: the store may still show the check Pending, and must not get a second answer."""

    attempts: dict[str, str] = field(default_factory=dict)

    def reset(self) -> None:
        self.attempts = {}  # a new leader re-lists: the store shows what was written


async def answer(ctx: Context, workload: WorkloadView, check: str, outcome: Outcome) -> None:
    """Write the check's answer. Claimed before the write: a pass that starts while it is in
    flight (the loop does not wait for the writes of the pass before) must not answer, nor
    post its Event, again."""
    uid = workload.uid
    attempt, answered = workload.attempt, ctx.component(Answered)
    if uid:
        answered.attempts[uid] = attempt
    try:
        await write_check(ctx, workload, check, outcome)
    except Exception as e:  # ApiException, OSError, urllib3's own: written again next pass
        if uid and answered.attempts.get(uid) == attempt:  # the pass may have renewed it
            del answered.attempts[uid]
        ctx.metrics.errors.labels("check").inc()
        log.warning("Workload %s: could not write check %s: %s", workload.key, check, e)


async def answer_refused(
    ctx: Context, workload: WorkloadView, check: str, refusal: str, *, never: bool = False
) -> None:
    """A reservation the apiserver would not take: Retry with its reason, backing off, so
    the user (check message, Event) and the admin (the reason names what to fix) see it
    instead of a pass that solves again for ever; Rejected when no placement of the gang
    could be stored (`never`)."""
    if never:
        await answer(ctx, workload, check, Outcome(
            CheckState.REJECTED, clip(f"cannot ever be placed: {refusal}"), "PlacementRejected",
            "Warning"))
        return
    retries = entry_retry_count(workload.check(check))
    after = retry_backoff_seconds(retries, ctx.options.retry_seconds)
    await answer(ctx, workload, check, retry(
        clip(f"placed, but the apiserver refused its ResourceReservation ({refusal}); "
             f"retry in {after}s"), after))


async def keep_pending(
    ctx: Context, workload: WorkloadView, check: str, message: str,
    event_reason: str = "Preempting",
) -> None:
    """Keep the check Pending with `message` (written, with its Event, only when it
    changes); the Workload is not marked answered, so the next pass looks at it again."""
    entry = workload.check(check)
    if entry.get("message") == message and entry.get("state") == CheckState.PENDING.value:
        return
    outcome = Outcome(CheckState.PENDING, message, event_reason)
    try:
        await write_check(ctx, workload, check, outcome)
    except Exception as e:
        ctx.metrics.errors.labels("check").inc()
        log.warning("Workload %s: could not write check %s: %s", workload.key, check, e)


def placement_of(rr: Mapping[str, Any], gang: Gang) -> Placement:
    """The decision a reservation records, as a Placement (for re-writing its check)."""
    decision = child(child(rr, "spec"), "decision")
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
