"""Which gated pod takes which slot of its reservation.

Who calls it: `ungater.py`, once per reservation with gated pods. The shape follows Kueue
TAS's ungater: the claims are recomputed from the pods themselves (their slot annotation), so
a restarted controller needs no memory; pods with a rank (Kueue's `podIndexLabel`, else the
well-known Job / JobSet / LeaderWorkerSet / training-operator index labels) take the slot of
the same index, so neighbouring ranks share nodes and racks (`kube.reservations` numbers the
slots in topology order); the others take the first free slot.

Pure: no kopf, no client.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import meta
from nexus_admit.kube.requests import pod_requests
from nexus_admit.kube.reservations import ReservedSlot, parse_slot_key

__all__ = ["INDEX_LABELS", "PodView", "assign_slots", "pod_view"]

KUEUE_PODSET_LABEL = "kueue.x-k8s.io/podset"

# rank labels, most specific first; Kueue's own podIndexLabel (from the Workload's
# topologyRequest) is tried before these
INDEX_LABELS = (
    "batch.kubernetes.io/job-completion-index",
    "jobset.sigs.k8s.io/job-index",
    "leaderworkerset.sigs.k8s.io/worker-index",
    "training.kubeflow.org/replica-index",
)
INDEX_ANNOTATIONS = ("batch.kubernetes.io/job-completion-index",)
# a rank is ASCII digits, at most 9 (no Job has a billion pods): "²" or "٣" pass
# str.isdigit() and are no rank; such a pod takes the first free slot, like an unranked one
_RANK = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True, slots=True)
class PodView:
    """What slot assignment needs to know of one pod."""

    name: str
    pod_set: str
    rank: int | None
    gated: bool  # carries our scheduling gate
    slot: tuple[str, int] | None  # the slot it holds (annotation), None while gated
    active: bool  # not terminated, not being deleted
    gpus: int = 0  # nvidia.com/gpu units it requests: it fits only a slot with as many


def _rank(m: Mapping[str, Any], index_label: str | None) -> int | None:
    labels = m.get("labels") or {}
    annotations = m.get("annotations") or {}
    keys = ((index_label,) if index_label else ()) + INDEX_LABELS
    for source, names in ((labels, keys), (annotations, INDEX_ANNOTATIONS)):
        for k in names:
            v = source.get(k)
            if isinstance(v, str) and _RANK.fullmatch(v):
                return int(v)
    return None


def pod_view(
    pod: Mapping[str, Any], pod_sets: Sequence[str], index_label: str | None = None
) -> PodView:
    m = meta(pod)
    labels = m.get("labels") or {}
    spec = pod.get("spec") or {}
    gates = [g.get("name") for g in spec.get("schedulingGates") or [] if isinstance(g, Mapping)]
    pod_set = str(labels.get(KUEUE_PODSET_LABEL) or (pod_sets[0] if len(pod_sets) == 1 else ""))
    phase = (pod.get("status") or {}).get("phase")
    gated = L.GATE_PLACEMENT in gates
    return PodView(
        name=str(m.get("name")),
        pod_set=pod_set,
        rank=_rank(m, index_label),
        gated=gated,
        # our pin sets the slot and lifts the gate in one patch: a gated pod's slot
        # annotation was written by someone else and holds nothing
        slot=None if gated else parse_slot_key((m.get("annotations") or {}).get(L.ANN_SLOT)),
        active=phase not in ("Succeeded", "Failed") and not m.get("deletionTimestamp"),
        gpus=pod_requests(pod, pod.get("spec")).gpus if gated else 0,
    )


def assign_slots(slots: Iterable[ReservedSlot], pods: Iterable[PodView]) -> dict[str, ReservedSlot]:
    """Pod name → slot for every gated pod without a slot that can get one.

    Slots held by active pods are taken; a slot whose pod terminated or was deleted is
    free again, for its replacement. Ranked pods first (their own index when free), then the
    others in name order, each the lowest free index of its pod set. Pods left over (more
    pods than slots) get nothing and stay gated, and so does a pod asking for more GPUs than
    a slot holds.
    """
    free: dict[str, dict[int, ReservedSlot]] = {}
    for s in slots:
        free.setdefault(s.pod_set, {})[s.index] = s
    pods = sorted(pods, key=lambda p: p.name)
    for p in pods:
        if p.active and p.slot is not None:
            free.get(p.slot[0], {}).pop(p.slot[1], None)
    waiting = [p for p in pods if p.gated and p.active and p.slot is None]
    out: dict[str, ReservedSlot] = {}
    for p in waiting:
        pool = free.get(p.pod_set, {})
        if p.rank is not None and p.rank in pool and _fits(p, pool[p.rank]):
            out[p.name] = pool.pop(p.rank)
    for p in waiting:
        pool = free.get(p.pod_set, {})
        fitting = [i for i, s in pool.items() if _fits(p, s)]
        if p.name not in out and fitting:
            out[p.name] = pool.pop(min(fitting))
    return out


def _fits(pod: PodView, slot: ReservedSlot) -> bool:
    """A pod asking for more GPUs than the slot holds would take devices nobody reserved."""
    return pod.gpus <= len(slot.gpus)
