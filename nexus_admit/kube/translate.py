"""Translation between Kubernetes objects (plain dicts from the API or YAML) and the model.

Pure functions, no client. This module is the public face of `nexus_admit.kube`'s
translation; the work is done in `cluster` (nodes, pods, reservations → ClusterSnapshot),
`workload` (Kueue Workloads → Gang), `requests` (effective pod requests) and `quantity`.
Every function raises `TranslationError(obj_ref, field, message)` on bad input.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster import (
    build_snapshot,
    gpu_fraction_milli,
    node_from_object,
    parse_time,
    pod_is_active,
    reservation_is_live,
    reservation_workload_key,
    topologies_from_objects,
)
from nexus_admit.kube.errors import Obj, TranslationError, meta, object_key, object_ref
from nexus_admit.kube.quantity import format_quantity
from nexus_admit.kube.requests import PodRequests, effective_requests, pod_requests
from nexus_admit.kube.workload import (
    KueueIndex,
    classify_workload,
    creation_key,
    is_pending_on_check,
    our_check_names,
    tas_pod_sets,
    workload_template_requests,
    workload_to_gang,
)
from nexus_admit.model import GPU_WHOLE, Gang, Placement, PlacementConfig

__all__ = [
    "KueueIndex",
    "Obj",
    "PodRequests",
    "TranslationError",
    "build_snapshot",
    "classify_workload",
    "creation_key",
    "effective_requests",
    "gpu_fraction_milli",
    "is_pending_on_check",
    "node_from_object",
    "object_key",
    "object_ref",
    "our_check_names",
    "parse_time",
    "placement_config_from_object",
    "pod_is_active",
    "pod_requests",
    "reservation_is_live",
    "reservation_object",
    "reservation_workload_key",
    "tas_pod_sets",
    "topologies_from_objects",
    "workload_template_requests",
    "workload_to_gang",
]


def placement_config_from_object(obj: Obj) -> PlacementConfig:
    """A PlacementConfig object (or a bare spec mapping without `kind`) → PlacementConfig."""
    spec: Any = obj.get("spec") if "kind" in obj or "spec" in obj else obj
    if spec is not None and not isinstance(spec, Mapping):
        raise TranslationError(object_ref(obj), "spec", "expected an object")
    try:
        return PlacementConfig.from_spec(spec)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = err.get("msg", str(e))
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise TranslationError(
            object_ref(obj) if "kind" in obj else "PlacementConfig",
            f"spec.{loc}" if loc else "spec",
            f"{msg}{more}",
        ) from None


def reservation_object(
    *,
    name: str,
    workload: Obj,
    gang: Gang,
    placement: Placement,
    expires_at: datetime,
) -> dict[str, Any]:
    """The ResourceReservation for a feasible placement of `workload` (owner: the Workload).

    Per pod set it records the per-pod `requests` and `gpuShare`, so the reservation holds
    capacity on its own, and one slot per pod {index, node, gpus (device indices), numaZone}.
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
        },
        "spec": {
            "workloadRef": {
                "name": str(m.get("name")),
                "namespace": str(m.get("namespace") or "default"),
            },
            "podSets": pod_sets,
            "expiresAt": expires_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    }
