"""GPUs waiting per tier: Workloads queued in ClusterQueues that use one of our checks and
not admitted yet, by the tier label of their ClusterQueue (admin-owned, never the user's).

Who calls it: `placing.py`'s capacity metrics (`nexus_admit_pending_gpus{tier}`). The engine
does not read it yet: placement-level backfill (a lower tier on idle premium GPUs only while
no higher tier waits for them) is where it goes next. Pure: no kopf, no client.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.errors import TranslationError, child, meta
from nexus_admit.kube.workload import workload_template_requests

__all__ = ["pending_gpus_by_tier"]


def _uses_check(cq: Mapping[str, Any], checks: Collection[str]) -> bool:
    strategy = child(child(cq, "spec"), "admissionChecksStrategy")
    names = {
        str(c.get("name")) for c in strategy.get("admissionChecks") or [] if isinstance(c, Mapping)
    }
    return bool(names & set(checks))


def _done(workload: Mapping[str, Any]) -> bool:
    conditions = child(workload, "status").get("conditions") or []
    states = {str(c.get("type")): c.get("status") for c in conditions if isinstance(c, Mapping)}
    return states.get("Admitted") == "True" or states.get("Finished") == "True"


def pending_gpus_by_tier(dump: ClusterDump, checks: Collection[str]) -> dict[str, int]:
    kueue = dump.kueue_index()
    out: dict[str, int] = defaultdict(int)
    for wl in dump.kind("Workload"):
        if _done(wl) or child(wl, "spec").get("active") is False:
            continue
        cq_name = kueue.cluster_queue_name(wl)
        cq = kueue.cluster_queues.get(cq_name) if cq_name else None
        if cq is None or not _uses_check(cq, checks):
            continue
        tier = str((meta(cq).get("labels") or {}).get(L.LABEL_TIER) or "default")
        try:
            per_pod = workload_template_requests(wl)
        except TranslationError:
            continue  # reported where it is placed
        counts = {
            str(ps.get("name") or "main"): int(ps.get("count") or 1)
            for ps in child(wl, "spec").get("podSets") or []
            if isinstance(ps, Mapping) and isinstance(ps.get("count", 1), int)
        }
        for (_, pod_set), (_, _, gpus) in per_pod.items():
            out[tier] += gpus * counts.get(pod_set, 1)
    return dict(out)
