"""A pod template's `topologySpreadConstraints` and required pod (anti-)affinity → the
gang's hard spread rules (`model.SpreadRule`), or a TranslationError naming the field.

nexus-admit pins every pod to a node, so a constraint it does not honour is not a
preference kube-scheduler may still weigh: a pinned pod that breaks a required rule stays
Pending. What maps onto the model is honoured; the rest is refused with the reason:

- `whenUnsatisfiable: DoNotSchedule` (the default) over the pod's own pods (its
  `labelSelector` matches the pod's labels) and a `topologyKey` that is one of the
  PlacementConfig's topology levels (the hostname included) → each domain of that level
  the gang puts pods in holds at most `maxSkew` more pods of the service than the
  least-loaded domain the pod may use.
  Another key, a selector of other pods, or `minDomains` → refused.
- `whenUnsatisfiable: ScheduleAnyway` is soft: not read (inference and service gangs
  spread by the spread term anyway; kube-scheduler's score has no say over a pinned pod).
- required `podAntiAffinity` against the pod's own pods on a topology level → at most one
  pod of the service per domain of that level (one per node on the hostname); against
  other pods, or on another key → refused. Preferred terms are soft: not read.
- required `podAffinity` → refused (nexus-admit does not place next to other pods).

A Job's pods carry `job-name` and `controller-uid` (and their `batch.kubernetes.io/`
forms), which the Job controller adds and Kueue's Workload template lacks: a selector of
those labels with the Workload's own Job's name or uid selects the gang's own pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nexus_admit.kube.errors import Obj, TranslationError, mapping, meta, object_ref, sequence
from nexus_admit.model import SpreadRule

__all__ = ["job_pod_labels", "selects", "spread_rules"]

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def selects(obj: Obj, selector: Mapping[str, Any], labels: Mapping[str, str], field: str) -> bool:
    """Whether a LabelSelector (matchLabels, matchExpressions) selects `labels`."""
    for k, v in mapping(obj, selector.get("matchLabels"), f"{field}.matchLabels").items():
        if labels.get(str(k)) != str(v):
            return False
    exprs = sequence(obj, selector.get("matchExpressions"), f"{field}.matchExpressions")
    for i, e in enumerate(exprs):
        ef = f"{field}.matchExpressions[{i}]"
        e = mapping(obj, e, ef)
        key, op = str(e.get("key") or ""), e.get("operator")
        values = {str(v) for v in sequence(obj, e.get("values"), f"{ef}.values")}
        value = labels.get(key)
        if op == "In":
            ok = value in values
        elif op == "NotIn":
            ok = value not in values
        elif op == "Exists":
            ok = value is not None
        elif op == "DoesNotExist":
            ok = value is None
        else:
            raise TranslationError(
                object_ref(obj), f"{ef}.operator",
                f"{op!r}: a label selector operator is In, NotIn, Exists or DoesNotExist",
            )
        if not ok:
            return False
    return True


def spread_rules(
    obj: Obj,
    pod_spec: Mapping[str, Any],
    field: str,
    pod_labels: Mapping[str, str] | None,
    levels: Sequence[str],
) -> list[SpreadRule]:
    """The hard spread rules of one pod template. `pod_labels` None: the pod's labels are
    not known (a Workload of a plain pod whose Pod is not in the snapshot); selectors are
    then taken to select the pod's own pods, as they almost always do."""
    if pod_labels is not None:
        pod_labels = {**pod_labels, **job_pod_labels(obj)}
    out = _topology_spread(obj, pod_spec, field, pod_labels, levels)
    affinity = mapping(obj, pod_spec.get("affinity"), f"{field}.affinity")
    af = f"{field}.affinity.podAffinity"
    if sequence(obj, mapping(obj, affinity.get("podAffinity"), af).get(_REQUIRED),
                f"{af}.{_REQUIRED}"):
        raise TranslationError(
            object_ref(obj), f"{af}.{_REQUIRED}",
            "required pod affinity is not honoured: nexus-admit pins each pod to a node of "
            "its own choosing and does not place next to other pods; remove it (a gang's "
            "pods are kept together by scheduling.kubenexus.io/required-topology)",
        )
    anti = mapping(obj, affinity.get("podAntiAffinity"), f"{field}.affinity.podAntiAffinity")
    tf = f"{field}.affinity.podAntiAffinity.{_REQUIRED}"
    for i, term in enumerate(sequence(obj, anti.get(_REQUIRED), tf)):
        term = mapping(obj, term, f"{tf}[{i}]")
        key = str(term.get("topologyKey") or "")
        _check_level(obj, key, levels, f"{tf}[{i}].topologyKey")
        if term.get("labelSelector") is None:
            continue  # selects no pod
        if not _own_pods(obj, term, pod_labels, f"{tf}[{i}]"):
            raise TranslationError(
                object_ref(obj), f"{tf}[{i}].labelSelector",
                "required anti-affinity against other pods is not honoured: nexus-admit "
                "tracks only the pods of the workload's own service; select the pod's own "
                "labels or use preferredDuringSchedulingIgnoredDuringExecution",
            )
        out.append(SpreadRule(level=key, max_per_domain=1))
    return out


def _topology_spread(
    obj: Obj,
    pod_spec: Mapping[str, Any],
    field: str,
    pod_labels: Mapping[str, str] | None,
    levels: Sequence[str],
) -> list[SpreadRule]:
    out = []
    cf = f"{field}.topologySpreadConstraints"
    for i, c in enumerate(sequence(obj, pod_spec.get("topologySpreadConstraints"), cf)):
        c = mapping(obj, c, f"{cf}[{i}]")
        if (c.get("whenUnsatisfiable") or "DoNotSchedule") == "ScheduleAnyway":
            continue  # soft: see the module's docstring
        skew = c.get("maxSkew")
        if not isinstance(skew, int) or isinstance(skew, bool) or skew < 1:
            raise TranslationError(object_ref(obj), f"{cf}[{i}].maxSkew",
                                   f"{skew!r}: maxSkew must be an integer of at least 1")
        if c.get("minDomains") is not None:
            raise TranslationError(
                object_ref(obj), f"{cf}[{i}].minDomains",
                "minDomains is not honoured by nexus-admit's placement; remove it or use "
                "whenUnsatisfiable: ScheduleAnyway",
            )
        key = str(c.get("topologyKey") or "")
        _check_level(obj, key, levels, f"{cf}[{i}].topologyKey")
        if c.get("labelSelector") is None:
            continue  # selects no pod: nothing to spread
        if not _own_pods(obj, c, pod_labels, f"{cf}[{i}]"):
            raise TranslationError(
                object_ref(obj), f"{cf}[{i}].labelSelector",
                "a spread over other pods is not honoured: nexus-admit tracks only the pods "
                "of the workload's own service; select the pod's own labels or use "
                "whenUnsatisfiable: ScheduleAnyway",
            )
        out.append(SpreadRule(level=key, max_skew=skew))
    return out


def job_pod_labels(workload: Obj) -> dict[str, str]:
    """The labels the Job controller puts on the pods of the Workload's owning Job (batch/v1
    Job, the controller owner reference): its name and uid, both forms."""
    refs = meta(workload).get("ownerReferences")
    for ref in refs if isinstance(refs, list) else ():
        if (isinstance(ref, Mapping) and ref.get("kind") == "Job" and ref.get("controller")
                and str(ref.get("apiVersion", "")).startswith("batch/")):
            name, uid = str(ref.get("name") or ""), str(ref.get("uid") or "")
            return {"job-name": name, "batch.kubernetes.io/job-name": name,
                    "controller-uid": uid, "batch.kubernetes.io/controller-uid": uid}
    return {}


def _check_level(obj: Obj, key: str, levels: Sequence[str], field: str) -> None:
    if key not in levels:
        raise TranslationError(
            object_ref(obj), field,
            f"{key!r} is not a topology level of the PlacementConfig ({list(levels)}): "
            f"nexus-admit pins each pod to a node and can honour a required spread only over "
            f"those levels' domains",
        )


def _own_pods(
    obj: Obj, term: Mapping[str, Any], pod_labels: Mapping[str, str] | None, field: str
) -> bool:
    """The term's labelSelector selects the pod itself (its service's pods)."""
    selector = mapping(obj, term.get("labelSelector"), f"{field}.labelSelector")
    if pod_labels is None:
        return True
    return selects(obj, selector, pod_labels, f"{field}.labelSelector")
