"""What a reservation's pods and nodes say about it, read without writing: the slots its pods
hold (its status), a pod no longer held to its slot, a slot whose node is gone, cordoned or
NotReady (held by a pinned pod: lost; held by none: stranded, it moves), a pinned pod
kube-scheduler keeps finding unschedulable. Pure.

Who calls it: `lifecycle_plan.py`, on the store's views of a reservation and its pods
(`kube/views.py`); `lifecycle.py` acts on the answers (a status write, a Retry).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.nodes import node_not_ready
from nexus_admit.kube.errors import TranslationError, child
from nexus_admit.kube.reservations import PHASE_BOUND, PHASE_RESERVED, ReservedSlot, slot_key
from nexus_admit.kube.views import PodView, ReservationView

__all__ = [
    "UNSCHEDULABLE_GRACE",
    "failed_node",
    "holders",
    "lost_node",
    "reservation_status",
    "stranded_slots",
    "unpinned_pod",
    "unschedulable_message",
    "unschedulable_pin",
]

# how long a pinned pod may stay unschedulable before its gang is re-placed: longer than the
# scheduler's first retries, short enough that the gang is not stuck behind a lost node
UNSCHEDULABLE_GRACE = timedelta(seconds=20)


def failed_node(node: Mapping[str, Any] | None) -> str | None:
    """Why a node can take no pod of a slot now (deleted, cordoned, NotReady), or None."""
    if node is None:
        return "was deleted"
    if child(node, "spec").get("unschedulable"):
        return "was cordoned"
    try:
        not_ready = node_not_ready(node)
    except TranslationError:
        return None  # told by the snapshot, which leaves the node out
    return None if not_ready is None else f"is {not_ready}"


def holders(pods: Sequence[PodView]) -> dict[str, PodView]:
    """Slot key → the live pod holding it (pinned or bound; not being deleted, not ended)."""
    return {slot_key(*p.slot): p for p in pods
            if p.slot is not None and p.live and (p.node or p.pinned)}


def lost_node(
    rr: ReservationView, pods: Sequence[PodView], nodes: Mapping[str, Any]
) -> str | None:
    """Why a slot can no longer be used (`nodes`: every Node by name): its node failed
    (deleted, cordoned, NotReady) while a live pod is pinned there but not bound (the pin
    cannot be changed: a pod's nodeSelector is fixed once its gate is lifted), or its node
    was deleted under its bound pod (lost with it: nothing runs it; the gang's Retry
    restarts it without counting a failure against its Job's backoffLimit). The gang is
    placed again. A slot no live pod holds moves instead (`stranded_slots`); a pod bound
    on a node cordoned or NotReady keeps its slot: it may come back, and it is not
    nexus's to delete (see `stranded_slots`)."""
    held = holders(pods)
    for s in rr.slots:
        pod = held.get(s.key)
        if pod is None:
            continue
        if pod.node:
            if s.node not in nodes:
                return f"node {s.node} of slot {s.key} was deleted with its pod {pod.name}"
            continue
        why = failed_node(nodes.get(s.node))
        if why is not None:
            return (f"node {s.node} of slot {s.key} {why} while pod {pod.name} was pinned "
                    "there but not bound")
    return None


def stranded_slots(
    rr: ReservationView, pods: Sequence[PodView], nodes: Mapping[str, Any]
) -> list[tuple[ReservedSlot, str]]:
    """The slots whose node failed (deleted, cordoned, NotReady) and that no live pod
    holds: not claimed yet, or their pod was deleted or ended (a replacement comes). Each
    with what happened to its node (`failed_node`). They move to a healthy node of the
    same domain before a pod is pinned there.
    A pod still bound on a failed node keeps its slot: it may come back (a NotReady node
    recovers), and deleting it is the node lifecycle controller's taint eviction's, or
    the Job's podFailurePolicy's, not nexus's; once it is gone its slot is stranded."""
    held = holders(pods)
    out: list[tuple[ReservedSlot, str]] = []
    for s in rr.slots:
        if s.key in held:
            continue
        why = failed_node(nodes.get(s.node))
        if why is not None:
            out.append((s, why))
    return out


def unpinned_pod(rr: ReservationView, pods: Sequence[PodView]) -> str | None:
    """A live pod of the reservation that is not held to its slot, and how: its gate was
    lifted by someone else before it got a slot (kube-scheduler may bind it anywhere,
    on capacity another gang holds), or it claims a slot whose node it is not pinned or
    bound to. None when every ungated pod sits on its slot."""
    slots = {s.key: s for s in rr.slots}
    for p in pods:
        if p.gated or not p.live:
            continue
        where = f" (bound to node {p.node})" if p.node else ""
        slot = slots.get(slot_key(*p.slot)) if p.slot is not None else None
        if slot is None:
            return (
                f"pod {p.name} lost its scheduling gate {L.GATE_PLACEMENT} before nexus-admit "
                f"gave it a slot{where}: it is not pinned to the reservation"
            )
        if p.node and p.node != slot.node:
            return (f"pod {p.name} claims slot {slot.key} on node {slot.node} but is bound "
                    f"to {p.node}")
        if not p.node and not p.pinned:
            return f"pod {p.name} claims slot {slot.key} but is not pinned to node {slot.node}"
    return None


def reservation_status(rr: ReservationView, pods: Sequence[PodView]) -> dict[str, Any]:
    """Which pod holds which slot (Claimed: pinned, Bound: on its node), and the phase:
    Bound once every slot's pod was bound, and Bound for good after that. A pod that
    restarts leaves its slot for a moment; were the phase taken back, a gang whose every
    pod restarted after `spec.expiresAt` would count as never bound, so its reservation
    would stop holding (`reservation_is_live`) and be released as expired."""
    wanted = {s.key for s in rr.slots}
    rows = []
    for p in sorted(pods, key=lambda p: p.name):
        key = slot_key(*p.slot) if p.slot is not None else None
        if key is None or key not in wanted or p.terminated:
            continue
        rows.append({"slot": key, "pod": p.name, "uid": p.uid,
                     "state": "Bound" if p.node else "Claimed"})
    bound_slots = {r["slot"] for r in rows if r["state"] == "Bound"}
    was_bound = rr.phase == PHASE_BOUND
    phase = PHASE_BOUND if wanted and (was_bound or bound_slots >= wanted) else PHASE_RESERVED
    return {"phase": phase, "slots": rows}


def unschedulable_pin(pod: PodView, now: datetime) -> str | None:
    """The scheduler's reason when a pinned pod has been unschedulable past the grace."""
    since = pod.unschedulable_since
    if since is None or now - since < UNSCHEDULABLE_GRACE:
        return None
    return pod.unschedulable_message


def unschedulable_message(pod: PodView, why: str) -> str:
    """Why a pinned, unschedulable pod sends its gang back: the DRA allocator could not give
    its claims the devices nexus counted on the node (the scheduler's message names the
    claims), else the capacity reserved there was taken."""
    head = f"pod {pod.name} pinned to node {pod.pinned} cannot be scheduled"
    if pod.claims and "claim" in why.lower():
        return (
            f"{head}: kube-scheduler's DRA allocator cannot allocate its ResourceClaims there "
            f"({why}); the node's devices are not what nexus counted when it placed the gang "
            "(a ResourceSlice changed or was withdrawn, or a selector is read differently); "
            "the gang is placed again"
        )
    return (
        f"{head} ({why}): the capacity reserved there was taken, most likely by a pod that "
        "bypassed Kueue; the gang is placed again"
    )
