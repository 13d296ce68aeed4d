"""Bursts placed one by one and jointly, side by side (placement/batch.py): the replay's
cluster filled part way by the replay's own jobs, then bursts of K jobs arriving at once,
each placed one by one in Kueue's order and then through `BatchEngine.place_burst` on the
same snapshot. Measures what the joint solve changes per burst (gangs placed, objective,
every term) and what it costs (seconds), without the replay's timing, which seldom has
several gangs waiting in one cycle (docs/simulator.md).

    python -m nexus_admit.sim.burst_study --seeds 1-10 --fill 0.7 --out FILE.json

(docs/simulator.md reads its summaries, kept in docs/data/batch-replay.json.)
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from nexus_admit.model import ClusterSnapshot, Gang, apply_slots
from nexus_admit.placement.batch import BatchEngine, BurstEntry
from nexus_admit.placement.sequence import OrderedPlacer
from nexus_admit.sim.openb import DEFAULT_DATA
from nexus_admit.sim.replay_model import (
    PRIORITY,
    ReplayScenario,
    build_cluster,
    generate_jobs,
    replay_config,
)

__all__ = ["burst_trials", "main"]


def burst_trials(seed: int, sizes: Sequence[int], fill: float, trials: int,
                 data: Path = DEFAULT_DATA, mix: tuple[float, float, float] | None = None,
                 each_gang: bool = True) -> list[dict[str, Any]]:
    """For one seed: fill the cluster to `fill` of its GPUs with the replay's jobs (one by
    one, nexus), then `trials` bursts of each size from the jobs left, each on that same
    snapshot. `mix`: the replay's (training, inference, fractional) shares; `each_gang`:
    see `BatchEngine`."""
    scn = ReplayScenario(seed=seed)
    if mix is not None:
        scn = replace(scn, mix=mix)
    snap = ClusterSnapshot.of(build_cluster(scn, data))
    jobs = generate_jobs(scn, snap.total_gpus)
    config = replay_config(scn)
    engine = BatchEngine(seed, each_gang=each_gang)
    rng = random.Random(seed)
    order = list(range(len(jobs)))
    rng.shuffle(order)
    placer = OrderedPlacer(engine, snap)
    used, target = 0.0, fill * snap.total_gpus * 1000
    rest: list[int] = []
    for i in order:
        if used < target and placer.place(jobs[i].gang(), config).feasible:
            used += jobs[i].gpu_milli_total
        else:
            rest.append(i)
    out = []
    for size in sizes:
        for trial in range(trials):
            picked = rng.sample(rest, min(size, len(rest)))
            picked.sort(key=lambda i: (-PRIORITY[jobs[i].tier], jobs[i].arrival))
            burst = [jobs[i].gang() for i in picked]
            out.append({"seed": seed, "size": size, "trial": trial,
                        **_one_burst(engine, snap, burst, config)})
    return out


def _one_burst(engine: BatchEngine, snap: ClusterSnapshot, burst: list[Gang],
               config: Any) -> dict[str, Any]:
    started = time.perf_counter()
    placer = OrderedPlacer(engine, snap.copy())
    entries = [BurstEntry(g, placer.place(g, config)) for g in burst]
    alone_seconds = time.perf_counter() - started
    outcome = engine.place_burst(snap, entries, config)
    check = snap.copy()  # never double-booked: every answer applies on one snapshot
    for gang, placement in zip(burst, outcome.placements, strict=True):
        if placement.feasible:
            apply_slots(check, gang, placement.slots)
    assert all(min(n.gpu_free, default=0) >= 0 for n in check)
    return {
        "gangs": len(burst), "in_model": outcome.gangs, "joint": outcome.joint,
        "reason": outcome.reason, "placed_one_by_one": outcome.placed_one_by_one,
        "placed_jointly": outcome.placed_jointly,
        "objective_one_by_one": round(outcome.objective_one_by_one, 3),
        "objective_joint": (round(outcome.objective_joint, 3)
                            if outcome.objective_joint is not None else None),
        "terms_one_by_one": outcome.terms_one_by_one, "terms_joint": outcome.terms_joint,
        "seconds_one_by_one": round(alone_seconds, 4),
        "seconds_joint": round(outcome.solve_seconds, 4),
    }


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per burst size: bursts, joint taken, gangs placed one by one / jointly, the mean
    objective change where taken, and the solve seconds (mean, max)."""
    out: dict[str, dict[str, float]] = {}
    for size in sorted({r["size"] for r in rows}):
        of = [r for r in rows if r["size"] == size]
        taken = [r for r in of if r["joint"]]
        out[str(size)] = {
            "bursts": len(of),
            "joint_models": sum(1 for r in of if r["in_model"]),
            "joint_taken": len(taken),
            "more_placed": sum(1 for r in taken if r["placed_jointly"] > r["placed_one_by_one"]),
            "lower_objective_only": sum(1 for r in taken
                                        if r["placed_jointly"] == r["placed_one_by_one"]),
            "placed_one_by_one": sum(r["placed_one_by_one"] for r in of),
            "placed_jointly": sum(r["placed_jointly"] if r["joint"] else r["placed_one_by_one"]
                                  for r in of),
            "objective_drop_where_taken": round(sum(
                r["objective_one_by_one"] - r["objective_joint"] for r in taken
                if r["placed_jointly"] == r["placed_one_by_one"]), 3),
            "seconds_one_by_one_mean": round(sum(r["seconds_one_by_one"] for r in of)
                                             / len(of), 4),
            "seconds_joint_mean": round(sum(r["seconds_joint"] for r in of) / len(of), 4),
            "seconds_joint_max": max(r["seconds_joint"] for r in of),
        }
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1-10")
    parser.add_argument("--sizes", default="2,4,8")
    parser.add_argument("--fill", type=float, default=0.7)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--mix", default="", help="training,inference,fractional shares")
    parser.add_argument("--burst-total", action="store_true",
                        help="bound only the burst's total objective, not each gang's")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    first, _, last = args.seeds.partition("-")
    sizes = [int(s) for s in args.sizes.split(",")]
    shares = [float(m) for m in args.mix.split(",")] if args.mix else []
    mix = (shares[0], shares[1], shares[2]) if shares else None
    rows = [r for seed in range(int(first), int(last or first) + 1)
            for r in burst_trials(seed, sizes, args.fill, args.trials, mix=mix,
                                  each_gang=not args.burst_total)]
    result = {"command": f"python -m nexus_admit.sim.burst_study --seeds {args.seeds} "
                         f"--sizes {args.sizes} --fill {args.fill} --trials {args.trials}"
                         + (f" --mix {args.mix}" if args.mix else "")
                         + (" --burst-total" if args.burst_total else ""),
              "summary": summary(rows), "bursts": rows}
    print(json.dumps(result["summary"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
