"""Offline: what one pass's snapshot and one one-pod decision cost, rebuilt from the whole
store (`ClusterDump.snapshot`, as every pass did before) against kept from its changes
(`kube/cluster/live.py`), at several fleet sizes. No cluster: the controller's store is fed
the objects the watches would bring.

The fleet is the load benchmark's (`e2e/fleet.py`, `scaled`, with its NodeResourceTopologies),
with `--pods-per-node` bound one-GPU pods on every node and one reservation (two slots, not
bound yet) per `--nodes-per-reservation` nodes. Each pass is what a burst's pass is: the
one-pod Workload placed by the pass before binds its pod on the node it was given (one
change), then the pass builds its snapshot and places the next one-pod Workload with the
engine (`bench_gang(1)`), which holds its slot on the snapshot as the controller's placer does.
The first pass of each tier is not counted in the percentiles; its decision alone (the
engine's facts derived over the fleet) is reported apart, as `first_decisions_ms`.

    python e2e/bench_e2e/snapshot_bench.py --nodes 100 1000 5000 --passes 50 \\
        --out docs/data/snapshot-live.json

`--gang 8x1` places a gang of the load benchmark instead (8 pods of 1 GPU, no topology
asked: the decision prunes the fleet's domains), its pods bound after each pass.
`--tiers gold bronze` places the passes' Workloads in those tiers in turn, and
`--vary-pods` draws each node's bound pods from 0 to twice `--pods-per-node`, so that the
nodes' free CPU and memory differ as under the load benchmark's background pods (most
nodes a symmetry class of their own); `--modes live` skips the full rebuilds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleet as fleet_mod

from nexus_admit.bench.fleet import bench_config, bench_gang
from nexus_admit.controller.store import Store
from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.live import LiveSnapshot
from nexus_admit.model import ClusterSnapshot, Gang, PodSet
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.sequence import OrderedPlacer
from nexus_admit.placement.tracking import TrackedSnapshot

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
RR = L.KIND_RESOURCE_RESERVATION


class Feed:
    """The store as the watches fill it: every object with a uid and a resourceVersion."""

    def __init__(self) -> None:
        self.store = Store()
        self.versions = itertools.count(1)

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        rv = next(self.versions)
        obj["kind"] = kind
        m = obj["metadata"]
        m.setdefault("uid", f"{kind}-{m.get('namespace', '')}-{m['name']}-{rv}")
        m["resourceVersion"] = str(rv)
        self.store.upsert(kind, obj)


def pod(name: str, node: str, gpus: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "bench", "labels": {}, "annotations": {}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {
            "requests": {"cpu": "4", "memory": "16Gi"},
            "limits": {L.GPU_RESOURCE: str(gpus)}}}]},
        "status": {"phase": "Running"},
    }


def reservation(name: str, nodes: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": L.GROUP_VERSION,
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {
            "workloadRef": {"name": name, "namespace": "bench"},
            "expiresAt": (NOW + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "podSets": [{"name": "main", "requests": {"cpu": "8", "memory": "32Gi"},
                         "slots": [{"index": i, "node": n, "gpus": [7]}
                                   for i, n in enumerate(nodes)]}],
        },
        "status": {"phase": "Reserved"},
    }


def fleet(
    nodes: int, pods_per_node: int, nodes_per_reservation: int, seed: int, vary: bool = False
) -> Feed:
    rng = random.Random(seed)
    spec = fleet_mod.scaled(fleet_mod.load(), nodes)
    feed = Feed()
    names = []
    for n in fleet_mod.nodes(spec):
        feed.put("Node", n)
        names.append(n["metadata"]["name"])
    for t in fleet_mod.node_resource_topologies(spec):
        feed.put("NodeResourceTopology", t)
    for name in names:
        for i in range(rng.randint(0, 2 * pods_per_node) if vary else pods_per_node):
            feed.put("Pod", pod(f"{name}-p{i}", name))
    for i in range(max(1, len(names) // nodes_per_reservation)):
        feed.put(RR, reservation(f"rr-{i}", rng.sample(names, 2)))
    return feed


def machine() -> dict[str, Any]:
    """What a report says of the machine it ran on."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "load_average_1m": round(os.getloadavg()[0], 2)}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


def load_gang(pods: int, gpus: int) -> Gang:
    """An Indexed Job of the load benchmark (`workloads.py`): `pods` pods of `gpus` GPUs,
    4 CPUs and 16 GiB per GPU, no topology asked."""
    ps = PodSet("main", pods, cpu_milli=4000 * gpus, memory_mib=16384 * gpus, gpus=gpus,
                indexed=True)
    return replace(bench_gang(8), name=f"bench/load-{pods}x{gpus}", pod_sets=(ps,),
                   preferred_level=None)


def run(
    mode: str, feed: Feed, passes: int, tiers: list[str] | None = None,
    shape: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """`passes` passes of one mode; the first (cold) is not counted. With `tiers`, pass i
    places its Workload in tiers[i % len(tiers)], and each tier's first pass is the cold
    one. `shape`: (pods, GPUs per pod) of a `load_gang` placed instead of the one-pod one."""
    engine = CpSatEngine(seed=0)
    config, placed_gang = bench_config(), bench_gang(1) if shape is None else load_gang(*shape)
    live = LiveSnapshot(feed.store.subscribe())
    build: Callable[[], ClusterSnapshot]
    if mode == "full":
        def build() -> ClusterSnapshot:
            snap = feed.store.dump().snapshot(now=NOW, skipped=[])
            return TrackedSnapshot(snap.nodes, snap.kueue_topologies)
    else:
        def build() -> ClusterSnapshot:
            return live.build(live.gather(feed.store, now=NOW), [])
    snapshot_s: list[float] = []
    decision_s: list[float] = []
    first_s: list[float] = []  # each cold pass's decision alone (its snapshot apart)
    placed: list[tuple[str, tuple[int, ...]]] = []
    cold = len(tiers) if tiers else 1
    for i in range(passes + cold):
        started = time.perf_counter()
        snapshot = build()
        built = time.perf_counter()
        gang = replace(placed_gang, tier=tiers[i % len(tiers)]) if tiers else placed_gang
        placement = OrderedPlacer(engine, snapshot).place(gang, config)
        done = time.perf_counter()
        if i >= cold:
            snapshot_s.append(built - started)
            decision_s.append(done - started)
        else:
            first_s.append(done - built)
        if placement.feasible:  # its pods bind before the next pass: the changes
            for j, slot in enumerate(placement.slots):
                placed.append((slot.node, slot.gpu_indices))
                feed.put("Pod", pod(f"{mode}-placed-{i}-{j}", slot.node, len(slot.gpu_indices)))
    return {
        "snapshot_ms": {"p50": pct(snapshot_s, 0.5), "p99": pct(snapshot_s, 0.99),
                        "mean": round(statistics.fmean(snapshot_s) * 1000, 2)},
        "decision_ms": {"p50": pct(decision_s, 0.5), "p99": pct(decision_s, 0.99),
                        "mean": round(statistics.fmean(decision_s) * 1000, 2)},
        # the first decision of each tier: the tracker built, or a tier's first ranking
        "first_decisions_ms": [round(t * 1000, 2) for t in first_s],
        "placed": placed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[100, 1000, 5000])
    ap.add_argument("--passes", type=int, default=50)
    ap.add_argument("--pods-per-node", type=int, default=4)
    ap.add_argument("--nodes-per-reservation", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiers", nargs="+", help="the Workloads' tiers, in turn")
    ap.add_argument("--gang", help="PODSxGPUS: the gang each pass places (default: one pod)")
    ap.add_argument("--vary-pods", action="store_true",
                    help="0 to 2× --pods-per-node bound pods per node, drawn per node")
    ap.add_argument("--modes", nargs="+", choices=("full", "live"), default=["full", "live"])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    shape: tuple[int, int] | None = None
    if args.gang:
        pods, _, gpus = args.gang.partition("x")
        if not (pods.isdigit() and gpus.isdigit()):
            ap.error("--gang: PODSxGPUS, e.g. 8x1")
        shape = (int(pods), int(gpus))
    results = []
    for n in args.nodes:
        row: dict[str, Any] = {}
        for mode in args.modes:
            feed = fleet(n, args.pods_per_node, args.nodes_per_reservation, args.seed,
                         args.vary_pods)
            row[mode] = run(mode, feed, args.passes, args.tiers, shape)
            row[f"{mode}_placements"] = row[mode].pop("placed")
            row["nodes"] = len(feed.store.by_key("Node"))
            row["pods"] = len(feed.store.by_key("Pod"))
            row["reservations"] = len(feed.store.by_key(RR))
        # the same Workloads on the same fleet: the live snapshot must place them alike
        row["placed"] = len(row[f"{args.modes[0]}_placements"])
        placements = [row.pop(f"{mode}_placements") for mode in args.modes]
        if len(placements) == 2:
            row["same_placements"] = placements[0] == placements[1]
        results.append(row)
        cells = " | ".join(
            f"{mode}: snapshot p50/p99 ms {row[mode]['snapshot_ms']['p50']}/"
            f"{row[mode]['snapshot_ms']['p99']}, {args.gang or '1-pod'} decision p50/p99 ms "
            f"{row[mode]['decision_ms']['p50']}/{row[mode]['decision_ms']['p99']}, "
            f"first decisions ms {row[mode]['first_decisions_ms']}"
            for mode in args.modes
        )
        print(f"{row['nodes']:>5} nodes {row['pods']:>6} pods | {cells} | same placements "
              f"{row.get('same_placements', '-')}", flush=True)
    report = {
        "what": "one pass's snapshot and a decision (snapshot + engine), full rebuild vs live "
                "snapshot, after the pods of the pass before bound",
        "passes": args.passes, "gang": args.gang, "pods_per_node": args.pods_per_node,
        "vary_pods": args.vary_pods, "tiers": args.tiers,
        "nodes_per_reservation": args.nodes_per_reservation,
        "machine": machine(),
        "results": results,
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
