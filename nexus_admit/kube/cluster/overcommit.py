"""Which reserved slots of a node no longer fit there: something nexus-admit does not place
(a plain pod, a pod of a queue without our check, a Kueue TAS Workload's pod or assignment)
was bound or assigned onto capacity a reservation holds, since kube-scheduler and the other
queues do not see our holds. Pure.

Who calls it: `controller/displaced.py`, for the nodes whose objects changed, which moves
the slots found here as a failed node's (`controller/failed_nodes.py`).

The node is counted as kube-scheduler counts it. First what its bound pods and the TAS
assignments naming it take (they are there, or will be, and cannot move); then the
reserved slots no bound pod holds, each on whichever free devices fit it (the device
plugin picks them, not our slot): first the slots a pinned pod holds (kube-scheduler binds
it as soon as there is room, and its pin cannot change), then the others by their
reservation's age, oldest first. The slots that find no room are displaced: the newest
reservations' first, and never a slot that still fits.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from nexus_admit.kube.cluster.capacity import (
    Claim,
    apply_claim,
    claim_fits,
    pod_is_active,
    reservation_slot_claims,
    slot_ref,
)
from nexus_admit.kube.cluster.snapshot import build_snapshot
from nexus_admit.kube.cluster.tas import has_topology_assignment, holds_quota
from nexus_admit.kube.errors import Obj, Skipped, meta, object_key
from nexus_admit.kube.podspec import AdmissionDefaults

__all__ = ["DisplacedSlot", "displaced_slots"]


@dataclass(frozen=True, slots=True)
class DisplacedSlot:
    """A reserved slot its node has no room for any more."""

    reservation: str  # "namespace/name"
    slot: str  # "<podSet>/<index>"
    node: str
    held: bool  # a pinned pod holds it (it cannot move)
    # a few of what nexus-admit did not place took the node: "pod namespace/name", "TAS
    # Workload namespace/name"
    others: tuple[str, ...]


def displaced_slots(
    node: Obj,
    pods: Iterable[Obj],
    reservations: Iterable[Obj],
    pinned: Collection[tuple[str, str]],
    *,
    node_resource_topology: Obj | None = None,
    resource_slices: Iterable[Obj] = (),
    resource_claims: Iterable[Obj] = (),
    workloads: Iterable[Obj] = (),
    template_requests: Mapping[tuple[str, str], tuple[int, int, int]] | None = None,
    admitted: AdmissionDefaults | None = None,
    now: datetime | None = None,
    skipped: list[Skipped] | None = None,
) -> list[DisplacedSlot]:
    """The slots of `reservations` (the live ones with a slot on `node`) that do not fit on
    `node` beside its bound `pods` (the pods whose `spec.nodeName` is the node), in the
    order of the module's doc. `pinned`: (reservation "namespace/name", slot key) a live pod
    is pinned to but not bound on. `workloads`: those whose Kueue TAS assignment names the
    node (what it holds there counts as bound, `snapshot._count_tas`). An unreadable node
    or object answers nothing: the snapshot tells it, and nothing moves on a guess."""
    pods, workloads = list(pods), list(workloads)
    name = str(meta(node).get("name") or "")
    try:
        fleet = build_snapshot(
            [node], pods, (),
            node_resource_topologies=[node_resource_topology] if node_resource_topology else (),
            resource_slices=resource_slices, resource_claims=resource_claims,
            workloads=workloads, admitted=admitted, now=now,
            skipped=skipped if skipped is not None else [])
    except Exception:
        return []
    free = fleet.nodes.get(name)
    if free is None:
        return []
    claimed: set[tuple[str, str, str]] = set()
    others = [f"TAS Workload {object_key(w)}" for w in workloads
              if has_topology_assignment(w) and holds_quota(w)]
    for pod in pods:
        try:
            if not pod_is_active(pod):
                continue
            ref = slot_ref(pod)
        except Exception:
            continue
        if ref is None:
            others.append(f"pod {object_key(pod)}")
        else:
            claimed.add(ref)
    # (not pinned, reservation age, reservation, slot): pinned first, then oldest first
    order: list[tuple[tuple[bool, str, str, str], Claim]] = []
    for rr in reservations:
        key = object_key(rr)
        age = str(meta(rr).get("creationTimestamp") or "")
        try:
            slots = reservation_slot_claims(rr, {name: free}, claimed, template_requests or {},
                                            on_node=name)
        except Exception:
            continue  # malformed: the snapshot leaves its nodes out and tells it
        for slot, claim in slots:
            order.append((((key, slot) not in pinned, age, key, slot), claim))
    out: list[DisplacedSlot] = []
    zones: dict[tuple[str, int], int] = {}
    for (unpinned, _, key, slot), claim in sorted(order, key=lambda e: e[0]):
        if claim_fits(free, claim):
            apply_claim(free, replace(claim, devices=None), zones)
        else:
            out.append(DisplacedSlot(key, slot, name, not unpinned, tuple(sorted(others)[:3])))
    return out
