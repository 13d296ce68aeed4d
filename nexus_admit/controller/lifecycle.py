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

`release_reason`, `retry_reason` and `missing_reservation` are pure, as is what the pods and
nodes say (`reservation_pods.py`); the rest writes through `api.py`. A reservation found quiet is
not read again until one of the objects it was read from changes or a deadline passes
(`Quiet`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from nexus_admit.controller.context import Context, Promised
from nexus_admit.controller.elastic import give_back_surplus, handed_over
from nexus_admit.controller.events import post_event
from nexus_admit.controller.outcome import CheckState, retry
from nexus_admit.controller.reservation_pods import (
    UNSCHEDULABLE_GRACE,
    conditions_of,
    lost_node,
    reservation_status,
    stranded_slots,
    unpinned_pod,
    unschedulable_message,
    unschedulable_pin,
    unschedulable_since,
)
from nexus_admit.controller.store import PerObject
from nexus_admit.controller.tasks import gather_bounded
from nexus_admit.controller.workload_check import current_entry, write_check
from nexus_admit.controller.writes import Answered
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import child, meta, object_key
from nexus_admit.kube.quantity import parse_time
from nexus_admit.kube.reservations import (
    PHASE_BOUND,
    PHASE_RESERVED,
    ReservedSlot,
    attempt_key,
    reservation_attempt,
    reservation_slots,
    reservation_workload_key,
    reservation_workload_uid,
)
from nexus_admit.model import PlacementConfig

__all__ = [
    "LifecycleState",
    "Quiet",
    "Stranded",
    "missing_reservation",
    "release",
    "release_reason",
    "retry_gang",
    "retry_reason",
    "settled",
    "status_due",
    "sync_lifecycle",
    "unclaimed",
]

log = logging.getLogger(__name__)

def release_reason(
    rr: Mapping[str, Any], workload: Mapping[str, Any] | None, checks: Sequence[str]
) -> str | None:
    """Why this reservation no longer holds capacity, or None while it should."""
    if workload is None:
        return "its Workload was deleted"
    uid = reservation_workload_uid(rr)
    if uid and uid != meta(workload).get("uid"):
        return "its Workload was deleted and created again"
    over = _attempt_over(workload)
    if over is not None:
        return over
    attempt = reservation_attempt(rr)
    if attempt and attempt != attempt_key(workload):
        return "the Workload holds a newer quota reservation"
    for check in checks:
        state = current_entry(workload, check).get("state")
        if state in (CheckState.RETRY.value, CheckState.REJECTED.value):
            return f"its placement check is {state}"
    return None


def _attempt_over(workload: Mapping[str, Any]) -> str | None:
    """Why the Workload's quota reservation no longer needs placed capacity, or None."""
    cond = conditions_of(workload)
    if cond.get("Finished", {}).get("status") == "True":
        return "the Workload finished"
    spec = child(workload, "spec")
    if spec.get("active") is False:
        return "the Workload was deactivated"
    if cond.get("Evicted", {}).get("status") == "True":
        why = cond["Evicted"].get("reason") or "evicted"
        return f"the Workload was evicted ({why})"
    if cond.get("QuotaReserved", {}).get("status") != "True":
        return "Kueue released the Workload's quota"
    return None


# how long a Ready check may name a reservation the store does not hold before that counts
# as a deletion: covers the watch of reservations lagging behind the watch of Workloads
MISSING_GRACE = timedelta(seconds=10)


def missing_reservation(
    workload: Mapping[str, Any], check: str, reservations: Collection[str], now: datetime
) -> str | None:
    """The reservation our Ready check entry promised the Workload's pods, when it is gone
    (deleted by hand, or lost to a watch gap) while the Workload still runs on it; None
    otherwise. `reservations`: the "namespace/name" of every reservation that exists."""
    return first_missing(promised_reservations(workload, check), reservations, now)


def promised_reservations(workload: Mapping[str, Any], check: str) -> list[Promised]:
    """The reservations our Ready check entry names for the Workload's pods while it still
    runs on them ("namespace/name", name, when the entry turned Ready): what
    `missing_reservation` reads of the Workload."""
    entry = current_entry(workload, check)
    if entry.get("state") != CheckState.READY.value or _attempt_over(workload) is not None:
        return []
    if meta(workload).get("deletionTimestamp"):
        return []
    ns = str(meta(workload).get("namespace") or "default")
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


def _ever_bound(rr: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> bool:
    status = child(rr, "status")
    if status.get("phase") == PHASE_BOUND:
        return True
    return any((p.get("spec") or {}).get("nodeName") for p in pods)


@dataclass(frozen=True, slots=True)
class Stranded:
    """A live reservation with slots whose node failed and that no live pod holds
    (`reservation_pods.stranded_slots`), each with why: `failed_nodes.py` moves them."""

    rr: Mapping[str, Any]
    workload: Mapping[str, Any]
    slots: tuple[tuple[ReservedSlot, str], ...]


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


@dataclass(frozen=True, slots=True)
class Quiet:
    """A reservation the lifecycle step found with nothing to do (nothing to release, no
    Retry, no status write due) and every object that answer read. The store replaces an
    object whenever a reader could see a change (`Store.upsert`), so while each is the very
    object the store still holds and no deadline has passed, the answer stands: the step
    skips it. Without this the step re-read every live reservation and every pod of each,
    once a second: at 5,000 nodes a fifth of the controller's samples after a burst, and
    growing with the gangs that run."""

    rr: Mapping[str, Any]
    workload: Mapping[str, Any] | None
    pods: tuple[Mapping[str, Any], ...]
    node_names: tuple[str, ...]
    nodes: tuple[Mapping[str, Any] | None, ...]
    checks: tuple[str, ...]
    phase: str
    # when a check that reads the time could answer otherwise: spec.expiresAt of a gang
    # never bound, a pinned pod's unschedulable grace (wall clock); the next slot-claims
    # status write (monotonic)
    wall_until: datetime | None
    tick_until: float | None

    @classmethod
    def of(
        cls,
        rr: Mapping[str, Any],
        workload: Mapping[str, Any] | None,
        pods: Sequence[Mapping[str, Any]],
        nodes: Mapping[str, Any],
        checks: Sequence[str],
        status: Mapping[str, Any],
        since: float,
        lapses: datetime | None,
    ) -> Quiet:
        names = tuple(s.node for s in reservation_slots(rr))
        deadlines: list[datetime] = []
        if lapses is not None and not _ever_bound(rr, pods):
            deadlines.append(lapses)
        for pod in pods:
            waiting = unschedulable_since(pod)
            if waiting is not None:
                deadlines.append(waiting + UNSCHEDULABLE_GRACE)
        return cls(
            rr, workload, tuple(pods), names, tuple(nodes.get(n) for n in names),
            tuple(checks), str(status["phase"]), min(deadlines, default=None),
            None if settled(child(rr, "status"), status) or unclaimed(child(rr, "status"), status)
            else since + STATUS_SLOTS_EVERY_SECONDS,
        )

    def holds(
        self,
        rr: Mapping[str, Any],
        workload: Mapping[str, Any] | None,
        pods: Sequence[Mapping[str, Any]],
        nodes: Mapping[str, Any],
        checks: Sequence[str],
        now: datetime,
        tick: float,
    ) -> bool:
        """Whether the step would find this reservation as quiet again."""
        if self.wall_until is not None and now >= self.wall_until:
            return False
        if self.tick_until is not None and tick >= self.tick_until:
            return False
        return (
            rr is self.rr
            and workload is self.workload
            and tuple(checks) == self.checks
            and len(pods) == len(self.pods)
            and all(a is b for a, b in zip(pods, self.pods, strict=True))
            and all(nodes.get(n) is o for n, o in zip(self.node_names, self.nodes, strict=True))
        )


# reservations looked at between two turns of the event loop: a few milliseconds of work,
# so a webhook call never waits for a whole pass over hundreds of reservations
YIELD_EVERY = 16


async def sync_lifecycle(ctx: Context) -> list[Stranded]:
    """One lifecycle step over every reservation; the ones with stranded slots, which
    the pass moves next (`failed_nodes.move_stranded`)."""
    now = ctx.clocks.wall()
    stranded: list[Stranded] = []
    checks = sorted(ctx.checks)
    phases: dict[str, int] = {PHASE_RESERVED: 0, PHASE_BOUND: 0}
    nodes = ctx.store.by_key("Node")  # read only: keyed by name, as lost_node asks
    status_writes = []
    tick = ctx.clocks.monotonic()
    live = {object_key(rr) for rr in ctx.store.items(L.KIND_RESOURCE_RESERVATION)}
    state = ctx.component(LifecycleState)
    state.status_written = {k: t for k, t in state.status_written.items() if k in live}
    state.quiet = {k: q for k, q in state.quiet.items() if k in live}
    for i, rr in enumerate(ctx.store.items(L.KIND_RESOURCE_RESERVATION)):
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)  # let the webhook and the watches in between
        m = meta(rr)
        ns, name = str(m.get("namespace")), str(m.get("name"))
        if m.get("deletionTimestamp"):
            continue
        key = f"{ns}/{name}"
        workload = ctx.store.get("Workload", reservation_workload_key(rr))
        pods = ctx.store.pods_of_reservation(ns, name)
        quiet = state.quiet.get(key)
        if isinstance(quiet, Quiet) and quiet.holds(rr, workload, pods, nodes, checks, now, tick):
            phases[quiet.phase] += 1
            continue
        state.quiet.pop(key, None)
        if handed_over(ctx, rr, workload):
            continue  # an elastic Job's new slice takes these slots over (elastic.py)
        reason = release_reason(rr, workload, checks)
        retry_failed = False
        lapses = lapses_at(rr, workload, _ttl_seconds(ctx, workload, checks))
        if reason is None and workload is not None:
            reason = retry_reason(rr, pods, nodes, now, lapses)
            if reason is not None and not await retry_gang(ctx, workload, checks, reason):
                reason, retry_failed = None, True  # tried again next pass
        if reason is not None:
            await release(ctx, rr, workload, reason, now)
            continue
        if await give_back_surplus(ctx, rr, workload, pods):
            continue  # a scale-down or finished pods: read again next pass
        failed = stranded_slots(rr, pods, nodes) if workload is not None else []
        if failed and workload is not None:
            stranded.append(Stranded(rr, workload, tuple(failed)))
        status = reservation_status(rr, pods)
        phases[status["phase"]] += 1
        # a new reservation's first status write waits as a claims change does: a gang that
        # binds within the period gets one write (Bound), not Reserved, Claimed, Bound; the
        # period starts at its first claim (`unclaimed`), not when it was created: in a
        # burst its Job waits for Kueue longer than that
        if unclaimed(child(rr, "status"), status):
            state.status_written.pop(key, None)
            since = tick
        else:
            since = state.status_written.setdefault(key, tick)
        if status_due(child(rr, "status"), status, since, tick):
            state.status_written[key] = tick
            status_writes.append(_write_status(ctx, ns, name, status))
        elif not retry_failed and not failed:
            state.quiet[key] = Quiet.of(rr, workload, pods, nodes, checks, status, since,
                                                lapses)
    # informational and independent of each other: together, not one round trip each
    await gather_bounded(status_writes)
    for phase, n in phases.items():
        ctx.metrics.reservations.labels(phase).set(n)
    await sync_missing(ctx)
    return stranded


DEFAULT_TTL_SECONDS: int = PlacementConfig.model_fields["reservation_ttl_seconds"].default


def _ttl_seconds(ctx: Context, workload: Mapping[str, Any] | None, checks: Sequence[str]) -> int:
    """reservationTtlSeconds of the PlacementConfig of our check the Workload has."""
    for check in checks:
        if workload is not None and current_entry(workload, check):
            config = ctx.checks[check].config
            if config is not None:
                return config.reservation_ttl_seconds
    return DEFAULT_TTL_SECONDS


# how often a reservation's status may be rewritten for its slot claims alone (a phase
# change is written at once): a gang's pods are pinned and bound over a few seconds, and a
# write per pass per reservation was a third of the controller's writes in a burst
STATUS_SLOTS_EVERY_SECONDS = 10.0


def status_due(
    have: Mapping[str, Any], want: Mapping[str, Any], since: float | None, now: float
) -> bool:
    """Write the reservation's status now? At once when its phase changes to Bound or
    Released, or from one phase to another; when only the slot claims changed, and for a
    reservation never written (no phase yet: it is Reserved), at most every
    `STATUS_SLOTS_EVERY_SECONDS` after `since` (its last write, or its first claim);
    never for a Bound reservation's pods leaving their slots (`settled`), nor for one never
    written that no pod has claimed yet (`unclaimed`)."""
    first_reserved = not have.get("phase") and want["phase"] == PHASE_RESERVED
    if have.get("phase") != want["phase"] and not first_reserved:
        return True
    if settled(have, want) or unclaimed(have, want):
        return False
    return since is None or now - since >= STATUS_SLOTS_EVERY_SECONDS


def unclaimed(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """A reservation never written whose pods have claimed no slot: a status would say
    Reserved and nothing else, which no status says as well. In a burst a gang's Job waits
    for Kueue to admit and start it for tens of seconds; that write was one of the 2.5 per
    Workload the load benchmark counted."""
    return not have.get("phase") and want["phase"] == PHASE_RESERVED and not want["slots"]


def settled(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """Nothing in `want` worth a write over `have`: the same phase and slot claims, or a
    Bound reservation whose only change is pods that left their slots. At the end of a run
    every pod leaves its slot and the Workload finishes seconds later, which releases the
    reservation: that write told no one anything (one per gang on the load benchmark). A
    pod that takes a slot again (a restart) is a new claim, written as before."""
    if not have.get("phase") or have.get("phase") != want["phase"]:
        return False
    rows = have.get("slots")
    if rows == want["slots"]:
        return True
    return (want["phase"] == PHASE_BOUND and isinstance(rows, list)
            and all(row in rows for row in want["slots"]))


async def _write_status(ctx: Context, ns: str, name: str, status: Mapping[str, Any]) -> None:
    try:
        await asyncio.to_thread(ctx.api.merge_status, L.KIND_RESOURCE_RESERVATION, name, ns, status)
    except Exception as e:  # informational; rewritten next pass
        ctx.metrics.errors.labels("reservation-status").inc()
        log.warning("could not update status of reservation %s/%s: %s", ns, name, e)


def lapses_at(
    rr: Mapping[str, Any], workload: Mapping[str, Any] | None, ttl_seconds: int
) -> datetime | None:
    """When a reservation none of whose pods was bound stops holding: its `spec.ttlSeconds`
    (else `ttl_seconds`, reservationTtlSeconds now) after Kueue admitted its Workload (the
    Admitted condition: quota and every check Ready). The TTL guards against pods that
    never come, and none come before admission: a sibling check answered late is waited
    for, its quota held by Kueue meanwhile. None while not admitted. A reservation with
    `spec.expiresAt` (made by an earlier version) lapses then."""
    spec = child(rr, "spec")
    try:
        expires = parse_time(spec.get("expiresAt"))
    except ValueError:
        return None  # unreadable: live, as the snapshot counts it (and tells it)
    if expires is not None:
        return expires
    own = spec.get("ttlSeconds")
    if isinstance(own, int) and not isinstance(own, bool) and own > 0:
        ttl_seconds = own
    admitted = conditions_of(workload).get("Admitted") if workload is not None else None
    if admitted is None or admitted.get("status") != "True":
        return None
    try:
        since = parse_time(admitted.get("lastTransitionTime"))
    except ValueError:
        since = None
    if since is None:  # no readable time: the reservation's own age is the safe side
        since = parse_time(meta(rr).get("creationTimestamp"))
    return None if since is None else since + timedelta(seconds=ttl_seconds)


def retry_reason(
    rr: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Any],
    now: datetime,
    lapses: datetime | None = None,
) -> str | None:
    """Why the gang must go back through Retry because its reservation cannot serve it any
    more (unbound past `lapses`, a pin unschedulable past the grace, a pod off its slot, a
    pod pinned to a slot whose node is gone, cordoned or NotReady before it bound), or
    None. A slot no pod holds on such a node is not a reason: it moves."""
    message = None
    if lapses is not None and lapses <= now and not _ever_bound(rr, pods):
        message = (
            f"reservation {meta(rr).get('name')} expired: no pod of the Workload was bound "
            "within reservationTtlSeconds of its admission; the gang is placed again"
        )
    else:
        for pod in pods:
            why = unschedulable_pin(pod, now)
            if why is not None:
                message = unschedulable_message(pod, why)
                break
    if message is None:
        why = unpinned_pod(rr, pods)
        if why is not None:
            message = (
                f"reservation {meta(rr).get('name')} no longer holds the gang: {why}; the "
                "gang is placed again"
            )
    if message is None:
        why = lost_node(rr, pods, nodes)
        if why is not None:
            message = (
                f"reservation {meta(rr).get('name')} cannot be used: {why}; the gang is "
                "placed again"
            )
    return message


async def retry_gang(
    ctx: Context, workload: Mapping[str, Any], checks: Sequence[str], message: str
) -> bool:
    """Send the Workload back through Retry on each of our checks it has; False when a
    write failed (tried again next pass)."""
    for check in checks:
        if current_entry(workload, check):
            outcome = retry(message, ctx.options.retry_seconds)
            try:
                await write_check(ctx, workload, check, outcome)
            except Exception as e:
                ctx.metrics.errors.labels("check").inc()
                log.warning("could not send %s back through Retry: %s", object_key(workload), e)
                return False
    uid = str(meta(workload).get("uid") or "")
    if uid:  # the store may still show the check Pending: no placement this attempt
        ctx.component(Answered).attempts[uid] = attempt_key(workload)
    return True


async def sync_missing(ctx: Context) -> None:
    """Workloads running on a reservation that is gone: back through Retry, so Kueue
    requeues them and they are placed (and their capacity held) again."""
    now = ctx.clocks.wall()
    existing = {object_key(r) for r in ctx.store.items(L.KIND_RESOURCE_RESERVATION)}
    existing |= set(ctx.ledger.assumed)
    checks = sorted(ctx.checks)
    workloads = ctx.store.listed("Workload")

    def promised(workload: dict[str, Any]) -> list[list[Promised]]:
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
    rr: Mapping[str, Any],
    workload: Mapping[str, Any] | None,
    reason: str,
    now: datetime,
) -> bool:
    """Delete a reservation, with an Event on its Workload saying why; False when the
    delete failed (the reservation may still hold its capacity)."""
    m = meta(rr)
    ns, name = str(m.get("namespace")), str(m.get("name"))
    try:
        await asyncio.to_thread(ctx.api.delete, L.KIND_RESOURCE_RESERVATION, name, ns)
    except Exception as e:
        ctx.metrics.errors.labels("release").inc()
        log.warning("could not release reservation %s/%s: %s", ns, name, e)
        return False
    ctx.store.delete(L.KIND_RESOURCE_RESERVATION, rr)  # free for this very pass
    log.info("released reservation %s/%s: %s", ns, name, reason)
    if workload is not None:
        await asyncio.to_thread(
            post_event,
            ctx.api,
            workload,
            "PlacementReleased",
            f"reservation {name} released: {reason}",
            now=now,
            action="Release",
        )
    return True
