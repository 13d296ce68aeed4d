"""Placement-level preemption through Kueue: evict the cheapest whole gangs of lower tiers in
one domain so that a waiting gang fits there, and hold the freed capacity for it.

Who calls it: `controller/loop` and `preemption/apply.py`, for a Workload that does not fit
now while its PlacementConfig has `preemption.enabled`. The victims are chosen by
`placement.preemption.plan_preemption`, through `placement.decide` (the replay's decision
too). Everything is recorded in the cluster, so a restarted
controller carries on from the objects alone:

1. The preemptor's ResourceReservation is written at once with its slots in the domain and
   the annotation `scheduling.kubenexus.io/preempts` naming each victim's Workload and
   reservation: from then on it holds the capacity, so nothing else is placed there.
2. Our check on each victim turns Retry with a message naming the preemptor and the domain;
   Kueue evicts the victim (its pods are deleted) and queues it again; lifecycle releases its
   reservation, and it is placed again later, elsewhere or there once the preemptor is done.
3. The preemptor's check stays Pending ("preempting …") until no pod of any victim's
   reservation is left and those reservations are gone; then it turns Ready as usual. A
   victim still Ready on a later pass (a write that failed, a restart) is sent through Retry
   again. After `preemption.gracePeriodSeconds` the preemption is given up: the reservation
   is released and the preemptor retried.

Only Workloads admitted through one of our checks (Ready) are victims: a Workload outside
the check is never touched, and the tiers, minimum run time and victim count come from the
preemptor's PlacementConfig.

It reads the store's views (`kube/views.py`), but for `running_gangs`, which reads the
pass's dump (see there).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.events import post_event
from nexus_admit.controller.outcome import CheckState, clip, retry
from nexus_admit.controller.workload_check import current_entry, write_check
from nexus_admit.kube import labels as L
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.errors import TranslationError, child, meta, object_key
from nexus_admit.kube.kueue import KueueIndex
from nexus_admit.kube.quantity import parse_time
from nexus_admit.kube.reservations import reservation_is_live, reservation_slots
from nexus_admit.kube.views import ReservationView, WorkloadView
from nexus_admit.model import ClusterSnapshot, Gang, PlacementConfig, Slot
from nexus_admit.placement.preemption import PreemptionPlan, RunningGang

__all__ = [
    "PreemptedVictim",
    "is_drain",
    "preempted_victims",
    "preempts_annotation",
    "progress",
    "running_gangs",
    "still_holds",
]

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class PreemptedVictim:
    workload: str  # "namespace/name"
    reservation: str  # "namespace/name" of the victim's reservation at eviction


def preempts_annotation(victims: Sequence[PreemptedVictim]) -> str:
    return json.dumps([{"workload": v.workload, "reservation": v.reservation} for v in victims])


def preempted_victims(rr: ReservationView) -> list[PreemptedVictim] | None:
    """The victims a preemptor's reservation waits for; None when it is no preemptor. A
    malformed annotation yields no victims (the reservation is then an ordinary one)."""
    raw = rr.annotations.get(L.ANN_PREEMPTS)
    if raw is None:
        return None
    try:
        items = json.loads(raw)
    except (TypeError, ValueError):
        return []
    if not isinstance(items, list):
        return []
    return [
        PreemptedVictim(str(i["workload"]), str(i["reservation"]))
        for i in items
        if isinstance(i, Mapping) and "workload" in i and "reservation" in i
    ]


def is_drain(rr: ReservationView) -> bool:
    return rr.annotations.get(L.ANN_DRAIN) == "true"


def _condition_time(workload: Mapping[str, Any], kind: str) -> datetime | None:
    for c in child(workload, "status").get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == kind and c.get("status") == "True":
            try:
                return parse_time(c.get("lastTransitionTime"))
            except ValueError:
                return None
    return None


def _ready_on_our_check(workload: WorkloadView, checks: Sequence[str]) -> bool:
    return any(workload.check(c).get("state") == CheckState.READY.value for c in checks)


def still_holds(rr: ReservationView, now: datetime) -> bool:
    """The reservation is not being deleted and is live (a malformed one holds nothing
    here; the snapshot reports it)."""
    if rr.deleting:
        return False
    try:
        return rr.live(now)
    except TranslationError:
        return False


def _object_holds(rr: Mapping[str, Any], now: datetime) -> bool:
    """`still_holds` of a reservation object (the dump's, `running_gangs`)."""
    if meta(rr).get("deletionTimestamp"):
        return False
    try:
        return reservation_is_live(rr, now)
    except TranslationError:
        return False


def running_gangs(
    checks: Sequence[str],
    dump: ClusterDump,
    snapshot: ClusterSnapshot,
    kueue: KueueIndex,
    config: PlacementConfig,
    now: datetime,
) -> tuple[list[RunningGang], dict[str, str]]:
    """Every admitted Workload holding a live reservation of ours, as preemption sees it,
    and the reservation key of each (by Workload key). Workloads admitted without our
    check, still waiting, or whose pod sets no longer translate are left out: never victims.
    Reads the pass's `dump` only (objects replaced, never changed in place), so it may run
    in the solver's thread while the loop goes on: the objects, not the store's views,
    which only the loop's thread reads."""
    checks = sorted(checks)
    workloads = {object_key(w): w for w in dump.kind("Workload")}
    out: list[RunningGang] = []
    reservations: dict[str, str] = {}
    for rr in dump.kind(L.KIND_RESOURCE_RESERVATION):
        if not _object_holds(rr, now):
            continue
        wl_key = str(child(child(rr, "spec"), "workloadRef").get("name") or "")
        ns = str(meta(rr).get("namespace") or "default")
        workload = workloads.get(f"{ns}/{wl_key}")
        if workload is None or not any(
                current_entry(workload, c).get("state") == CheckState.READY.value
                for c in checks):
            continue
        admitted = _condition_time(workload, "Admitted")
        if admitted is None or _condition_time(workload, "Evicted") is not None:
            continue
        try:
            gang = dump.gang(workload, config, snapshot, kueue, now=now)
        except TranslationError:
            continue
        slots = tuple(
            Slot(s.pod_set, s.index, s.node, s.gpus, s.numa_zone) for s in reservation_slots(rr)
        )
        priority = child(workload, "spec").get("priority")
        out.append(
            RunningGang(
                gang,
                slots,
                ran_seconds=max(0.0, (now - admitted).total_seconds()),
                priority=priority if isinstance(priority, int) else 0,
            )
        )
        reservations[gang.name] = object_key(rr)
    return out, reservations


def victim_message(preemptor: Gang, plan: PreemptionPlan) -> str:
    return clip(
        f"preempted by {preemptor.name} (tier {preemptor.tier}), which needs "
        f"{plan.domain_name()}: this Workload ran on capacity it may borrow only while "
        f"{preemptor.tier} does not need it; it is evicted and queued again, and placed "
        "again when capacity is free"
    )


def waiting_message(preemptor_rr: str, plan_text: str, left: int) -> str:
    return clip(
        f"preempting: capacity held by reservation {preemptor_rr}; waiting for {left} "
        f"evicted Workload(s) to leave ({plan_text})"
    )


async def evict(
    ctx: Context,
    victim: WorkloadView,
    message: str,
    now: datetime,
) -> bool:
    """Our check on the victim turns Retry (Kueue evicts and requeues it); False when a
    write failed (tried again on the next pass)."""
    for check in sorted(ctx.checks):
        if victim.check(check).get("state") != CheckState.READY.value:
            continue
        outcome = retry(message, ctx.options.retry_seconds, "PlacementPreempted")
        try:
            await write_check(ctx, victim, check, outcome)
        except Exception as e:  # ApiException, OSError, urllib3's own
            ctx.metrics.errors.labels("check").inc()
            log.warning("could not evict %s: %s", victim.key, e)
            return False
        ctx.metrics.preemptions.labels("victim").inc()
    return True


@dataclass(frozen=True, slots=True)
class Progress:
    done: bool  # every victim has left: answer Ready
    expired: bool  # the grace period passed first: give up
    left: int  # victims still holding pods or a reservation


async def progress(
    ctx: Context,
    rr: ReservationView,
    victims: Sequence[PreemptedVictim],
    config: PlacementConfig,
    now: datetime,
) -> Progress:
    """Where a preemption stands; victims still Ready on our check are evicted again. A
    drain (`scheduling.kubenexus.io/drain`) evicts nothing and has no grace period: its
    reservation's TTL bounds the wait."""
    drain = is_drain(rr)
    left = 0
    for v in victims:
        ns, _, rr_name = v.reservation.partition("/")
        # bound and not ended (`capacity.pod_is_active`)
        pods = [p for p in ctx.store.pod_views_of_reservation(ns, rr_name)
                if p.node and not p.terminated]
        holds = ctx.store.reservation(v.reservation) is not None
        if not pods and not holds:
            continue
        left += 1
        workload = ctx.store.workload(v.workload)
        if drain:
            continue
        if workload is not None and _ready_on_our_check(workload, sorted(ctx.checks)):
            message = clip(
                f"preempted for reservation {rr.key}: evicted and queued again"
            )
            await evict(ctx, workload, message, now)
    created = rr.created
    expired = (
        left > 0
        and not drain
        and created is not None
        and (now - created).total_seconds() > config.preemption.grace_period_seconds
    )
    return Progress(done=left == 0, expired=expired, left=left)


async def announce(ctx: Context, workload: Mapping[str, Any], text: str, now: datetime) -> None:
    """A `Preempting` Event on the Workload (the object, `view.raw`: an Event's subject)."""
    await asyncio.to_thread(
        post_event, ctx.api, workload, "Preempting", clip(text), now=now, action="Preempt"
    )
