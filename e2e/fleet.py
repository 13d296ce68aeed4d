"""Expand the declarative fake GPU fleet (e2e/fleet.yaml) into Kubernetes objects.

`nodes(spec)` returns KWOK-managed Node manifests, `node_resource_topologies(spec)` the
matching NodeResourceTopology (topology.node.k8s.io/v1alpha2) objects: every node has
`numaZones` NUMA zones that split its GPUs, CPUs and memory evenly.

Run `python3 e2e/fleet.py [fleet.yaml]` to print the generated objects as YAML.
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

FLEET_FILE = Path(__file__).resolve().parent / "fleet.yaml"

GPU_RESOURCE = "nvidia.com/gpu"
_CLIQUE_NAMESPACE = uuid.UUID("5b0e3c4e-7f2a-4d59-9a8e-6e2d0c1f4a10")


@dataclass(frozen=True)
class FakeNode:
    name: str
    pool: str
    rack: str
    block: str
    zone: str
    labels: dict[str, str]
    annotations: dict[str, str]
    allocatable: dict[str, str]
    numa_zones: int
    gpus: int


def load(path: str | Path = FLEET_FILE) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def expand(spec: dict[str, Any]) -> list[FakeNode]:
    """One FakeNode per node of every pool, in a stable order."""
    topo = spec["topologyLabels"]
    out: list[FakeNode] = []
    for pool in spec["pools"]:
        gpu = pool.get("gpu")  # a CPU pool has none
        for r in range(int(pool["racks"])):
            rack = f"{pool['name']}-r{r}"
            block = f"{pool['name']}-b{r // int(pool.get('racksPerBlock', 1))}"
            clique = None
            if gpu and gpu.get("clique") == "per-rack":
                cluster_uuid = uuid.uuid5(_CLIQUE_NAMESPACE, f"{pool['name']}-fabric")
                clique = f"{cluster_uuid}.{r + 1}"
            for i in range(int(pool["nodesPerRack"])):
                name = f"{rack}-{i}"
                labels = dict(spec.get("commonLabels", {}))
                labels.update(
                    {
                        topo["zone"]: pool["zone"],
                        topo["block"]: block,
                        topo["rack"]: rack,
                        topo["host"]: name,
                        "scheduling.kubenexus.io/e2e-pool": pool["name"],
                    }
                )
                if gpu:
                    labels.update(
                        {
                            "nvidia.com/gpu.present": "true",
                            "nvidia.com/gpu.product": gpu["product"],
                            "nvidia.com/gpu.family": gpu["family"],
                            "nvidia.com/gpu.count": str(gpu["count"]),
                            "nvidia.com/gpu.memory": str(gpu["memoryMiB"]),
                        }
                    )
                if clique:
                    labels["nvidia.com/gpu.clique"] = clique
                allocatable = {k: str(v) for k, v in pool["allocatable"].items()}
                if gpu:
                    allocatable[GPU_RESOURCE] = str(gpu["count"])
                out.append(
                    FakeNode(
                        name=name,
                        pool=pool["name"],
                        rack=rack,
                        block=block,
                        zone=pool["zone"],
                        labels=labels,
                        annotations=dict(spec.get("kwokAnnotation", {})),
                        allocatable=allocatable,
                        numa_zones=int(pool.get("numaZones", 1)),
                        gpus=int(gpu["count"]) if gpu else 0,
                    )
                )
    return out


def node_manifest(n: FakeNode) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": n.name, "labels": n.labels, "annotations": n.annotations},
        "spec": {},
        # KWOK's node-initialize stage keeps capacity/allocatable from the created object.
        "status": {"capacity": dict(n.allocatable), "allocatable": dict(n.allocatable)},
    }


def _split(quantity: str, parts: int) -> str:
    """Split a cpu count or a memory quantity evenly (exact for the fleet's round numbers)."""
    units = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4}
    for suffix, power in units.items():
        if quantity.endswith(suffix):
            kib = int(quantity[: -len(suffix)]) * 1024 ** (power - 1)
            return f"{kib // parts}Ki"
    return str(int(quantity) // parts)


def nrt_manifest(n: FakeNode) -> dict[str, Any]:
    zones = []
    for z in range(n.numa_zones):
        resources = []
        for res in ("cpu", "memory", GPU_RESOURCE):
            if res not in n.allocatable:
                continue  # a CPU node has no GPUs to split
            q = _split(n.allocatable[res], n.numa_zones)
            resources.append({"name": res, "capacity": q, "allocatable": q, "available": q})
        zones.append(
            {
                "name": f"node-{z}",
                "type": "Node",
                "costs": [
                    {"name": f"node-{o}", "value": 10 if o == z else 20}
                    for o in range(n.numa_zones)
                ],
                "resources": resources,
            }
        )
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": n.name, "labels": {"scheduling.kubenexus.io/e2e-pool": n.pool}},
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "container"},
        ],
        "zones": zones,
    }


def nodes(spec: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [node_manifest(n) for n in expand(spec or load())]


def node_resource_topologies(spec: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [nrt_manifest(n) for n in expand(spec or load())]


def scaled(spec: dict[str, Any], total_nodes: int) -> dict[str, Any]:
    """The same fleet with about `total_nodes` nodes: every pool keeps its share of the
    nodes, its rack size and its racks per block; only the number of racks changes (the
    load benchmark's 1,000-node fleet is fleet.yaml at a larger size). Only the GPU pools:
    the CPU nodes the tests keep for GPU-less drivers are not part of the benchmark's fleet."""
    pools = [p for p in spec["pools"] if p.get("gpu")]
    base = [int(p["racks"]) * int(p["nodesPerRack"]) for p in pools]
    want = [total_nodes * b / sum(base) for b in base]
    # whole racks, largest remainders first, so the total lands as close as racks allow
    racks = [max(1, int(w // int(p["nodesPerRack"]))) for w, p in zip(want, pools, strict=True)]
    by_remainder = sorted(
        range(len(pools)),
        key=lambda i: want[i] - racks[i] * int(pools[i]["nodesPerRack"]),
        reverse=True,
    )
    for i in by_remainder:
        have = sum(r * int(p["nodesPerRack"]) for r, p in zip(racks, pools, strict=True))
        if have + int(pools[i]["nodesPerRack"]) <= total_nodes:
            racks[i] += 1
    out = dict(spec)
    out["pools"] = [{**p, "racks": r} for p, r in zip(pools, racks, strict=True)]
    return out


def summary(spec: dict[str, Any] | None = None) -> dict[str, dict[str, int]]:
    """{pool: {"nodes": n, "gpus": g}} — handy for test assertions."""
    out: dict[str, dict[str, int]] = {}
    for n in expand(spec or load()):
        s = out.setdefault(n.pool, {"nodes": 0, "gpus": 0})
        s["nodes"] += 1
        s["gpus"] += n.gpus
    return out


if __name__ == "__main__":
    spec = load(sys.argv[1] if len(sys.argv) > 1 else FLEET_FILE)
    yaml.safe_dump_all(nodes(spec) + node_resource_topologies(spec), sys.stdout, sort_keys=False)
