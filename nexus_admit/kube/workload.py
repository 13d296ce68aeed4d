"""Kueue v1beta2 Workloads → model Gangs, and which Workloads wait on the nexus check.

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
`required-topology` / `preferred-topology` (ours, else Kueue's TAS `topologyRequest`) and
`numa-policy` are gang-wide: pod sets must agree on the topology levels; the strictest NUMA
policy wins.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster import gpu_fraction_milli
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
from nexus_admit.kube.quantity import parse_memory_mib
from nexus_admit.kube.requests import pod_requests
from nexus_admit.model import (
    GPU_WHOLE,
    Gang,
    Node,
    NodeSelectorRequirement,
    NumaPolicy,
    PlacementConfig,
    PodSet,
    Toleration,
    WorkloadType,
)

__all__ = [
    "OWNER_KINDS",
    "KueueIndex",
    "admission_order_key",
    "classify_workload",
    "creation_key",
    "is_pending_on_check",
    "our_check_names",
    "tas_pod_sets",
    "tier_claims",
    "workload_template_requests",
    "workload_tier",
    "workload_to_gang",
]

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
_INDEXED_OWNERS = frozenset(
    {
        "JobSet",
        "PyTorchJob",
        "TFJob",
        "MPIJob",
        "XGBoostJob",
        "PaddleJob",
        "JAXJob",
        "TrainJob",
        "LeaderWorkerSet",
        "StatefulSet",
    }
)

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
_SELECTOR_OPS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


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
    """Workload type from owner kinds, then well-known labels (Workload and pod templates).

    Deployment/StatefulSet/ReplicaSet and other services become `inference` when they use
    GPUs. An indexed Job with GPUs and more than one pod is `training`. Default `batch`.
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
    label_sets = [mapping(workload, meta(workload).get("labels"), "metadata.labels")]
    for i, tpl in enumerate(_templates(workload)):
        fld = f"spec.podSets[{i}].template.metadata"
        tmeta = mapping(workload, tpl.get("metadata"), fld)
        label_sets.append(mapping(workload, tmeta.get("labels"), f"{fld}.labels"))
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


# ---------------------------------------------------------------- pending check


def _conditions(workload: Obj) -> dict[str, str]:
    out: dict[str, str] = {}
    status = mapping(workload, workload.get("status"), "status")
    for c in sequence(workload, status.get("conditions"), "status.conditions"):
        if isinstance(c, Mapping) and c.get("type"):
            out[str(c["type"])] = str(c.get("status", ""))
    return out


def our_check_names(admission_checks: Iterable[Obj]) -> set[str]:
    """Names of the AdmissionChecks whose `spec.controllerName` is ours."""
    return {
        str(meta(ac).get("name"))
        for ac in admission_checks
        if mapping(ac, ac.get("spec"), "spec").get("controllerName") == L.ADMISSION_CHECK_CONTROLLER
    }


def is_pending_on_check(workload: Obj, check_names: Collection[str] | None) -> bool:
    """The Workload waits on our check: its state is Pending, QuotaReserved=True, not
    Evicted, not Finished, not Admitted, `spec.active` not false.

    `check_names` are our AdmissionChecks' names; None (no AdmissionCheck objects known, as
    in a dump without them) accepts any Pending check.
    """
    if mapping(workload, workload.get("spec"), "spec").get("active") is False:
        return False
    cond = _conditions(workload)
    if cond.get("QuotaReserved") != "True":
        return False
    if any(cond.get(t) == "True" for t in ("Evicted", "Finished", "Admitted")):
        return False
    status = mapping(workload, workload.get("status"), "status")
    for st in sequence(workload, status.get("admissionChecks"), "status.admissionChecks"):
        if not isinstance(st, Mapping) or st.get("state") != "Pending":
            continue
        name = st.get("name")
        if check_names is None or (isinstance(name, str) and name in check_names):
            return True
    return False


def creation_key(obj: Obj) -> tuple[str, str]:
    """Sort key: creationTimestamp (RFC 3339 sorts as text), then namespace/name."""
    return (str(meta(obj).get("creationTimestamp") or ""), object_key(obj))


def admission_order_key(workload: Obj) -> tuple[int, str, str]:
    """Kueue's admission order: higher `spec.priority` first, then older first (then by
    namespace/name, so the order is total). `plan` and the controller both place in it."""
    spec = workload.get("spec")
    priority = spec.get("priority") if isinstance(spec, Mapping) else None
    if not isinstance(priority, int) or isinstance(priority, bool):
        priority = 0
    return (-priority, *creation_key(workload))


# ---------------------------------------------------------------- Kueue objects


@dataclass(slots=True)
class KueueIndex:
    """The Kueue objects a Workload's translation looks things up in."""

    cluster_queues: dict[str, Obj] = field(default_factory=dict)
    local_queues: dict[tuple[str, str], Obj] = field(default_factory=dict)
    resource_flavors: dict[str, Obj] = field(default_factory=dict)
    admission_checks: dict[str, Obj] = field(default_factory=dict)
    # owners (Job, JobSet, ...) by (kind, namespace, name), when known
    owners: dict[tuple[str, str, str], Obj] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        *,
        cluster_queues: Iterable[Obj] = (),
        local_queues: Iterable[Obj] = (),
        resource_flavors: Iterable[Obj] = (),
        admission_checks: Iterable[Obj] = (),
        owners: Iterable[Obj] = (),
    ) -> KueueIndex:
        def name(o: Obj) -> str:
            return str(meta(o).get("name") or "")

        return cls(
            cluster_queues={name(o): o for o in cluster_queues},
            local_queues={
                (str(meta(o).get("namespace") or "default"), name(o)): o for o in local_queues
            },
            resource_flavors={name(o): o for o in resource_flavors},
            admission_checks={name(o): o for o in admission_checks},
            owners={
                (str(o.get("kind", "")), str(meta(o).get("namespace") or ""), name(o)): o
                for o in owners
            },
        )

    def our_checks(self) -> set[str] | None:
        """Our AdmissionCheck names, or None when no AdmissionCheck objects are known."""
        if not self.admission_checks:
            return None
        return our_check_names(self.admission_checks.values())

    def cluster_queue_name(self, workload: Obj) -> str | None:
        status = mapping(workload, workload.get("status"), "status")
        adm = mapping(workload, status.get("admission"), "status.admission")
        if adm.get("clusterQueue"):
            return str(adm["clusterQueue"])
        queue = mapping(workload, workload.get("spec"), "spec").get("queueName")
        if not queue:
            return None
        ns = str(meta(workload).get("namespace") or "default")
        lq = self.local_queues.get((ns, str(queue)))
        if lq is None:
            return None
        cq = mapping(lq, lq.get("spec"), "spec").get("clusterQueue")
        return str(cq) if cq else None

    def owner_of(self, workload: Obj) -> Obj | None:
        ns = str(meta(workload).get("namespace") or "")
        refs = meta(workload).get("ownerReferences")
        for r in sequence(workload, refs, "metadata.ownerReferences"):
            if isinstance(r, Mapping):
                o = self.owners.get((str(r.get("kind", "")), ns, str(r.get("name", ""))))
                if o is not None:
                    return o
        return None


def tas_pod_sets(workload: Obj, kueue: KueueIndex) -> list[str]:
    """Pod sets Kueue placed on a TAS flavor (ResourceFlavor with `spec.topologyName`):
    Kueue already fixed their hostnames, so the controller does not pin them."""
    out = []
    status = mapping(workload, workload.get("status"), "status")
    admission = mapping(workload, status.get("admission"), "status.admission")
    fld = "status.admission.podSetAssignments"
    for i, psa in enumerate(sequence(workload, admission.get("podSetAssignments"), fld)):
        psa = mapping(workload, psa, f"{fld}[{i}]")
        for flavor in mapping(workload, psa.get("flavors"), f"{fld}[{i}].flavors").values():
            rf = kueue.resource_flavors.get(str(flavor))
            if rf is not None and mapping(rf, rf.get("spec"), "spec").get("topologyName"):
                out.append(str(psa.get("name") or "main"))
                break
    return out


# ---------------------------------------------------------------- gang


def workload_tier(workload: Obj, kueue: KueueIndex, config: PlacementConfig) -> str:
    """The tier of the Workload's ClusterQueue (label), else the config's default."""
    cq_name = kueue.cluster_queue_name(workload)
    cq = kueue.cluster_queues.get(cq_name) if cq_name else None
    if cq is None:
        return config.default_tier
    tier = mapping(cq, meta(cq).get("labels"), "metadata.labels").get(L.LABEL_TIER)
    if not tier:
        return config.default_tier
    if tier not in config.tier_names():
        raise TranslationError(
            object_ref(cq),
            f"metadata.labels[{L.LABEL_TIER}]",
            f"tier {tier!r} is not defined in the PlacementConfig; use one of "
            f"{list(config.tier_names())} or add it to the PlacementConfig's tiers",
        )
    return str(tier)


def _tolerations(obj: Obj, value: Any, field: str) -> list[Toleration]:
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


def _affinity(
    obj: Obj, spec: Mapping[str, Any], field: str
) -> tuple[tuple[NodeSelectorRequirement, ...], ...]:
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
                ef = f"{tf}.{part}[{j}]"
                e = mapping(obj, e, ef)
                op = e.get("operator")
                if op not in _SELECTOR_OPS:
                    raise TranslationError(
                        object_ref(obj),
                        f"{ef}.operator",
                        f"{op!r} is not a node selector operator; "
                        f"use one of {sorted(_SELECTOR_OPS)}",
                    )
                key = str(e.get("key") or "")
                if part == "matchFields":
                    if key != "metadata.name":
                        raise TranslationError(
                            object_ref(obj), f"{ef}.key", "matchFields supports only metadata.name"
                        )
                    key = L.HOSTNAME_LABEL  # node name ≈ hostname label
                values = tuple(str(v) for v in sequence(obj, e.get("values"), f"{ef}.values"))
                reqs.append(NodeSelectorRequirement(key, str(op), values))
        if reqs:
            terms.append(tuple(reqs))
    return tuple(terms)


def _flavor_constraints(
    workload: Obj, psa: Mapping[str, Any], kueue: KueueIndex, field: str
) -> tuple[dict[str, str] | None, list[Toleration]]:
    """Merged nodeLabels (None = no constraint, {} never) and extra tolerations of the
    flavors assigned to one pod set."""
    flavors = mapping(workload, psa.get("flavors"), f"{field}.flavors")
    labels: dict[str, str] = {}
    constrained = False
    tolerations: list[Toleration] = []
    seen: set[str] = set()
    for resource, flavor in sorted(flavors.items()):
        if str(flavor) in seen:
            continue
        seen.add(str(flavor))
        rf = kueue.resource_flavors.get(str(flavor))
        if rf is None:
            raise TranslationError(
                object_ref(workload),
                f"{field}.flavors[{resource}]",
                f"ResourceFlavor {flavor!r} does not exist (include resourceflavors in the "
                f"snapshot, or check the ClusterQueue)",
            )
        spec = mapping(rf, rf.get("spec"), "spec")
        for k, v in mapping(rf, spec.get("nodeLabels"), "spec.nodeLabels").items():
            constrained = True
            if k in labels and labels[k] != str(v):
                labels["\0conflict"] = ""  # flavors disagree: no node can match
            labels[str(k)] = str(v)
        tolerations += _tolerations(rf, spec.get("tolerations"), "spec.tolerations")
    return (labels if constrained else None), tolerations


def _level(workload: Obj, value: Any, field: str, levels: Sequence[str] | None, what: str) -> str:
    level = str(value)
    if levels is not None and level not in levels:
        raise TranslationError(
            object_ref(workload),
            field,
            f"{what} {level!r} is not a topology level of this cluster; use one of {list(levels)}",
        )
    return level


def workload_template_requests(workload: Obj) -> dict[tuple[str, str], tuple[int, int, int]]:
    """{(ns/name, podSet): (cpu milli, memory MiB, GPUs)} per pod, for reservations that do
    not state their requests."""
    key = object_key(workload)
    out: dict[tuple[str, str], tuple[int, int, int]] = {}
    for i, ps in enumerate(
        sequence(workload, child(workload, "spec").get("podSets"), "spec.podSets")
    ):
        ps = mapping(workload, ps, f"spec.podSets[{i}]")
        tpl = mapping(workload, ps.get("template"), f"spec.podSets[{i}].template")
        r = pod_requests(workload, tpl.get("spec"), f"spec.podSets[{i}].template.spec")
        out[(key, str(ps.get("name") or "main"))] = (r.cpu_milli, r.memory_mib, r.gpus)
    return out


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


def workload_to_gang(
    workload: Obj,
    *,
    config: PlacementConfig,
    kueue: KueueIndex | None = None,
    nodes: Iterable[Node] | None = None,
    levels: Sequence[str] | None = None,
    now: datetime | None = None,
) -> Gang:
    """A Kueue v1beta2 Workload → Gang.

    `nodes` (the snapshot's) turn the assigned flavors into `allowed_nodes`; without them the
    flavors' nodeLabels are added to each pod set's nodeSelector instead. `levels` (the
    resolved topology levels) validate the topology annotations. `now` gives the gang its
    waited time since the Workload's creation (PlacementConfig.localityWait reads it;
    without `now` it has waited 0 s). Raises TranslationError.
    """
    kueue = kueue or KueueIndex()
    ref = object_ref(workload)
    key = object_key(workload)
    spec = mapping(workload, workload.get("spec"), "spec")
    status = mapping(workload, workload.get("status"), "status")
    admission = mapping(workload, status.get("admission"), "status.admission")
    assignments: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for i, a in enumerate(
        sequence(workload, admission.get("podSetAssignments"), "status.admission.podSetAssignments")
    ):
        a = mapping(workload, a, f"status.admission.podSetAssignments[{i}]")
        assignments[str(a.get("name") or "main")] = (i, a)
    node_list = list(nodes) if nodes is not None else None

    raw_sets = sequence(workload, spec.get("podSets"), "spec.podSets")
    if not raw_sets:
        raise TranslationError(ref, "spec.podSets", "a Workload needs at least one pod set")

    pod_sets: list[PodSet] = []
    required: dict[str, str] = {}
    preferred: dict[str, str] = {}
    wtypes: dict[str, WorkloadType] = {}
    numa: list[NumaPolicy] = []
    owner_kinds = set(_owner_kinds(workload))
    owner = kueue.owner_of(workload)
    for i, ps in enumerate(raw_sets):
        fld = f"spec.podSets[{i}]"
        ps = mapping(workload, ps, fld)
        name = str(ps.get("name") or "main")
        count = ps.get("count", 1)
        count_field = f"{fld}.count"
        a_index, psa = assignments.get(name, (-1, {}))
        if psa.get("count") is not None:
            count = psa["count"]
            count_field = f"status.admission.podSetAssignments[{a_index}].count"
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise TranslationError(ref, count_field, f"{count!r}: a pod count must be 0 or more")
        if count == 0:
            continue
        tpl = mapping(workload, ps.get("template"), f"{fld}.template")
        tmeta = mapping(workload, tpl.get("metadata"), f"{fld}.template.metadata")
        ann = {
            str(k): v
            for k, v in mapping(
                workload, tmeta.get("annotations"), f"{fld}.template.metadata.annotations"
            ).items()
        }
        afld = f"{fld}.template.metadata.annotations"
        pspec = mapping(workload, tpl.get("spec"), f"{fld}.template.spec")
        req = pod_requests(workload, pspec, f"{fld}.template.spec")

        gpus, gpu_milli = req.gpus, GPU_WHOLE
        fraction = gpu_fraction_milli(workload, ann, afld)
        if fraction is not None and fraction < GPU_WHOLE:
            if req.gpus != 1:
                raise TranslationError(
                    ref,
                    f"{afld}[{L.ANN_GPU_FRACTION}]",
                    f"a GPU share needs the pod to request exactly {L.GPU_RESOURCE}: 1 "
                    f"(it requests {req.gpus})",
                )
            gpu_milli = fraction

        vram = 0
        if ann.get(L.ANN_GPU_MEMORY) not in (None, ""):
            raw = ann[L.ANN_GPU_MEMORY]
            try:
                vram = parse_memory_mib(raw)
            except ValueError:
                raise TranslationError(
                    ref,
                    f"{afld}[{L.ANN_GPU_MEMORY}]",
                    f"{raw!r} is not a memory quantity; write the VRAM needed per GPU like "
                    f"40Gi or 81920Mi",
                ) from None
            if vram <= 0:
                raise TranslationError(
                    ref, f"{afld}[{L.ANN_GPU_MEMORY}]", f"{raw!r}: VRAM per GPU must be above 0"
                )
            if gpus == 0:
                vram = 0  # meaningless without a GPU; harmless, ignored

        wt = ann.get(L.ANN_WORKLOAD_TYPE)
        if wt not in (None, ""):
            try:
                wtypes[name] = WorkloadType(str(wt).strip().lower())
            except ValueError:
                raise TranslationError(
                    ref,
                    f"{afld}[{L.ANN_WORKLOAD_TYPE}]",
                    f"unknown workload type {wt!r}; use one of {[t.value for t in WorkloadType]}",
                ) from None

        np = ann.get(L.ANN_NUMA_POLICY)
        if np not in (None, ""):
            try:
                numa.append(NumaPolicy(str(np).strip().lower()))
            except ValueError:
                raise TranslationError(
                    ref,
                    f"{afld}[{L.ANN_NUMA_POLICY}]",
                    f"unknown NUMA policy {np!r}; use one of {[p.value for p in NumaPolicy]}",
                ) from None

        topo = mapping(workload, ps.get("topologyRequest"), f"{fld}.topologyRequest")
        for store, ours, kueue_ann, tr_key, what in (
            (
                required,
                L.ANN_REQUIRED_TOPOLOGY,
                L.KUEUE_PODSET_REQUIRED_TOPOLOGY,
                "required",
                "required-topology",
            ),
            (
                preferred,
                L.ANN_PREFERRED_TOPOLOGY,
                L.KUEUE_PODSET_PREFERRED_TOPOLOGY,
                "preferred",
                "preferred-topology",
            ),
        ):
            if ann.get(ours):
                store[name] = _level(workload, ann[ours], f"{afld}[{ours}]", levels, what)
            elif ann.get(kueue_ann):
                store[name] = _level(workload, ann[kueue_ann], f"{afld}[{kueue_ann}]", levels, what)
            elif topo.get(tr_key):
                store[name] = _level(
                    workload, topo[tr_key], f"{fld}.topologyRequest.{tr_key}", levels, what
                )

        tolerations = _tolerations(
            workload, pspec.get("tolerations"), f"{fld}.template.spec.tolerations"
        )
        selector = {
            str(k): str(v)
            for k, v in mapping(
                workload, pspec.get("nodeSelector"), f"{fld}.template.spec.nodeSelector"
            ).items()
        }
        allowed: frozenset[str] | None = None
        if psa:
            flavor_labels, flavor_tols = _flavor_constraints(
                workload, psa, kueue, f"status.admission.podSetAssignments[{a_index}]"
            )
            tolerations += [t for t in flavor_tols if t not in tolerations]
            if flavor_labels is not None:
                if node_list is None:
                    selector.update(flavor_labels)
                else:
                    allowed = frozenset(
                        n.name
                        for n in node_list
                        if all(n.labels.get(k) == v for k, v in flavor_labels.items())
                    )

        indexed = (
            bool(owner_kinds & _INDEXED_OWNERS)
            or bool(topo.get("podIndexLabel"))
            or ("Job" in owner_kinds and _job_indexed(owner))
        )
        try:
            pod_sets.append(
                PodSet(
                    name=name,
                    count=count,
                    cpu_milli=req.cpu_milli,
                    memory_mib=req.memory_mib,
                    gpus=gpus,
                    gpu_milli=gpu_milli,
                    vram_mib=vram,
                    tolerations=tuple(tolerations),
                    node_selector=selector,
                    affinity_terms=_affinity(workload, pspec, f"{fld}.template.spec"),
                    allowed_nodes=allowed,
                    indexed=indexed,
                )
            )
        except ValueError as e:
            raise TranslationError(ref, fld, str(e)) from None

    if not pod_sets:
        raise TranslationError(ref, "spec.podSets[*].count", "every pod set has count 0")

    def one(values: dict[str, Any], what: str) -> Any:
        distinct = sorted(set(values.values()), key=str)
        if len(distinct) > 1:
            raise TranslationError(
                ref,
                f"spec.podSets[*].template.metadata.annotations ({what})",
                f"pod sets disagree ({dict(sorted(values.items()))}); the gang is placed as a "
                f"whole, so give every pod set the same {what} or leave it out",
            )
        return distinct[0] if distinct else None

    wtype = one(wtypes, L.ANN_WORKLOAD_TYPE) or classify_workload(workload, owner)
    numa_policy = max(numa, key=lambda p: _NUMA_RANK[p]) if numa else NumaPolicy(config.numa_policy)
    try:
        return Gang(
            name=key,
            pod_sets=tuple(pod_sets),
            tier=workload_tier(workload, kueue, config),
            workload_type=wtype,
            required_level=one(required, L.ANN_REQUIRED_TOPOLOGY),
            preferred_level=one(preferred, L.ANN_PREFERRED_TOPOLOGY),
            numa_policy=numa_policy,
            waited_seconds=_waited_seconds(workload, now),
        )
    except ValueError as e:
        if isinstance(e, TranslationError):
            raise
        raise TranslationError(ref, "spec.podSets", str(e)) from None


def tier_claims(workload: Obj) -> list[str]:
    """Where the Workload or its pod templates claim a tier themselves (the tier label key
    as a label or annotation): tenants cannot choose their tier, so these are ignored; the
    controller says so in an Event."""
    out = []
    m = meta(workload)
    for what in ("labels", "annotations"):
        value = child(m, what).get(L.LABEL_TIER)
        if value:
            out.append(f"metadata.{what}[{L.LABEL_TIER}]={value}")
    for i, ps in enumerate(_listed(child(workload, "spec").get("podSets"))):
        tm = child(child(ps, "template") if isinstance(ps, Mapping) else {}, "metadata")
        for what in ("labels", "annotations"):
            value = child(tm, what).get(L.LABEL_TIER)
            if value:
                out.append(f"spec.podSets[{i}].template.metadata.{what}[{L.LABEL_TIER}]={value}")
    return out


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
