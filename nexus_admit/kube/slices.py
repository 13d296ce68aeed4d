"""Kueue's Workload slices (elastic Jobs) and a reservation's surplus slots: pure.

Kueue v0.19.2 (`ElasticJobsViaWorkloadSlices`, on by default) answers the scale-up of a
running elastic Job (`kueue.x-k8s.io/elastic-job: "true"`) with a new Workload, a slice
that names the one it replaces (`kueue.x-k8s.io/workload-slice-replacement-for`), and
finishes the old slice as soon as the new one holds quota (`pkg/workloadslicing`,
`scheduler.replaceWorkloadSlice`). The Job keeps running: its template was stamped once, so
every pod, old or added, carries the first slice's reservation label. A scale-down, and
a finished pod Kueue counts in `status.reclaimablePods`, shrink the slice in place.

So the new slice's reservation carries the old one's slots over (the running pods stay
where they are, claimed by them as before) and adds slots only for the added pods; it
records the label its pods carry (`scheduling.kubenexus.io/pod-label`). A reservation
holding more slots than its Workload still asks for gives back the free ones.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import Obj, child, meta
from nexus_admit.kube.reservations import ReservedSlot, reservation_slots
from nexus_admit.model import Gang, Node

__all__ = [
    "added_gang",
    "carried_domain",
    "carried_slots",
    "replaced_slice",
    "slice_waits",
    "surplus_trimmed",
    "template_reservation_label",
    "wanted_slots",
    "with_carried",
]


def replaced_slice(workload: Obj) -> str | None:
    """"namespace/name" of the slice this Workload replaces (its own namespace only)."""
    value = child(meta(workload), "annotations").get(L.KUEUE_WORKLOAD_SLICE_REPLACES)
    if not isinstance(value, str):
        return None
    ns, _, name = value.partition("/")
    own = str(meta(workload).get("namespace") or "default")
    return value if name and ns == own else None


def template_reservation_label(workload: Obj) -> str | None:
    """The reservation label every pod set template of the Workload carries (the label
    Kueue stamped on the Job's template for the first slice), or None."""
    found: set[str] = set()
    pod_sets = child(workload, "spec").get("podSets")
    for ps in pod_sets if isinstance(pod_sets, list) else []:
        labels = child(child(child(ps, "template"), "metadata"), "labels")
        value = labels.get(L.LABEL_RESERVATION)
        if not isinstance(value, str) or not value:
            return None
        found.add(value)
    return found.pop() if len(found) == 1 else None


def slice_waits(workload: Obj) -> bool:
    """Is the Workload still to run: not finished, deactivated or evicted?"""
    if child(workload, "spec").get("active") is False:
        return False
    conditions = child(workload, "status").get("conditions")
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, Mapping) and c.get("type") in ("Finished", "Evicted") \
                and c.get("status") == "True":
            return False
    return True


def carried_slots(rr: Obj, counts: Mapping[str, int]) -> dict[str, list[ReservedSlot]]:
    """The old slice's slots per pod set of the new one, lowest indices first, at most as
    many as the new slice asks for."""
    out: dict[str, list[ReservedSlot]] = {}
    for s in sorted(reservation_slots(rr), key=lambda s: (s.pod_set, s.index)):
        kept = out.setdefault(s.pod_set, [])
        if len(kept) < counts.get(s.pod_set, 0):
            kept.append(s)
    return {k: v for k, v in out.items() if v}


def added_gang(gang: Gang, carried: Mapping[str, Sequence[ReservedSlot]]) -> Gang | None:
    """The gang of the pods the new slice adds (per pod set: its count less the carried
    slots), or None when it adds none."""
    pod_sets = tuple(
        replace(ps, count=ps.count - len(carried.get(ps.name, ())))
        for ps in gang.pod_sets
        if ps.count > len(carried.get(ps.name, ()))
    )
    return replace(gang, pod_sets=pod_sets) if pod_sets else None


def carried_domain(
    carried: Mapping[str, Sequence[ReservedSlot]], nodes: Mapping[str, Node],
    levels: Sequence[str],
) -> dict[str, str]:
    """The smallest topology domain (label, value) every carried slot's node shares, {}
    when they share none: the added pods are tried there first. `levels`: highest first."""
    names = {s.node for slots in carried.values() for s in slots}
    known = [nodes[n] for n in names if n in nodes]
    if not known or len(known) != len(names):
        return {}
    for level in reversed(levels):
        values = {n.labels.get(level) for n in known}
        if len(values) == 1 and None not in values:
            return {level: str(values.pop())}
    return {}


def _slot_row(s: ReservedSlot, index: int) -> dict[str, Any]:
    row: dict[str, Any] = {"index": index, "node": s.node, "gpus": list(s.gpus)}
    if s.numa_zone is not None:
        row["numaZone"] = s.numa_zone
    return row


def with_carried(
    body: Mapping[str, Any], old: Obj, carried: Mapping[str, Sequence[ReservedSlot]],
    pod_sets: Iterable[str], pod_label: str,
) -> dict[str, Any]:
    """The new slice's reservation: `body` (the added pods' slots, numbered from 0) with
    the carried slots first, as written, and the added ones numbered after them; a pod set
    that adds no pod keeps the old entry's requests. It records `pod_label`."""
    new_sets = {str(ps.get("name")): ps for ps in child(body, "spec").get("podSets") or []}
    old_sets = {str(ps.get("name") or "main"): ps
                for ps in child(old, "spec").get("podSets") or [] if isinstance(ps, Mapping)}
    merged = []
    for name in pod_sets:
        kept = carried.get(name, ())
        entry = dict(new_sets.get(name) or old_sets.get(name) or {"name": name})
        entry.pop("slots", None)
        offset = max((s.index for s in kept), default=-1) + 1
        added = [{**row, "index": int(row["index"]) + offset}
                 for row in (new_sets.get(name) or {}).get("slots") or []]
        entry["slots"] = [_slot_row(s, s.index) for s in kept] + added
        merged.append(entry)
    m = dict(meta(body))
    m["annotations"] = {**child(m, "annotations"), L.ANN_POD_LABEL: pod_label}
    return {**body, "metadata": m, "spec": {**child(body, "spec"), "podSets": merged}}


def wanted_slots(workload: Obj) -> dict[str, int]:
    """Per pod set, the slots the Workload still needs: its count (Kueue shrinks it in
    place on a scale-down) less its `status.reclaimablePods` (finished pods of a Job that
    will not be replaced). Malformed entries count as asking for every slot."""
    out: dict[str, int] = {}
    pod_sets = child(workload, "spec").get("podSets")
    for ps in pod_sets if isinstance(pod_sets, list) else []:
        count = ps.get("count") if isinstance(ps, Mapping) else None
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
            out[str(ps.get("name") or "main")] = count
    reclaimable = child(workload, "status").get("reclaimablePods")
    for r in reclaimable if isinstance(reclaimable, list) else []:
        count = r.get("count") if isinstance(r, Mapping) else None
        name = str(r.get("name") or "") if isinstance(r, Mapping) else ""
        if name in out and isinstance(count, int) and not isinstance(count, bool) and count > 0:
            out[name] = max(0, out[name] - count)
    return out


def surplus_trimmed(
    rr: Obj, wanted: Mapping[str, int], held: Collection[str]
) -> list[dict[str, Any]] | None:
    """The reservation's `spec.podSets` without its surplus slots, or None when it has none
    to give back: per pod set, the slots beyond `wanted` that no live pod holds (`held`:
    slot keys), highest index first. A slot a pod still holds is kept until that pod
    ends; a pod set the Workload does not name is left alone."""
    pod_sets = child(rr, "spec").get("podSets")
    if not isinstance(pod_sets, list):
        return None
    by_set: dict[str, list[ReservedSlot]] = {}
    for s in reservation_slots(rr):
        by_set.setdefault(s.pod_set, []).append(s)
    dropped: set[tuple[str, int]] = set()
    for name, slots in by_set.items():
        surplus = len(slots) - wanted.get(name, len(slots))
        free = [s for s in sorted(slots, key=lambda s: -s.index) if s.key not in held]
        dropped |= {(name, s.index) for s in free[:max(0, surplus)]}
    if not dropped:
        return None
    out = []
    for ps in pod_sets:
        if not isinstance(ps, Mapping):
            out.append(ps)
            continue
        name = str(ps.get("name") or "main")
        found = ps.get("slots")
        rows: list[Any] = found if isinstance(found, list) else []
        kept = [row for j, row in enumerate(rows)
                if not (isinstance(row, Mapping) and (name, _index(row, j)) in dropped)]
        out.append({**ps, "slots": kept})
    return out


def _index(row: Mapping[str, Any], j: int) -> int:
    index = row.get("index", j)
    return index if isinstance(index, int) else j
