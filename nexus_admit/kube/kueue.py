"""Kueue facts about a Workload: the Kueue objects it is looked up in (`KueueIndex`), whether
it waits on our AdmissionCheck, Kueue's admission order, its tier (from its ClusterQueue),
the constraints of the flavors Kueue assigned, and the pod sets Kueue placed by TAS.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nexus_admit.kube import labels as L
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
from nexus_admit.kube.podspec import tolerations as parse_tolerations
from nexus_admit.model import PlacementConfig, Toleration

# Kueue's own ProvisioningRequest admission check (pkg/controller/admissionchecks/provisioning)
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"

__all__ = [
    "PROVISIONING_CONTROLLER",
    "KueueIndex",
    "admission_order_key",
    "check_entries",
    "check_entry_of",
    "creation_key",
    "entry_retry_count",
    "flavor_constraints",
    "is_pending_on_check",
    "our_check_names",
    "pending_checks",
    "provisioned_by",
    "provisioning_check_names",
    "retry_count",
    "sibling_node_selectors",
    "tas_pod_sets",
    "tier_claims",
    "unready_provisioning_check",
    "workload_tier",
]


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


def provisioning_check_names(admission_checks: Iterable[Obj]) -> set[str]:
    """Names of the AdmissionChecks run by Kueue's ProvisioningRequest controller."""
    return {
        str(meta(ac).get("name"))
        for ac in admission_checks
        if isinstance(ac.get("spec"), Mapping)
        and ac["spec"].get("controllerName") == PROVISIONING_CONTROLLER
    }


def check_entries(workload: Obj) -> list[Mapping[str, Any]]:
    """The Workload's `status.admissionChecks` entries that are objects (others skipped:
    this is read on every pass, and a malformed entry is Kueue's to reject). The one place
    a Workload's check entries are read."""
    status = workload.get("status")
    entries = status.get("admissionChecks") if isinstance(status, Mapping) else None
    return [e for e in entries if isinstance(e, Mapping)] if isinstance(entries, list) else []


def check_entry_of(workload: Obj, check: str) -> dict[str, Any]:
    """The Workload's entry for `check` (a copy), or {} when it has none."""
    return next((dict(e) for e in check_entries(workload) if e.get("name") == check), {})


def retry_count(workload: Obj, check: str) -> int:
    """How often Kueue has evicted the Workload for `check`'s Retry (`retryCount`); 0 when
    absent or unreadable (a Workload is untrusted input: a bad count must not stop a pass,
    and the smallest backoff is the safe guess)."""
    return entry_retry_count(check_entry_of(workload, check))


def entry_retry_count(entry: Mapping[str, Any]) -> int:
    """`retry_count` of one check entry (a `WorkloadView.check`)."""
    value = entry.get("retryCount")
    if isinstance(value, bool) or not isinstance(value, int | str):
        return 0
    try:
        return max(0, int(value))
    except ValueError:
        return 0


def pending_checks(workload: Obj, checks: Collection[str]) -> list[str]:
    """The names of `checks` whose entry on the Workload is Pending, in status order."""
    return [str(e["name"]) for e in check_entries(workload)
            if e.get("name") in checks and e.get("state") == "Pending"]


def unready_provisioning_check(
    workload: Obj, provisioning: Collection[str]
) -> tuple[str, str, str] | None:
    """(name, state, message) of the first of the Workload's `provisioning` checks that is
    not Ready: its nodes are not there (or not booked) yet, so placing now would place
    without them."""
    for entry in check_entries(workload):
        name = entry.get("name")
        if name in provisioning and entry.get("state") != "Ready":
            return str(name), str(entry.get("state") or ""), str(entry.get("message") or "")
    return None


def provisioned_by(workload: Obj, provisioning: Collection[str]) -> str | None:
    """The first of the Workload's `provisioning` checks that is Ready: its autoscaler has
    booked the nodes (they may still be booting: cluster-autoscaler says Provisioned once
    the scale-up is under way)."""
    for entry in check_entries(workload):
        if entry.get("name") in provisioning and entry.get("state") == "Ready":
            return str(entry["name"])
    return None


def sibling_node_selectors(workload: Obj, ours: Collection[str]) -> dict[str, dict[str, str]]:
    """Per pod set, the nodeSelector the Workload's other Ready checks set through their
    podSetUpdates (Kueue applies every check's to the pods; the provisioning check's names
    the provisioned nodes). A key two checks set to different values: "\0conflict" (no
    node can match; Kueue would refuse to start the pods anyway)."""
    out: dict[str, dict[str, str]] = {}
    for entry in check_entries(workload):
        if entry.get("name") in ours or entry.get("state") != "Ready":
            continue
        updates = entry.get("podSetUpdates")
        for update in updates if isinstance(updates, list) else []:
            selector = update.get("nodeSelector") if isinstance(update, Mapping) else None
            if not isinstance(selector, Mapping) or not isinstance(update.get("name"), str):
                continue
            into = out.setdefault(update["name"], {})
            for key, value in selector.items():
                if key in into and into[key] != str(value):
                    into["\0conflict"] = ""
                into[str(key)] = str(value)
    return out


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


@dataclass(slots=True)
class KueueIndex:
    """The Kueue objects a Workload's translation looks things up in."""

    cluster_queues: dict[str, Obj] = field(default_factory=dict)
    local_queues: dict[tuple[str, str], Obj] = field(default_factory=dict)
    resource_flavors: dict[str, Obj] = field(default_factory=dict)
    admission_checks: dict[str, Obj] = field(default_factory=dict)
    # owners (Job, JobSet, ...) by (kind, namespace, name), when known; a dump's passes
    # give a lookup into objects of that kind, not a dict of every pod (`ClusterDump`)
    owners: Mapping[tuple[str, str, str], Obj] = field(default_factory=dict)
    # RuntimeClasses (node.k8s.io) by name: their pod overhead joins a pod set's requests
    runtime_classes: dict[str, Obj] = field(default_factory=dict)
    # LimitRanges by namespace: their container defaults join a pod set's requests
    limit_ranges: dict[str, list[Obj]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        *,
        cluster_queues: Iterable[Obj] = (),
        local_queues: Iterable[Obj] = (),
        resource_flavors: Iterable[Obj] = (),
        admission_checks: Iterable[Obj] = (),
        owners: Iterable[Obj] | Mapping[tuple[str, str, str], Obj] = (),
        runtime_classes: Iterable[Obj] = (),
        limit_ranges: Iterable[Obj] = (),
    ) -> KueueIndex:
        def name(o: Obj) -> str:
            return str(meta(o).get("name") or "")

        by_namespace: dict[str, list[Obj]] = {}
        for o in limit_ranges:
            by_namespace.setdefault(str(meta(o).get("namespace") or "default"), []).append(o)

        return cls(
            cluster_queues={name(o): o for o in cluster_queues},
            local_queues={
                (str(meta(o).get("namespace") or "default"), name(o)): o for o in local_queues
            },
            resource_flavors={name(o): o for o in resource_flavors},
            admission_checks={name(o): o for o in admission_checks},
            owners=owners if isinstance(owners, Mapping) else {
                (str(o.get("kind", "")), str(meta(o).get("namespace") or ""), name(o)): o
                for o in owners
            },
            runtime_classes={name(o): o for o in runtime_classes},
            limit_ranges=by_namespace,
        )

    def our_checks(self) -> set[str] | None:
        """Our AdmissionCheck names, or None when no AdmissionCheck objects are known."""
        if not self.admission_checks:
            return None
        return our_check_names(self.admission_checks.values())

    def limit_ranges_of(self, obj: Obj) -> list[Obj]:
        """The LimitRanges of the object's namespace (its pods are admitted there)."""
        return self.limit_ranges.get(str(meta(obj).get("namespace") or "default"), [])

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


def flavor_constraints(
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
        tolerations += parse_tolerations(rf, spec.get("tolerations"), "spec.tolerations")
    return (labels if constrained else None), tolerations


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
