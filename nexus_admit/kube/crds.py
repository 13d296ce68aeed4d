"""The CRD manifests of nexus-admit, built in code so they cannot drift from the model.

* `PlacementConfig`: the OpenAPI schema is generated from the pydantic model's JSON schema
  (refs inlined, `null` unions → `nullable`, defaults left to the model).
* `ResourceReservation`: written here; `kube/cluster/capacity.py` reads exactly these fields.

`python -m nexus_admit.kube.crds [DIR]` writes `DIR/placementconfigs.yaml` and
`DIR/resourcereservations.yaml` (default DIR: ./crds); tests check the files are current.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from nexus_admit.kube import labels as L
from nexus_admit.model import PlacementConfig

__all__ = [
    "crd_files",
    "placement_config_crd",
    "placement_config_schema",
    "render",
    "resource_reservation_crd",
]

_DROP = frozenset({"title", "default"})


def _structural(node: Any, defs: Mapping[str, Any]) -> Any:
    """JSON Schema (pydantic) → Kubernetes structural OpenAPI v3 schema."""
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, Mapping):
        return node
    if "$ref" in node:
        target = defs[str(node["$ref"]).rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(node["anyOf"])
        if len(options) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            single: dict[str, Any] = _structural({**options[0], **rest}, defs)
            if nullable:
                single["nullable"] = True
            return single
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "additionalProperties" and value is False:
            continue  # structural schemas prune unknown fields instead
        if key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"] = value
            out["exclusiveMinimum"] = True
            continue
        if key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"] = value
            out["exclusiveMaximum"] = True
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
            continue
        out[key] = _structural(value, defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def placement_config_schema() -> dict[str, Any]:
    """The OpenAPI schema of PlacementConfig.spec, from the pydantic model."""
    raw = PlacementConfig.model_json_schema(by_alias=True, mode="validation")
    spec: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    spec["description"] = (
        "Everything an admin may tune about nexus-admit's placement. Omitted fields take the "
        "built-in defaults."
    )
    return spec


def _crd(
    *,
    plural: str,
    kind: str,
    scope: str,
    short_names: list[str],
    schema: dict[str, Any],
    columns: list[dict[str, Any]],
    status: bool,
) -> dict[str, Any]:
    version: dict[str, Any] = {
        "name": L.API_VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
        "additionalPrinterColumns": columns,
    }
    if status:
        version["subresources"] = {"status": {}}
    names: dict[str, Any] = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": kind.lower(),
    }
    if short_names:
        names["shortNames"] = short_names
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{L.API_GROUP}"},
        "spec": {"group": L.API_GROUP, "names": names, "scope": scope, "versions": [version]},
    }


_META = {
    "apiVersion": {"type": "string"},
    "kind": {"type": "string"},
    "metadata": {"type": "object"},
}


def placement_config_crd() -> dict[str, Any]:
    schema = {
        "type": "object",
        "description": "PlacementConfig: how nexus-admit places gangs. Referenced by the "
        "AdmissionCheck's spec.parameters.",
        "properties": {**_META, "spec": placement_config_schema()},
    }
    return _crd(
        plural="placementconfigs",
        kind=L.KIND_PLACEMENT_CONFIG,
        scope="Cluster",
        short_names=["pcfg"],
        schema=schema,
        columns=[
            {"name": "Topology", "type": "string", "jsonPath": ".spec.topology.topologyName"},
            {"name": "Default Tier", "type": "string", "jsonPath": ".spec.defaultTier"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        status=False,
    )


_QTY = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}


def resource_reservation_crd() -> dict[str, Any]:
    slot = {
        "type": "object",
        "required": ["index", "node"],
        "properties": {
            "index": {"type": "integer", "minimum": 0, "description": "Pod index in the pod set."},
            "node": {"type": "string", "description": "Node the pod is pinned to."},
            "gpus": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0},
                "description": "GPU device indices on the node.",
            },
            "numaZone": {"type": "integer", "minimum": 0, "description": "NUMA zone id."},
        },
    }
    pod_set = {
        "type": "object",
        "required": ["name", "slots"],
        "properties": {
            "name": {"type": "string"},
            "requests": {
                "type": "object",
                "description": "Per-pod requests held by each slot (cpu, memory).",
                "additionalProperties": _QTY,
            },
            "gpuShare": {
                **_QTY,
                "description": "Share of each GPU one pod uses (1 = whole; 0.5 = half).",
            },
            "slots": {"type": "array", "items": slot, "x-kubernetes-list-type": "atomic"},
        },
    }
    spec = {
        "type": "object",
        "required": ["workloadRef", "podSets"],
        "properties": {
            "workloadRef": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "namespace": {"type": "string"},
                    "uid": {"type": "string"},
                },
            },
            "podSets": {"type": "array", "items": pod_set},
            "expiresAt": {
                "type": "string",
                "format": "date-time",
                "description": "Slots not yet bound are released after this time.",
            },
            "decision": {
                "type": "object",
                "description": "Why the pods go where they go: the engine's answer.",
                "properties": {
                    "policy": {"type": "string"},
                    "status": {"type": "string"},
                    "objective": {"type": "number"},
                    "nodes": {"type": "integer", "description": "Distinct nodes used."},
                    "gpus": {"type": "integer", "description": "GPU devices reserved."},
                    "terms": {"type": "object", "additionalProperties": {"type": "number"}},
                    "explanation": {"type": "array", "items": {"type": "string"}},
                    "mode": {
                        "type": "string",
                        "enum": ["placed", "borrowed", "preempting", "draining"],
                        "description": "placed; borrowed (on a higher tier's hardware, may be "
                        "preempted); preempting (holds the capacity of Workloads it evicted "
                        "until they leave); draining (holds GPUs as the Workloads there "
                        "finish).",
                    },
                },
            },
        },
    }
    condition = {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer"},
        },
    }
    status = {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": ["Reserved", "Bound", "Released"]},
            "slots": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "slot": {"type": "string", "description": "<podSet>/<index>"},
                        "pod": {"type": "string"},
                        "uid": {"type": "string"},
                        "state": {"type": "string", "enum": ["Claimed", "Bound", "Released"]},
                    },
                },
            },
            "conditions": {
                "type": "array",
                "items": condition,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
        },
    }
    schema = {
        "type": "object",
        "description": "ResourceReservation: where every pod of a Workload is to run, held "
        "until its pods are bound.",
        "properties": {**_META, "spec": spec, "status": status},
    }
    return _crd(
        plural="resourcereservations",
        kind=L.KIND_RESOURCE_RESERVATION,
        scope="Namespaced",
        short_names=["rr"],
        schema=schema,
        columns=[
            {"name": "Workload", "type": "string", "jsonPath": ".spec.workloadRef.name"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Nodes", "type": "integer", "jsonPath": ".spec.decision.nodes"},
            {"name": "GPUs", "type": "integer", "jsonPath": ".spec.decision.gpus"},
            {"name": "Mode", "type": "string", "jsonPath": ".spec.decision.mode"},
            {"name": "Expires", "type": "date", "jsonPath": ".spec.expiresAt", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        status=True,
    )


def render(crd: Mapping[str, Any]) -> str:
    header = "# Generated by `python -m nexus_admit.kube.crds`; do not edit by hand.\n"
    return header + yaml.safe_dump(dict(crd), sort_keys=False, width=100)


def crd_files() -> dict[str, str]:
    """File name → manifest text."""
    return {
        "placementconfigs.yaml": render(placement_config_crd()),
        "resourcereservations.yaml": render(resource_reservation_crd()),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "crds")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in crd_files().items():
        (out / name).write_text(text)
        print(out / name)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
