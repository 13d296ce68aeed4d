"""What a preemption or drain decision means in the cluster (the decision itself is
`placement.decide`). Everything is recorded in objects, so a restarted controller carries on
from them alone: a preemptor's or drain's reservation is written at once, annotated with
the Workloads it waits for; victims are evicted through Kueue; a drain that gives way or
ends is released with an Event on its Workload. It reads the store's views (`kube/views.py`);
an object (`view.raw`) only where it is translated or an Event is about it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.lifecycle import release
from nexus_admit.controller.outcome import clip, retry
from nexus_admit.controller.preemption.victims import (
    PreemptedVictim,
    announce,
    evict,
    is_drain,
    preempts_annotation,
    progress,
    still_holds,
    victim_message,
    waiting_message,
)
from nexus_admit.controller.writes import answer, keep_pending, reserve
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import TranslationError, child
from nexus_admit.kube.kueue import KueueIndex, workload_tier
from nexus_admit.kube.views import ReservationView, WorkloadView
from nexus_admit.model import PlacementConfig
from nexus_admit.placement.decide import Drain, LiveDrain, MoveOffDrain, PlaceOverDrains, Preempt
from nexus_admit.placement.preemption import RunningGang
from nexus_admit.placement.sequence import OrderedPlacer

__all__ = [
    "apply_drain",
    "apply_move_off",
    "apply_over_drains",
    "apply_preempt",
    "live_drain",
    "preemption_done",
    "yielding_drains",
]

log = logging.getLogger(__name__)


def live_drain(rr: ReservationView, tier: str) -> LiveDrain:
    return LiveDrain(rr.workload_key, tier, frozenset(s.node for s in rr.slots))


def yielding_drains(
    ctx: Context,
    workload: WorkloadView,
    now: datetime,
    still_waiting: Callable[[WorkloadView], bool],
) -> dict[str, ReservationView]:
    """Other Workloads' live drains that may give way (by Workload key): each one's Workload
    still waits on our check in the attempt the reservation is for, unanswered (a drain
    that ended in a Ready answer, also one the watch has not shown yet, holds a running
    gang's slots). Whether one gives way to this gang is `decide`'s rule (tier)."""
    own = workload.key
    out: dict[str, ReservationView] = {}
    for rr in ctx.store.reservations():
        if not is_drain(rr) or rr.workload_key == own or not still_holds(rr, now):
            continue
        drained = ctx.store.workload(rr.workload_key)
        if drained is None or not still_waiting(drained) or rr.name != drained.reservation_name:
            continue
        out[rr.workload_key] = rr
    return out


def drain_tier(ctx: Context, kueue: KueueIndex, rr: ReservationView,
               config: PlacementConfig) -> str | None:
    drained = ctx.store.workload(rr.workload_key)
    if drained is None:
        return None
    try:
        return workload_tier(drained.raw, kueue, config)
    except TranslationError:
        return None


async def apply_preempt(
    ctx: Context, placer: OrderedPlacer, workload: WorkloadView, check: str,
    decision: Preempt, running: Mapping[str, RunningGang], reservations: Mapping[str, str],
    config: PlacementConfig, now: datetime,
) -> None:
    """Hold the victims' capacity for the preemptor, write its reservation, evict the victims
    through Kueue; the preemptor's check stays Pending until they have left. `running` and
    `reservations`: the running gangs `decide` was given, and their reservations' keys."""
    plan, gang = decision.plan, decision.gang
    victims = [PreemptedVictim(v.name, reservations[v.name]) for v in plan.victims]
    # the victims' capacity goes to the preemptor for the rest of this pass
    for v in plan.victims:
        if v.name in running:
            placer.undo(running[v.name].gang, running[v.name].slots)
    placer.hold(gang, tuple(plan.placement.slots))
    reserved = await reserve(
        ctx, placer, workload, check, gang, plan.placement, config, now,
        annotations={L.ANN_PREEMPTS: preempts_annotation(victims)}, mode="preempting",
    )
    if reserved is None:
        # they keep running; a create whose answer was lost keeps the preemptor's slots
        # taken too, so theirs come back clamped on top
        for v in plan.victims:
            if v.name in running:
                placer.hold(running[v.name].gang, running[v.name].slots, over=True)
        return  # the next pass decides again; nothing was evicted
    ctx.metrics.preemptions.labels("preemptor").inc()
    message = victim_message(gang, plan)
    for preempted in victims:
        victim = ctx.store.workload(preempted.workload)
        if victim is not None:
            await evict(ctx, victim, message, now)
    rr_key = workload.reservation_key
    await announce(ctx, workload.raw, f"{plan.describe()}; reservation {rr_key}", now)
    await keep_pending(ctx, workload, check,
                       waiting_message(rr_key, plan.describe(), len(victims)))


async def apply_drain(
    ctx: Context, placer: OrderedPlacer, workload: WorkloadView, check: str,
    decision: Drain, reservations: Mapping[str, str], config: PlacementConfig, now: datetime,
) -> None:
    """Write the draining reservation at once: it holds those GPUs as the Workloads there
    finish (nothing is evicted), so new placements avoid them."""
    plan, gang = decision.plan, decision.gang
    waited_for = [PreemptedVictim(v.name, reservations[v.name]) for v in plan.victims]
    # the Workloads waited for keep running: the drain's slots come on top of theirs
    placer.hold(gang, tuple(plan.placement.slots), over=True)
    reserved = await reserve(
        ctx, placer, workload, check, gang, plan.placement, config, now,
        annotations={L.ANN_PREEMPTS: preempts_annotation(waited_for), L.ANN_DRAIN: "true"},
        over=True, mode="draining",
    )
    if reserved is None:
        return
    ctx.metrics.preemptions.labels("drain").inc()
    rr_key = workload.reservation_key
    text = plan.placement.explanation[-1]
    await announce(ctx, workload.raw, f"{text}; reservation {rr_key}", now)
    await keep_pending(ctx, workload, check, waiting_message(rr_key, text, len(waited_for)))


async def apply_over_drains(
    ctx: Context, placer: OrderedPlacer, workload: WorkloadView, check: str,
    decision: PlaceOverDrains, drains: Mapping[str, ReservationView],
    config: PlacementConfig, now: datetime,
) -> Any:
    """Withdraw the drains the placement crosses (released, with an Event on the drained
    Workload: it drains again on its next pass), then reserve; what the reservation holds,
    or None when a write failed (the next pass decides again)."""
    own, gang = workload.key, decision.gang
    for drain in decision.withdrawn:
        rr = drains[drain.name]
        drained = ctx.store.workload(drain.name)
        reason = (
            f"drain withdrawn: Workload {own} (tier {gang.tier}) had no place off its "
            "nodes and is placed there; this Workload drains again on its next pass"
        )
        if not await release(ctx, rr, drained, reason, now):
            return None
        ctx.ledger.forget(rr.key)
        ctx.metrics.preemptions.labels("drain-yielded").inc()
    # held clamped over the drain's hold: written at once, never given back this pass
    placer.hold(gang, tuple(decision.placement.slots), over=True)
    return await reserve(ctx, placer, workload, check, gang, decision.placement, config, now,
                         over=True)


async def apply_move_off(
    ctx: Context, placer: OrderedPlacer, workload: WorkloadView, check: str,
    decision: MoveOffDrain, rr: ReservationView, config: PlacementConfig, now: datetime,
) -> Any:
    """The draining reservation is released and one with the new placement written under
    the same name; what it holds, or None (a write failed: the next pass looks again)."""
    if not await release(ctx, rr, workload, "drain ended: the gang fits now without it", now):
        return None
    ctx.ledger.forget(rr.key)
    ctx.metrics.preemptions.labels("drain-moved").inc()
    # the pass's placer still holds the drain's slots, clamped: this comes on top
    placer.hold(decision.gang, tuple(decision.placement.slots), over=True)
    return await reserve(ctx, placer, workload, check, decision.gang, decision.placement,
                         config, now, over=True)


async def preemption_done(
    ctx: Context, workload: WorkloadView, check: str, rr: ReservationView,
    victims: list[PreemptedVictim], config: PlacementConfig, now: datetime,
) -> bool:
    """True once every victim has left (answer Ready from the reservation); meanwhile the
    check stays Pending with how many are left, and after the grace period the preemption is
    given up (reservation released, Retry)."""
    state = await progress(ctx, rr, victims, config, now)
    if state.done:
        return True
    rr_key = rr.key
    if state.expired:
        try:
            await asyncio.to_thread(ctx.api.delete, L.KIND_RESOURCE_RESERVATION, rr.name,
                                    rr.namespace)
        except Exception as e:
            ctx.metrics.errors.labels("release").inc()
            log.warning("could not release reservation %s: %s", rr_key, e)
            return False
        ctx.store.delete(L.KIND_RESOURCE_RESERVATION, rr.raw)
        ctx.metrics.preemptions.labels("given-up").inc()
        grace = config.preemption.grace_period_seconds
        await answer(ctx, workload, check, retry(
            clip(f"preemption given up: {state.left} evicted Workload(s) still held capacity "
                 f"after gracePeriodSeconds {grace:.0f}; reservation {rr_key} released"),
            ctx.options.retry_seconds))
        return False
    # the decision as written: read only here, for the message (no view field)
    explanation = child(child(rr.raw, "spec"), "decision").get("explanation")
    plan_text = str(explanation[-1]) if isinstance(explanation, list) and explanation else ""
    await keep_pending(ctx, workload, check, waiting_message(rr_key, plan_text, state.left))
    return False
