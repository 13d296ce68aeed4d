"""Elastic Jobs (Kueue's Workload slices) and slots a Workload no longer needs.

Who calls it: `loop/place.py` (a new slice's reservation carries the old one's slots over:
`carry_over`) and `lifecycle.py` (the old slice's reservation is kept until the new one's
exists: `handed_over`; surplus slots of a scale-down or of finished pods, which
`lifecycle_plan.plan_reservation` finds, are given back: `trim_reservation`). What the
objects say is read in `kube/slices.py`; why, in docs/controller.md ("Elastic Jobs").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import child, meta, object_key
from nexus_admit.kube.reservations import (
    ReservedSlot,
    reservation_pod_label,
    reservation_workload_key,
)
from nexus_admit.kube.slices import (
    added_gang,
    carried_slots,
    replaced_slice,
    slice_waits,
    template_reservation_label,
)
from nexus_admit.model import Gang

__all__ = ["Carry", "carry_over", "handed_over", "trim_reservation"]

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class Carry:
    """A new Workload slice's placement: the old slice's reservation, its slots the new
    slice keeps (per pod set), and the gang of the pods it adds (None: it adds none)."""

    old: Mapping[str, Any]
    carried: dict[str, list[ReservedSlot]]
    added: Gang | None
    pod_label: str

    @property
    def kept(self) -> int:
        return sum(len(v) for v in self.carried.values())


def _owners(obj: Mapping[str, Any]) -> set[str]:
    refs = meta(obj).get("ownerReferences")
    return {str(r.get("uid")) for r in refs if isinstance(r, Mapping) and r.get("uid")} \
        if isinstance(refs, list) else set()


def carry_over(ctx: Context, workload: Mapping[str, Any], gang: Gang) -> Carry | None:
    """The carry-over of a Workload slice that replaces a slice we placed, or None (not a
    slice, or the old slice had no reservation of ours: placed as any Workload). The old
    slice must be in the store with an owner the new one shares (Kueue makes both for the
    same Job), and its reservation must hold the label the new slice's pods carry."""
    replaced = replaced_slice(workload)
    label = template_reservation_label(workload)
    if replaced is None or label is None:
        return None
    old_slice = ctx.store.get("Workload", replaced)
    if old_slice is None or not _owners(old_slice) & _owners(workload):
        return None
    old = next((rr for rr in ctx.store.reservations_of_workload(replaced)
                if reservation_pod_label(rr) == label
                and not meta(rr).get("deletionTimestamp")), None)
    if old is None:
        return None
    carried = carried_slots(old, {ps.name: ps.count for ps in gang.pod_sets})
    return Carry(old, carried, added_gang(gang, carried), label)


def handed_over(
    ctx: Context, rr: Mapping[str, Any], workload: Mapping[str, Any] | None
) -> bool:
    """Is this the reservation of a slice Kueue finished for its replacement, which still
    waits for a reservation of its own? Then it keeps holding the running pods' slots:
    released, they would go to the next gang while the Job runs on them."""
    if workload is None or slice_waits(workload):
        return False
    if child(meta(workload), "annotations").get(L.KUEUE_ELASTIC_JOB) != "true":
        return False  # Kueue marks every slice: any other Workload costs no scan
    key = object_key(workload)
    for other in ctx.store.listed("Workload"):
        if replaced_slice(other) != key or not slice_waits(other):
            continue
        if not _owners(other) & _owners(workload):
            continue
        return not ctx.store.reservations_of_workload(object_key(other))
    return False


async def trim_reservation(
    ctx: Context, rr: Mapping[str, Any], pod_sets: list[dict[str, Any]]
) -> bool:
    """Write the reservation's `spec.podSets` without its surplus slots (a scale-down,
    finished pods Kueue counts as reclaimable: `lifecycle_plan.plan_reservation` found
    them); False when the write failed (the next pass reads it again)."""
    m = meta(rr)
    ns, name = str(m.get("namespace")), str(m.get("name"))
    try:
        await asyncio.to_thread(ctx.api.merge_spec, L.KIND_RESOURCE_RESERVATION, name, ns,
                                {"podSets": pod_sets}, str(m.get("resourceVersion") or ""))
    except Exception as e:  # a conflict or an outage: the next pass reads it again
        ctx.metrics.errors.labels("reservation-trim").inc()
        log.warning("could not give back surplus slots of %s/%s: %s", ns, name, e)
        return False
    slots = sum(len(ps.get("slots") or []) for ps in pod_sets if isinstance(ps, Mapping))
    log.info("reservation %s/%s of Workload %s gave back surplus slots: %d held", ns, name,
             reservation_workload_key(rr), slots)
    return True
