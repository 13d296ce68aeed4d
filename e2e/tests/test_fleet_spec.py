"""The declarative fleet expands consistently (no cluster needed)."""

from __future__ import annotations

import fleet


def test_fleet_expansion_is_consistent():
    spec = fleet.load()
    nodes = fleet.nodes(spec)
    nrts = {o["metadata"]["name"]: o for o in fleet.node_resource_topologies(spec)}
    names = [n["metadata"]["name"] for n in nodes]
    assert len(names) == len(set(names)) == 66
    assert fleet.summary(spec) == {
        "h100": {"nodes": 32, "gpus": 256},
        "a100": {"nodes": 16, "gpus": 128},
        "l40s": {"nodes": 16, "gpus": 64},
        "cpu": {"nodes": 2, "gpus": 0},
    }
    cpu_nodes = [n for n in nodes if n["metadata"]["name"].startswith("cpu-")]
    assert all("nvidia.com/gpu" not in n["status"]["allocatable"] for n in cpu_nodes)
    assert all("nvidia.com/gpu.present" not in n["metadata"]["labels"] for n in cpu_nodes)
    nodes = [n for n in nodes if n not in cpu_nodes]
    for n in nodes:
        labels, alloc = n["metadata"]["labels"], n["status"]["allocatable"]
        assert labels["nvidia.com/gpu.count"] == alloc["nvidia.com/gpu"]
        assert labels["kubernetes.io/hostname"] == n["metadata"]["name"]
        assert n["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
        zones = nrts[n["metadata"]["name"]]["zones"]
        assert len(zones) == 2
        gpus = sum(
            int(r["allocatable"])
            for z in zones
            for r in z["resources"]
            if r["name"] == "nvidia.com/gpu"
        )
        cpus = sum(
            int(r["allocatable"]) for z in zones for r in z["resources"] if r["name"] == "cpu"
        )
        assert gpus == int(alloc["nvidia.com/gpu"])
        assert cpus == int(alloc["cpu"])
    # H100 racks are NVLink cliques (one per rack); the other pools have none
    cliques = {
        n["metadata"]["labels"].get("nvidia.com/gpu.clique")
        for n in nodes
        if n["metadata"]["name"].startswith("h100-")
    }
    assert len(cliques) == 4 and None not in cliques
    assert all(
        "nvidia.com/gpu.clique" not in n["metadata"]["labels"]
        for n in nodes
        if not n["metadata"]["name"].startswith("h100-")
    )
