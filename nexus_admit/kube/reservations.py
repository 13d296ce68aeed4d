"""ResourceReservation shapes, names, liveness and slot keys: the one home for them.

Who calls it: the controller (to write reservations and to read them back after a restart),
`plan` and the snapshot builder (`kube/cluster/`, which counts live reservations as taken
capacity). A reservation is the durable record of one placement decision; everything the
controller needs after a restart can be read back from it and from the pods that carry its
label, so nothing here keeps state.

Names are deterministic: one name per (Workload uid, quota reservation). Kueue gives a
Workload a new quota reservation after every eviction or Retry, so a new attempt gets a new
reservation, and a repeated event or a restarted controller finds the one it already wrote
(`AlreadyExists` means done).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import Obj, TranslationError, child, mapping, meta, object_ref
from nexus_admit.kube.quantity import format_quantity, parse_time
from nexus_admit.kube.versioned import VersionedCache
from nexus_admit.model import GPU_WHOLE, ClusterSnapshot, Gang, Placement, Slot

__all__ = [
    "PHASE_BOUND",
    "PHASE_RESERVED",
    "ReservedSlot",
    "attempt_key",
    "neighbour_order",
    "parse_slot_key",
    "phase_holds",
    "reservation_attempt",
    "reservation_is_live",
    "reservation_key",
    "reservation_name",
    "reservation_object",
    "reservation_pod_label",
    "reservation_pod_sets",
    "reservation_slots",
    "reservation_workload_key",
    "reservation_workload_uid",
    "slot_key",
]

PHASE_RESERVED = "Reserved"
PHASE_BOUND = "Bound"

_LABEL_VALUE_MAX = 63
_HASH_LEN = 10
# ASCII digits only (`\d` takes every script's digits), bounded
_SLOT_KEY = re.compile(r"(?P<pod_set>[^/]{1,253})/(?P<index>[0-9]{1,9})")


@dataclass(frozen=True, slots=True)
class ReservedSlot:
    """One slot of a reservation as written: `<podSet>/<index>` on `node`."""

    pod_set: str
    index: int
    node: str
    gpus: tuple[int, ...]
    numa_zone: int | None

    @property
    def key(self) -> str:
        return slot_key(self.pod_set, self.index)


def slot_key(pod_set: str, index: object) -> str:
    """The value of a pod's `scheduling.kubenexus.io/slot` annotation."""
    return f"{pod_set}/{index}"


def parse_slot_key(value: Any) -> tuple[str, int] | None:
    """`(podSet, index)` of a slot annotation, or None when it is not one."""
    m = _SLOT_KEY.fullmatch(value) if isinstance(value, str) else None
    return (m["pod_set"], int(m["index"])) if m else None


def attempt_key(workload: Obj) -> str:
    """Identifies one quota reservation of a Workload: the time its QuotaReserved condition
    last became True (a Retry or an eviction makes Kueue reserve anew, with a new time)."""
    status = workload.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, Mapping) and c.get("type") == "QuotaReserved":
            return str(c.get("lastTransitionTime") or "")
    return ""


def reservation_name(workload: Obj) -> str:
    """`<workload name>-<hash of uid and attempt>`, at most 63 characters, so it is also a
    valid value of the pod label `scheduling.kubenexus.io/reservation`."""
    m = meta(workload)
    digest = hashlib.sha256(f"{m.get('uid', '')}/{attempt_key(workload)}".encode()).hexdigest()
    prefix = str(m.get("name") or "workload")[: _LABEL_VALUE_MAX - _HASH_LEN - 1]
    prefix = prefix.rstrip("-.") or "workload"
    return f"{prefix}-{digest[:_HASH_LEN]}"


def reservation_attempt(rr: Obj) -> str:
    return str(child(meta(rr), "annotations").get(L.ANN_ATTEMPT, ""))


def reservation_pod_label(rr: Obj) -> str:
    """The reservation label its pods carry: its own name, or for a Workload slice's
    reservation the label of the slices before it (`kube/slices.py`)."""
    m = meta(rr)
    label = child(m, "annotations").get(L.ANN_POD_LABEL)
    return label if isinstance(label, str) and label else str(m.get("name") or "")


def reservation_workload_uid(rr: Obj) -> str:
    spec = rr.get("spec")
    ref = spec.get("workloadRef") if isinstance(spec, Mapping) else None
    return str(ref.get("uid") or "") if isinstance(ref, Mapping) else ""


def neighbour_order(
    slots: Iterable[Slot], snapshot: ClusterSnapshot, levels: Iterable[str]
) -> list[Slot]:
    """Slots renumbered per pod set so that consecutive indices sit on the same node and
    neighbouring nodes (sorted by their domain at every topology level, highest first):
    the ungater gives pod rank i slot i, so ranks that talk most share racks."""
    level_keys = tuple(levels)

    def position(s: Slot) -> tuple[Any, ...]:
        node = snapshot.nodes.get(s.node)
        labels = node.labels if node is not None else {}
        return (tuple(labels.get(k, "") for k in level_keys), s.node, s.index)

    out: list[Slot] = []
    by_set: dict[str, list[Slot]] = {}
    for s in slots:
        by_set.setdefault(s.pod_set, []).append(s)
    for pod_set, group in by_set.items():
        for i, s in enumerate(sorted(group, key=position)):
            out.append(Slot(pod_set, i, s.node, s.gpu_indices, s.numa_zone))
    return out


# A pass reads the slots of every live reservation several times (per pod, per node); one
# version of a reservation always holds the same slots. Objects without a uid and
# resourceVersion (files, tests) are parsed every time.
_SLOTS: VersionedCache[tuple[ReservedSlot, ...]] = VersionedCache()


def reservation_slots(rr: Obj) -> list[ReservedSlot]:
    """Every slot a reservation holds, malformed entries skipped (the snapshot builder
    reports them with the field when it counts capacity)."""
    m = rr.get("metadata")
    uid = m.get("uid") if isinstance(m, Mapping) else None
    version = m.get("resourceVersion") if isinstance(m, Mapping) else None
    if not uid or not version:
        return _parse_slots(rr)
    return list(_SLOTS.get(str(uid), str(version), lambda: tuple(_parse_slots(rr))))


def _parse_slots(rr: Obj) -> list[ReservedSlot]:
    out: list[ReservedSlot] = []
    spec = rr.get("spec")
    pod_sets = spec.get("podSets") if isinstance(spec, Mapping) else None
    for ps in pod_sets if isinstance(pod_sets, list) else []:
        if not isinstance(ps, Mapping):
            continue
        name = str(ps.get("name") or "main")
        slots = ps.get("slots")
        for j, s in enumerate(slots if isinstance(slots, list) else []):
            if not isinstance(s, Mapping) or not s.get("node"):
                continue
            gpus = s.get("gpus")
            devices = tuple(g for g in gpus if isinstance(g, int)) if isinstance(gpus, list) else ()
            zone = s.get("numaZone")
            index = s.get("index", j)
            out.append(
                ReservedSlot(
                    name,
                    int(index) if isinstance(index, int) else j,
                    str(s["node"]),
                    devices,
                    zone if isinstance(zone, int) else None,
                )
            )
    return out


def reservation_workload_key(rr: Obj) -> str:
    """'namespace/name' of the Workload a ResourceReservation belongs to (a lenient read:
    the snapshot builder reports a malformed reservation with its field)."""
    ref = child(child(rr, "spec"), "workloadRef")
    ns = ref.get("namespace") or meta(rr).get("namespace") or "default"
    return f"{ns}/{ref.get('name', '')}"


def reservation_is_live(rr: Obj, now: datetime, *, bound: bool = False) -> bool:
    """Not Released, and not past `spec.expiresAt` unless one of its pods is bound (`bound`,
    or its status phase Bound): the TTL applies only before binding, so a bound gang's
    slot stays held while its pod restarts. The snapshot, the ungater and the lifecycle's
    expiry (`_ever_bound`) use the same rule."""
    status = mapping(rr, rr.get("status"), "status")
    held = phase_holds(status.get("phase"), bound=bound)
    if held is not None:
        return held
    try:
        expires = parse_time(mapping(rr, rr.get("spec"), "spec").get("expiresAt"))
    except ValueError:
        raise TranslationError(
            object_ref(rr), "spec.expiresAt", "not an RFC 3339 time (e.g. 2025-05-01T10:00:00Z)"
        ) from None
    return expires is None or expires > now


def phase_holds(phase: Any, *, bound: bool) -> bool | None:
    """`reservation_is_live` as far as the phase decides it: False when Released, True when
    `bound` or Bound, None when `spec.expiresAt` decides."""
    if phase == "Released":
        return False
    if bound or phase == PHASE_BOUND:
        return True
    return None


def reservation_pod_sets(rr: Obj) -> list[str]:
    """The names of the reservation's pod sets, in its order."""
    pod_sets = child(rr, "spec").get("podSets")
    items = pod_sets if isinstance(pod_sets, list) else []
    return [str(ps.get("name")) for ps in items if isinstance(ps, Mapping)]


def reservation_object(
    *,
    name: str,
    workload: Obj,
    gang: Gang,
    placement: Placement,
    expires_at: datetime | None = None,
    ttl_seconds: int | None = None,
) -> dict[str, Any]:
    """The ResourceReservation for a feasible placement of `workload` (owner: the Workload).

    Per pod set it records the per-pod `requests` and `gpuShare`, so the reservation holds
    capacity on its own, and one slot per pod {index, node, gpus (device indices), numaZone};
    the quota reservation it was made for (annotation), and the engine's decision (terms,
    explanation), so a restarted controller can answer from it alone.
    """
    if not placement.feasible:
        raise ValueError("only a feasible placement can be reserved")
    m = meta(workload)
    by_set: dict[str, list[dict[str, Any]]] = {}
    for s in placement.slots:
        slot: dict[str, Any] = {"index": s.index, "node": s.node, "gpus": list(s.gpu_indices)}
        if s.numa_zone is not None:
            slot["numaZone"] = s.numa_zone
        by_set.setdefault(s.pod_set, []).append(slot)
    pod_sets = []
    for ps in gang.pod_sets:
        entry: dict[str, Any] = {
            "name": ps.name,
            "requests": {"cpu": format_quantity(ps.cpu_milli), "memory": f"{ps.memory_mib}Mi"},
            "slots": sorted(by_set.get(ps.name, []), key=lambda s: int(s["index"])),
        }
        if ps.gpus:
            entry["gpuShare"] = format_quantity(ps.gpu_milli if ps.fractional else GPU_WHOLE)
        pod_sets.append(entry)
    owner = {
        "apiVersion": str(workload.get("apiVersion") or L.KUEUE_GROUP_VERSION),
        "kind": "Workload",
        "name": str(m.get("name")),
        "uid": str(m.get("uid") or ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {
        "apiVersion": L.GROUP_VERSION,
        "kind": L.KIND_RESOURCE_RESERVATION,
        "metadata": {
            "name": name,
            "namespace": str(m.get("namespace") or "default"),
            "ownerReferences": [owner] if owner["uid"] else [],
            "annotations": {
                L.ANN_ATTEMPT: attempt_key(workload),
                # at most one ComputeDomain per NVLink clique: later gangs read it here
                **({L.ANN_COMPUTE_DOMAIN: gang.compute_domain} if gang.compute_domain else {}),
            },
        },
        "spec": {
            "workloadRef": {
                "name": str(m.get("name")),
                "namespace": str(m.get("namespace") or "default"),
                "uid": str(m.get("uid") or ""),
            },
            "podSets": pod_sets,
            **({} if expires_at is None else
               {"expiresAt": expires_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}),
            **({} if ttl_seconds is None else {"ttlSeconds": ttl_seconds}),
            # why the pods go where they go: `kubectl get rr -o yaml` shows the engine's answer
            "decision": {
                "policy": placement.policy,
                "status": placement.status.value,
                "objective": round(float(placement.objective), 6),
                "nodes": len({s.node for s in placement.slots}),
                "gpus": sum(a.gpus for a in placement.assignments()),
                "terms": {k: round(float(v), 6) for k, v in placement.terms.items()},
                "explanation": list(placement.explanation),
            },
        },
    }


def reservation_key(workload: Obj) -> str:
    """The 'namespace/name' of the reservation of the Workload's current attempt."""
    return f"{meta(workload).get('namespace') or 'default'}/{reservation_name(workload)}"
