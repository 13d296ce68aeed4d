"""GPUs waiting per tier: Workloads queued in ClusterQueues that use one of our checks and
not admitted yet, by the tier label of their ClusterQueue (admin-owned, never the user's).

Who calls it: `loop/cycle.py`, for the capacity metrics (`nexus_admit_pending_gpus{tier}`) and
for backfill (PlacementConfig `preemption.backfill`: a lower tier borrows a higher tier's
hardware only while no Workload of that tier waits that it could hold). Pure: no kopf, no
client.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from typing import Any

from nexus_admit.controller.store import PerObject
from nexus_admit.kube import labels as L
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.errors import TranslationError, child, meta
from nexus_admit.kube.kueue import KueueIndex
from nexus_admit.kube.podspec import workload_template_requests
from nexus_admit.kube.queues import cluster_queue_checks
from nexus_admit.model import GPU_WHOLE

__all__ = ["pending_demands", "pending_gpus_by_tier", "queues_using", "waiting_queue",
           "waiting_workloads", "workload_demand"]


def _uses_check(cq: Mapping[str, Any], checks: Collection[str]) -> bool:
    return bool(cluster_queue_checks(cq) & set(checks))


def _done(workload: Mapping[str, Any]) -> bool:
    conditions = child(workload, "status").get("conditions") or []
    states = {str(c.get("type")): c.get("status") for c in conditions if isinstance(c, Mapping)}
    return states.get("Admitted") == "True" or states.get("Finished") == "True"


def waiting_workloads(
    dump: ClusterDump, checks: Collection[str]
) -> list[tuple[dict[str, Any], Mapping[str, Any]]]:
    """(Workload, its ClusterQueue) of every active Workload not yet admitted or finished
    in a ClusterQueue that uses one of `checks`."""
    kueue = dump.kueue_index()
    out = []
    for wl in dump.kind("Workload"):
        cq = waiting_queue(wl, kueue, checks)
        if cq is not None:
            out.append((wl, cq))
    return out


def waiting_queue(
    workload: Mapping[str, Any], kueue: KueueIndex, checks: Collection[str]
) -> Mapping[str, Any] | None:
    """The ClusterQueue of an active Workload not yet admitted or finished, when that
    queue uses one of `checks`; else None (also when its queue cannot be read: it waits
    for none of ours, and its view names the field, `skipped.with_view_problems`)."""
    if _done(workload) or child(workload, "spec").get("active") is False:
        return None
    try:
        cq_name = kueue.cluster_queue_name(workload)
    except TranslationError:  # untrusted: one such Workload must not stop the pass
        return None
    cq = kueue.cluster_queues.get(cq_name) if cq_name else None
    return cq if cq is not None and _uses_check(cq, checks) else None


def queues_using(kueue: KueueIndex, checks: Collection[str]) -> tuple[object, ...]:
    """What `waiting_queue` reads besides the Workload: each LocalQueue's ClusterQueue and
    whether each ClusterQueue uses one of `checks` (not their status, which Kueue writes
    on every admission)."""
    return (
        tuple((k, child(lq, "spec").get("clusterQueue")) for k, lq in kueue.local_queues.items()),
        tuple((name, _uses_check(cq, checks)) for name, cq in kueue.cluster_queues.items()),
    )


def pending_demands(
    dump: ClusterDump, checks: Collection[str],
    memo: PerObject[tuple[str, int] | None] | None = None,
) -> list[tuple[str, int]]:
    """(tier, GPUs in milli-GPUs) of every waiting Workload, one entry each. With `memo`,
    a Workload's demand is derived again only when the store holds a new object for it."""
    kueue = dump.kueue_index()
    workloads = dump.kind("Workload")

    def demand(wl: dict[str, Any]) -> tuple[str, int] | None:
        return workload_demand(wl, kueue, checks)

    if memo is None:
        demands = [demand(wl) for wl in workloads]
    else:
        tiers = tuple((name, _tier(cq)) for name, cq in kueue.cluster_queues.items())
        demands = memo.values(
            workloads, demand, (frozenset(checks), *queues_using(kueue, checks), tiers)
        )
    return [d for d in demands if d is not None]


def workload_demand(
    workload: Mapping[str, Any], kueue: KueueIndex, checks: Collection[str]
) -> tuple[str, int] | None:
    """(its ClusterQueue's tier, GPUs in milli-GPUs) of a waiting Workload; None for one
    that does not wait in a queue of ours, or whose pod templates cannot be read (that is
    reported where it is placed)."""
    cq = waiting_queue(workload, kueue, checks)
    if cq is None:
        return None
    try:
        per_pod = workload_template_requests(workload, kueue)
    except TranslationError:
        return None
    counts = {
        str(ps.get("name") or "main"): int(ps.get("count") or 1)
        for ps in child(workload, "spec").get("podSets") or []
        if isinstance(ps, Mapping) and isinstance(ps.get("count", 1), int)
    }
    gpus = sum(g * counts.get(pod_set, 1) for (_, pod_set), (_, _, g) in per_pod.items())
    return (_tier(cq), gpus * GPU_WHOLE)


def _tier(cluster_queue: Mapping[str, Any]) -> str:
    return str((meta(cluster_queue).get("labels") or {}).get(L.LABEL_TIER) or "default")


def pending_gpus_by_tier(
    dump: ClusterDump, checks: Collection[str],
    memo: PerObject[tuple[str, int] | None] | None = None,
) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for tier, milli in pending_demands(dump, checks, memo):
        out[tier] += milli // GPU_WHOLE
    return dict(out)
