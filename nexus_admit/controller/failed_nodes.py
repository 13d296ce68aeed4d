"""Slots whose node failed move to a healthy node of the same domain, or the gang goes back.

Who calls it: `loop/cycle.py`, right after the lifecycle step found reservations with
stranded slots (`reservation_pods.stranded_slots`: the node was deleted, cordoned or went
NotReady, and no live pod holds the slot: not claimed yet, or its pod was deleted or ended
and a replacement comes). As Kueue TAS replaces a failed node, only those slots move, each
to a node of its pod set's domain (the rack, block or clique all its slots share, within
the nodeSelector our Ready check gave the pod set) that the pod set may use and that has
room now (`placement/replacement.py`): the reservation is patched in place, under the same
name, so the Workload's Ready check, its pods' label and the slots that run stay as they
are, and a pod gated meanwhile is pinned to the new node. When one of them has nowhere to
go the gang is sent back through Retry and the reservation released, as any slot that can
no longer be used. Events: `SlotMoved`, or `PlacementReleased` with the Retry.

It reads the store's views (`kube/views.py`); the objects (`view.raw`) only to translate
the gang again and to build the reservation's patch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.events import post_event
from nexus_admit.controller.lifecycle import release, retry_gang
from nexus_admit.controller.lifecycle_plan import Stranded
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import TranslationError, child, meta
from nexus_admit.kube.views import ReservationView, WorkloadView
from nexus_admit.model import ClusterSnapshot, PlacementConfig, Slot
from nexus_admit.placement.replacement import replacement_slots, shared_domain
from nexus_admit.placement.sequence import OrderedPlacer

__all__ = ["move_stranded", "moved_pod_sets", "pod_set_domains"]

log = logging.getLogger(__name__)


async def move_stranded(
    ctx: Context, stranded: Sequence[Stranded], snapshot: ClusterSnapshot
) -> None:
    """Move each reservation's stranded slots, or send its gang back (see the module).
    `snapshot`: the pass's, read only (the moves are found on copies of its nodes)."""
    checks = sorted(ctx.checks)
    dump = ctx.store.dump()
    kueue = dump.kueue_index()
    now = ctx.clocks.wall()
    for s in stranded:
        check, config = _our_check(ctx, s.workload, checks)
        if config is None:
            continue  # no placement config to read it with: the check step says why
        moving = [Slot(r.pod_set, r.index, r.node, r.gpus, r.numa_zone) for r, _ in s.slots]
        why = "; ".join(f"node {r.node} of slot {r.key} {w}" for r, w in s.slots)
        try:
            levels = config.resolve_levels(snapshot.kueue_topologies)
            gang = dump.gang(s.workload.raw, config, snapshot, kueue, now=now)
        except (TranslationError, ValueError) as e:
            moved, domains = None, {}
            why = f"{why}; its Workload cannot be read again ({e})"
        else:
            domains = pod_set_domains(s.rr, s.workload, check, ctx.store.by_key("Node"),
                                      levels)
            room = _candidates(snapshot, domains)
            ctx.ledger.hold_in(OrderedPlacer(ctx.engine, room))  # placements in flight
            moved = replacement_slots(room, gang, moving, domains)
        if moved is None:
            await _send_back(ctx, s, checks, why, domains, now)
        else:
            await _patch(ctx, s, moved, now)


def _our_check(
    ctx: Context, workload: WorkloadView, checks: Sequence[str]
) -> tuple[str, PlacementConfig | None]:
    for check in checks:
        if workload.check(check):
            return check, ctx.checks[check].config
    return "", None


def pod_set_domains(
    rr: ReservationView, workload: WorkloadView, check: str,
    nodes: Mapping[str, Any], levels: Sequence[str],
) -> dict[str, dict[str, str]]:
    """Per pod set, the labels a replacement node must carry: the topology levels (and
    the NVLink clique) every node of its slots shares, as far as those nodes are still
    known (none: those the gang's nodes share), and the nodeSelector our Ready check gave
    its pods (a pod pinned outside it would never schedule)."""
    keys = [*levels[:-1], L.GFD_GPU_CLIQUE]  # the last level is the hostname
    by_set: dict[str, list[Mapping[str, str]]] = {}
    for slot in rr.slots:
        node = nodes.get(slot.node)
        labels = child(meta(node), "labels") if node is not None else None
        group = by_set.setdefault(slot.pod_set, [])
        if labels is not None:
            group.append({str(k): str(v) for k, v in labels.items()})
    # a pod set none of whose nodes is known any more (all deleted) keeps to the domain the
    # whole gang's known nodes share
    gang = shared_domain([labels for group in by_set.values() for labels in group], keys)
    out = {name: shared_domain(group, keys) if group else dict(gang)
           for name, group in by_set.items()}
    for update in workload.check(check).get("podSetUpdates") or []:
        if not isinstance(update, Mapping) or str(update.get("name")) not in out:
            continue
        selector = update.get("nodeSelector")
        if isinstance(selector, Mapping):
            out[str(update["name"])].update({str(k): str(v) for k, v in selector.items()})
    return out


def _candidates(
    snapshot: ClusterSnapshot, domains: Mapping[str, Mapping[str, str]]
) -> ClusterSnapshot:
    """Copies of the snapshot's nodes inside one of the domains (the snapshot is the
    pass's and is not changed here)."""

    def inside(labels: Mapping[str, str]) -> bool:
        return any(all(labels.get(k) == v for k, v in d.items()) for d in domains.values())

    return ClusterSnapshot(
        nodes={n.name: n.copy() for n in snapshot.nodes.values() if inside(n.labels)},
        kueue_topologies=snapshot.kueue_topologies,
    )


def moved_pod_sets(rr: Mapping[str, Any], moved: Sequence[Slot]) -> list[dict[str, Any]]:
    """The reservation's `spec.podSets` with the moved slots on their new nodes (read from
    the object, `view.raw`: the patch keeps every other field as written)."""
    new = {(s.pod_set, s.index): s for s in moved}
    out: list[dict[str, Any]] = []
    for ps in child(rr, "spec").get("podSets") or []:
        if not isinstance(ps, Mapping):
            continue
        name = str(ps.get("name") or "main")
        slots = []
        for j, slot in enumerate(ps.get("slots") or []):
            index = slot.get("index", j) if isinstance(slot, Mapping) else j
            to = new.get((name, index)) if isinstance(index, int) else None
            if to is None:
                slots.append(slot)
                continue
            entry: dict[str, Any] = {**slot, "node": to.node, "gpus": list(to.gpu_indices)}
            entry.pop("numaZone", None)
            if to.numa_zone is not None:
                entry["numaZone"] = to.numa_zone
            slots.append(entry)
        out.append({**ps, "slots": slots})
    return out


async def _patch(ctx: Context, s: Stranded, moved: Sequence[Slot], now: datetime) -> None:
    ns, name = s.rr.namespace, s.rr.name
    version = str(meta(s.rr.raw).get("resourceVersion") or "")  # the patch's precondition
    try:
        stored = await asyncio.to_thread(
            ctx.api.merge_spec, L.KIND_RESOURCE_RESERVATION, name, ns,
            {"podSets": moved_pod_sets(s.rr.raw, moved)}, version)
    except Exception as e:  # a newer version, or the apiserver: looked at again next pass
        ctx.metrics.errors.labels("reservation-move").inc()
        log.warning("could not move slots of reservation %s/%s: %s", ns, name, e)
        return
    if stored:
        ctx.store.upsert(L.KIND_RESOURCE_RESERVATION, stored)  # held there for this pass
    note = "; ".join(f"slot {r.key} moved from node {r.node}, which {why}, to node {to.node}"
                     for (r, why), to in zip(s.slots, moved, strict=True))
    log.info("reservation %s/%s: %s", ns, name, note)
    await asyncio.to_thread(post_event, ctx.api, s.workload.raw, "SlotMoved",
                            f"reservation {name}: {note}", now=now, action="Move")


async def _send_back(
    ctx: Context, s: Stranded, checks: Sequence[str], why: str,
    domains: Mapping[str, Mapping[str, str]], now: datetime,
) -> None:
    within = ", ".join(sorted({f"{k}={v}" for d in domains.values() for k, v in d.items()}))
    message = (f"reservation {s.rr.name} cannot be used: {why}; no healthy node "
               f"{f'in {within} ' if within else ''}has room for its pods; the gang is "
               "placed again")
    if await retry_gang(ctx, s.workload, checks, message):
        await release(ctx, s.rr, s.workload, message, now)
    else:
        log.warning("Workload %s: Retry for its failed node not written; next pass",
                    s.workload.key)
