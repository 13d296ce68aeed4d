"""Is a pod one of its reservation's Workload's pods? By the owner chain Kueue uses.

Who calls it: `ungater.py`, before a pod may take a slot. Kueue ties a Job's (JobSet's...)
pods to their Workload through the owner both share: the Workload's ownerReference names
the Job, and the Job is the pods' owner. For plain pods (one pod, or a pod group) Kueue
makes every member pod an owner of the Workload (`ensureWorkloadOwnedByAllMembers`), so the
pod's own uid is among the Workload's ownerReferences. A `pod-group-name` label or a
`kueue.x-k8s.io/workload` annotation alone is set by whoever writes the pod: no proof.

Pure: no kopf, no client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nexus_admit.kube.errors import meta

__all__ = ["owned_member"]


def _owner_uids(obj: Mapping[str, Any]) -> set[str]:
    refs = meta(obj).get("ownerReferences")
    items = refs if isinstance(refs, list) else []
    return {str(r["uid"]) for r in items if isinstance(r, Mapping) and r.get("uid")}


def owned_member(pod: Mapping[str, Any], workload: Mapping[str, Any]) -> bool:
    """The pod shares an owner with the Workload (a Job's pod), or the Workload is owned
    by the pod itself (a plain pod, or a member of a plain-pod group Kueue has adopted)."""
    workload_owners = _owner_uids(workload)
    uid = str(meta(pod).get("uid") or "")
    return bool(_owner_uids(pod) & workload_owners) or (bool(uid) and uid in workload_owners)
