"""What the lifecycle step does with one reservation, decided from what the store holds:
pure (no client, no context), so the step is a plan, then its writes.

Who calls it: `lifecycle.sync_lifecycle` reads each live reservation with its Workload, pods
and nodes, asks `plan_reservation` for a `ReservationStep` (release it, send its gang back
through Retry, give back surplus slots, hand over stranded slots, write its status, or
nothing until one of those objects changes: `Quiet`), then writes the steps. The reasons
are `release_reason` (the attempt is over) and `retry_reason` (the reservation can no
longer serve its gang); when it lapses is `lapses_at`; whether its status is worth a write
is `status_due`. It reads the store's views of the reservation, its Workload and its pods
(`kube/views.py`); the nodes as objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from nexus_admit.controller.outcome import CheckState
from nexus_admit.controller.reservation_pods import (
    UNSCHEDULABLE_GRACE,
    lost_node,
    reservation_status,
    stranded_slots,
    unpinned_pod,
    unschedulable_message,
    unschedulable_pin,
)
from nexus_admit.kube import labels as L
from nexus_admit.kube.quantity import parse_time
from nexus_admit.kube.reservations import PHASE_BOUND, PHASE_RESERVED, ReservedSlot
from nexus_admit.kube.slices import surplus_trimmed, wanted_slots
from nexus_admit.kube.views import PodView, ReservationView, WorkloadView

__all__ = [
    "STATUS_SLOTS_EVERY_SECONDS",
    "Quiet",
    "ReservationStep",
    "Stranded",
    "attempt_over",
    "lapses_at",
    "plan_reservation",
    "quiet_step",
    "release_reason",
    "retry_reason",
    "settled",
    "status_due",
    "unclaimed",
]


def release_reason(
    rr: ReservationView, workload: WorkloadView | None, checks: Sequence[str]
) -> str | None:
    """Why this reservation no longer holds capacity, or None while it should."""
    if workload is None:
        return "its Workload was deleted"
    if rr.workload_uid and rr.workload_uid != workload.uid:
        return "its Workload was deleted and created again"
    over = attempt_over(workload)
    if over is not None:
        return over
    if rr.attempt and rr.attempt != workload.attempt:
        return "the Workload holds a newer quota reservation"
    for check in checks:
        state = workload.check(check).get("state")
        if state in (CheckState.RETRY.value, CheckState.REJECTED.value):
            return f"its placement check is {state}"
    return None


def attempt_over(workload: WorkloadView) -> str | None:
    """Why the Workload's quota reservation no longer needs placed capacity, or None."""
    if workload.condition("Finished") == "True":
        return "the Workload finished"
    if not workload.active:
        return "the Workload was deactivated"
    if workload.condition("Evicted") == "True":
        why = workload.conditions["Evicted"].get("reason") or "evicted"
        return f"the Workload was evicted ({why})"
    if workload.condition("QuotaReserved") != "True":
        return "Kueue released the Workload's quota"
    return None



def _ever_bound(rr: ReservationView, pods: Sequence[PodView]) -> bool:
    return rr.phase == PHASE_BOUND or any(p.node for p in pods)



@dataclass(frozen=True, slots=True)
class Stranded:
    """A live reservation with slots whose node failed and that no live pod holds
    (`reservation_pods.stranded_slots`), each with why: `failed_nodes.py` moves them."""

    rr: ReservationView
    workload: WorkloadView
    slots: tuple[tuple[ReservedSlot, str], ...]



@dataclass(frozen=True, slots=True)
class Quiet:
    """A reservation the lifecycle step found with nothing to do (nothing to release, no
    Retry, no status write due) and every object that answer read. The store replaces an
    object whenever a reader could see a change (`Store.upsert`), so while each is the very
    object the store still holds and no deadline has passed, the answer stands: the step
    skips it. Without this the step re-read every live reservation and every pod of each,
    once a second: at 5,000 nodes a fifth of the controller's samples after a burst, and
    growing with the gangs that run."""

    rr: ReservationView
    workload: WorkloadView | None
    pods: tuple[PodView, ...]
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
        rr: ReservationView,
        workload: WorkloadView | None,
        pods: Sequence[PodView],
        nodes: Mapping[str, Any],
        checks: Sequence[str],
        status: Mapping[str, Any],
        since: float,
        lapses: datetime | None,
    ) -> Quiet:
        names = tuple(s.node for s in rr.slots)
        deadlines: list[datetime] = []
        if lapses is not None and not _ever_bound(rr, pods):
            deadlines.append(lapses)
        for pod in pods:
            if pod.unschedulable_since is not None:
                deadlines.append(pod.unschedulable_since + UNSCHEDULABLE_GRACE)
        return cls(
            rr, workload, tuple(pods), names, tuple(nodes.get(n) for n in names),
            tuple(checks), str(status["phase"]), min(deadlines, default=None),
            None if settled(rr.status, status) or unclaimed(rr.status, status)
            else since + STATUS_SLOTS_EVERY_SECONDS,
        )

    def holds(
        self,
        rr: ReservationView,
        workload: WorkloadView | None,
        pods: Sequence[PodView],
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


def lapses_at(
    rr: ReservationView, workload: WorkloadView | None, ttl_seconds: int
) -> datetime | None:
    """When a reservation none of whose pods was bound stops holding: its `spec.ttlSeconds`
    (else `ttl_seconds`, reservationTtlSeconds now) after Kueue admitted its Workload (the
    Admitted condition: quota and every check Ready). The TTL guards against pods that
    never come, and none come before admission: a sibling check answered late is waited
    for, its quota held by Kueue meanwhile. None while not admitted. A reservation with
    `spec.expiresAt` (made by an earlier version) lapses then."""
    if not rr.expiry_readable:
        return None  # unreadable: live, as the snapshot counts it (and tells it)
    if rr.expires_at is not None:
        return rr.expires_at
    if rr.ttl_seconds is not None:
        ttl_seconds = rr.ttl_seconds
    admitted = workload.conditions.get("Admitted") if workload is not None else None
    if admitted is None or admitted.get("status") != "True":
        return None
    try:
        since = parse_time(admitted.get("lastTransitionTime"))
    except ValueError:
        since = None
    if since is None:  # no readable time: the reservation's own age is the safe side
        since = rr.created
    return None if since is None else since + timedelta(seconds=ttl_seconds)


def retry_reason(
    rr: ReservationView,
    pods: Sequence[PodView],
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
            f"reservation {rr.name} expired: no pod of the Workload was bound "
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
                f"reservation {rr.name} no longer holds the gang: {why}; the "
                "gang is placed again"
            )
    if message is None:
        why = lost_node(rr, pods, nodes)
        if why is not None:
            message = (
                f"reservation {rr.name} cannot be used: {why}; the gang is "
                "placed again"
            )
    return message


@dataclass(frozen=True, slots=True)
class ReservationStep:
    """What the lifecycle step does with one reservation (`plan_reservation`), in the order
    `lifecycle.sync_lifecycle` writes it: release it (after sending its gang back through
    Retry when `retry`), or give back its surplus slots (`trim`: its `spec.podSets`
    without them), or hand its stranded slots to `failed_nodes.move_stranded` and write
    its `status`. `quiet` and `status_since` are the step's memos for it afterwards."""

    rr: ReservationView
    workload: WorkloadView | None
    phase: str | None = None  # counted in the reservations metric (None: not counted)
    release: str | None = None  # why it is released
    retry: bool = False  # its gang goes back through Retry first, for the same reason
    trim: list[dict[str, Any]] | None = None
    stranded: tuple[tuple[ReservedSlot, str], ...] = ()
    status: Mapping[str, Any] | None = None
    quiet: Quiet | None = None  # found with nothing to do: skipped until something changes
    status_since: float | None = None  # its last status write, or its first claim (monotonic)


def plan_reservation(
    rr: ReservationView,
    workload: WorkloadView | None,
    pods: Sequence[PodView],
    nodes: Mapping[str, Any],
    checks: Sequence[str],
    now: datetime,
    tick: float,
    *,
    ttl_seconds: int,
    handed_over: bool,
    claims: Mapping[str, str],
    quiet: Quiet | None,
    status_since: float | None,
) -> ReservationStep:
    """The step for one reservation. `ttl_seconds`: reservationTtlSeconds of the Workload's
    check; `handed_over`: an elastic Job's new slice takes its slots over
    (`elastic.handed_over`); `claims`: pod uid -> slot key the ungater just handed out;
    `quiet`, `status_since`: the step's memos for it from earlier passes."""
    unchanged = quiet_step(rr, workload, pods, nodes, checks, now, tick,
                           quiet=quiet, status_since=status_since)
    if unchanged is not None:
        return unchanged
    keep = ReservationStep(rr, workload, status_since=status_since)
    if handed_over:
        return keep
    reason = release_reason(rr, workload, checks)
    if reason is not None:
        return ReservationStep(rr, workload, release=reason, status_since=status_since)
    lapses = lapses_at(rr, workload, ttl_seconds)
    if workload is None:
        return keep  # release_reason said so already; for the type checker
    reason = retry_reason(rr, pods, nodes, now, lapses)
    if reason is not None:
        return ReservationStep(rr, workload, release=reason, retry=True,
                               status_since=status_since)
    trim = surplus_trimmed(rr.raw, wanted_slots(workload.raw), held_slots(pods, claims))
    if trim is not None:
        return ReservationStep(rr, workload, trim=trim, status_since=status_since)
    failed = tuple(stranded_slots(rr, pods, nodes))
    status = reservation_status(rr, pods)
    have = rr.status
    # a new reservation's first status write waits as a claims change does: a gang that
    # binds within the period gets one write (Bound), not Reserved, Claimed, Bound; the
    # period starts at its first claim (`unclaimed`), not when it was created: in a
    # burst its Job waits for Kueue longer than that
    since = tick if unclaimed(have, status) else (
        status_since if status_since is not None else tick)
    if status_due(have, status, since, tick):
        return ReservationStep(rr, workload, str(status["phase"]), stranded=failed,
                               status=status, status_since=tick)
    kept_since = None if unclaimed(have, status) else since
    found_quiet = None if failed else Quiet.of(
        rr, workload, pods, nodes, checks, status, since, lapses)
    return ReservationStep(rr, workload, str(status["phase"]), stranded=failed,
                           quiet=found_quiet, status_since=kept_since)


def quiet_step(
    rr: ReservationView,
    workload: WorkloadView | None,
    pods: Sequence[PodView],
    nodes: Mapping[str, Any],
    checks: Sequence[str],
    now: datetime,
    tick: float,
    *,
    quiet: Quiet | None,
    status_since: float | None,
) -> ReservationStep | None:
    """The step of a reservation with nothing to plan (being deleted, or `quiet` still
    holds), or None. Asked first, before the inputs only a plan reads are derived: in a
    burst most reservations are quiet on most passes."""
    if rr.deleting:
        return ReservationStep(rr, workload, quiet=quiet, status_since=status_since)
    if quiet is not None and quiet.holds(rr, workload, pods, nodes, checks, now, tick):
        return ReservationStep(rr, workload, quiet.phase, quiet=quiet, status_since=status_since)
    return None


def held_slots(pods: Sequence[PodView], claims: Mapping[str, str]) -> set[str]:
    """The slot keys live pods hold, and those the ungater just handed to a live pod whose
    pin the watch has not shown yet (a Job's replacement, as another of its pods finishes):
    never given back, or the pin would name a slot the reservation no longer has."""
    live = [p for p in pods if not p.terminated]
    held = {str(p.annotations.get(L.ANN_SLOT)) for p in live}
    held |= {claims[p.uid] for p in live if claims.get(p.uid)}
    return held
