"""The objective terms of ARCHITECTURE §1, defined once on a list of slots.

The CP-SAT engine encodes exactly these definitions linearly; every policy reports them
through `evaluate_terms`, so the numbers compared in plans, benchmarks and the simulator
mean the same thing for every policy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from nexus_admit.model import GPU_WHOLE, Node, PodSet, Slot
from nexus_admit.placement.problem import Problem
from nexus_admit.placement.spread import pair_cost

__all__ = [
    "TERMS",
    "evaluate_terms",
    "gang_gpus",
    "level_weight",
    "numa_alignable",
    "stranded_vram_gib",
    "term_weights",
    "weighted_objective",
]

# Term names as reported (stable keys of the JSON output).
TERMS = (
    "tierMismatch",  # Σ GPUs × class cost of the tier on that hardware class
    "vramStrandedGiB",  # Σ per GPU of max(0, minUtilization(tier) × VRAM − need)
    "islandsBroken",  # pristine 8-GPU nodes / NVLink cliques started but left part idle
    "domainSpread",  # Σ over levels above host of (domains used − 1) × level weight
    "gangSplit",  # Σ over levels above host where the gang uses > 1 domain of level weight
    "nodesUsed",  # distinct nodes
    "fragmentation",  # GPUs (share) left idle on the GPU nodes this gang touches
    "domainFragmentation",  # GPUs (share) left free in the racks/ToRs this gang touches
    "numaUnaligned",  # pods whose GPUs and CPUs are not from one NUMA zone
    "maxPodsPerNode",  # the busiest node's pod count (inference/service spread)
    "spreadPairs",  # weighted pairs of the service's pods sharing a node or domain (spread.py)
)


def level_weight(problem: Problem, level_index: int) -> int:
    """Higher levels cost more to span: 1 for the level just above the host, doubling up."""
    above_host = len(problem.levels) - 1
    return 1 << max(0, above_host - 1 - level_index)


def stranded_vram_gib(problem: Problem, pod_set: PodSet, node: Node) -> float:
    """VRAM left idle per GPU below the tier's utilisation line (0 when the need is unset)."""
    if not pod_set.vram_mib or pod_set.fractional or not pod_set.gpus:
        return 0.0
    floor = problem.config.min_vram_utilization(problem.gang.tier) * node.gpu_memory_mib
    return max(0.0, floor - pod_set.vram_mib) / 1024.0


def numa_alignable(node: Node, pod_set: PodSet) -> bool:
    """Whether one NUMA zone of `node` could ever hold this pod's GPUs (an 8-GPU pod on a
    node of two 4-GPU zones cannot, so it is not counted as unaligned)."""
    if not node.numa_zones:
        return False
    return pod_set.whole_gpus <= max(len(z.gpu_indices) for z in node.numa_zones)


def _one_rack_may_hold(problem: Problem) -> bool:
    """Whether some rack has the GPUs free for the whole gang: BestFit among racks (the
    domainFragmentation term) is for such gangs; a gang that must span racks should span
    few of them, not the tightest ones."""
    rack_level = len(problem.levels) - 2
    if rack_level < 0:
        return False
    free = problem.domain_free_gpu_milli(rack_level)
    return max(free.values(), default=0) >= problem.gang.gpu_milli


def gang_gpus(problem: Problem) -> int:
    """The gang's GPUs (shares summed, rounded up), at least 1: what a spread slows down."""
    return max(1, -(-problem.gang.gpu_milli // GPU_WHOLE))


def term_weights(problem: Problem) -> dict[str, int]:
    w = problem.config.weights
    packs = problem.gang.workload_type.packs
    # a one-pod gang has nothing to spread: let it keep whole racks for the gangs
    single = problem.gang.pod_count == 1
    return {
        "tierMismatch": w.tier_mismatch,
        "vramStrandedGiB": w.vram_stranded,
        "islandsBroken": w.island_broken,
        # spreading workloads still honour a preferred level (as few of its domains)
        "domainSpread": w.domain_spread if packs or problem.gang.preferred_level else 0,
        "gangSplit": (
            w.gang_split * gang_gpus(problem) if packs or problem.gang.preferred_level else 0
        ),
        "nodesUsed": w.node_count if packs else 0,
        "fragmentation": w.fragmentation if packs else 0,
        "domainFragmentation": (
            w.domain_fragmentation if (packs or single) and _one_rack_may_hold(problem) else 0
        ),
        "numaUnaligned": w.numa_unaligned,
        "maxPodsPerNode": 0 if packs else w.spread,
        # its weights per level are PlacementConfig.spread, inside the term
        "spreadPairs": 0 if packs else 1,
    }


def weighted_objective(problem: Problem, terms: dict[str, float]) -> float:
    weights = term_weights(problem)
    return sum(weights[name] * terms.get(name, 0.0) for name in TERMS)


def evaluate_terms(problem: Problem, slots: Sequence[Slot]) -> dict[str, float]:
    """Every term for `slots` placed on `problem.snapshot` (the state before placement)."""
    nodes = problem.snapshot.nodes
    pod_sets = {p.name: p for p in problem.gang.pod_sets}
    tier_mismatch = 0.0
    stranded = 0.0
    unaligned = 0
    per_node: dict[str, int] = defaultdict(int)
    gpu_milli_on: dict[str, int] = defaultdict(int)
    for slot in slots:
        ps = pod_sets[slot.pod_set]
        node = nodes[slot.node]
        per_node[slot.node] += 1
        if ps.gpus:
            gpu_milli_on[slot.node] += ps.gpu_milli_per_pod
            tier_mismatch += problem.class_cost(slot.node) * ps.gpu_milli_per_pod / GPU_WHOLE
            stranded += ps.gpus * stranded_vram_gib(problem, ps, node)
        if slot.numa_zone is None and numa_alignable(node, ps):
            unaligned += 1
    gpu_nodes = [nodes[name] for name in gpu_milli_on]

    # An island is broken when this gang starts using it but leaves part of it idle;
    # taking a whole pristine node or clique is what islands are kept for.
    def filled(n: Node) -> bool:
        return gpu_milli_on.get(n.name, 0) >= n.free_gpu_milli

    islands = sum(
        1 for n in gpu_nodes if problem.is_island(n) and n.is_pristine() and not filled(n)
    )
    # only the cliques of the nodes it touches can break (not a scan of every clique)
    pristine = problem.pristine_cliques
    for clique in {c for n in gpu_nodes if (c := n.clique) is not None and c in pristine}:
        if not all(filled(nodes[m]) for m in pristine[clique]):
            islands += 1
    # GPU share still idle on the GPU nodes this gang touches, in GPUs
    fragmentation = sum(n.free_gpu_milli - gpu_milli_on[n.name] for n in gpu_nodes) / GPU_WHOLE
    spread = 0
    domain_fragmentation = 0.0
    lowest = len(problem.levels) - 2  # the level just above the host
    if lowest >= 0:
        free = problem.domain_free_gpu_milli(lowest)
        touched = {d for n in per_node if (d := problem.paths[n][lowest]) is not None}
        taken = sum(m for n, m in gpu_milli_on.items() if problem.paths[n][lowest] is not None)
        domain_fragmentation = (sum(free[d] for d in touched) - taken) / GPU_WHOLE
    split = 0
    for li in range(len(problem.levels) - 1):
        used = {problem.paths[name][li] for name in per_node}
        spread += (len(used) - 1) * level_weight(problem, li) if used else 0
        split += level_weight(problem, li) if len(used) > 1 else 0
    return {
        "tierMismatch": round(tier_mismatch, 3),
        "vramStrandedGiB": round(stranded, 3),
        "islandsBroken": float(islands),
        "domainSpread": float(spread),
        "gangSplit": float(split),
        "nodesUsed": float(len(per_node)),
        "fragmentation": round(fragmentation, 3),
        "domainFragmentation": round(domain_fragmentation, 3),
        "numaUnaligned": float(unaligned),
        "maxPodsPerNode": float(max(per_node.values(), default=0)),
        "spreadPairs": pair_cost(problem, per_node),
    }
