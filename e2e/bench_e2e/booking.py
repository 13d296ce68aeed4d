"""Double-booked GPUs and pods off their planned node, judged from the cluster's objects
(bound pods, node allocatable, ResourceReservations as plain dicts), never from the
controller's own view."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nexus_admit.kube import labels as L

GPU = "nvidia.com/gpu"
RESERVATION_LABEL = L.LABEL_RESERVATION
SLOT_ANNOTATION = L.ANN_SLOT


@dataclass(frozen=True, slots=True)
class BoundPod:
    namespace: str
    name: str
    node: str
    gpus: int
    reservation: str | None  # its reservation label, if any
    slot: str | None  # its slot annotation (podSet/index), if any


def bound_pod(pod: Mapping[str, Any]) -> BoundPod | None:
    """A pod (API dict) that holds GPUs on a node now: bound and not finished."""
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    if not spec.get("nodeName") or (pod.get("status") or {}).get("phase") in (
        "Succeeded",
        "Failed",
    ):
        return None
    gpus = sum(
        int(((c.get("resources") or {}).get("requests") or {}).get(GPU, 0))
        for c in spec.get("containers") or []
    )
    return BoundPod(
        meta.get("namespace", ""),
        meta.get("name", ""),
        spec["nodeName"],
        gpus,
        (meta.get("labels") or {}).get(RESERVATION_LABEL),
        (meta.get("annotations") or {}).get(SLOT_ANNOTATION),
    )


def over_allocated(allocatable: Mapping[str, int], pods: Iterable[BoundPod]) -> dict[str, int]:
    """{node: GPUs bound beyond its allocatable} for every node where that is > 0."""
    used: Counter[str] = Counter()
    for p in pods:
        used[p.node] += p.gpus
    return {n: u - allocatable.get(n, 0) for n, u in used.items() if u > allocatable.get(n, 0)}


def shared_devices(reservations: Iterable[Mapping[str, Any]]) -> list[str]:
    """GPU devices that two live reservations both hold (each as 'node/gpu: a, b')."""
    holder: dict[tuple[str, int], str] = {}
    out = []
    for rr in reservations:
        meta = rr["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        who = f"{meta.get('namespace')}/{meta['name']}"
        for ps in rr["spec"]["podSets"]:
            for s in ps["slots"]:
                for g in s.get("gpus") or []:
                    other = holder.setdefault((s["node"], int(g)), who)
                    if other != who:
                        out.append(f"{s['node']}/{g}: {other}, {who}")
    return out


def double_booked_gpus(
    allocatable: Mapping[str, int],
    pods: Iterable[BoundPod],
    reservations: Iterable[Mapping[str, Any]] = (),
) -> int:
    """GPUs promised twice: bound beyond allocatable, plus devices two reservations hold."""
    return sum(over_allocated(allocatable, pods).values()) + len(shared_devices(reservations))


def slot_nodes(reservations: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], str]:
    """(namespace, reservation, 'podSet/index') -> the node the reservation planned."""
    out = {}
    for rr in reservations:
        meta = rr["metadata"]
        for ps in rr["spec"]["podSets"]:
            for s in ps["slots"]:
                out[(meta.get("namespace", ""), meta["name"], f"{ps['name']}/{s['index']}")] = s[
                    "node"
                ]
    return out


def on_planned_node(
    pods: Iterable[BoundPod], reservations: Iterable[Mapping[str, Any]]
) -> tuple[int, int, list[str]]:
    """(pods on the node their slot planned, pods that carry a reservation, the misplaced
    ones described). A pod whose reservation or slot is unknown counts as misplaced."""
    planned = slot_nodes(reservations)
    good, total, bad = 0, 0, []
    for p in pods:
        if not p.reservation:
            continue
        total += 1
        node = planned.get((p.namespace, p.reservation, p.slot or ""))
        if node == p.node:
            good += 1
        else:
            bad.append(f"{p.namespace}/{p.name}: on {p.node}, planned {node} (slot {p.slot})")
    return good, total, bad
