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
from nexus_admit.model import PlacementConfig, SolveStatus
from nexus_admit.model.config import DAY_SECONDS

__all__ = [
    "MAX_RESERVATION_SLOTS",
    "QUANTITY_PATTERN",
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
        if key == "propertyNames":
            # not part of a structural schema: the key bounds become a CEL rule
            out.setdefault("x-kubernetes-validations", []).append(_key_rule(value))
            continue
        if key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
            continue
        out[key] = _structural(value, defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def _key_rule(names: Mapping[str, Any]) -> dict[str, str]:
    low, high = int(names.get("minLength", 0)), int(names["maxLength"])
    return {
        "rule": f"self.all(k, size(k) >= {low} && size(k) <= {high})",
        "message": f"keys must be {low} to {high} characters long",
    }


def _cel_list(items: list[str]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


def _placement_config_rules(spec: dict[str, Any]) -> None:
    """What the model's cross-field validator checks, as CEL and list types the apiserver
    enforces (so `kubectl apply` refuses what the controller would report as invalid)."""
    default = PlacementConfig()
    props = spec["properties"]
    # unique names: a list of type map refuses a second entry with the same key
    for field, key in (("hardwareClasses", "name"), ("tiers", "name"), ("vramThresholds", "tier")):
        props[field]["x-kubernetes-list-type"] = "map"
        props[field]["x-kubernetes-list-map-keys"] = [key]
    props["topology"]["x-kubernetes-validations"] = [
        {
            "rule": "!(has(self.topologyName) && has(self.levels))",
            "message": "set either topologyName or levels, not both",
        },
        {
            "rule": "!has(self.levels) || size(self.levels) > 0",
            "message": "levels must name at least one node label",
        },
    ]
    tiers = (
        f"(has(self.tiers) ? self.tiers.map(t, t.name) : {_cel_list(list(default.tier_names()))})"
    )
    classes = (
        "(has(self.hardwareClasses) ? self.hardwareClasses.map(c, c.name) : "
        f"{_cel_list(list(default.class_names))})"
    )
    spec["x-kubernetes-validations"] = [
        {
            "rule": f"(has(self.defaultTier) ? self.defaultTier : '{default.default_tier}') "
            f"in {tiers}",
            "message": "defaultTier must be one of the tiers",
        },
        {
            "rule": "!has(self.tiers) || self.tiers.all(t, !has(t.classCosts) || "
            f"t.classCosts.all(c, c in {classes}))",
            "message": "tiers[].classCosts may name only hardwareClasses",
        },
        {
            "rule": "!has(self.tiers) || self.tiers.all(t, !has(t.allowedClasses) || "
            f"t.allowedClasses.all(c, c in {classes}))",
            "message": "tiers[].allowedClasses may name only hardwareClasses",
        },
        {
            "rule": f"!has(self.vramThresholds) || self.vramThresholds.all(v, v.tier in {tiers})",
            "message": "vramThresholds may name only tiers",
        },
    ]


def placement_config_schema() -> dict[str, Any]:
    """The OpenAPI schema of PlacementConfig.spec, from the pydantic model, with the model's
    cross-field rules as CEL."""
    raw = PlacementConfig.model_json_schema(by_alias=True, mode="validation")
    spec: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    spec["description"] = (
        "Everything an admin may tune about nexus-admit's placement. Omitted fields take the "
        "built-in defaults."
    )
    _placement_config_rules(spec)
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


# Kubernetes' own quantity syntax (apimachinery's resource.Quantity), without a sign: a
# reservation holds capacity, so a negative request would free someone else's.
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QTY = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "x-kubernetes-int-or-string": True,
    "pattern": QUANTITY_PATTERN,  # strings only; the rule covers integers
    "maxLength": 64,
    "x-kubernetes-validations": [
        {"rule": "type(self) == string || self >= 0", "message": "must not be negative"}
    ],
}

# Slots one reservation may hold, over all its pod sets. A slot costs at most ~360 bytes in
# the spec and ~410 in the status (253-character node and pod names, 16 GPUs): 1,024 slots
# stay under 0.8 MiB, well below the ~1.5 MiB an object may have in etcd, with room for the
# decision and the metadata. A larger gang is refused by the apiserver on create.
MAX_RESERVATION_SLOTS = 1024
MAX_POD_SETS = 8  # Kueue's own limit on a Workload's podSets
MAX_GPUS_PER_SLOT = 64
_DNS_SUBDOMAIN = 253
_DNS_LABEL = 63


def _string(max_length: int, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "maxLength": max_length, **extra}


def resource_reservation_crd() -> dict[str, Any]:
    slot = {
        "type": "object",
        "required": ["index", "node"],
        "properties": {
            "index": {
                "type": "integer",
                "minimum": 0,
                "maximum": 2**31 - 1,
                "description": "Pod index in the pod set.",
            },
            "node": _string(_DNS_SUBDOMAIN, minLength=1, description="Node the pod is pinned to."),
            "gpus": {
                "type": "array",
                "maxItems": MAX_GPUS_PER_SLOT,
                "items": {"type": "integer", "minimum": 0, "maximum": 1023},
                "x-kubernetes-list-type": "set",
                "description": "GPU device indices on the node.",
            },
            "numaZone": {
                "type": "integer",
                "minimum": 0,
                "maximum": 1023,
                "description": "NUMA zone id.",
            },
        },
    }
    pod_set = {
        "type": "object",
        "required": ["name", "slots"],
        "properties": {
            "name": _string(_DNS_LABEL, minLength=1),
            "requests": {
                "type": "object",
                "description": "Per-pod requests held by each slot (cpu, memory).",
                "maxProperties": 16,
                "additionalProperties": _QTY,
                "x-kubernetes-validations": [_key_rule({"minLength": 1, "maxLength": 317})],
            },
            "gpuShare": {
                **_QTY,
                "description": "Share of each GPU one pod uses (1 = whole; 0.5 = half).",
            },
            "slots": {
                "type": "array",
                "maxItems": MAX_RESERVATION_SLOTS,
                "items": slot,
                # one slot per pod index
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["index"],
            },
        },
    }
    spec = {
        "type": "object",
        "required": ["workloadRef", "podSets"],
        "x-kubernetes-validations": [
            {
                "rule": f"self.podSets.map(p, size(p.slots)).sum() <= {MAX_RESERVATION_SLOTS}",
                "message": f"a reservation holds at most {MAX_RESERVATION_SLOTS} slots "
                "over all its pod sets",
            }
        ],
        "properties": {
            "workloadRef": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": _string(_DNS_SUBDOMAIN, minLength=1),
                    "namespace": _string(_DNS_LABEL),
                    "uid": _string(128),
                },
            },
            "podSets": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_POD_SETS,
                "items": pod_set,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
            "expiresAt": {
                "type": "string",
                "format": "date-time",
                "description": "Slots not yet bound are released after this time (written by "
                "versions before ttlSeconds).",
            },
            "ttlSeconds": {
                "type": "integer",
                "minimum": 1,
                "maximum": DAY_SECONDS,
                "description": "Slots not yet bound are released this long after Kueue admits "
                "the Workload (the PlacementConfig's reservationTtlSeconds at placement).",
            },
            "decision": {
                "type": "object",
                "description": "Why the pods go where they go: the engine's answer.",
                "properties": {
                    "policy": _string(_DNS_LABEL),
                    "status": {
                        "type": "string",
                        "enum": [s.value for s in SolveStatus],
                    },
                    "objective": {"type": "number"},
                    "nodes": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "Distinct nodes used.",
                    },
                    "gpus": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "GPU devices reserved.",
                    },
                    "terms": {
                        "type": "object",
                        "maxProperties": 64,
                        "additionalProperties": {"type": "number"},
                    },
                    "explanation": {
                        "type": "array",
                        "maxItems": 64,
                        "items": _string(4096),
                    },
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
            "type": _string(316),
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": _string(1024),
            "message": _string(32768),
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer", "minimum": 0},
        },
    }
    status = {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": ["Reserved", "Bound", "Released"]},
            "slots": {
                "type": "array",
                "maxItems": MAX_RESERVATION_SLOTS,
                "items": {
                    "type": "object",
                    "properties": {
                        "slot": _string(128, description="<podSet>/<index>"),
                        "pod": _string(_DNS_SUBDOMAIN),
                        "uid": _string(128),
                        "state": {"type": "string", "enum": ["Claimed", "Bound", "Released"]},
                    },
                },
            },
            "conditions": {
                "type": "array",
                "maxItems": 16,
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
            {"name": "TTL", "type": "integer", "jsonPath": ".spec.ttlSeconds", "priority": 1},
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
