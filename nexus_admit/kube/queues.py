"""Which Kueue queues use our AdmissionCheck: the one fact that decides whether a pod is
gated at creation, whoever creates it (a Job, a ReplicaSet, a StatefulSet, a tenant).

A pod names its LocalQueue with the label `kueue.x-k8s.io/queue-name`; the LocalQueue (in
the pod's namespace) names its ClusterQueue in `spec.clusterQueue`; the ClusterQueue lists
its checks in `spec.admissionChecksStrategy.admissionChecks[].name`. A pod is ours iff that
chain ends in a ClusterQueue listing one of our checks. Any missing or malformed link
means "not ours": a pod of a queue without the check is never touched.

A StatefulSet's pods are the exception: Kueue puts the queue label on the StatefulSet and
only an annotation on its pod template (`kueue.x-k8s.io/pod-suspending-parent:
statefulset`); its pod reconciler adds the queue label to each pod after creation, too late
for a gate. So the StatefulSet's own queue decides for its pods, listed under a key of
its own (`gated_parent_key`).

Who calls it: the pod webhook (`controller/webhook/review.py`) and the controller's sync
of the queue list the gate policy reads (`controller/queue_gate.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from nexus_admit.kube import labels as L

__all__ = [
    "MULTIKUEUE_CONTROLLER",
    "SUSPENDING_PARENT_ANNOTATION",
    "QueueLookup",
    "cluster_queue_checks",
    "gated_parent_key",
    "gated_queue_key",
    "gated_queues",
    "local_queue_cluster_queue",
    "multikueue_managers",
    "pod_queue",
    "queue_uses_check",
    "suspending_statefulset",
]

QueueLookup = Callable[[str, str], Mapping[str, Any] | None]  # (kind, key) → object or None

# a ConfigMap key may hold at most 253 characters of [-._a-zA-Z0-9]
_CONFIGMAP_KEY_MAX = 253
# Kueue's pod template annotation naming the framework that suspends the pods through their
# parent; "statefulset" is the one whose pods are created without the queue label
SUSPENDING_PARENT_ANNOTATION = "kueue.x-k8s.io/pod-suspending-parent"
# the value of a namespace's own key when one of its LocalQueues uses the check
NAMESPACE_USES_CHECK = "uses-check"
STATEFULSET_PARENT = "statefulset"
# the controller of Kueue's MultiKueue AdmissionCheck: a ClusterQueue listing one dispatches
# its Workloads to worker clusters (it is a manager's)
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def pod_queue(pod: Mapping[str, Any]) -> str:
    """The LocalQueue the pod names, or "" (no label, or not a string)."""
    labels = _mapping(_mapping(pod.get("metadata")).get("labels"))
    queue = labels.get(L.KUEUE_QUEUE_NAME_LABEL)
    return queue if isinstance(queue, str) else ""


def local_queue_cluster_queue(local_queue: Mapping[str, Any] | None) -> str:
    """The ClusterQueue a LocalQueue points at, or "" when it names none."""
    cq = _mapping(_mapping(local_queue).get("spec")).get("clusterQueue")
    return cq if isinstance(cq, str) else ""


def cluster_queue_checks(cluster_queue: Mapping[str, Any] | None) -> set[str]:
    """The AdmissionChecks a ClusterQueue lists (v1beta2's admissionChecksStrategy; the
    older plain `spec.admissionChecks` list of names too, where an object still has it)."""
    spec = _mapping(_mapping(cluster_queue).get("spec"))
    entries = _mapping(spec.get("admissionChecksStrategy")).get("admissionChecks")
    names = {
        e["name"]
        for e in (entries if isinstance(entries, list) else [])
        if isinstance(e, Mapping) and isinstance(e.get("name"), str)
    }
    legacy = spec.get("admissionChecks")
    names |= {n for n in (legacy if isinstance(legacy, list) else []) if isinstance(n, str)}
    return names


def multikueue_managers(
    cluster_queues: Iterable[Mapping[str, Any]],
    admission_checks: Iterable[Mapping[str, Any]],
    ours: Collection[str],
) -> dict[str, str]:
    """Each check of `ours` that a MultiKueue manager's ClusterQueue lists (one that lists a
    MultiKueue check too) → the first such ClusterQueue's name. Malformed objects count as
    listing nothing."""
    multikueue = {
        str(_mapping(ac.get("metadata")).get("name"))
        for ac in admission_checks
        if _mapping(ac.get("spec")).get("controllerName") == MULTIKUEUE_CONTROLLER
    }
    out: dict[str, str] = {}
    if not multikueue:
        return out
    for cq in sorted(cluster_queues, key=lambda o: str(_mapping(o.get("metadata")).get("name"))):
        listed = cluster_queue_checks(cq)
        if listed & multikueue:
            for check in sorted(listed & set(ours)):
                out.setdefault(check, str(_mapping(cq.get("metadata")).get("name")))
    return out


def queue_uses_check(
    namespace: str, queue: str, lookup: QueueLookup, checks: Collection[str]
) -> bool:
    """The LocalQueue `namespace/queue` leads to a ClusterQueue listing one of `checks`."""
    if not queue or not checks:
        return False
    cq_name = local_queue_cluster_queue(lookup("LocalQueue", f"{namespace}/{queue}"))
    if not cq_name:
        return False
    return bool(cluster_queue_checks(lookup("ClusterQueue", cq_name)) & set(checks))


def gated_queue_key(namespace: str, queue: str) -> str | None:
    """The key of a queue in the gate policy's ConfigMap: "<namespace>.<queue>" (a
    namespace has no dots, so the first one splits it), or None when it cannot be a
    ConfigMap key (too long)."""
    key = f"{namespace}.{queue}"
    return key if namespace and queue and len(key) <= _CONFIGMAP_KEY_MAX else None


def gated_parent_key(namespace: str, kind: str, name: str) -> str | None:
    """The key of a workload parent (a StatefulSet) in the gate policy's ConfigMap:
    "<namespace>_<kind>_<name>" (neither a namespace nor a name has an underscore, so it
    never meets a queue's key), or None when too long."""
    key = f"{namespace}_{kind}_{name}"
    return key if namespace and name and len(key) <= _CONFIGMAP_KEY_MAX else None


def suspending_statefulset(pod: Mapping[str, Any]) -> str:
    """The name of the StatefulSet through which Kueue suspends this pod (Kueue's
    annotation and the pod's StatefulSet owner), or "" for any other pod."""
    m = _mapping(pod.get("metadata"))
    if _mapping(m.get("annotations")).get(SUSPENDING_PARENT_ANNOTATION) != STATEFULSET_PARENT:
        return ""
    refs = m.get("ownerReferences")
    for r in refs if isinstance(refs, list) else []:
        if isinstance(r, Mapping) and r.get("kind") == "StatefulSet":
            name = r.get("name")
            return name if isinstance(name, str) else ""
    return ""


def gated_queues(
    local_queues: Iterable[Mapping[str, Any]],
    cluster_queues: Iterable[Mapping[str, Any]],
    checks: Collection[str],
    statefulsets: Iterable[Mapping[str, Any]] = (),
) -> tuple[dict[str, str], list[str]]:
    """Every LocalQueue as {key (`gated_queue_key`): its ClusterQueue when that lists one of
    `checks`, else ""}, and the problems of the queues that cannot be listed. The gate
    policy gates a pod whose queue is listed with a ClusterQueue, or not listed at all: a
    queue created a moment before its first pods (the list not yet written) is gated rather
    than left unpinned, and the ungater lifts the gate from a pod whose queue turns out not
    to use the check. Each StatefulSet that names a known queue is listed too
    (`gated_parent_key`), with its queue's value, and each namespace with a LocalQueue
    (its bare name: NAMESPACE_USES_CHECK when one of its queues uses the check, else ""),
    which decides for a StatefulSet not listed yet. Malformed objects are skipped: they lead
    nowhere."""
    by_name: dict[str, Mapping[str, Any]] = {}
    for cq in cluster_queues:
        name = _mapping(cq.get("metadata") if isinstance(cq, Mapping) else None).get("name")
        if isinstance(name, str):
            by_name[name] = cq
    using = {n for n, cq in by_name.items() if cluster_queue_checks(cq) & set(checks)}
    listed: dict[str, str] = {}
    problems: list[str] = []
    for lq in local_queues:
        if not isinstance(lq, Mapping):
            continue
        m = _mapping(lq.get("metadata"))
        ns, name = m.get("namespace"), m.get("name")
        if not (isinstance(ns, str) and isinstance(name, str)):
            continue
        cq_name = local_queue_cluster_queue(lq)
        key = gated_queue_key(ns, name)
        if key is None:
            if cq_name in using:
                problems.append(
                    f"LocalQueue {ns}/{name}: its name is too long to be listed for the gate "
                    f"policy (namespace + '.' + name over {_CONFIGMAP_KEY_MAX} characters); "
                    "its pods are gated as a queue not yet known"
                )
            continue
        listed[key] = cq_name if cq_name in using else ""
        # the namespace itself: does any of its queues use the check (a StatefulSet not
        # listed yet is gated only in such a namespace)
        if listed.get(ns) != NAMESPACE_USES_CHECK:
            listed[ns] = NAMESPACE_USES_CHECK if cq_name in using else ""
    _list_statefulsets(statefulsets, listed)
    return listed, problems


def _list_statefulsets(statefulsets: Iterable[Mapping[str, Any]], listed: dict[str, str]) -> None:
    """Each StatefulSet under its parent key, valued as its queue is; one whose queue is
    not listed stays unlisted (its pods gated to be safe, like a queue not known yet)."""
    for sts in statefulsets:
        m = _mapping(sts.get("metadata") if isinstance(sts, Mapping) else None)
        ns, name = m.get("namespace"), m.get("name")
        queue = pod_queue(sts) if isinstance(sts, Mapping) else ""
        if not (isinstance(ns, str) and isinstance(name, str) and queue):
            continue
        queue_key, key = gated_queue_key(ns, queue), gated_parent_key(ns, "StatefulSet", name)
        if key is not None and queue_key in listed:
            listed[key] = listed[queue_key]
