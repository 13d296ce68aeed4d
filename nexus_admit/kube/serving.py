"""Serving workloads as Kueue v0.19 records them, and the sets of replicas they belong to.

- A Deployment's pods each become a single-pod Workload owned by the Pod (the Pod is owned
  by a ReplicaSet and labelled `pod-template-hash`); Kueue copies only the pod spec into
  the Workload, so what the Workload is comes from its owner Pod (the store's Pods,
  through `KueueIndex.owner_of`).
- A StatefulSet is one pod-group Workload owned by the StatefulSet; a LeaderWorkerSet
  group one Workload owned by the LWS; their pod templates carry
  `kueue.x-k8s.io/pod-group-serving: "true"`.

The *service* of a Workload is the set its replicas belong to: the Deployment (through
the ReplicaSet when the index has it; else the ReplicaSet, whose name changes with each
rollout), the StatefulSet or the LWS. Its *siblings* are where the service's other
Workloads already hold slots: the live ResourceReservations of those Workloads, counted
per node. The gang gets both, and the hard spread rules of its pod templates
(kube/podspread.py); the spread term and the rules count the siblings.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import Obj, TranslationError, child, meta, object_key
from nexus_admit.kube.kueue import KueueIndex
from nexus_admit.kube.podspread import spread_rules
from nexus_admit.kube.reservations import (
    reservation_is_live,
    reservation_slots,
    reservation_workload_key,
)
from nexus_admit.model import Gang, SpreadRule

__all__ = [
    "ServiceIndex",
    "is_serving_pod",
    "owner_pod",
    "service_key",
    "serving_gang",
    "serving_templates",
    "with_siblings",
]

# the controllers whose pods are replicas of one service
_SET_KINDS = frozenset({"ReplicaSet", "Deployment", "StatefulSet", "LeaderWorkerSet"})
_REVISION_LABELS = ("pod-template-hash", "controller-revision-hash")


def _controller_ref(obj: Obj) -> Mapping[str, Any] | None:
    """The controller owner reference (else the first one)."""
    refs = [r for r in _listed(meta(obj).get("ownerReferences")) if isinstance(r, Mapping)]
    return next((r for r in refs if r.get("controller")), refs[0] if refs else None)


def owner_pod(workload: Obj, kueue: KueueIndex) -> Obj | None:
    """The Pod that owns a plain-pod Workload, when the index has it."""
    owner = kueue.owner_of(workload)
    return owner if owner is not None and owner.get("kind") == "Pod" else None


def is_serving_pod(pod: Obj) -> bool:
    """A replica of a service: owned by a ReplicaSet or StatefulSet, labelled with their
    revision hash, or in a serving pod group."""
    ref = _controller_ref(pod)
    if ref is not None and ref.get("kind") in ("ReplicaSet", "StatefulSet"):
        return True
    labels = child(meta(pod), "labels")
    if any(k in labels for k in _REVISION_LABELS):
        return True
    return str(child(meta(pod), "annotations").get(L.KUEUE_POD_GROUP_SERVING)) == "true"


def serving_templates(workload: Obj) -> bool:
    """Kueue marked the Workload's pod templates as a serving pod group."""
    for ps in _listed(child(workload, "spec").get("podSets")):
        tmeta = child(child(ps, "template") if isinstance(ps, Mapping) else {}, "metadata")
        if str(child(tmeta, "annotations").get(L.KUEUE_POD_GROUP_SERVING)) == "true":
            return True
    return False


def service_key(workload: Obj, kueue: KueueIndex) -> str | None:
    """`Kind/namespace/name` of the set the Workload's pods are replicas of, or None."""
    ns = str(meta(workload).get("namespace") or "default")
    pod = owner_pod(workload, kueue)
    ref = _controller_ref(pod if pod is not None else workload)
    if ref is None or not isinstance(ref.get("kind"), str) or ref["kind"] not in _SET_KINDS:
        return None
    kind, name = str(ref.get("kind")), str(ref.get("name") or "")
    if kind == "ReplicaSet":
        rs = kueue.owners.get(("ReplicaSet", ns, name))
        up = _controller_ref(rs) if rs is not None else None
        if up is not None and up.get("kind") == "Deployment":
            kind, name = "Deployment", str(up.get("name") or "")
    return f"{kind}/{ns}/{name}"


@dataclass(slots=True)
class ServiceIndex:
    """Per service, per Workload, the pods its live reservations hold on each node."""

    held: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        workloads: Iterable[Obj],
        reservations: Iterable[Obj],
        kueue: KueueIndex,
        now: datetime | None = None,
    ) -> ServiceIndex:
        services: dict[str, str] = {}
        for wl in workloads:
            # a malformed Workload is skipped here and told when it is translated; it
            # never stops the index for everyone else
            with contextlib.suppress(Exception):
                key = service_key(wl, kueue)
                if key is not None:
                    services[object_key(wl)] = key
        held: dict[str, dict[str, dict[str, int]]] = {}
        for rr in reservations:
            with contextlib.suppress(Exception):  # a malformed reservation: skipped alike
                wl_key = reservation_workload_key(rr)
                service = services.get(wl_key)
                if service is None or not _live(rr, now):
                    continue
                slots = reservation_slots(rr)
                per_node = held.setdefault(service, {}).setdefault(wl_key, defaultdict(int))
                for slot in slots:
                    per_node[slot.node] += 1
        return cls(held)

    def siblings(self, service: str, workload_key: str) -> dict[str, int]:
        """Where the service's other Workloads hold pods (node -> pods)."""
        out: dict[str, int] = defaultdict(int)
        for wl_key, per_node in self.held.get(service, {}).items():
            if wl_key != workload_key:
                for node, pods in per_node.items():
                    out[node] += pods
        return dict(out)


def _live(rr: Obj, now: datetime | None) -> bool:
    """Counted unless Released or past its TTL (an unreadable one counts: more spread)."""
    if now is None:
        return str(child(rr, "status").get("phase")) != "Released"
    try:
        return reservation_is_live(rr, now)
    except TranslationError:
        return True


def with_siblings(gang: Gang, more: Mapping[str, int]) -> Gang:
    """The gang with `more` sibling pods (node -> pods) added to its own."""
    if not more:
        return gang
    merged: dict[str, int] = defaultdict(int, gang.siblings)
    for node, pods in more.items():
        merged[node] += pods
    return replace(gang, siblings=dict(merged))


def serving_gang(
    gang: Gang,
    workload: Obj,
    kueue: KueueIndex,
    levels: Sequence[str],
    services: ServiceIndex | None,
) -> Gang:
    """The gang with its service, its siblings (from `services`) and the hard spread
    rules of its pod templates. Raises TranslationError for a rule it cannot honour."""
    service = service_key(workload, kueue)
    pod = owner_pod(workload, kueue)
    rules: list[SpreadRule] = []
    for i, ps in enumerate(_listed(child(workload, "spec").get("podSets"))):
        tpl = child(ps, "template") if isinstance(ps, Mapping) else {}
        labels = {str(k): str(v) for k, v in child(child(tpl, "metadata"), "labels").items()}
        if pod is not None:
            labels.update({str(k): str(v) for k, v in child(meta(pod), "labels").items()})
        known = labels if labels or pod is not None else None
        fld = f"spec.podSets[{i}].template.spec"
        for rule in spread_rules(workload, child(tpl, "spec"), fld, known, levels):
            if rule not in rules:
                rules.append(rule)
    siblings = (
        services.siblings(service, object_key(workload))
        if service is not None and services is not None
        else {}
    )
    if service is None and not rules:
        return gang
    return replace(gang, service=service, siblings=siblings, spread_rules=tuple(rules))


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
