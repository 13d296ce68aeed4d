"""Pins gated pods to their slots and lifts the gate, so kube-scheduler binds them there.

Who calls it: `placing.py`, as the last step of every pass. For each live reservation with
pods that still carry our scheduling gate, the pure `assign_slots` chooses their slots, and
one strategic-merge patch per pod adds the hostname nodeSelector and the slot / NUMA-zone
annotations and drops the gate (Kubernetes accepts a new nodeSelector on a gated pod). The
patches of a reservation go out concurrently; the reservation's status is rewritten once
per pass by `lifecycle.py`, not per pod.

The slots a pod holds are read back from the pods themselves, so a restart needs no
memory; `ctx.ungating` only covers our own patches until the watch shows them, so a pass in
between does not hand the same slot out twice (Kueue TAS's ungater keeps the same kind of
expectations).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.slot_assignment import PodView, assign_slots, pod_view
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import child, meta
from nexus_admit.kube.quantity import parse_time
from nexus_admit.kube.reservations import ReservedSlot, reservation_slots, reservation_workload_key

__all__ = ["pin_patch", "sync_ungating"]

log = logging.getLogger("nexus_admit.ungater")


def pin_patch(slot: ReservedSlot, hostname: str) -> dict[str, Any]:
    annotations = {L.ANN_SLOT: slot.key}
    if slot.numa_zone is not None:
        annotations[L.ANN_NUMA_ZONE] = str(slot.numa_zone)
    return {
        "metadata": {"annotations": annotations},
        "spec": {
            "nodeSelector": {L.HOSTNAME_LABEL: hostname},
            "schedulingGates": [{"$patch": "delete", "name": L.GATE_PLACEMENT}],
        },
    }


def _index_label(workload: Mapping[str, Any] | None) -> str | None:
    """Kueue's podIndexLabel of the Workload's first pod set that declares one."""
    spec = child(workload, "spec") if workload else {}
    for ps in spec.get("podSets") or []:
        tr = ps.get("topologyRequest") if isinstance(ps, Mapping) else None
        if isinstance(tr, Mapping) and tr.get("podIndexLabel"):
            return str(tr["podIndexLabel"])
    return None


def _pod_sets(rr: Mapping[str, Any]) -> list[str]:
    spec = child(rr, "spec")
    return [str(ps.get("name")) for ps in spec.get("podSets") or [] if isinstance(ps, Mapping)]


def _views(ctx: Context, pods: Sequence[Mapping[str, Any]], rr: Mapping[str, Any]) -> list[PodView]:
    index_label = _index_label(ctx.store.get("Workload", reservation_workload_key(rr)))
    out = []
    for p in pods:
        view = pod_view(p, _pod_sets(rr), index_label)
        uid = str(meta(p).get("uid") or "")
        if view.slot is not None or not view.gated:
            ctx.ungating.pop(uid, None)  # the watch shows our patch
        elif uid in ctx.ungating:
            continue  # patched, not yet seen: its slot is held by the assumption below
        out.append(view)
    return out


KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"


def unpinned_release(pod: Mapping[str, Any]) -> bool:
    """A plain pod gated by the webhook (its queue uses our check) that Kueue admitted
    without a reservation label (a TAS flavor: Kueue chose its host): lift our gate only."""
    labels = meta(pod).get("labels") or {}
    gates = _gates(pod)
    return (
        L.GATE_PLACEMENT in gates
        and KUEUE_ADMISSION_GATE not in gates
        and not labels.get(L.LABEL_RESERVATION)
    )


async def sync_ungating(ctx: Context) -> None:
    pods = ctx.store.items("Pod")
    live = {str(meta(p).get("uid")) for p in pods}
    ctx.ungating = {u: s for u, s in ctx.ungating.items() if u in live}
    for pod in pods:
        if unpinned_release(pod) and str(meta(pod).get("uid")) not in ctx.ungating:
            await _lift(ctx, pod)
    for rr in ctx.store.items(L.KIND_RESOURCE_RESERVATION):
        m = meta(rr)
        if m.get("deletionTimestamp"):
            continue
        ns, name = str(m.get("namespace")), str(m.get("name"))
        pods = ctx.store.pods_of_reservation(ns, name, L.LABEL_RESERVATION)
        if not any(L.GATE_PLACEMENT in _gates(p) for p in pods):
            continue
        views = _views(ctx, pods, rr)
        uids = {str(meta(p).get("uid")) for p in pods}
        taken = {slot for uid, slot in ctx.ungating.items() if uid in uids}
        slots = [s for s in reservation_slots(rr) if s.key not in taken]
        chosen = assign_slots(slots, views)
        if not chosen:
            continue
        by_name = {str(meta(p).get("name")): p for p in pods}
        await asyncio.gather(*(_pin(ctx, by_name[pod], slot) for pod, slot in chosen.items()))


async def _lift(ctx: Context, pod: Mapping[str, Any]) -> None:
    m = meta(pod)
    patch = {"spec": {"schedulingGates": [{"$patch": "delete", "name": L.GATE_PLACEMENT}]}}
    ctx.ungating[str(m.get("uid"))] = ""
    try:
        await asyncio.to_thread(
            ctx.api.patch_pod, str(m.get("name")), str(m.get("namespace")), patch
        )
    except Exception as e:
        ctx.ungating.pop(str(m.get("uid")), None)
        ctx.metrics.errors.labels("ungate").inc()
        log.warning("could not lift the gate of %s/%s: %s", m.get("namespace"), m.get("name"), e)


def _gates(pod: Mapping[str, Any]) -> list[str]:
    spec = child(pod, "spec")
    return [str(g.get("name")) for g in spec.get("schedulingGates") or [] if isinstance(g, Mapping)]


async def _pin(ctx: Context, pod: Mapping[str, Any], slot: ReservedSlot) -> None:
    m = meta(pod)
    node = ctx.store.get("Node", slot.node)
    labels = (meta(node).get("labels") or {}) if node else {}
    hostname = str(labels.get(L.HOSTNAME_LABEL) or slot.node)
    uid = str(m.get("uid") or "")
    ctx.ungating[uid] = slot.key
    try:
        await asyncio.to_thread(
            ctx.api.patch_pod,
            str(m.get("name")),
            str(m.get("namespace")),
            pin_patch(slot, hostname),
        )
    except Exception as e:  # the pod stays gated; the next pass tries again
        ctx.ungating.pop(uid, None)
        ctx.metrics.errors.labels("ungate").inc()
        log.warning(
            "could not pin pod %s/%s to %s: %s", m.get("namespace"), m.get("name"), slot.node, e
        )
        return
    ctx.faults.hit("kill-while-ungating")
    created = parse_time(m.get("creationTimestamp"))
    if created is not None:
        ctx.metrics.ungate_seconds.observe(max(0.0, (ctx.clock() - created).total_seconds()))
    log.info("pod %s/%s → %s (slot %s)", m.get("namespace"), m.get("name"), slot.node, slot.key)
