"""What happens to a ResourceReservation after its decision.

Who calls it: `loop/cycle.py`, before it places anything, so capacity released here is free for
the same pass. Passive steps read the world: a reservation whose Workload finished, was
evicted, deactivated, deleted or reserved quota anew is released (deleted; the owner
reference would garbage-collect it with the Workload anyway); its status records which pods
hold which slots and becomes `Bound` when all are bound. Active steps act: a reservation none
of whose pods bound within `reservationTtlSeconds` of Kueue admitting its Workload
(`lapses_at`) is released and its gang sent back through Retry; a pinned pod that stays
unschedulable (a pod outside Kueue took the capacity) sends its gang back through Retry
with that reason, and so does a pod pinned to a slot whose node was deleted, cordoned or
went NotReady before the pod bound there (a slot no live pod holds on such a node is
handed to `failed_nodes.py`, which moves it), and a Ready Workload whose reservation is
gone (deleted by hand: its pods would stay pinned while nothing holds their capacity),
and a gang one of whose pods left its slot (its gate lifted by someone else: a tenant
cannot unpin a pod to jump a reservation unnoticed). A pinned pod whose ResourceClaims
kube-scheduler's DRA allocator cannot allocate on its node says so in the Retry message.

The step is a plan, then its writes: what to do with each reservation is decided purely
(`lifecycle_plan.plan_reservation`, from what the pods and nodes say: `reservation_pods.py`),
then written through `api.py` (`_apply`). A reservation found quiet is not read again
until one of the objects it was read from changes or a deadline passes (`Quiet`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from nexus_admit.controller.context import Context, Promised
from nexus_admit.controller.elastic import handed_over, trim_reservation
from nexus_admit.controller.events import post_event
from nexus_admit.controller.lifecycle_plan import (
    Quiet,
    ReservationStep,
    Stranded,
    attempt_over,
    plan_reservation,
    quiet_step,
)
from nexus_admit.controller.outcome import CheckState, retry
from nexus_admit.controller.store import PerObject
from nexus_admit.controller.tasks import gather_bounded
from nexus_admit.controller.ungater_state import UngaterState
from nexus_admit.controller.workload_check import write_check
from nexus_admit.controller.writes import Answered
from nexus_admit.kube import labels as L
from nexus_admit.kube.quantity import parse_time
from nexus_admit.kube.reservations import PHASE_BOUND, PHASE_RESERVED
from nexus_admit.kube.views import ReservationView, WorkloadView
from nexus_admit.model import PlacementConfig

__all__ = [
    "LifecycleState",
    "missing_reservation",
    "release",
    "retry_gang",
    "sync_lifecycle",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# how long a Ready check may name a reservation the store does not hold before that counts
# as a deletion: covers the watch of reservations lagging behind the watch of Workloads
MISSING_GRACE = timedelta(seconds=10)


def missing_reservation(
    workload: WorkloadView, check: str, reservations: Collection[str], now: datetime
) -> str | None:
    """The reservation our Ready check entry promised the Workload's pods, when it is gone
    (deleted by hand, or lost to a watch gap) while the Workload still runs on it; None
    otherwise. `reservations`: the "namespace/name" of every reservation that exists."""
    return first_missing(promised_reservations(workload, check), reservations, now)


def promised_reservations(workload: WorkloadView, check: str) -> list[Promised]:
    """The reservations our Ready check entry names for the Workload's pods while it still
    runs on them ("namespace/name", name, when the entry turned Ready): what
    `missing_reservation` reads of the Workload."""
    entry = workload.check(check)
    if entry.get("state") != CheckState.READY.value or attempt_over(workload) is not None:
        return []
    if workload.deleting:
        return []
    ns = workload.namespace or "default"
    since = parse_time(entry.get("lastTransitionTime"))
    out: list[Promised] = []
    for update in entry.get("podSetUpdates") or []:
        labels = update.get("labels") if isinstance(update, Mapping) else None
        name = labels.get(L.LABEL_RESERVATION) if isinstance(labels, Mapping) else None
        if name:
            out.append((f"{ns}/{name}", str(name), since))
    return out


def first_missing(
    promised: Sequence[Promised], reservations: Collection[str], now: datetime
) -> str | None:
    """The first promised reservation that is gone, once the grace has passed."""
    for key, name, since in promised:
        if key in reservations:
            continue
        if since is None or now - since < MISSING_GRACE:
            return None
        return name
    return None


@dataclass
class LifecycleState:
    """The lifecycle step's memos, by reservation "namespace/name": when its status was
    last written (monotonic), and what the step last found it quiet on (not looked at
    again until one of those objects changes); and each Workload's promised reservations
    (`sync_missing`), kept while the store holds it."""

    status_written: dict[str, float] = field(default_factory=dict)
    quiet: dict[str, Quiet] = field(default_factory=dict)
    promised: PerObject[list[list[Promised]]] = field(default_factory=PerObject)

    def reset(self) -> None:
        """The memos (a status write is due at once, as for a new reservation)."""
        self.status_written, self.quiet, self.promised = {}, {}, PerObject()


# reservations looked at between two turns of the event loop: a few milliseconds of work,
# so a webhook call never waits for a whole pass over hundreds of reservations
YIELD_EVERY = 16


async def sync_lifecycle(ctx: Context) -> list[Stranded]:
    """One lifecycle step over every reservation: each planned from what the store holds
    (`lifecycle_plan.plan_reservation`), then written (`_apply`); the ones with stranded
    slots, which the pass moves next (`failed_nodes.move_stranded`)."""
    now, tick = ctx.clocks.wall(), ctx.clocks.monotonic()
    checks = sorted(ctx.checks)
    nodes = ctx.store.by_key("Node")  # read only: keyed by name, as lost_node asks
    reservations = ctx.store.reservations()
    state = ctx.component(LifecycleState)
    live = {rr.key for rr in reservations}
    state.status_written = {k: t for k, t in state.status_written.items() if k in live}
    state.quiet = {k: q for k, q in state.quiet.items() if k in live}
    claims = ctx.component(UngaterState).claims
    steps: list[ReservationStep] = []
    for i, rr in enumerate(reservations):
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)  # let the webhook and the watches in between
        key = rr.key
        workload = ctx.store.workload(rr.workload_key)
        pods = ctx.store.pod_views_of_reservation(rr.namespace, rr.name)
        since = state.status_written.get(key)
        step = quiet_step(rr, workload, pods, nodes, checks, now, tick,
                          quiet=state.quiet.get(key), status_since=since)
        if step is None:  # planned afresh (quiet=None: it was just found not to hold)
            step = plan_reservation(
                rr, workload, pods, nodes, checks, now, tick,
                ttl_seconds=_ttl_seconds(ctx, workload, checks),
                handed_over=handed_over(ctx, rr.raw, None if workload is None else workload.raw),
                claims=claims, quiet=None, status_since=since)
        steps.append(step)
    stranded = await _apply(ctx, steps, checks, now)
    phases: dict[str, int] = {PHASE_RESERVED: 0, PHASE_BOUND: 0}
    for step in steps:
        if step.phase is not None:
            phases[step.phase] += 1
    for phase, n in phases.items():
        ctx.metrics.reservations.labels(phase).set(n)
    await sync_missing(ctx)
    return stranded


async def _apply(
    ctx: Context, steps: Sequence[ReservationStep], checks: Sequence[str], now: datetime
) -> list[Stranded]:
    """Write the steps: releases (a Retry first where asked: when that write fails nothing
    else is done for the reservation this pass), surplus slots given back, then the status
    writes, together (informational and independent of each other). Keeps the step's
    memos; returns the stranded slots to move."""
    state = ctx.component(LifecycleState)
    stranded: list[Stranded] = []
    status_writes = []
    for step in steps:
        rr, workload = step.rr, step.workload
        _keep(state.quiet, rr.key, step.quiet)
        _keep(state.status_written, rr.key, step.status_since)
        if step.release is not None:
            if step.retry:
                assert workload is not None  # a Retry is planned only for a Workload
                if not await retry_gang(ctx, workload, checks, step.release):
                    continue  # tried again next pass
            await release(ctx, rr, workload, step.release, now)
        elif step.trim is not None:
            await trim_reservation(ctx, rr.raw, step.trim)
        else:
            if step.stranded and workload is not None:
                stranded.append(Stranded(rr, workload, step.stranded))
            if step.status is not None:
                status_writes.append(_write_status(ctx, rr.namespace, rr.name, step.status))
    await gather_bounded(status_writes)
    return stranded


def _keep(memo: dict[str, T], key: str, value: T | None) -> None:
    """Set or forget one memo entry."""
    if value is None:
        memo.pop(key, None)
    else:
        memo[key] = value


DEFAULT_TTL_SECONDS: int = PlacementConfig.model_fields["reservation_ttl_seconds"].default


def _ttl_seconds(ctx: Context, workload: WorkloadView | None, checks: Sequence[str]) -> int:
    """reservationTtlSeconds of the PlacementConfig of our check the Workload has."""
    for check in checks:
        if workload is not None and workload.check(check):
            config = ctx.checks[check].config
            if config is not None:
                return config.reservation_ttl_seconds
    return DEFAULT_TTL_SECONDS


async def _write_status(ctx: Context, ns: str, name: str, status: Mapping[str, Any]) -> None:
    try:
        await asyncio.to_thread(ctx.api.merge_status, L.KIND_RESOURCE_RESERVATION, name, ns, status)
    except Exception as e:  # informational; rewritten next pass
        ctx.metrics.errors.labels("reservation-status").inc()
        log.warning("could not update status of reservation %s/%s: %s", ns, name, e)


async def retry_gang(
    ctx: Context, workload: WorkloadView, checks: Sequence[str], message: str
) -> bool:
    """Send the Workload back through Retry on each of our checks it has; False when a
    write failed (tried again next pass)."""
    for check in checks:
        if workload.check(check):
            outcome = retry(message, ctx.options.retry_seconds)
            try:
                await write_check(ctx, workload, check, outcome)
            except Exception as e:
                ctx.metrics.errors.labels("check").inc()
                log.warning("could not send %s back through Retry: %s", workload.key, e)
                return False
    if workload.uid:  # the store may still show the check Pending: no placement this attempt
        ctx.component(Answered).attempts[workload.uid] = workload.attempt
    return True


async def sync_missing(ctx: Context) -> None:
    """Workloads running on a reservation that is gone: back through Retry, so Kueue
    requeues them and they are placed (and their capacity held) again."""
    now = ctx.clocks.wall()
    existing = {r.key for r in ctx.store.reservations()}
    existing |= set(ctx.ledger.assumed)
    checks = sorted(ctx.checks)
    workloads = ctx.store.workloads()

    def promised(workload: WorkloadView) -> list[list[Promised]]:
        return [promised_reservations(workload, check) for check in checks]

    # what each Workload promises is read again only when the store holds a new object
    kept = ctx.component(LifecycleState).promised.values(workloads, promised, (tuple(checks),))
    for workload, by_check in zip(workloads, kept, strict=True):
        for check, promises in zip(checks, by_check, strict=True):
            name = first_missing(promises, existing, now) if promises else None
            if name is not None:
                await retry_gang(ctx, workload, [check], (
                    f"reservation {name} was deleted while the Workload was admitted on it: "
                    "its pods' capacity is no longer held; the gang is placed again"))


async def release(
    ctx: Context,
    rr: ReservationView,
    workload: WorkloadView | None,
    reason: str,
    now: datetime,
) -> bool:
    """Delete a reservation, with an Event on its Workload saying why; False when the
    delete failed (the reservation may still hold its capacity)."""
    ns, name = rr.namespace, rr.name
    try:
        await asyncio.to_thread(ctx.api.delete, L.KIND_RESOURCE_RESERVATION, name, ns)
    except Exception as e:
        ctx.metrics.errors.labels("release").inc()
        log.warning("could not release reservation %s/%s: %s", ns, name, e)
        return False
    ctx.store.delete(L.KIND_RESOURCE_RESERVATION, rr.raw)  # free for this very pass
    log.info("released reservation %s/%s: %s", ns, name, reason)
    if workload is not None:
        await asyncio.to_thread(
            post_event,
            ctx.api,
            workload.raw,
            "PlacementReleased",
            f"reservation {name} released: {reason}",
            now=now,
            action="Release",
        )
    return True
