"""Translation between Kubernetes objects (plain dicts from the API or YAML) and the model.

Pure functions, no client. This module is the public face of `nexus_admit.kube`'s
translation; the work is done in `cluster` (nodes, pods, reservations → ClusterSnapshot),
`workload` (Kueue Workloads → Gang), `requests` (effective pod requests) and `quantity`.
Every function raises `TranslationError(obj_ref, field, message)` on bad input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from nexus_admit.kube.cluster import (
    build_snapshot,
    gpu_fraction_milli,
    node_from_object,
    pod_is_active,
    topologies_from_objects,
)
from nexus_admit.kube.errors import Obj, TranslationError, object_key, object_ref
from nexus_admit.kube.kueue import (
    KueueIndex,
    creation_key,
    is_pending_on_check,
    our_check_names,
    tas_pod_sets,
)
from nexus_admit.kube.podspec import workload_template_requests
from nexus_admit.kube.quantity import parse_time
from nexus_admit.kube.requests import PodRequests, effective_requests, pod_requests
from nexus_admit.kube.reservations import (
    reservation_is_live,
    reservation_object,
    reservation_workload_key,
)
from nexus_admit.kube.workload import classify_workload, workload_to_gang
from nexus_admit.model import PlacementConfig

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
