"""What the controller keeps of an object: the object without the fields no reader uses.

Who calls it: the controller's store, on the way in (every watch event and every listed
object), and the lists themselves, page by page (`controller/api.py`), so a page's raw
objects are dropped before the next page is read. At 5,000 nodes and 20,000 pods the
fields below are most of what the apiserver sends: `managedFields` alone is often larger
than the rest of a pod's metadata, and a container's image, command, env and probes are
never read by the placement (docs/benchmarks.md has the measurement).

The fields are removed by name (a deny list): a field a reader may need is kept by
default, so a reader added later cannot silently see a hole. Every reader of the store was
checked against this list (kube/translate.py, kube/cluster/, kube/requests.py,
kube/podspec.py, kube/dra.py, kube/serving.py, kube/podspread.py, controller/ungating/,
webhook/, lifecycle.py, queue_gate.py); `tests/kube/test_stored.py` checks that the
stripped e2e and benchmark fixtures translate to exactly the same snapshot and gangs.

What is kept is also compacted: every key and every short string value is interned
(`sys.intern`), so the thousands of copies of "metadata", "nvidia.com/gpu", a label value
or a node name that the JSON decoder made one per object become one string each. That
halves what the stripped objects hold again, for about half the cost of decoding them.

Pure: it never changes its argument. The result is a `StoredObject` (a plain dict), which
`stripped` returns as it is: the list strips each object as its page arrives and the store
strips what it is given, and the same object is never compacted twice.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["LAST_APPLIED", "StoredObject", "stripped"]

# strings up to this long are interned: keys, label values, names, quantities, uids,
# timestamps; a longer one (a message, an annotation's JSON) is most likely unique
_INTERN_MAX = 64


class StoredObject(dict[str, Any]):
    """An object as the store keeps it (`stripped`'s result): a dict, marked so that
    stripping it again costs nothing."""

    __slots__ = ()

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

# of a container (any of a pod's three lists, and a Workload's pod templates): resources,
# name and restartPolicy (a sidecar's requests count for the whole pod) are read
_CONTAINER_UNREAD = frozenset({
    "image", "imagePullPolicy", "command", "args", "workingDir", "env", "envFrom",
    "volumeMounts", "volumeDevices", "livenessProbe", "readinessProbe", "startupProbe",
    "lifecycle", "securityContext", "terminationMessagePath", "terminationMessagePolicy",
    "ports", "stdin", "stdinOnce", "tty",
})
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
# of a pod spec: volumes (GPUs through DRA are spec.resourceClaims, kept), identity and
# networking of the running pod
_POD_SPEC_UNREAD = frozenset({
    "volumes", "securityContext", "dnsPolicy", "dnsConfig", "imagePullSecrets",
    "enableServiceLinks", "serviceAccount", "serviceAccountName",
    "automountServiceAccountToken", "terminationGracePeriodSeconds", "hostAliases",
    "readinessGates",
})
# of a pod status: phase, conditions (PodScheduled), nominatedNodeName and the DRA claim
# statuses are read
_POD_STATUS_UNREAD = frozenset({
    "containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses", "podIP",
    "podIPs", "hostIP", "hostIPs", "startTime", "qosClass",
})
# of a Node: capacity, allocatable, labels, taints, unschedulable and the Ready condition
# (its type, status and reason; not its heartbeat times) are read
_NODE_SPEC_UNREAD = frozenset({"podCIDR", "podCIDRs", "providerID"})
_NODE_STATUS_UNREAD = frozenset({
    "images", "nodeInfo", "daemonEndpoints", "addresses", "volumesAttached",
    "volumesInUse", "config", "runtimeHandlers", "features",
})
_READY_KEPT = ("type", "status", "reason")


def _node_conditions(conditions: Any) -> Any:
    """The Ready condition alone; anything malformed kept as it is, for the translation to
    tell."""
    if not isinstance(conditions, list):
        return conditions
    return [
        {k: c[k] for k in _READY_KEPT if k in c} if isinstance(c, Mapping) else c
        for c in conditions
        if not isinstance(c, Mapping) or c.get("type") == "Ready"
    ]


def _without(obj: Mapping[str, Any], unread: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in unread}


def _metadata(m: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in m.items() if k != "managedFields"}
    notes = m.get("annotations")
    if isinstance(notes, Mapping) and LAST_APPLIED in notes:
        out["annotations"] = {k: v for k, v in notes.items() if k != LAST_APPLIED}
    return out


def _pod_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    out = _without(spec, _POD_SPEC_UNREAD)
    for name in _CONTAINER_LISTS:
        containers = spec.get(name)
        if isinstance(containers, list):
            out[name] = [
                _without(c, _CONTAINER_UNREAD) if isinstance(c, Mapping) else c
                for c in containers
            ]
    return out


def _template(template: Any) -> Any:
    """A pod template (a Workload's pod set): its metadata and spec as a pod's."""
    if not isinstance(template, Mapping):
        return template
    out = dict(template)
    if isinstance(template.get("metadata"), Mapping):
        out["metadata"] = _metadata(template["metadata"])
    if isinstance(template.get("spec"), Mapping):
        out["spec"] = _pod_spec(template["spec"])
    return out


def _workload_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(spec)
    pod_sets = spec.get("podSets")
    if isinstance(pod_sets, list):
        out["podSets"] = [
            {**ps, "template": _template(ps["template"])}
            if isinstance(ps, Mapping) and "template" in ps
            else ps
            for ps in pod_sets
        ]
    return out


def _compact(value: Any) -> Any:
    if isinstance(value, dict):
        return {sys.intern(k) if isinstance(k, str) else k: _compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    if isinstance(value, str) and len(value) <= _INTERN_MAX:
        return sys.intern(value)
    return value


def stripped(kind: str, obj: Mapping[str, Any]) -> StoredObject:
    """`obj` without the fields no reader of the controller's store uses, compacted (see
    the module doc); a `StoredObject` is returned as it is. A field of an unexpected type
    is left as it is: the reader reports it."""
    if isinstance(obj, StoredObject):
        return obj
    return StoredObject(_compact(_stripped(kind, obj)))


def _stripped(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(obj)
    if isinstance(obj.get("metadata"), Mapping):
        out["metadata"] = _metadata(obj["metadata"])
    spec, status = obj.get("spec"), obj.get("status")
    if kind == "Pod":
        if isinstance(spec, Mapping):
            out["spec"] = _pod_spec(spec)
        if isinstance(status, Mapping):
            out["status"] = _without(status, _POD_STATUS_UNREAD)
    elif kind == "Node":
        if isinstance(spec, Mapping):
            out["spec"] = _without(spec, _NODE_SPEC_UNREAD)
        if isinstance(status, Mapping):
            out["status"] = _without(status, _NODE_STATUS_UNREAD)
            if "conditions" in status:
                out["status"]["conditions"] = _node_conditions(status["conditions"])
    elif kind == "Workload" and isinstance(spec, Mapping):
        out["spec"] = _workload_spec(spec)
    return out
