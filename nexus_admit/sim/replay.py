"""The multi-tenant heterogeneous gang replay: the scenario and its model
(`replay_model`), one run (`replay_run`, every placement decided by `placement.decide`),
and here many runs over seeds and policies, compared seed by seed."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nexus_admit.sim.openb import DEFAULT_DATA
from nexus_admit.sim.replay_model import (
    AGG_LABEL,
    FABRIC,
    MODEL_NOTES,
    POOLS,
    REPLAY_GANG_SPLIT,
    REPLAY_LOCALITY_WAIT_SECONDS,
    REPLAY_VRAM_STRANDED,
    TIERS,
    TOR_LABEL,
    WAIT_REASONS,
    Drains,
    Job,
    ReplayResult,
    ReplayScenario,
    build_cluster,
    generate_jobs,
    load_fabric,
    may_preempt,
    preemption_mode,
    quota_room,
    replay_config,
    spread_factor,
)
from nexus_admit.sim.replay_run import run_replay
from nexus_admit.sim.stats import paired_difference, verdict

__all__ = [
    "AGG_LABEL",
    "FABRIC",
    "MODEL_NOTES",
    "POOLS",
    "REPLAY_GANG_SPLIT",
    "REPLAY_LOCALITY_WAIT_SECONDS",
    "REPLAY_VRAM_STRANDED",
    "TIERS",
    "TOR_LABEL",
    "WAIT_REASONS",
    "Drains",
    "Job",
    "ReplayResult",
    "ReplayScenario",
    "build_cluster",
    "compare",
    "generate_jobs",
    "load_fabric",
    "may_preempt",
    "preemption_mode",
    "quota_room",
    "replay_config",
    "run_replay",
    "run_replays",
    "spread_factor",
    "standing",
]


# ---------------------------------------------------------------- many runs, summary

# metric -> True when higher is better
METRICS: dict[str, bool] = {
    "effective_throughput": True,
    "gpu_allocation": True,
    "cost_per_effective_gpu_hour": False,
    "tier_mismatch_gpu_hours": False,
    "stranded_vram_gib_hours": False,
    "pristine_islands_mean": True,
    "one_tor_share": True,
    "one_agg_share": True,
    "pending_at_end": False,
    "lost_gpu_hours": False,
}


def delay_metrics(r: ReplayResult) -> dict[str, float]:
    out = {}
    for group, st in r.delay.items():
        if group == "all":
            continue
        out[f"delay_mean[{group}]"] = st["mean"]
        out[f"delay_p95[{group}]"] = st["p95"]
    return out


def _metric_values(r: ReplayResult) -> dict[str, float]:
    v = {m: float(getattr(r, m)) for m in METRICS}
    v.update(delay_metrics(r))
    return v


def compare(results: Sequence[ReplayResult], ours: str = "nexus",
            reference: str = "default", *, across_seeds: bool = False) -> list[dict[str, Any]]:
    """Per scenario/seed: for every metric, each policy's value, the best policy, whether
    `ours` is best (ties count), and ratios to the kube `reference` policy. With
    `across_seeds`, per scenario on the mean over its seeds (rows carry seed -1): one
    lucky or unlucky seed weighs less, since one early choice changes the whole replay.
    Those rows also carry, for every other policy, the paired per-seed difference of
    `ours` against it with its 95 % interval and a verdict (see `verdict`)."""
    runs: dict[tuple[str, int], dict[str, dict[int, dict[str, float]]]] = defaultdict(
        lambda: defaultdict(dict))
    for r in results:
        runs[(r.scenario, -1 if across_seeds else r.seed)][r.policy][r.seed] = \
            _metric_values(r)
    rows = []
    for (scenario, seed), by_policy in sorted(runs.items()):
        values: dict[str, dict[str, float]] = {}
        for p, per_seed in by_policy.items():
            per_run = list(per_seed.values())
            names = set(per_run[0]).intersection(*per_run[1:])
            values[p] = {m: round(float(np.mean([v[m] for v in per_run])), 3) for m in names}
        metric_names = sorted({m for v in values.values() for m in v})
        for m in metric_names:
            higher = METRICS.get(m, False)
            vals = {p: v[m] for p, v in values.items() if m in v}
            best = max(vals.values()) if higher else min(vals.values())
            winners = sorted(p for p, x in vals.items() if x == best)
            row: dict[str, Any] = {
                "scenario": scenario, "seed": seed, "metric": m,
                "higher_is_better": higher, "values": vals, "best": winners,
                "ours_best": ours in winners,
                "vs_reference": (round(vals[ours] / vals[reference], 3)
                                 if ours in vals and reference in vals and vals[reference]
                                 else None),
            }
            if across_seeds and ours in vals:
                row["paired"] = {}
                mine = by_policy[ours]
                for p in vals:
                    if p == ours:
                        continue
                    seeds = sorted(set(mine) & set(by_policy[p]))
                    diff = paired_difference([mine[s][m] for s in seeds],
                                             [by_policy[p][s][m] for s in seeds], higher)
                    row["paired"][p] = {**diff, "seeds": len(seeds), "verdict": verdict(diff)}
            rows.append(row)
    return rows


def standing(row: dict[str, Any]) -> str:
    """One metric's across-seeds verdict for `ours` against all the others: 'ahead of all'
    (every interval excludes 0 in its favour), 'behind' (some policy is ahead with an
    interval excluding 0), otherwise 'within noise' of the best of the others."""
    verdicts = [v["verdict"] for v in row.get("paired", {}).values()]
    if not verdicts:
        return "n/a"
    if "behind" in verdicts:
        return "behind"
    if all(v in ("ahead", "tie") for v in verdicts) and "ahead" in verdicts:
        return "ahead of all"
    if all(v == "tie" for v in verdicts):
        return "tie"
    return "within noise"


def _replay_one(args: tuple[str, ReplayScenario, str]) -> ReplayResult:
    policy, scn, data = args
    return run_replay(policy, scn, Path(data))


def run_replays(
    policies: Sequence[str],
    scenarios: Sequence[ReplayScenario],
    data: Path = DEFAULT_DATA,
    workers: int = 2,
    on_progress: Callable[[int, int, ReplayResult], None] | None = None,
) -> list[ReplayResult]:
    from concurrent.futures import ProcessPoolExecutor, as_completed

    tasks = [(p, s, str(data)) for s in scenarios for p in policies]
    tasks.sort(key=lambda t: t[0] != "nexus")
    out: list[ReplayResult] = []
    if workers <= 1:
        for t in tasks:
            out.append(_replay_one(t))
            if on_progress:
                on_progress(len(out), len(tasks), out[-1])
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for f in as_completed([pool.submit(_replay_one, t) for t in tasks]):
                out.append(f.result())
                if on_progress:
                    on_progress(len(out), len(tasks), out[-1])
    order = {p: i for i, p in enumerate(policies)}
    out.sort(key=lambda r: (r.scenario, r.seed, order.get(r.policy, 99)))
    return out
