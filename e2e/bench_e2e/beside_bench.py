"""Offline: a burst's start, where the one-pod shapes waiting for quota are warmed while the
first gangs are decided, with and without warming beside their CP-SAT solves
(`CpSatEngine.work_beside_solves`). No cluster: the fleet and the store are
`snapshot_bench.py`'s.

Each round decides one gang of the load benchmark (`--gang`, its pods bound afterwards) and
then warms for at most 50 ms as a pass does after its decisions (at least one shape when
one is due); with `--modes beside`, the shapes are also warmed beside each solve, stopped
when it is done. `--shapes` one-pod shapes (1, 2, 4 and 8 GPUs at 4 and then 2 CPUs per
GPU) wait from the start. Reported per mode: the gangs' decision times, when every shape
was warm (seconds since the first gang's decision started), and how many were warmed
beside; then each shape's first decision (whether it derived its facts over the fleet).
The gangs' placements must be the same in both modes.

    python e2e/bench_e2e/beside_bench.py --nodes 1000 5000 --out docs/data/beside.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_e2e import snapshot_bench as sb
from nexus_admit.bench.fleet import bench_config, bench_gang
from nexus_admit.kube.cluster.live import LiveSnapshot
from nexus_admit.model import ClusterSnapshot, Gang
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.sequence import OrderedPlacer

AFTER_BUDGET_SECONDS = 0.05  # controller/warm.py BUDGET_SECONDS


def one_pod_shapes(count: int) -> list[Gang]:
    base = bench_gang(1)
    ps = base.pod_sets[0]
    out = []
    for i in range(count):
        gpus, cpus = (1, 2, 4, 8)[i % 4], 4 if i < 4 else 2
        out.append(replace(base, name=f"bench/one-{gpus}g-{cpus}c", pod_sets=(replace(
            ps, gpus=gpus, cpu_milli=1000 * cpus * gpus, memory_mib=16384 * gpus),)))
    return out


def run(feed: sb.Feed, mode: str, gangs: int, shape: tuple[int, int],
        shapes: list[Gang]) -> dict[str, Any]:
    engine, config = CpSatEngine(seed=0), bench_config()
    live = LiveSnapshot(feed.store.subscribe())
    to_warm = list(shapes)
    beside_count = 0
    gang_s: list[float] = []
    placed: list[tuple[str, tuple[int, ...]]] = []
    started = all_warm = 0.0

    def warm(snapshot: ClusterSnapshot, go_on: Any) -> int:
        warmed = 0
        while to_warm and go_on():
            engine.warm(snapshot, to_warm.pop(0), config)
            warmed += 1
        return warmed

    for i in range(gangs):
        snapshot = live.build(live.gather(feed.store, now=sb.NOW), [])
        if mode == "beside":
            def beside(done: threading.Event, snapshot: ClusterSnapshot = snapshot) -> None:
                nonlocal beside_count
                beside_count += warm(snapshot, lambda: not done.is_set())
            engine.work_beside_solves(beside)
        t = time.perf_counter()
        started = started or t
        placement = OrderedPlacer(engine, snapshot).place(
            replace(sb.load_gang(*shape), name=f"bench/gang-{i}"), config)
        gang_s.append(time.perf_counter() - t)
        engine.work_beside_solves(None)
        after = time.perf_counter()
        warm(snapshot, lambda after=after: time.perf_counter() - after < AFTER_BUDGET_SECONDS)
        if not to_warm and not all_warm:
            all_warm = time.perf_counter() - started
        for j, slot in enumerate(placement.slots):
            placed.append((slot.node, slot.gpu_indices))
            feed.put("Pod", sb.pod(f"{mode}-gang-{i}-{j}", slot.node, len(slot.gpu_indices)))
    snapshot = live.build(live.gather(feed.store, now=sb.NOW), [])
    firsts = []
    for gang in shapes:  # each shape's first decision, on the fleet after the gangs
        t = time.perf_counter()
        p = OrderedPlacer(engine, snapshot).place(gang, config)
        firsts.append({"shape": gang.name, "ms": round((time.perf_counter() - t) * 1000, 2),
                       "fleet_scan": p.fleet_scan})
    return {
        "gang_decision_ms": {"p50": round(statistics.median(gang_s) * 1000, 1),
                             "max": round(max(gang_s) * 1000, 1),
                             "sum": round(sum(gang_s) * 1000, 1)},
        "all_shapes_warm_s": round(all_warm, 3) if all_warm else None,
        "shapes_left_cold": len(to_warm),
        "warmed_beside": beside_count,
        "one_pod_first_decisions": firsts,
        "placed": placed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--gangs", type=int, default=8)
    ap.add_argument("--gang", default="8x1", help="PODSxGPUS of the gangs decided")
    ap.add_argument("--shapes", type=int, default=8, help="one-pod shapes waiting (≤ 8)")
    ap.add_argument("--modes", nargs="+", choices=("after", "beside"),
                    default=["after", "beside"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    pods, _, gpus = args.gang.partition("x")
    shape = (int(pods), int(gpus))
    results = []
    for n in args.nodes:
        row: dict[str, Any] = {"nodes": n}
        for mode in args.modes:
            feed = sb.fleet(n, 4, 10, args.seed, vary=True)
            row[mode] = run(feed, mode, args.gangs, shape, one_pod_shapes(args.shapes))
            r = row[mode]
            fleet = [f["ms"] for f in r["one_pod_first_decisions"] if f["fleet_scan"]]
            print(f"{n:>5} nodes {mode:>6}: {args.gang} decision p50/max "
                  f"{r['gang_decision_ms']['p50']}/{r['gang_decision_ms']['max']} ms, all "
                  f"{args.shapes} shapes warm at {r['all_shapes_warm_s']} s "
                  f"({r['warmed_beside']} beside, {r['shapes_left_cold']} left cold); "
                  f"one-pod first decisions over the fleet: {len(fleet)} {fleet}", flush=True)
        placements = [row[m].pop("placed") for m in args.modes]
        row["same_placements"] = all(p == placements[0] for p in placements)
        print(f"{n:>5} nodes: same gang placements {row['same_placements']}", flush=True)
        results.append(row)
    report = {
        "what": "a burst's start: one-pod shapes warmed while gangs are decided, after each "
                "decision (50 ms) or also beside each CP-SAT solve",
        "gang": args.gang, "gangs": args.gangs, "shapes": args.shapes,
        "machine": sb.machine(),
        "results": results,
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
