"""What a reservation's pods and nodes say about it, read without writing: the slots its pods
hold (its status), a pod no longer held to its slot, a slot whose node is gone, cordoned or
NotReady (held by a pinned pod: lost; held by none: stranded, it moves), a pinned pod
kube-scheduler keeps finding unschedulable. Pure.

Who calls it: `lifecycle.py`, which acts on the answers (a status write, a Retry).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.nodes import node_not_ready
from nexus_admit.kube.errors import TranslationError, child, meta
from nexus_admit.kube.quantity import parse_time
from nexus_admit.kube.reservations import (
    PHASE_BOUND,
    PHASE_RESERVED,
    ReservedSlot,
    parse_slot_key,
    reservation_slots,
    slot_key,
)

__all__ = [
    "UNSCHEDULABLE_GRACE",
    "conditions_of",
    "failed_node",
    "lost_node",
    "reservation_status",
    "slot_holders",
    "stranded_slots",
    "unpinned_pod",
    "unschedulable_message",
    "unschedulable_pin",
    "unschedulable_since",
]

# how long a pinned pod may stay unschedulable before its gang is re-placed: longer than the
# scheduler's first retries, short enough that the gang is not stuck behind a lost node
UNSCHEDULABLE_GRACE = timedelta(seconds=20)


def conditions_of(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """An object's status conditions by type (malformed entries left out)."""
    status = child(obj, "status")
    return {str(c.get("type")): c for c in status.get("conditions") or [] if isinstance(c, Mapping)}


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


def slot_holders(pods: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Slot key → the live pod holding it (pinned or bound; not being deleted, not ended)."""
    out: dict[str, Mapping[str, Any]] = {}
    for p in pods:
        m = meta(p)
        ref = parse_slot_key(child(m, "annotations").get(L.ANN_SLOT))
        phase = child(p, "status").get("phase")
        if ref is None or m.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
            continue
        spec = child(p, "spec")
        if spec.get("nodeName") or child(spec, "nodeSelector").get(L.HOSTNAME_LABEL):
            out[slot_key(*ref)] = p
    return out


def lost_node(
    rr: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], nodes: Mapping[str, Any]
) -> str | None:
    """Why a slot can no longer be used (`nodes`: every Node by name): its node failed
    (deleted, cordoned, NotReady) while a live pod is pinned there but not bound (the pin
    cannot be changed: a pod's nodeSelector is fixed once its gate is lifted), or its node
    was deleted under its bound pod (lost with it: nothing runs it; the gang's Retry
    restarts it without counting a failure against its Job's backoffLimit). The gang is
    placed again. A slot no live pod holds moves instead (`stranded_slots`); a pod bound
    on a node cordoned or NotReady keeps its slot: it may come back, and it is not
    nexus's to delete (see `stranded_slots`)."""
    holders = slot_holders(pods)
    for s in reservation_slots(rr):
        pod = holders.get(s.key)
        if pod is None:
            continue
        name = meta(pod).get("name")
        if child(pod, "spec").get("nodeName"):
            if s.node not in nodes:
                return f"node {s.node} of slot {s.key} was deleted with its pod {name}"
            continue
        why = failed_node(nodes.get(s.node))
        if why is not None:
            return (f"node {s.node} of slot {s.key} {why} while pod {name} was pinned there "
                    "but not bound")
    return None


def stranded_slots(
    rr: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], nodes: Mapping[str, Any]
) -> list[tuple[ReservedSlot, str]]:
    """The slots whose node failed (deleted, cordoned, NotReady) and that no live pod
    holds: not claimed yet, or their pod was deleted or ended (a replacement comes). Each
    with what happened to its node (`failed_node`). They move to a healthy node of the
    same domain before a pod is pinned there.
    A pod still bound on a failed node keeps its slot: it may come back (a NotReady node
    recovers), and deleting it is the node lifecycle controller's taint eviction's, or
    the Job's podFailurePolicy's, not nexus's; once it is gone its slot is stranded."""
    holders = slot_holders(pods)
    out: list[tuple[ReservedSlot, str]] = []
    for s in reservation_slots(rr):
        if s.key in holders:
            continue
        why = failed_node(nodes.get(s.node))
        if why is not None:
            out.append((s, why))
    return out


def unpinned_pod(rr: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> str | None:
    """A live pod of the reservation that is not held to its slot, and how: its gate was
    lifted by someone else before it got a slot (kube-scheduler may bind it anywhere,
    on capacity another gang holds), or it claims a slot whose node it is not pinned or
    bound to. None when every ungated pod sits on its slot."""
    slots = {s.key: s for s in reservation_slots(rr)}
    for p in pods:
        m = meta(p)
        spec = child(p, "spec")
        gates = spec.get("schedulingGates")
        gated = isinstance(gates, list) and any(
            isinstance(g, Mapping) and g.get("name") == L.GATE_PLACEMENT for g in gates
        )
        phase = child(p, "status").get("phase")
        if gated or m.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
            continue
        name, node = m.get("name"), spec.get("nodeName")
        where = f" (bound to node {node})" if node else ""
        ref = parse_slot_key(child(m, "annotations").get(L.ANN_SLOT))
        slot = slots.get(slot_key(*ref)) if ref is not None else None
        if slot is None:
            return (
                f"pod {name} lost its scheduling gate {L.GATE_PLACEMENT} before nexus-admit "
                f"gave it a slot{where}: it is not pinned to the reservation"
            )
        if node and node != slot.node:
            return f"pod {name} claims slot {slot.key} on node {slot.node} but is bound to {node}"
        if not node and not child(spec, "nodeSelector").get(L.HOSTNAME_LABEL):
            return f"pod {name} claims slot {slot.key} but is not pinned to node {slot.node}"
    return None


def reservation_status(rr: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Which pod holds which slot (Claimed: pinned, Bound: on its node), and the phase:
    Bound once every slot's pod was bound, and Bound for good after that. A pod that
    restarts leaves its slot for a moment; were the phase taken back, a gang whose every
    pod restarted after `spec.expiresAt` would count as never bound, so its reservation
    would stop holding (`reservation_is_live`) and be released as expired."""
    wanted = {s.key for s in reservation_slots(rr)}
    rows = []
    for p in sorted(pods, key=lambda p: str(meta(p).get("name"))):
        m = meta(p)
        ref = parse_slot_key((m.get("annotations") or {}).get(L.ANN_SLOT))
        phase = (p.get("status") or {}).get("phase")
        if ref is None or slot_key(*ref) not in wanted or phase in ("Succeeded", "Failed"):
            continue
        bound = bool((p.get("spec") or {}).get("nodeName"))
        rows.append(
            {
                "slot": slot_key(*ref),
                "pod": str(m.get("name")),
                "uid": str(m.get("uid") or ""),
                "state": "Bound" if bound else "Claimed",
            }
        )
    bound_slots = {r["slot"] for r in rows if r["state"] == "Bound"}
    was_bound = child(rr, "status").get("phase") == PHASE_BOUND
    phase = PHASE_BOUND if wanted and (was_bound or bound_slots >= wanted) else PHASE_RESERVED
    return {"phase": phase, "slots": rows}


def unschedulable_since(pod: Mapping[str, Any]) -> datetime | None:
    """Since when kube-scheduler has found an unbound pod unschedulable, or None."""
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    cond = conditions_of(pod).get("PodScheduled")
    if not cond or cond.get("status") != "False" or cond.get("reason") != "Unschedulable":
        return None
    return parse_time(cond.get("lastTransitionTime"))


def unschedulable_pin(pod: Mapping[str, Any], now: datetime) -> str | None:
    """The scheduler's reason when a pinned pod has been unschedulable past the grace."""
    since = unschedulable_since(pod)
    if since is None or now - since < UNSCHEDULABLE_GRACE:
        return None
    cond = conditions_of(pod)["PodScheduled"]
    return str(cond.get("message") or "unschedulable")


def unschedulable_message(pod: Mapping[str, Any], why: str) -> str:
    """Why a pinned, unschedulable pod sends its gang back: the DRA allocator could not give
    its claims the devices nexus counted on the node (the scheduler's message names the
    claims), else the capacity reserved there was taken."""
    spec = child(pod, "spec")
    node = child(spec, "nodeSelector").get(L.HOSTNAME_LABEL)
    head = f"pod {meta(pod).get('name')} pinned to node {node} cannot be scheduled"
    if spec.get("resourceClaims") and "claim" in why.lower():
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
