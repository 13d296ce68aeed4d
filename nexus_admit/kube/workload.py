"""Kueue v1beta2 Workloads → model Gangs (pod-spec parsing: kube/podspec.py; Kueue facts:
kube/kueue.py).

Tier: only from the ClusterQueue label `scheduling.kubenexus.io/tier` (ClusterQueue from
`status.admission.clusterQueue`, else LocalQueue `spec.queueName` → `spec.clusterQueue`),
else the PlacementConfig `defaultTier`. Pod annotations never set a tier.

Workload type: the pod template annotation `scheduling.kubenexus.io/workload-type` when set;
otherwise classified from the Workload's owner kinds, then well-known labels (see
`classify_workload`).

Per pod set, from the pod template: effective requests, `gpu-fraction` (share of one GPU),
`gpu-memory` (VRAM per GPU), tolerations (+ the assigned flavors' tolerations),
nodeSelector and required node affinity, and the nodes of the flavors Kueue assigned
(`status.admission.podSetAssignments[].flavors` → ResourceFlavor `spec.nodeLabels`).
`required-topology` / `preferred-topology` (ours, else Kueue's TAS `topologyRequest`), the
`workload-type` annotation and Kueue's `podset-group-name` (annotation or
`topologyRequest.podSetGroupName`) are kept per pod set; pod sets may disagree. The gang-wide
values are those of the GPU pod sets (of every pod set when none has GPUs): the narrowest
level stated, the type stated by the pod sets with the most GPUs. `numa-policy` is
gang-wide: the strictest wins. See `Gang.level_of` for which pod sets the levels bind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.dra import ClaimGpus, DraIndex, claim_gpus, claim_nodes
from nexus_admit.kube.errors import (
    Obj,
    TranslationError,
    child,
    mapping,
    meta,
    object_key,
    object_ref,
    sequence,
)
from nexus_admit.kube.kueue import KueueIndex, flavor_constraints, workload_tier
from nexus_admit.kube.podspec import (
    annotated_numa_policy,
    annotated_workload_type,
    gpu_share_milli,
    node_affinity_terms,
    node_selector,
    tolerations,
    topology_requests,
    vram_per_gpu_mib,
    with_limit_range_defaults,
    with_runtime_overhead,
)
from nexus_admit.kube.requests import pod_requests
from nexus_admit.kube.serving import is_serving_pod, serving_templates
from nexus_admit.model import (
    NVLINK_CLIQUE_LEVEL,
    Gang,
    Node,
    NumaPolicy,
    PlacementConfig,
    PodSet,
    Toleration,
    WorkloadType,
    with_clique_level,
)

__all__ = ["OWNER_KINDS", "classify_workload", "reads_job_completion_mode", "workload_to_gang"]


# ---------------------------------------------------------------- classification

_OWNER_TYPES: dict[str, WorkloadType] = {
    # distributed training frameworks
    "JobSet": WorkloadType.TRAINING,
    "PyTorchJob": WorkloadType.TRAINING,
    "TFJob": WorkloadType.TRAINING,
    "MPIJob": WorkloadType.TRAINING,
    "XGBoostJob": WorkloadType.TRAINING,
    "PaddleJob": WorkloadType.TRAINING,
    "JAXJob": WorkloadType.TRAINING,
    "TrainJob": WorkloadType.TRAINING,
    "RayJob": WorkloadType.TRAINING,
    # batch
    "Job": WorkloadType.BATCH,
    "CronJob": WorkloadType.BATCH,
    "SparkApplication": WorkloadType.BATCH,
    "ScheduledSparkApplication": WorkloadType.BATCH,
    "AppWrapper": WorkloadType.BATCH,
    "Workflow": WorkloadType.BATCH,
    # serving
    "LeaderWorkerSet": WorkloadType.INFERENCE,
    "InferenceService": WorkloadType.INFERENCE,
    "RayService": WorkloadType.INFERENCE,
    # long-running services (become inference when they use GPUs)
    "Deployment": WorkloadType.SERVICE,
    "StatefulSet": WorkloadType.SERVICE,
    "ReplicaSet": WorkloadType.SERVICE,
    "RayCluster": WorkloadType.SERVICE,
}

# every owner kind the classification reads (a dump's owner objects are these kinds)
OWNER_KINDS = frozenset(_OWNER_TYPES)

# owners whose pods carry an index (completion index, replica index, rank)
_INDEXED_OWNERS = frozenset({
    "JobSet", "PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "TrainJob",
    "LeaderWorkerSet", "StatefulSet",
})

_INFERENCE_LABELS = (
    "serving.kserve.io/inferenceservice",
    "serving.knative.dev/service",
    "leaderworkerset.sigs.k8s.io/name",
    "ray.io/serve",
)
_TRAINING_LABELS = (
    "training.kubeflow.org/job-name",
    "training.kubeflow.org/replica-type",
    "trainer.kubeflow.org/trainjob-name",
    "jobset.sigs.k8s.io/jobset-name",
)
_BATCH_LABELS = ("spark-role", "sparkoperator.k8s.io/app-name", "batch.kubernetes.io/job-name")
_COMPONENT_LABEL = "app.kubernetes.io/component"
_INFERENCE_COMPONENTS = frozenset({"inference", "predictor", "serving", "model-server", "server"})
_SERVICE_LABELS = ("pod-template-hash", "controller-revision-hash")

_NUMA_RANK = {NumaPolicy.NONE: 0, NumaPolicy.PREFERRED: 1, NumaPolicy.SINGLE_NUMA_NODE: 2}


def _owner_kinds(workload: Obj) -> list[str]:
    refs = sequence(workload, meta(workload).get("ownerReferences"), "metadata.ownerReferences")
    kinds = [str(r.get("kind", "")) for r in refs if isinstance(r, Mapping)]
    # the controller owner first
    ctrl = [str(r.get("kind", "")) for r in refs if isinstance(r, Mapping) and r.get("controller")]
    return ctrl + [k for k in kinds if k not in ctrl]


def _templates(workload: Obj) -> list[Mapping[str, Any]]:
    out = []
    for ps in _pod_sets(workload):
        if isinstance(ps, Mapping) and isinstance(ps.get("template"), Mapping):
            out.append(ps["template"])
    return out


def _pod_sets(workload: Obj) -> Sequence[Any]:
    spec = mapping(workload, workload.get("spec"), "spec")
    return sequence(workload, spec.get("podSets"), "spec.podSets")


def _uses_gpus(workload: Obj) -> bool:
    for i, tpl in enumerate(_templates(workload)):
        fld = f"spec.podSets[{i}].template.spec"
        spec = mapping(workload, tpl.get("spec"), fld)
        for j, c in enumerate(sequence(workload, spec.get("containers"), f"{fld}.containers")):
            c = mapping(workload, c, f"{fld}.containers[{j}]")
            res = mapping(workload, c.get("resources"), f"{fld}.containers[{j}].resources")
            for part in ("requests", "limits"):
                if L.GPU_RESOURCE in mapping(
                    workload, res.get(part), f"{fld}.containers[{j}].resources.{part}"
                ):
                    return True
    return False


def classify_workload(workload: Obj, owner: Obj | None = None) -> WorkloadType:
    """Workload type from owner kinds, then Kueue's serving marks, then well-known labels
    (Workload, pod templates, and the owner Pod of a plain-pod Workload).

    Deployment/StatefulSet/ReplicaSet and other services become `inference` when they use
    GPUs, so do a serving pod group (`kueue.x-k8s.io/pod-group-serving: "true"` on a pod
    template) and a plain-pod Workload whose Pod is a ReplicaSet's or StatefulSet's
    (`owner`: the Pod, from `KueueIndex.owner_of`). An indexed Job with GPUs and more than
    one pod is `training`. Default `batch`.
    """
    gpus = _uses_gpus(workload)
    for kind in _owner_kinds(workload):
        t = _OWNER_TYPES.get(kind)
        if t is None:
            continue
        if t is WorkloadType.SERVICE and gpus:
            return WorkloadType.INFERENCE
        if kind == "Job" and gpus and _job_indexed(owner) and _pod_total(workload) > 1:
            return WorkloadType.TRAINING
        return t
    # Kueue's serving pod groups (StatefulSet, LWS), and a Deployment's or StatefulSet's
    # pod as its own Workload (owned by the Pod; Kueue copies only the pod spec)
    pod = owner if owner is not None and owner.get("kind") == "Pod" else None
    if serving_templates(workload) or (pod is not None and is_serving_pod(pod)):
        return WorkloadType.INFERENCE if gpus else WorkloadType.SERVICE
    label_sets = [mapping(workload, meta(workload).get("labels"), "metadata.labels")]
    for i, tpl in enumerate(_templates(workload)):
        fld = f"spec.podSets[{i}].template.metadata"
        tmeta = mapping(workload, tpl.get("metadata"), fld)
        label_sets.append(mapping(workload, tmeta.get("labels"), f"{fld}.labels"))
    if pod is not None:
        label_sets.append(child(meta(pod), "labels"))
    for labels in label_sets:
        if any(k in labels for k in _INFERENCE_LABELS):
            return WorkloadType.INFERENCE
        if str(labels.get(_COMPONENT_LABEL, "")).lower() in _INFERENCE_COMPONENTS:
            return WorkloadType.INFERENCE
    for labels in label_sets:
        if any(k in labels for k in _TRAINING_LABELS):
            return WorkloadType.TRAINING
        if any(k in labels for k in _BATCH_LABELS):
            return WorkloadType.BATCH
        if any(k in labels for k in _SERVICE_LABELS):
            return WorkloadType.INFERENCE if gpus else WorkloadType.SERVICE
    return WorkloadType.BATCH


def _job_indexed(owner: Obj | None) -> bool:
    if not owner:
        return False
    return mapping(owner, owner.get("spec"), "spec").get("completionMode") == "Indexed"


def _pod_total(workload: Obj) -> int:
    total = 0
    for ps in _pod_sets(workload):
        c = ps.get("count", 1) if isinstance(ps, Mapping) else 0
        total += c if isinstance(c, int) else 0
    return total


def reads_job_completion_mode(workload: Obj) -> bool:
    """Whether the translation of `workload` reads its Job's `spec.completionMode`: only
    for more than one pod (an Indexed Job's pod sets are `indexed` and, with GPUs, it is
    `training`); a one-pod Workload translates alike either way, so its Job need not be
    read. A malformed Workload says yes: its translation reports what is wrong with it."""
    try:
        return _pod_total(workload) > 1
    except TranslationError:
        return True


def _waited_seconds(workload: Obj, now: datetime | None) -> float:
    """Seconds from metadata.creationTimestamp (set by the API server, RFC 3339) to `now`;
    0 without `now` or a readable timestamp."""
    created = meta(workload).get("creationTimestamp")
    if now is None or not isinstance(created, str):
        return 0.0
    try:
        since = datetime.fromisoformat(created)
    except ValueError:
        return 0.0
    if since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    return max(0.0, (now - since).total_seconds())


@dataclass(slots=True)
class _GangWide:
    """What each pod set asks for, by pod set name: the gang-wide values are derived from
    these (`_gang`); the NUMA policies: the strictest wins."""

    required: dict[str, str] = field(default_factory=dict)
    preferred: dict[str, str] = field(default_factory=dict)
    workload_types: dict[str, WorkloadType] = field(default_factory=dict)
    groups: dict[str, str] = field(default_factory=dict)
    numa: list[NumaPolicy] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Context:
    """What the translation of every pod set of one Workload reads."""

    workload: Obj
    kueue: KueueIndex
    assignments: dict[str, tuple[int, Mapping[str, Any]]]  # pod set -> (index, assignment)
    nodes: list[Node] | None
    levels: Sequence[str] | None
    owner_kinds: frozenset[str]
    owner: Obj | None
    dra: DraIndex
    gpu_classes: tuple[str, ...]


def workload_to_gang(
    workload: Obj,
    *,
    config: PlacementConfig,
    kueue: KueueIndex | None = None,
    nodes: Iterable[Node] | None = None,
    levels: Sequence[str] | None = None,
    now: datetime | None = None,
    dra: DraIndex | None = None,
) -> Gang:
    """A Kueue v1beta2 Workload → Gang.

    `nodes` (the snapshot's) turn the assigned flavors into `allowed_nodes`; without them the
    flavors' nodeLabels are added to each pod set's nodeSelector instead. `levels` (the
    resolved topology levels) validate the topology annotations. `now` gives the gang its
    waited time since the Workload's creation (PlacementConfig.localityWait reads it;
    without `now` it has waited 0 s). `dra` resolves the pod templates' ResourceClaim
    (Template)s: GPUs asked through them count like `nvidia.com/gpu` (kube/dra.py); without
    it a template naming one is an error. Raises TranslationError.
    """
    kueue = kueue or KueueIndex()
    ref = object_ref(workload)
    spec = mapping(workload, workload.get("spec"), "spec")
    assignments = _assignments(workload)
    node_list = list(nodes) if nodes is not None else None
    raw_sets = sequence(workload, spec.get("podSets"), "spec.podSets")
    if not raw_sets:
        raise TranslationError(ref, "spec.podSets", "a Workload needs at least one pod set")
    owner_kinds = frozenset(_owner_kinds(workload))
    ctx = _Context(
        workload,
        kueue,
        assignments,
        node_list,
        levels,
        owner_kinds,
        kueue.owner_of(workload),
        dra or DraIndex({}, {}),
        config.gpu_device_classes,
    )
    said = _GangWide()
    pod_sets = [
        ps
        for i, raw in enumerate(raw_sets)
        if (ps := _pod_set(ctx, i, mapping(workload, raw, f"spec.podSets[{i}]"), said))
        is not None
    ]
    if not pod_sets:
        raise TranslationError(ref, "spec.podSets[*].count", "every pod set has count 0")
    return _gang(ctx, pod_sets, said, config, now)


def _assignments(workload: Obj) -> dict[str, tuple[int, Mapping[str, Any]]]:
    status = mapping(workload, workload.get("status"), "status")
    admission = mapping(workload, status.get("admission"), "status.admission")
    out: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for i, a in enumerate(
        sequence(workload, admission.get("podSetAssignments"), "status.admission.podSetAssignments")
    ):
        a = mapping(workload, a, f"status.admission.podSetAssignments[{i}]")
        out[str(a.get("name") or "main")] = (i, a)
    return out


def _pod_count(ctx: _Context, fld: str, ps: Mapping[str, Any], name: str) -> int:
    """The pods Kueue admitted (the assignment's count, for partial admission), else the
    pod set's."""
    count = ps.get("count", 1)
    count_field = f"{fld}.count"
    a_index, psa = ctx.assignments.get(name, (-1, {}))
    if psa.get("count") is not None:
        count = psa["count"]
        count_field = f"status.admission.podSetAssignments[{a_index}].count"
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise TranslationError(
            object_ref(ctx.workload), count_field, f"{count!r}: a pod count must be 0 or more"
        )
    return count


def _pod_set(ctx: _Context, i: int, ps: Mapping[str, Any], said: _GangWide) -> PodSet | None:
    """One pod set as a PodSet (None when it has no pods); what it says about the whole
    gang goes into `said`."""
    workload, fld = ctx.workload, f"spec.podSets[{i}]"
    name = str(ps.get("name") or "main")
    count = _pod_count(ctx, fld, ps, name)
    if count == 0:
        return None
    tpl = mapping(workload, ps.get("template"), f"{fld}.template")
    tmeta = mapping(workload, tpl.get("metadata"), f"{fld}.template.metadata")
    afld = f"{fld}.template.metadata.annotations"
    ann = {str(k): v for k, v in mapping(workload, tmeta.get("annotations"), afld).items()}
    pspec = mapping(workload, tpl.get("spec"), f"{fld}.template.spec")
    pspec = with_runtime_overhead(workload, pspec, ctx.kueue.runtime_classes,
                                  f"{fld}.template.spec")
    pspec = with_limit_range_defaults(workload, pspec, ctx.kueue.limit_ranges_of(workload),
                                      f"{fld}.template.spec")
    req = pod_requests(workload, pspec, f"{fld}.template.spec")
    claimed = _claimed_gpus(ctx, fld, pspec, ann, req.gpus)
    gpu_milli = gpu_share_milli(workload, ann, afld, req)
    gpus = req.gpus + claimed.gpus
    vram = max(vram_per_gpu_mib(workload, ann, afld, gpus), claimed.vram_mib)
    _gang_wide(ctx, fld, ps, name, ann, said)
    topo = mapping(workload, ps.get("topologyRequest"), f"{fld}.topologyRequest")
    toleration_list, selector, allowed = _node_constraints(ctx, fld, name, pspec)
    allowed = claim_nodes(claimed, ctx.nodes, ctx.dra, allowed)
    if claimed.product is not None and ctx.nodes is None:
        selector[L.GFD_GPU_PRODUCT] = claimed.product
    indexed = (
        bool(ctx.owner_kinds & _INDEXED_OWNERS)
        or bool(topo.get("podIndexLabel"))
        # a one-pod set's rank says nothing: the Job is not read for a one-pod Workload
        or ("Job" in ctx.owner_kinds and count > 1 and _job_indexed(ctx.owner))
    )
    try:
        return PodSet(
            name=name,
            count=count,
            cpu_milli=req.cpu_milli,
            memory_mib=req.memory_mib,
            gpus=gpus,
            gpu_milli=gpu_milli,
            vram_mib=vram,
            tolerations=tuple(toleration_list),
            node_selector=selector,
            affinity_terms=node_affinity_terms(workload, pspec, f"{fld}.template.spec"),
            allowed_nodes=allowed,
            indexed=indexed,
            required_level=_clique_bound(ctx, said.required.get(name), claimed),
            preferred_level=said.preferred.get(name),
            workload_type=said.workload_types.get(name),
            group=said.groups.get(name),
            compute_domain=claimed.compute_domain,
        )
    except ValueError as e:
        raise TranslationError(object_ref(workload), fld, str(e)) from None


def _clique_bound(ctx: _Context, stated: str | None, claimed: ClaimGpus) -> str | None:
    """A ComputeDomain pod set's required level: the level it states when that lies inside
    one NVLink clique (under the clique in the gang's levels), else the clique."""
    if claimed.compute_domain is None:
        return stated
    if stated is None:
        return NVLINK_CLIQUE_LEVEL
    if ctx.levels is None:
        return stated  # unresolved levels: the clique heads them unless the config names it
    order = with_clique_level(ctx.levels, True)
    return stated if order.index(stated) > order.index(NVLINK_CLIQUE_LEVEL) else (
        NVLINK_CLIQUE_LEVEL)


def _claimed_gpus(
    ctx: _Context, fld: str, pspec: Mapping[str, Any], ann: Mapping[str, Any], units: int
) -> ClaimGpus:
    """The GPUs a pod set's pods ask through DRA claims; a pod asks its GPUs one way."""
    claimed = claim_gpus(
        ctx.workload, pspec, f"{fld}.template.spec", ctx.dra, ctx.gpu_classes
    )
    if claimed.gpus and units:
        raise TranslationError(
            object_ref(ctx.workload),
            f"{fld}.template.spec.resourceClaims",
            f"the pods ask GPUs both as {L.GPU_RESOURCE} and through ResourceClaims; "
            f"ask them one way",
        )
    if claimed.gpus and ann.get(L.ANN_GPU_FRACTION) not in (None, ""):
        raise TranslationError(
            object_ref(ctx.workload),
            f"{fld}.template.metadata.annotations[{L.ANN_GPU_FRACTION}]",
            "a GPU share is read for pods asking nvidia.com/gpu, not for GPUs asked "
            "through ResourceClaims",
        )
    return claimed


def _gang_wide(
    ctx: _Context,
    fld: str,
    ps: Mapping[str, Any],
    name: str,
    ann: Mapping[str, Any],
    said: _GangWide,
) -> None:
    """A pod set's workload type, NUMA policy, topology levels and podset group, into
    `said`."""
    workload, afld = ctx.workload, f"{fld}.template.metadata.annotations"
    workload_type = annotated_workload_type(workload, ann, afld)
    if workload_type is not None:
        said.workload_types[name] = workload_type
    numa = annotated_numa_policy(workload, ann, afld)
    if numa is not None:
        said.numa.append(numa)
    topo = mapping(workload, ps.get("topologyRequest"), f"{fld}.topologyRequest")
    required, preferred = topology_requests(workload, ann, topo, fld, ctx.levels)
    if required is not None:
        said.required[name] = required
    if preferred is not None:
        said.preferred[name] = preferred
    group = topo.get("podSetGroupName") or ann.get(L.KUEUE_PODSET_GROUP_NAME)
    if group:
        said.groups[name] = str(group)


def _node_constraints(
    ctx: _Context, fld: str, name: str, pspec: Mapping[str, Any]
) -> tuple[list[Toleration], dict[str, str], frozenset[str] | None]:
    """Tolerations (the pod's and its flavors'), nodeSelector, and the nodes the assigned
    flavors allow: with the snapshot's nodes, as names; else their nodeLabels join the
    nodeSelector."""
    workload = ctx.workload
    toleration_list = tolerations(
        workload, pspec.get("tolerations"), f"{fld}.template.spec.tolerations"
    )
    selector = node_selector(workload, pspec, f"{fld}.template.spec")
    allowed: frozenset[str] | None = None
    a_index, psa = ctx.assignments.get(name, (-1, {}))
    if psa:
        flavor_labels, flavor_tols = flavor_constraints(
            workload, psa, ctx.kueue, f"status.admission.podSetAssignments[{a_index}]"
        )
        toleration_list += [t for t in flavor_tols if t not in toleration_list]
        if flavor_labels is not None:
            if ctx.nodes is None:
                selector.update(flavor_labels)
            else:
                allowed = frozenset(
                    n.name
                    for n in ctx.nodes
                    if all(n.labels.get(k) == v for k, v in flavor_labels.items())
                )
    return toleration_list, selector, allowed


def _gang(
    ctx: _Context,
    pod_sets: list[PodSet],
    said: _GangWide,
    config: PlacementConfig,
    now: datetime | None,
) -> Gang:
    workload = ctx.workload
    ref = object_ref(workload)
    _check_groups(ref, pod_sets)
    # the GPU pod sets decide for the gang (every pod set when none has GPUs)
    deciding = [p for p in pod_sets if p.gpus] or pod_sets
    order = _level_order(ctx, config)
    wtype = _leading_type(deciding) or classify_workload(workload, ctx.owner)
    numa_policy = (
        max(said.numa, key=lambda p: _NUMA_RANK[p]) if said.numa else NumaPolicy(config.numa_policy)
    )
    try:
        return Gang(
            name=object_key(workload),
            pod_sets=tuple(pod_sets),
            tier=workload_tier(workload, ctx.kueue, config),
            workload_type=wtype,
            required_level=_narrowest([p.required_level for p in deciding], order),
            preferred_level=_narrowest([p.preferred_level for p in deciding], order),
            numa_policy=numa_policy,
            waited_seconds=_waited_seconds(workload, now),
        )
    except ValueError as e:
        if isinstance(e, TranslationError):
            raise
        raise TranslationError(ref, "spec.podSets", str(e)) from None


def _check_groups(ref: str, pod_sets: list[PodSet]) -> None:
    """The pod sets of one podset group share one domain: they must not ask for different
    required levels (Kueue's own validation asks the same of them)."""
    levels: dict[str, dict[str, str]] = {}
    for p in pod_sets:
        if p.group is not None and p.required_level is not None:
            levels.setdefault(p.group, {})[p.name] = p.required_level
    for group, stated in levels.items():
        if len(set(stated.values())) > 1:
            raise TranslationError(
                ref,
                f"spec.podSets[*].template.metadata.annotations ({L.KUEUE_PODSET_GROUP_NAME})",
                f"pod sets of group {group!r} ask for different required levels "
                f"({dict(sorted(stated.items()))}); a group shares one domain, so give them "
                f"the same level",
            )


def _level_order(ctx: _Context, config: PlacementConfig) -> Sequence[str] | None:
    """The topology levels, highest first, to rank the pod sets' levels by: the resolved
    ones, else the config's own list (unknown with a Kueue Topology not at hand)."""
    if ctx.levels is not None:
        return ctx.levels
    if config.topology.topology_name:
        return None
    return config.resolve_levels({})


def _narrowest(stated: list[str | None], order: Sequence[str] | None) -> str | None:
    """The narrowest (lowest) level stated; without a known order, the first stated."""
    levels = [level for level in stated if level is not None]
    if not levels:
        return None
    if order is None:
        return levels[0]
    return max(levels, key=lambda level: order.index(level) if level in order else -1)


def _leading_type(pod_sets: list[PodSet]) -> WorkloadType | None:
    """The workload type stated by the pod sets with the most GPUs (then pods), if any
    states one; the first such pod set wins a tie."""
    stated = [p for p in pod_sets if p.workload_type is not None]
    if not stated:
        return None
    lead = max(stated, key=lambda p: (p.count * p.gpu_milli_per_pod, p.count))
    return lead.workload_type
