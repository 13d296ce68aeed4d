"""What Kueue's Topology-Aware Scheduling (TAS) holds: a Workload's
`status.admission.podSetAssignments[].topologyAssignment` (v1beta2: `levels` and `slices`,
each slice `domainCount` domains with `valuesPerLevel` and `podCounts`, universal or
individual, prefix + root + suffix) names the nodes its pods will run on from the moment
Kueue reserves quota, before the pods exist. Kueue TAS counts the whole assignment until the
Workload finishes or loses its quota; so does the snapshot (`snapshot._count_tas`), less
the pods of that pod set already bound to each node (counted as pods, not twice).

Only an assignment whose lowest level is `kubernetes.io/hostname` names nodes; with a
higher lowest level (a rack) kube-scheduler picks the node within the domain, and the
assignment is not counted (listed as skipped, so the admin gives the Topology the
hostname level)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import Obj, TranslationError, mapping, object_ref, sequence

__all__ = [
    "TasPodSet",
    "assignment_nodes",
    "has_topology_assignment",
    "holds_quota",
    "tas_pod_sets_of",
]

_FIELD = "status.admission.podSetAssignments"


@dataclass(frozen=True, slots=True)
class TasPodSet:
    """One pod set's topology assignment: pods per lowest-level domain."""

    name: str
    lowest_level: str
    pods: dict[str, int]  # domain value (a node name at the hostname level) → pods

    @property
    def names_nodes(self) -> bool:
        return self.lowest_level == L.HOSTNAME_LABEL


def _assignments(workload: Obj) -> list[Any]:
    status = workload.get("status")
    admission = status.get("admission") if isinstance(status, Mapping) else None
    psas = admission.get("podSetAssignments") if isinstance(admission, Mapping) else None
    return psas if isinstance(psas, list) else []


def has_topology_assignment(workload: Obj) -> bool:
    """Any pod set assignment carries a `topologyAssignment` (readable or not)."""
    return any(isinstance(a, Mapping) and a.get("topologyAssignment") is not None
               for a in _assignments(workload))


def holds_quota(workload: Obj) -> bool:
    """QuotaReserved=True and not Finished: Kueue TAS counts its assignment."""
    status = workload.get("status")
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    state = {str(c.get("type")): c.get("status") for c in conds or ()
             if isinstance(c, Mapping)} if isinstance(conds, list) else {}
    return state.get("QuotaReserved") == "True" and state.get("Finished") != "True"


def tas_pod_sets_of(workload: Obj) -> list[TasPodSet]:
    """Every pod set assignment with a `topologyAssignment`, decoded. Raises
    TranslationError naming the field when one cannot be read."""
    out = []
    status = mapping(workload, workload.get("status"), "status")
    admission = mapping(workload, status.get("admission"), "status.admission")
    for i, psa in enumerate(sequence(workload, admission.get("podSetAssignments"), _FIELD)):
        psa = mapping(workload, psa, f"{_FIELD}[{i}]")
        if psa.get("topologyAssignment") is None:
            continue
        fld = f"{_FIELD}[{i}].topologyAssignment"
        ta = mapping(workload, psa.get("topologyAssignment"), fld)
        out.append(_decode(workload, str(psa.get("name") or "main"), ta, fld))
    return out


def assignment_nodes(workload: Obj) -> set[str]:
    """The nodes the Workload's assignments name, as far as they can be read (whether or
    not it holds quota): what a change of it can move."""
    try:
        return {n for ps in tas_pod_sets_of(workload) if ps.names_nodes for n in ps.pods}
    except Exception:
        return set()


def _decode(workload: Obj, name: str, ta: Mapping[str, Any], fld: str) -> TasPodSet:
    ref = object_ref(workload)
    levels = sequence(workload, ta.get("levels"), f"{fld}.levels")
    if not levels or not all(isinstance(lv, str) and lv for lv in levels):
        raise TranslationError(ref, f"{fld}.levels", "expected a list of node label keys")
    pods: dict[str, int] = {}
    for s, sl in enumerate(sequence(workload, ta.get("slices"), f"{fld}.slices")):
        sfld = f"{fld}.slices[{s}]"
        sl = mapping(workload, sl, sfld)
        count = sl.get("domainCount")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise TranslationError(ref, f"{sfld}.domainCount", f"{count!r} is not a count")
        values = sequence(workload, sl.get("valuesPerLevel"), f"{sfld}.valuesPerLevel")
        if len(values) != len(levels):
            raise TranslationError(ref, f"{sfld}.valuesPerLevel",
                                   f"{len(values)} entries for {len(levels)} levels")
        domains = _level_values(workload, values[-1], count, f"{sfld}.valuesPerLevel[-1]")
        for domain, n in zip(domains, _pod_counts(workload, sl, count, sfld), strict=True):
            pods[domain] = pods.get(domain, 0) + n
    return TasPodSet(name, str(levels[-1]), pods)


def _level_values(workload: Obj, value: Any, count: int, fld: str) -> list[str]:
    value = mapping(workload, value, fld)
    if isinstance(value.get("universal"), str):
        return [value["universal"]] * count
    ind = mapping(workload, value.get("individual"), f"{fld}.individual")
    roots = sequence(workload, ind.get("roots"), f"{fld}.individual.roots")
    prefix, suffix = ind.get("prefix") or "", ind.get("suffix") or ""
    if (len(roots) != count or not all(isinstance(r, str) for r in roots)
            or not isinstance(prefix, str) or not isinstance(suffix, str)):
        raise TranslationError(object_ref(workload), f"{fld}.individual",
                               f"expected {count} roots (strings) with a string prefix/suffix")
    return [prefix + r + suffix for r in roots]


def _pod_counts(workload: Obj, sl: Mapping[str, Any], count: int, sfld: str) -> list[int]:
    fld = f"{sfld}.podCounts"
    pc = mapping(workload, sl.get("podCounts"), fld)
    universal = pc.get("universal")
    counts = ([universal] * count if universal is not None
              else list(sequence(workload, pc.get("individual"), f"{fld}.individual")))
    if len(counts) != count or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts
    ):
        raise TranslationError(object_ref(workload), fld,
                               f"expected {count} pod counts (whole numbers)")
    return counts
