"""Which gated pod takes which slot of its reservation.

Who calls it: `ungater.py`, once per reservation with gated pods. The shape follows Kueue
TAS's ungater: the claims are recomputed from the pods themselves (their slot annotation), so
a restarted controller needs no memory; pods with a rank take the slot of the same index in
their pod set, so neighbouring ranks share nodes and racks (`kube.reservations` numbers the
slots in topology order); the others take the first free slot.

A pod being deleted keeps its slot while it may still hold the node (`holds_slot`): an
Indexed Job replaces a pod as soon as it starts terminating, and kube-scheduler counts the
old pod on its node until the kubelet removes it. Pinned at once, the replacement would
wait unschedulable beside it and, past `reservation_pods.UNSCHEDULABLE_GRACE`, send its
whole gang back through Retry; kept gated, it is pinned once the old pod is gone, or
once its grace period and `TERMINATION_MARGIN` have passed (a node that never removes it).

Reads the store's views (`kube/views.py`): each pod's `PodView` becomes a `RankedPod`, what
slot assignment needs of it (its rank, by the rules below, and whether it holds a slot now).

A pod's rank within its pod set, by the kind's own labels (`RankRule`, read from the
Workload's pod set the way Kueue TAS reads it):
- Kueue's `topologyRequest`: `podIndexLabel`, and for a pod set made of several Jobs (a
  JobSet's replicated job, a TrainJob's) `subGroupIndexLabel` / `subGroupCount`: rank =
  job index × pods per Job + completion index;
- the pod set template's `kueue.x-k8s.io/pod-index-offset` (a LeaderWorkerSet's workers
  are indexed from 1, the leader being 0): subtracted;
- without them (Kueue's TopologyAwareScheduling gate off): a JobSet pod's `job-index` ×
  its pod set's pods per Job (from `replicatedjob-replicas`) + completion index; a
  LeaderWorkerSet worker's `worker-index` − 1; else the well-known index labels.

Pure: no kopf, no client.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from nexus_admit.kube.quantity import parse_time
from nexus_admit.kube.requests import pod_requests
from nexus_admit.kube.reservations import ReservedSlot
from nexus_admit.kube.views import PodView, WorkloadView

__all__ = [
    "INDEX_LABELS",
    "TERMINATION_MARGIN",
    "RankRule",
    "RankedPod",
    "assign_slots",
    "creation_slot",
    "holds_slot",
    "rank_rules",
    "ranked_pod",
]

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
class RankedPod:
    """What slot assignment needs to know of one pod (`ranked_pod`)."""

    name: str
    pod_set: str
    rank: int | None
    gated: bool  # carries our scheduling gate
    slot: tuple[str, int] | None  # the slot it holds (annotation), None while gated
    active: bool  # holds or may take a slot: not terminated, not deleted (`holds_slot`)
    gpus: int = 0  # nvidia.com/gpu units it requests: it fits only a slot with as many
    node: str | None = None  # the node it is bound to


JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOBSET_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
POD_INDEX_OFFSET = "kueue.x-k8s.io/pod-index-offset"


@dataclass(frozen=True, slots=True)
class RankRule:
    """How a pod set's pods carry their rank (see the module docstring)."""

    count: int = 0  # pods in the pod set
    index_label: str | None = None
    sub_group_label: str | None = None
    sub_groups: int = 0
    offset: int = 0

    def rank(self, labels: Mapping[str, Any], annotations: Mapping[str, Any]) -> int | None:
        if self.index_label is not None:
            index = _number(labels.get(self.index_label))
            if index is None:
                return None
            index -= self.offset
            if self.sub_group_label is None or self.sub_groups <= 1:
                return index if index >= 0 else None
            sub = _number(labels.get(self.sub_group_label))
            per = self.count // self.sub_groups
            if sub is None or not 0 <= index < per:
                return None
            return sub * per + index
        return _fallback_rank(self, labels, annotations)


def _fallback_rank(
    rule: RankRule, labels: Mapping[str, Any], annotations: Mapping[str, Any]
) -> int | None:
    job, replicas = _number(labels.get(JOBSET_JOB_INDEX)), _number(labels.get(JOBSET_REPLICAS))
    completion = _number(labels.get(COMPLETION_INDEX))
    if job is not None and replicas and completion is not None and rule.count:
        per = rule.count // replicas
        return job * per + completion if 0 <= completion < per else None
    worker = _number(labels.get(LWS_WORKER_INDEX))
    if worker is not None:
        return worker - rule.offset if worker >= rule.offset else None
    for source, names in ((labels, INDEX_LABELS), (annotations, INDEX_ANNOTATIONS)):
        for k in names:
            if (v := _number(source.get(k))) is not None:
                return v
    return None


def _number(v: Any) -> int | None:
    return int(v) if isinstance(v, str) and _RANK.fullmatch(v) else None


def rank_rules(workload: WorkloadView | None) -> dict[str, RankRule]:
    """Each pod set's RankRule, from the Workload's spec (no Workload: none): its pod sets
    as written (`raw`), which the view does not hold."""
    spec = workload.raw.get("spec") if workload is not None else None
    pod_sets = spec.get("podSets") if isinstance(spec, Mapping) else None
    items = [ps for ps in pod_sets if isinstance(ps, Mapping)] if isinstance(pod_sets, list) else []
    names = {str(ps.get("name") or "main") for ps in items}
    return {str(ps.get("name") or "main"): _rule(ps, names) for ps in items}


def _rule(ps: Mapping[str, Any], names: set[str]) -> RankRule:
    tr = ps.get("topologyRequest")
    tr = tr if isinstance(tr, Mapping) else {}
    tpl = ps.get("template")
    tmeta = tpl.get("metadata") if isinstance(tpl, Mapping) else None
    ann = tmeta.get("annotations") if isinstance(tmeta, Mapping) else None
    offset = _number((ann if isinstance(ann, Mapping) else {}).get(POD_INDEX_OFFSET))
    if offset is None:  # a LeaderWorkerSet's workers without Kueue TAS: the leader is 0
        offset = 1 if ps.get("name") == "worker" and "leader" in names else 0
    count, sub_groups = ps.get("count"), tr.get("subGroupCount")
    label, sub_label = tr.get("podIndexLabel"), tr.get("subGroupIndexLabel")
    return RankRule(
        count=count if isinstance(count, int) else 0,
        index_label=label if isinstance(label, str) and label else None,
        sub_group_label=sub_label if isinstance(sub_label, str) and sub_label else None,
        sub_groups=sub_groups if isinstance(sub_groups, int) else 0,
        offset=offset,
    )


# how long past the end of its grace period (its deletionTimestamp) a pod being deleted is
# taken to hold its node: the kubelet stops its containers then, reports, and removes it
TERMINATION_MARGIN = timedelta(seconds=15)


def holds_slot(pod: PodView, now: datetime) -> bool:
    """Whether a pod still holds its slot: not finished (kube-scheduler does not count a
    Succeeded or Failed pod), and not being deleted, or being deleted from a node it was
    bound to until its deletionTimestamp plus TERMINATION_MARGIN. A pod never bound holds
    no node (the apiserver deletes it at once); an unreadable deletionTimestamp holds
    nothing, as before."""
    if pod.terminated:
        return False
    if not pod.deletion:
        return True
    if not pod.node:
        return False
    try:
        ends = parse_time(pod.deletion)
    except (TypeError, ValueError):
        return False
    return ends is not None and now < ends + TERMINATION_MARGIN


def ranked_pod(
    pod: PodView,
    pod_sets: Sequence[str],
    rules: Mapping[str, RankRule] | None = None,
    *,
    now: datetime,
) -> RankedPod:
    """The pod as slot assignment reads it. Its GPU request is read from the pod as written
    (`raw`), and only while it is gated (what it asks of the slot it is to take)."""
    pod_set = str(pod.labels.get(KUEUE_PODSET_LABEL)
                  or (pod_sets[0] if len(pod_sets) == 1 else ""))
    rule = (rules or {}).get(pod_set, RankRule())
    return RankedPod(
        name=pod.name,
        pod_set=pod_set,
        rank=rule.rank(pod.labels, pod.annotations),
        gated=pod.gated,
        # our pin sets the slot and lifts the gate in one patch: a gated pod's slot
        # annotation was written by someone else and holds nothing
        slot=None if pod.gated else pod.slot,
        active=holds_slot(pod, now),
        gpus=pod_requests(pod.raw, pod.raw.get("spec")).gpus if pod.gated else 0,
        node=pod.node,
    )


def assign_slots(
    slots: Iterable[ReservedSlot], pods: Iterable[RankedPod]
) -> dict[str, ReservedSlot]:
    """Pod name → slot for every gated pod without a slot that can get one.

    Slots held by active pods are taken; a slot whose pod terminated or was deleted (and
    left its node: `holds_slot`) is free again, for its replacement, and so is one that
    moved off the failed node its pod is still bound to (`controller/failed_nodes.py`).
    Ranked pods first (their own index when free), then the others in name order, each the
    lowest free index of its pod set. Pods left over (more pods than slots) get nothing and
    stay gated, and so does a pod asking for more GPUs than a slot holds.
    """
    free: dict[str, dict[int, ReservedSlot]] = {}
    for s in slots:
        free.setdefault(s.pod_set, {})[s.index] = s
    pods = sorted(pods, key=lambda p: p.name)
    for p in pods:
        if p.active and p.slot is not None:
            pool = free.get(p.slot[0], {})
            held = pool.get(p.slot[1])
            if held is not None and p.node is not None and held.node != p.node:
                continue  # its slot moved off its failed node: it holds the new node nothing
            pool.pop(p.slot[1], None)
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


def _fits(pod: RankedPod, slot: ReservedSlot) -> bool:
    """A pod asking for more GPUs than the slot holds would take devices nobody reserved."""
    return pod.gpus <= len(slot.gpus)


def creation_slot(
    slots: Iterable[ReservedSlot], pod: RankedPod, others: Iterable[RankedPod]
) -> ReservedSlot | None:
    """The slot a pod being created can be pinned to at once, or None: then it stays
    gated and `assign_slots` gives it one later, on the leader.

    Only the slot of the pod's own rank, and only where `assign_slots` would choose the
    same for it whatever the order: the pod has a rank, that slot is free and fits it, and
    no other pod of the reservation waits gated (a gated pod without its own slot free
    takes the lowest free one, which may be this one). Any doubt leaves the pod to the
    ungater, so the answer needs no claim shared between replicas: a rank names one slot.
    """
    if pod.rank is None or not pod.gated or not pod.active:
        return None
    for other in others:
        if not other.active:
            continue
        if other.gated or other.slot == (pod.pod_set, pod.rank):
            return None
    for s in slots:
        if s.pod_set == pod.pod_set and s.index == pod.rank:
            return s if _fits(pod, s) else None
    return None
