"""Pod-spec parsing for one pod set of a Workload: tolerations, required node affinity, the
nodeSelector, the per-pod-set annotations (`gpu-fraction`, `gpu-memory`, `workload-type`,
`numa-policy`) and the topology levels asked for (ours, else Kueue's TAS ones).

Every reader raises TranslationError naming the field and what to write instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import (
    Obj,
    TranslationError,
    child,
    mapping,
    object_key,
    object_ref,
    sequence,
)
from nexus_admit.kube.quantity import parse_memory_mib, parse_quantity
from nexus_admit.kube.requests import (
    PodRequests,
    gpu_fraction_milli,
    pod_level_requests,
    pod_requests,
)
from nexus_admit.model import (
    GPU_WHOLE,
    NodeSelectorRequirement,
    NumaPolicy,
    Toleration,
    WorkloadType,
)

__all__ = [
    "AdmissionDefaults",
    "annotated_numa_policy",
    "annotated_workload_type",
    "gpu_share_milli",
    "node_affinity_terms",
    "node_selector",
    "tolerations",
    "topology_level",
    "topology_requests",
    "vram_per_gpu_mib",
    "with_limit_range_defaults",
    "with_runtime_overhead",
    "workload_template_requests",
]

_SELECTOR_OPS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def tolerations(obj: Obj, value: Any, field: str) -> list[Toleration]:
    """A `tolerations` list (of a pod spec or a ResourceFlavor)."""
    out = []
    for i, t in enumerate(sequence(obj, value, field)):
        t = mapping(obj, t, f"{field}[{i}]")
        op = t.get("operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise TranslationError(
                object_ref(obj), f"{field}[{i}].operator", f"{op!r}: use Equal or Exists"
            )
        key = t.get("key") or None
        if key is None and op != "Exists":
            raise TranslationError(
                object_ref(obj), f"{field}[{i}]", "a toleration without a key needs operator Exists"
            )
        effect = t.get("effect")
        if effect and effect not in _TAINT_EFFECTS:
            raise TranslationError(
                object_ref(obj),
                f"{field}[{i}].effect",
                f"{effect!r}: use one of {list(_TAINT_EFFECTS)}, or leave it out for every effect",
            )
        out.append(
            Toleration(
                key=str(key) if key else None,
                operator=op,
                value=str(t.get("value") or ""),
                effect=str(t["effect"]) if t.get("effect") else None,
            )
        )
    return out

def with_runtime_overhead(
    workload: Obj, pod_spec: Mapping[str, Any], runtime_classes: Mapping[str, Obj], field: str
) -> Mapping[str, Any]:
    """`pod_spec` as the apiserver admits the pod: the RuntimeClass admission plugin adds the
    class's `overhead.podFixed` as `spec.overhead` and merges its `scheduling.nodeSelector`
    and `scheduling.tolerations` into the pod's, which Kueue's Workload template does not
    carry. A class not known (yet) adds nothing (the apiserver decides on the pod); one whose
    overhead is not a resource list is told, naming the class; a node selector
    key the class sets to another value than the pod's is the user's to fix (the apiserver
    refuses such a pod)."""
    name = pod_spec.get("runtimeClassName")
    if not name or not isinstance(name, str):
        return pod_spec
    rc = runtime_classes.get(name)
    if not isinstance(rc, Mapping):
        return pod_spec
    spec = dict(pod_spec)
    overhead = rc.get("overhead")
    fixed = overhead.get("podFixed") if isinstance(overhead, Mapping) else None
    if fixed is not None and not isinstance(fixed, Mapping):
        # the apiserver validates a RuntimeClass, so only a dump carries this: the requests
        # cannot be known, and guessing them would under-count the node
        raise TranslationError(
            object_ref(workload),
            f"{field}.runtimeClassName",
            f"RuntimeClass {name} has an overhead.podFixed that is not a resource list",
        )
    if fixed and spec.get("overhead") is None:
        spec["overhead"] = {str(k): v for k, v in fixed.items()}
    scheduling = rc.get("scheduling")
    if not isinstance(scheduling, Mapping):
        return spec
    selector = scheduling.get("nodeSelector")
    if isinstance(selector, Mapping) and selector:
        own = mapping(workload, spec.get("nodeSelector"), f"{field}.nodeSelector")
        merged = {str(k): str(v) for k, v in own.items()}
        for key, value in selector.items():
            if str(merged.get(str(key), value)) != str(value):
                raise TranslationError(
                    object_ref(workload),
                    f"{field}.nodeSelector[{key}]",
                    f"{merged[str(key)]!r} conflicts with RuntimeClass {name!r}, which selects "
                    f"{value!r}; drop the key or use another runtimeClassName",
                )
            merged[str(key)] = str(value)
        spec["nodeSelector"] = merged
    extra = scheduling.get("tolerations")
    if isinstance(extra, list) and extra:
        own_tolerations = list(sequence(workload, spec.get("tolerations"), f"{field}.tolerations"))
        spec["tolerations"] = own_tolerations + [t for t in extra if t not in own_tolerations]
    return spec


def with_limit_range_defaults(
    workload: Obj, pod_spec: Mapping[str, Any], limit_ranges: Sequence[Obj], field: str
) -> Mapping[str, Any]:
    """`pod_spec` as the apiserver admits the pod in a namespace with `limit_ranges`: the
    LimitRanger admission plugin gives every container (init containers too) the default
    request of each resource it neither requests nor limits (a limit alone is its request
    already). Kueue applies the same defaults only to its own copy, for quota; the stored
    template lacks them. Pod-level requests are fixed before the plugin runs (the pod's
    defaulting), so a pod-level limit the containers did not request stays the request."""
    defaults = _limit_range_default_requests(workload, limit_ranges, field)
    if not defaults:
        return pod_spec
    spec = dict(pod_spec)
    pod_level = pod_level_requests(workload, pod_spec, field)
    if pod_level:
        res = mapping(workload, spec.get("resources"), f"{field}.resources")
        stated = mapping(workload, res.get("requests"), f"{field}.resources.requests")
        limits = mapping(workload, res.get("limits"), f"{field}.resources.limits")
        frozen = {k: limits[k] for k in pod_level if k not in stated}
        spec["resources"] = {**res, "requests": {**frozen, **stated}}
    for part in ("containers", "initContainers"):
        containers = sequence(workload, spec.get(part), f"{field}.{part}")
        if containers:
            spec[part] = [
                _with_default_requests(workload, c, defaults, f"{field}.{part}[{i}]")
                for i, c in enumerate(containers)
            ]
    return spec


def _limit_range_default_requests(
    workload: Obj, limit_ranges: Sequence[Obj], field: str
) -> dict[str, str]:
    """The default request per resource of the namespace's Container limits: within one
    LimitRange the last item naming a resource, across LimitRanges the first by name (the
    apiserver applies them in no stated order). Read as the apiserver stores a LimitRange:
    an unset defaultRequest is the default, else the max, else the min."""
    out: dict[str, str] = {}
    for lr in sorted(limit_ranges, key=lambda o: str(child(o, "metadata").get("name") or "")):
        own: dict[str, str] = {}
        for item in _listed(child(lr, "spec").get("limits")):
            if not isinstance(item, Mapping) or item.get("type") != "Container":
                continue
            request: dict[str, Any] = {}
            for source in ("min", "max", "default", "defaultRequest"):  # the last one wins
                value = item.get(source)
                if isinstance(value, Mapping):
                    request.update(value)
            for name, qty in request.items():
                try:
                    parse_quantity(qty)
                except (ValueError, TypeError):
                    raise TranslationError(
                        object_ref(workload),
                        field,
                        f"LimitRange {object_key(lr)} has a default {name} of {qty!r}, not a "
                        f"quantity: the pods' requests cannot be known",
                    ) from None
                own[str(name)] = str(qty)
        for name, qty in own.items():
            out.setdefault(name, qty)
    return out


def _with_default_requests(
    workload: Obj, value: Any, defaults: Mapping[str, str], field: str
) -> Mapping[str, Any]:
    container = mapping(workload, value, field)
    res = mapping(workload, container.get("resources"), f"{field}.resources")
    requests = dict(mapping(workload, res.get("requests"), f"{field}.resources.requests"))
    limits = mapping(workload, res.get("limits"), f"{field}.resources.limits")
    missing = {k: v for k, v in defaults.items() if k not in requests and k not in limits}
    if not missing:
        return container
    return {**container, "resources": {**res, "requests": {**requests, **missing}}}


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def node_affinity_terms(
    obj: Obj, spec: Mapping[str, Any], field: str
) -> tuple[tuple[NodeSelectorRequirement, ...], ...]:
    """The required node affinity's terms (any one must match), each a tuple of
    requirements (all must match); `matchFields` on metadata.name reads the hostname."""
    aff = mapping(obj, spec.get("affinity"), f"{field}.affinity")
    na = mapping(obj, aff.get("nodeAffinity"), f"{field}.affinity.nodeAffinity")
    fld = f"{field}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    req = mapping(obj, na.get("requiredDuringSchedulingIgnoredDuringExecution"), fld)
    terms = []
    for i, term in enumerate(
        sequence(obj, req.get("nodeSelectorTerms"), f"{fld}.nodeSelectorTerms")
    ):
        tf = f"{fld}.nodeSelectorTerms[{i}]"
        term = mapping(obj, term, tf)
        reqs: list[NodeSelectorRequirement] = []
        for part in ("matchExpressions", "matchFields"):
            for j, e in enumerate(sequence(obj, term.get(part), f"{tf}.{part}")):
                reqs.append(_requirement(obj, mapping(obj, e, f"{tf}.{part}[{j}]"), part,
                                         f"{tf}.{part}[{j}]"))
        if reqs:
            terms.append(tuple(reqs))
    return tuple(terms)


def _requirement(obj: Obj, e: Mapping[str, Any], part: str, ef: str) -> NodeSelectorRequirement:
    op = e.get("operator")
    if op not in _SELECTOR_OPS:
        raise TranslationError(
            object_ref(obj),
            f"{ef}.operator",
            f"{op!r} is not a node selector operator; use one of {sorted(_SELECTOR_OPS)}",
        )
    key = str(e.get("key") or "")
    if part == "matchFields":
        if key != "metadata.name":
            raise TranslationError(
                object_ref(obj), f"{ef}.key", "matchFields supports only metadata.name"
            )
        key = L.HOSTNAME_LABEL  # node name ≈ hostname label
    values = tuple(str(v) for v in sequence(obj, e.get("values"), f"{ef}.values"))
    return NodeSelectorRequirement(key, str(op), values)


def node_selector(workload: Obj, pod_spec: Mapping[str, Any], field: str) -> dict[str, str]:
    return {
        str(k): str(v)
        for k, v in mapping(workload, pod_spec.get("nodeSelector"), f"{field}.nodeSelector").items()
    }


def gpu_share_milli(
    workload: Obj, annotations: Mapping[str, Any], field: str, requests: PodRequests
) -> int:
    """The share of one GPU each pod uses (`gpu-fraction`), GPU_WHOLE without one; a share
    needs the pod to request exactly one GPU."""
    fraction = gpu_fraction_milli(workload, annotations, field)
    if fraction is None or fraction >= GPU_WHOLE:
        return GPU_WHOLE
    if requests.gpus != 1:
        raise TranslationError(
            object_ref(workload),
            f"{field}[{L.ANN_GPU_FRACTION}]",
            f"a GPU share needs the pod to request exactly {L.GPU_RESOURCE}: 1 "
            f"(it requests {requests.gpus})",
        )
    return fraction


def vram_per_gpu_mib(
    workload: Obj, annotations: Mapping[str, Any], field: str, gpus: int
) -> int:
    """The `gpu-memory` annotation (VRAM needed per GPU) in MiB, 0 when absent or when the
    pod uses no GPU."""
    raw = annotations.get(L.ANN_GPU_MEMORY)
    if raw in (None, ""):
        return 0
    try:
        vram = parse_memory_mib(raw)
    except ValueError:
        raise TranslationError(
            object_ref(workload),
            f"{field}[{L.ANN_GPU_MEMORY}]",
            f"{raw!r} is not a memory quantity; write the VRAM needed per GPU like "
            f"40Gi or 81920Mi",
        ) from None
    if vram <= 0:
        raise TranslationError(
            object_ref(workload),
            f"{field}[{L.ANN_GPU_MEMORY}]",
            f"{raw!r}: VRAM per GPU must be above 0",
        )
    return vram if gpus else 0  # meaningless without a GPU; harmless, ignored


def annotated_workload_type(
    workload: Obj, annotations: Mapping[str, Any], field: str
) -> WorkloadType | None:
    value = annotations.get(L.ANN_WORKLOAD_TYPE)
    if value in (None, ""):
        return None
    try:
        return WorkloadType(str(value).strip().lower())
    except ValueError:
        raise TranslationError(
            object_ref(workload),
            f"{field}[{L.ANN_WORKLOAD_TYPE}]",
            f"unknown workload type {value!r}; use one of {[t.value for t in WorkloadType]}",
        ) from None


def annotated_numa_policy(
    workload: Obj, annotations: Mapping[str, Any], field: str
) -> NumaPolicy | None:
    value = annotations.get(L.ANN_NUMA_POLICY)
    if value in (None, ""):
        return None
    try:
        return NumaPolicy(str(value).strip().lower())
    except ValueError:
        raise TranslationError(
            object_ref(workload),
            f"{field}[{L.ANN_NUMA_POLICY}]",
            f"unknown NUMA policy {value!r}; use one of {[p.value for p in NumaPolicy]}",
        ) from None


def topology_level(
    workload: Obj, value: Any, field: str, levels: Sequence[str] | None, what: str
) -> str:
    """A topology level named in `field`, checked against the cluster's `levels` if known."""
    level = str(value)
    if levels is not None and level not in levels:
        raise TranslationError(
            object_ref(workload),
            field,
            f"{what} {level!r} is not a topology level of this cluster; use one of {list(levels)}",
        )
    return level


def topology_requests(
    workload: Obj,
    annotations: Mapping[str, Any],
    topology_request: Mapping[str, Any],
    field: str,
    levels: Sequence[str] | None,
) -> tuple[str | None, str | None]:
    """(required, preferred) topology level of one pod set: our annotation, else Kueue's
    pod-set annotation, else the pod set's TAS `topologyRequest`."""
    afld = f"{field}.template.metadata.annotations"
    found: list[str | None] = []
    for ours, kueue_ann, tr_key, what in (
        (
            L.ANN_REQUIRED_TOPOLOGY,
            L.KUEUE_PODSET_REQUIRED_TOPOLOGY,
            "required",
            "required-topology",
        ),
        (
            L.ANN_PREFERRED_TOPOLOGY,
            L.KUEUE_PODSET_PREFERRED_TOPOLOGY,
            "preferred",
            "preferred-topology",
        ),
    ):
        level = None
        if annotations.get(ours):
            level = topology_level(workload, annotations[ours], f"{afld}[{ours}]", levels, what)
        elif annotations.get(kueue_ann):
            level = topology_level(
                workload, annotations[kueue_ann], f"{afld}[{kueue_ann}]", levels, what
            )
        elif topology_request.get(tr_key):
            level = topology_level(
                workload,
                topology_request[tr_key],
                f"{field}.topologyRequest.{tr_key}",
                levels,
                what,
            )
        found.append(level)
    return found[0], found[1]


class AdmissionDefaults(Protocol):
    """What the apiserver adds to a pod that Kueue's Workload template lacks: RuntimeClasses
    by name (overhead) and each namespace's LimitRanges (`kube.kueue.KueueIndex` is one)."""

    @property
    def runtime_classes(self) -> Mapping[str, Obj]: ...

    def limit_ranges_of(self, obj: Obj) -> Sequence[Obj]: ...


def workload_template_requests(
    workload: Obj, admitted: AdmissionDefaults | None = None
) -> dict[tuple[str, str], tuple[int, int, int]]:
    """{(ns/name, podSet): (cpu milli, memory MiB, GPUs)} per pod, for reservations that do
    not state their requests and for what a Kueue TAS assignment holds; with `admitted`,
    as the apiserver admits the pods (RuntimeClass overhead, LimitRange defaults), as our
    own pod sets are counted (kube/workload.py)."""
    key = object_key(workload)
    out: dict[tuple[str, str], tuple[int, int, int]] = {}
    for i, ps in enumerate(
        sequence(workload, child(workload, "spec").get("podSets"), "spec.podSets")
    ):
        ps = mapping(workload, ps, f"spec.podSets[{i}]")
        tpl = mapping(workload, ps.get("template"), f"spec.podSets[{i}].template")
        fld = f"spec.podSets[{i}].template.spec"
        spec = mapping(workload, tpl.get("spec"), fld)
        if admitted is not None:
            spec = with_runtime_overhead(workload, spec, admitted.runtime_classes, fld)
            spec = with_limit_range_defaults(
                workload, spec, admitted.limit_ranges_of(workload), fld
            )
        r = pod_requests(workload, spec, fld)
        out[(key, str(ps.get("name") or "main"))] = (r.cpu_milli, r.memory_mib, r.gpus)
    return out
