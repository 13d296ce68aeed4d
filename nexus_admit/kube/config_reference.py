"""The PlacementConfig reference (docs/placement-config.md), generated from the model.

    python -m nexus_admit.kube.config_reference      # rewrites docs/placement-config.md

Field names, types, bounds and defaults come from the pydantic model
(`nexus_admit.model.config`) and the built-in `PlacementConfig()`; what each field means is
the table `MEANINGS` below, keyed by the field's path. `tests/kube/test_config_reference.py`
fails when the document differs from what this renders, or when a field has no meaning
here (or a meaning names a field that is gone), so the reference cannot drift.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from nexus_admit.model import PlacementConfig

__all__ = ["DOC", "MEANINGS", "field_paths", "render"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "placement-config.md"

MEANINGS: dict[str, str] = {
    "topology": "The fabric levels placement reasons about, highest first.",
    "topology.topologyName": "A Kueue `Topology` whose levels to use (instead of `levels`).",
    "topology.levels": "Node label keys, highest level first, ending with the host label.",
    "hardwareClasses": "GPU products grouped into classes; the first class that matches wins.",
    "hardwareClasses[].name": "The class name that tiers' `classCosts` refer to.",
    "hardwareClasses[].gpuProducts": "Globs over the GFD label `nvidia.com/gpu.product`.",
    "tiers": "Service tiers; a ClusterQueue's label `scheduling.kubenexus.io/tier` names one.",
    "tiers[].name": "The tier name (the value of the ClusterQueue label).",
    "tiers[].classCosts": "Cost per GPU of this tier's work on each hardware class (0: its "
    "home class). Soft: weighed against the other terms (a tier's GPU pod may still go to "
    "a costlier class to keep an island of its own class whole).",
    "tiers[].allowedClasses": "Hard: the only hardware classes this tier's GPU pods may run "
    "on (CPU-only pods anywhere). Unset: every class. Trade-off: a gang waits (Retry) for "
    "room on these classes instead of running at once on another.",
    "defaultTier": "The tier of Workloads whose ClusterQueue has no tier label.",
    "vramThresholds": "Per tier, the VRAM share of a GPU a pod should use; VRAM left below "
    "it counts as stranded.",
    "vramThresholds[].tier": "The tier.",
    "vramThresholds[].minUtilization": "Share of each GPU's VRAM (0-1).",
    "weights": "Weights of the objective terms (each term is also reported on its own in "
    "the check message).",
    "weights.tierMismatch": "× class cost per GPU placed off its tier's home class.",
    "weights.vramStranded": "Per GiB of VRAM stranded below the tier's threshold.",
    "weights.islandBroken": "Per pristine 8-GPU island (node) first touched.",
    "weights.domainSpread": "Per extra fabric domain a gang spans, × the level's rank.",
    "weights.gangSplit": "Per level a gang is split at, × level rank × the gang's GPUs.",
    "weights.nodeCount": "Per node used (packing workload types: training, batch).",
    "weights.fragmentation": "Per node left partly used.",
    "weights.domainFragmentation": "Per GPU left free in the racks a gang touches.",
    "weights.numaUnaligned": "Per pod that does not fit one NUMA zone.",
    "weights.spread": "Inference and service gangs: pods on the busiest node.",
    "spread": "Inference and service gangs only (training and batch never): the `spreadPairs` "
    "term, per pair of the service's pods (the gang's and its siblings already placed: a "
    "Deployment's other replicas) that share a node or a domain.",
    "spread.node": "Per pair on one node. Above `weights.islandBroken` by default: replicas "
    "take a node each even if that starts a pristine island; set it below to keep islands "
    "whole and let replicas share nodes.",
    "spread.domain": "Per pair in one domain of each level above the host not in `levels` (a "
    "pair in one rack also shares its block and zone, so higher levels weigh more).",
    "spread.levels": "Level label key → weight per pair in one of its domains.",
    "weights.fragGradient": "Engine-only: per GPU of fragmentation a gang adds (FGD measure).",
    "weights.fillOrder": "Engine-only: per node used × its rank in the node order.",
    "solver": "CP-SAT limits.",
    "solver.timeLimitSeconds": "Longest solve per gang; the best placement found is used.",
    "solver.workers": "CP-SAT search workers (1 is fastest on small models).",
    "solver.maxCandidateNodes": "Above this many candidate nodes, prune to the best domains.",
    "solver.keptFraction": "...or keep this share of the candidates, whichever is more.",
    "solver.relativeGap": "Stop within this fraction of optimal (large models only).",
    "solver.exactBelowNodes": "Models of at most this many nodes are solved to proven optimum.",
    "numaPolicy": "`single-numa-node`: a pod must fit one NUMA zone; `preferred`: try to; "
    "`none`: ignore NUMA.",
    "islandMinGpus": "A node with at least this many GPUs is an island worth keeping whole.",
    "localityWait": "Hold a gang (Retry) rather than split it across domains of `level`, "
    "while one domain could hold it. Off when absent.",
    "localityWait.level": "A topology level above the host.",
    "localityWait.maxWaitSeconds": "Longest hold; split after it.",
    "preemption": "Placement-level preemption, backfill and drain-to-fit; see "
    "docs/controller.md. Off unless `enabled`.",
    "preemption.enabled": "Turn preemption, backfill and drain-to-fit on.",
    "preemption.mayEvict": "Tier → the tiers it may evict, each ranked below it (tiers rank in "
    "the order listed). Unset: every lower tier.",
    "preemption.victims": "`borrowed`: only placements on a higher tier's hardware may be "
    "evicted; `any`: every placement of an evictable tier.",
    "preemption.maxVictimsPerGang": "Workloads evicted for one preemptor at most.",
    "preemption.minRunSeconds": "A Workload admitted less than this long ago is never evicted.",
    "preemption.maxLostGpuHours": "GPU-hours run so far by all victims of one preemption, at "
    "most. Unset: no limit.",
    "preemption.gracePeriodSeconds": "How long a preemptor waits for its victims' pods to go "
    "before it gives up (reservation released, Retry).",
    "preemption.backfill": "Keep a lower tier off a hardware class whose owning tier has a "
    "Workload waiting that the class's free GPUs could hold.",
    "preemption.drainAfterSeconds": "A multi-pod gang waiting this long gets a reservation of "
    "intent on the freest domain, held as the Workloads there finish; it gives way only to a "
    "higher tier with no other place. Unset: off.",
    "preemption.weights": "What evicting one Workload costs; the cheapest victim set wins.",
    "preemption.weights.victim": "Per Workload evicted (fewest victims first).",
    "preemption.weights.lostGpuHour": "Per GPU-hour a victim has run so far.",
    "preemption.weights.tier": "Per tier the victim ranks above the lowest.",
    "preemption.weights.priority": "Per point of the victim's priority (negative counts as 0).",
    "reservationTtlSeconds": "Seconds after Kueue admits the Workload (every check Ready) by "
    "which a pod of its reservation must be bound; else it is released and the gang retried.",
    "retryAfterSeconds": "Not read by the controller yet: its Retry delay is `nexus-admit run "
    "--retry-seconds`.",
    "gpuDeviceClasses": "Dynamic Resource Allocation DeviceClasses whose devices are whole "
    "GPUs: a pod's ResourceClaims on them are its GPUs (see [dra.md](dra.md)).",
}


def _schema() -> dict[str, Any]:
    return PlacementConfig.model_json_schema(by_alias=True)


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        return dict(defs[node["$ref"].rsplit("/", 1)[1]])
    for option in node.get("anyOf") or []:
        if option.get("type") != "null":
            return _resolve(option, defs)
    return node


def _walk(node: dict[str, Any], defs: dict[str, Any], prefix: str) -> list[tuple[str, Any]]:
    """(path, property schema) of every field, depth first, in the model's order."""
    out = []
    for name, prop in (node.get("properties") or {}).items():
        path = f"{prefix}{name}"
        out.append((path, prop))
        target = _resolve(prop, defs)
        if target.get("type") == "object" and "properties" in target:
            out += _walk(target, defs, f"{path}.")
        items = target.get("items")
        if target.get("type") == "array" and isinstance(items, dict):
            item = _resolve(items, defs)
            if "properties" in item:
                out += _walk(item, defs, f"{path}[].")
    return out


def field_paths() -> list[str]:
    schema = _schema()
    return [p for p, _ in _walk(schema, schema.get("$defs") or {}, "")]


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    target = _resolve(prop, defs)
    kind = target.get("type", "object")
    if kind == "array":
        item = _resolve(target.get("items") or {}, defs)
        return "list of objects" if "properties" in item else f"list of {item.get('type')}"
    if kind == "object" and "additionalProperties" in target and "properties" not in target:
        value = target["additionalProperties"]
        return f"map of {value.get('type', 'any') if isinstance(value, dict) else 'any'}"
    return str(kind)


def _bounds(prop: dict[str, Any]) -> str:
    for option in prop.get("anyOf") or []:  # an optional field: the bounds of its value
        if option.get("type") != "null":
            prop = {**option, **{k: v for k, v in prop.items() if k != "anyOf"}}
    parts = []
    for key, sign in (
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("maxProperties", "keys ≤"),
    ):
        if key in prop:
            parts.append(f"{sign} {prop[key]}")
    return ", ".join(parts)


def _default(path: str, defaults: dict[str, Any]) -> str:
    if "[]" in path:
        return ""
    node: Any = defaults
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return "absent"
        node = node[part]
    text = json.dumps(node, separators=(", ", ": "))
    return f"`{text}`" if len(text) <= 60 else "see below"


def render() -> str:
    schema = _schema()
    defs = schema.get("$defs") or {}
    defaults = PlacementConfig().to_spec()
    lines = [
        "# PlacementConfig reference",
        "",
        "<!-- Generated by `python -m nexus_admit.kube.config_reference` from the model in",
        "nexus_admit/model/config.py; tests/kube/test_config_reference.py keeps it current. -->",
        "",
        "The spec of a `PlacementConfig` (`scheduling.kubenexus.io/v1alpha1`, cluster-scoped).",
        "An AdmissionCheck names one in `spec.parameters`; every field may be omitted and then",
        "takes the default below. The controller reads changes from its watch; an invalid spec",
        "turns the AdmissionCheck `Active=False` with the reason. The CRD (generated from the",
        "same model) carries these bounds, and the cross-field rules as CEL (unique names,",
        "`defaultTier` one of the tiers, `classCosts` and `allowedClasses` naming known",
        "classes, not both",
        "`topologyName` and `levels`), so the apiserver refuses such a spec at `kubectl apply`.",
        "",
        "| field | type | bounds | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for path, prop in _walk(schema, defs, ""):
        meaning = MEANINGS.get(path, "**undocumented**")
        cells = (f"`{path}`", _type(prop, defs), _bounds(prop), _default(path, defaults), meaning)
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## The built-in default",
        "",
        "```yaml",
        *_yaml(defaults).rstrip("\n").splitlines(),
        "```",
        "",
    ]
    return "\n".join(lines)


def _yaml(spec: dict[str, Any]) -> str:
    import yaml

    return str(yaml.safe_dump(spec, sort_keys=False, default_flow_style=None, width=88))


def main() -> int:
    DOC.write_text(render())
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
