"""Run every policy on the same synthetic instances and collect comparable numbers.

For each fleet size and each repeat (a differently loaded fleet), each gang size is placed
by every policy on the same snapshot. The nexus engine's solve times give p50/p99; a
long-run reference solve of each instance (the first `reference_repeats` repeats) on the full,
unreduced candidate set gives the objective gap. Every placement is checked by the
independent validator.

Those decisions are cold: a fresh snapshot, nothing derived from it yet. The controller
decides on a warm one, its `TrackedSnapshot` kept from pass to pass with the facts derived
from it (the node memo, the trackers of live_facts.py and live_reduction.py). `warm`
decisions per instance measure that: one engine on a tracked copy of the fleet places the
gang once untimed (the controller's first decision of a shape, or its `warm`), then again
`warm` times, each placement applied before the next decision as the pods it binds would
be; recorded as policy `WARM`. One-pod gangs only: a gang of 64 applied 20 times fills a
1,000-node fleet, and its figures would measure the filling.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from nexus_admit.bench.fleet import BENCH_LEVELS, bench_config, bench_gang, generate_fleet
from nexus_admit.model import ClusterSnapshot, Gang, Placement, PlacementConfig
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.policies import make_policy
from nexus_admit.placement.problem import prepare
from nexus_admit.placement.tracking import TrackedSnapshot
from nexus_admit.placement.validate import violations

__all__ = ["WARM", "BenchResult", "Record", "run_bench", "summarise"]

WARM = "nexus (warm)"  # the policy name the warm decisions are recorded under


@dataclass(slots=True)
class Record:
    nodes: int
    gang: int
    repeat: int
    policy: str
    feasible: bool
    status: str
    seconds: float
    objective: float
    islands_broken: float
    domains: dict[str, int]  # distinct domains used per level above the host
    nodes_used: int
    tier_mismatch_gpus: float  # GPUs placed on a hardware class that costs this tier > 0
    vram_stranded_gib: float
    violations: list[str]
    reason: str = ""
    # CPU the process spent on the decision (every thread: CP-SAT's workers too); on a busy
    # machine the wall time also counts the time the decision waited for a core
    cpu_seconds: float = 0.0


@dataclass(slots=True)
class BenchResult:
    records: list[Record] = field(default_factory=list)
    references: dict[str, dict[str, Any]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "summary": summarise(self),
            "references": self.references,
            "records": [asdict(r) for r in self.records],
        }


def _record(
    snapshot: ClusterSnapshot,
    gang: Gang,
    config: PlacementConfig,
    placement: Placement,
    nodes: int,
    repeat: int,
    seconds: float,
) -> Record:
    problem = prepare(snapshot, gang, config)
    used = placement.pods_per_node()
    domains = {
        level: len({problem.paths[n][li] for n in used})
        for li, level in enumerate(problem.levels[:-1])
    }
    pod_sets = {p.name: p for p in gang.pod_sets}
    mismatch = sum(
        pod_sets[s.pod_set].gpu_milli_per_pod / 1000
        for s in placement.slots
        if problem.class_cost(s.node) > 0
    )
    return Record(
        nodes=nodes,
        gang=gang.pod_count,
        repeat=repeat,
        policy=placement.policy,
        feasible=placement.feasible,
        status=str(placement.status),
        seconds=seconds,
        objective=placement.objective,
        islands_broken=placement.terms.get("islandsBroken", 0.0),
        domains=domains,
        nodes_used=len(used),
        tier_mismatch_gpus=mismatch,
        vram_stranded_gib=placement.terms.get("vramStrandedGiB", 0.0),
        violations=violations(snapshot, gang, placement, config),
        reason=placement.reason,
    )


def run_bench(
    sizes: Sequence[int],
    gangs: Sequence[int],
    policies: Sequence[str],
    repeats: int,
    reference_seconds: float,
    time_limit: float = 1.0,
    progress: Callable[[str], None] | None = None,
    reference_repeats: int | None = None,
    warm: int = 0,
) -> BenchResult:
    """`reference_repeats`: how many repeats get a reference solve (default: all); `warm`:
    nexus decisions of a one-pod gang per instance on a tracked snapshot after its first
    (0: none)."""
    ref_repeats = repeats if reference_repeats is None else reference_repeats
    config = bench_config(time_limit)
    result = BenchResult(
        settings={
            "sizes": list(sizes),
            "gangs": list(gangs),
            "policies": list(policies),
            "repeats": repeats,
            "referenceSeconds": reference_seconds,
            "referenceRepeats": ref_repeats if reference_seconds > 0 else 0,
            "timeLimitSeconds": time_limit,
            "warmDecisions": warm if "nexus" in policies else 0,
            "levels": list(BENCH_LEVELS),
        }
    )
    instances = {p: make_policy(p, seed=0) for p in policies}
    for nodes in sizes:
        for repeat in range(repeats):
            snapshot = generate_fleet(nodes, seed=1000 * nodes + repeat)
            for size in gangs:
                gang = bench_gang(size)
                for name, policy in instances.items():
                    if progress:
                        progress(f"{nodes} nodes, repeat {repeat}, gang {size}, {name}")
                    gc.collect()  # garbage of earlier runs is not this solve's cost
                    started, cpu = time.perf_counter(), time.process_time()
                    placement = policy.place(snapshot, gang, config)
                    seconds = time.perf_counter() - started
                    cpu_seconds = time.process_time() - cpu
                    record = _record(snapshot, gang, config, placement, nodes, repeat, seconds)
                    record.cpu_seconds = cpu_seconds
                    result.records.append(record)
                if warm > 0 and "nexus" in instances and size == 1:
                    if progress:
                        progress(f"{nodes} nodes, repeat {repeat}, gang {size}: {warm} warm")
                    result.records.extend(
                        _warm_records(snapshot, gang, config, nodes, repeat, warm)
                    )
                if repeat < ref_repeats and reference_seconds > 0 and "nexus" in instances:
                    if progress:
                        progress(
                            f"{nodes} nodes, repeat {repeat}, gang {size}: "
                            f"{reference_seconds:g}s reference"
                        )
                    result.references[_ref_key(nodes, size, repeat)] = _reference(
                        snapshot, gang, config, reference_seconds
                    )
    return result


def _warm_records(
    snapshot: ClusterSnapshot,
    gang: Gang,
    config: PlacementConfig,
    nodes: int,
    repeat: int,
    decisions: int,
) -> list[Record]:
    """`decisions` timed nexus decisions of `gang` on a tracked copy of `snapshot`, after
    one untimed, each placement applied before the next (see the module)."""
    tracked = TrackedSnapshot(
        {name: node.copy() for name, node in snapshot.nodes.items()}, snapshot.kueue_topologies
    )
    engine = make_policy("nexus", seed=0)
    first = engine.place(tracked, gang, config)
    if first.feasible:
        tracked.apply(gang, first.slots)
    out: list[Record] = []
    for i in range(decisions):
        this = replace(gang, name=f"{gang.name}-warm-{i}")
        gc.collect()
        started, cpu = time.perf_counter(), time.process_time()
        placement = engine.place(tracked, this, config)
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu
        placement.policy = WARM
        record = _record(tracked, this, config, placement, nodes, repeat, seconds)
        record.cpu_seconds = cpu_seconds
        out.append(record)
        if placement.feasible:
            tracked.apply(this, placement.slots)
    return out


def _ref_key(nodes: int, gang: int, repeat: int) -> str:
    return f"{nodes}/{gang}/{repeat}"


def _reference(
    snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig, seconds: float
) -> dict[str, Any]:
    """The unreduced model, no gap tolerance, a long time limit."""
    ref_config = config.model_copy(
        update={"solver": config.solver.model_copy(update={"relative_gap": 0.0, "workers": 8})}
    )
    ref = CpSatEngine(reduce=False, time_limit=seconds).place(snapshot, gang, ref_config)
    return {
        "feasible": ref.feasible,
        "objective": ref.objective,
        "status": str(ref.status),
        "seconds": ref.solve_seconds,
    }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def _gap(result: BenchResult, rec: Record) -> float | None:
    """% by which `rec` is worse than its instance's reference (negative: better)."""
    ref = result.references.get(_ref_key(rec.nodes, rec.gang, rec.repeat))
    if not ref or not ref["feasible"] or not rec.feasible:
        return None
    best = float(ref["objective"])
    return 100 * (rec.objective - best) / max(abs(best), 1.0)


def summarise(result: BenchResult) -> list[dict[str, Any]]:
    """One row per (nodes, gang, policy): latency percentiles and mean quality metrics."""
    groups: dict[tuple[int, int, str], list[Record]] = {}
    for r in result.records:
        groups.setdefault((r.nodes, r.gang, r.policy), []).append(r)
    rows = []
    for (nodes, gang, policy), recs in sorted(groups.items()):
        ok = [r for r in recs if r.feasible]
        row: dict[str, Any] = {
            "nodes": nodes,
            "gang": gang,
            "policy": policy,
            "runs": len(recs),
            "placed": len(ok),
            "p50Ms": 1000 * _pct([r.seconds for r in recs], 50),
            "p99Ms": 1000 * _pct([r.seconds for r in recs], 99),
            "p99CpuMs": 1000 * _pct([r.cpu_seconds for r in recs], 99),
            "violations": sum(len(r.violations) for r in recs),
        }
        if ok:
            row.update(
                {
                    "domainsSpanned": statistics.fmean(sum(r.domains.values()) for r in ok),
                    "islandsBroken": statistics.fmean(r.islands_broken for r in ok),
                    "nodesUsed": statistics.fmean(r.nodes_used for r in ok),
                    "tierMismatchGpus": statistics.fmean(r.tier_mismatch_gpus for r in ok),
                    "vramStrandedGiB": statistics.fmean(r.vram_stranded_gib for r in ok),
                    "objective": statistics.fmean(r.objective for r in ok),
                    "optimal": sum(1 for r in ok if r.status == "optimal"),
                }
            )
        gaps = [g for r in recs if (g := _gap(result, r)) is not None]
        if policy == "nexus" and gaps:
            row["gapToReferencePct"] = max(gaps)  # the worst instance
            row["gapMeanPct"] = statistics.fmean(gaps)
            row["referenceInstances"] = len(gaps)
        rows.append(row)
    return rows
