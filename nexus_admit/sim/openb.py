"""The Alibaba openb trace (cluster-trace-gpu-v2023) and the FGD paper's protocol
(Weng et al., USENIX ATC 2023; the data and its sources: nexus_admit/data/README.md):

1. take the pod list, append pods sampled with replacement (or drop random pods) until the
   total GPU request reaches 1.3 × the cluster's GPU capacity;
2. shuffle with the run's seed (42–51);
3. create pods one at a time, never delete them; a pod that fits nowhere fails and is skipped;
4. after each pod record the GPU request arrived so far and the GPU allocated (% of
   capacity); report the allocation at arrived = 100 % and 130 %.

Every pod is a one-pod gang placed by a registered placement policy through the same
`place()` the controller uses; the snapshot is a `TrackedSnapshot` so vectorised policies
refresh only the nodes that changed.
"""

from __future__ import annotations

import csv
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from nexus_admit.model import (
    GPU_WHOLE,
    Gang,
    Node,
    NodeSelectorRequirement,
    ObjectiveWeights,
    PlacementConfig,
    PodSet,
    SolverSettings,
)
from nexus_admit.placement.base import PlacementPolicy
from nexus_admit.placement.fragmentation import (
    PodShape,
    WorkloadDistribution,
    node_fragmentation,
)
from nexus_admit.placement.sequence import OrderedPlacer
from nexus_admit.placement.tracking import TrackedSnapshot
from nexus_admit.sim.data import default_data, open_csv
from nexus_admit.sim.policies import policy_for

__all__ = [
    "DEFAULT_DATA",
    "GPU_PRODUCT_LABEL",
    "NODE_LIST",
    "OPENB_NEXUS_CONFIG",
    "PUBLISHED",
    "TRACES",
    "OpenbPod",
    "OpenbRun",
    "allocation_at",
    "cluster_fragmentation",
    "gpu_request",
    "inflate",
    "load_nodes",
    "load_pods",
    "pod_list",
    "pod_set",
    "run_openb",
    "workload_distribution",
]

DEFAULT_DATA = default_data()
TRACES = ("default", "multigpu50", "gpuspec33")
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
SEEDS = tuple(range(42, 52))

# Published GPU allocation ratios (mean of 10 seeds), from the paper (Weng et al., ATC 2023):
# (trace, policy) -> (arrived 100 %, arrived 130 %)
PUBLISHED: dict[tuple[str, str], tuple[float, float]] = {
    ("default", "paper-random"): (86.30, 87.47),
    ("default", "dotprod"): (90.62, 90.85),
    ("default", "gpu-clustering"): (91.65, 91.88),
    ("default", "gpu-packing"): (91.78, 92.00),
    ("default", "paper-bestfit"): (92.86, 93.08),
    ("default", "fgd"): (95.23, 95.39),
    ("multigpu50", "paper-bestfit"): (95.62, 95.74),
    ("multigpu50", "gpu-packing"): (96.06, 96.18),
    ("multigpu50", "fgd"): (97.09, 97.18),
    ("gpuspec33", "paper-bestfit"): (80.39, 93.09),
    ("gpuspec33", "gpu-packing"): (82.22, 93.22),
    ("gpuspec33", "fgd"): (87.84, 94.55),
}

# The PlacementConfig the nexus engine runs openb with: pods here are one-pod gangs on a
# flat cluster (no fabric, no tiers, no VRAM needs), so the terms that matter are the
# fragmentation gradient for the trace's typical pods and the fill order; islands and the
# plain idle-share term are off, and every node stays a candidate (no domain pruning).
OPENB_NEXUS_CONFIG = PlacementConfig(
    weights=ObjectiveWeights(island_broken=0, fragmentation=0, frag_gradient=1000,
                             fill_order=1500),
    solver=SolverSettings(max_candidate_nodes=5000),
)

# VRAM per GPU (MiB) of the disclosed models (public spec sheets); G1-G3 are undisclosed.
_VRAM = {"T4": 16384, "P100": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 24576}


@dataclass(frozen=True, slots=True)
class OpenbPod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU
    gpu_spec: tuple[str, ...] = ()

    @property
    def gpu_request(self) -> int:
        return gpu_request(self)

    @property
    def shape(self) -> PodShape:
        milli = self.gpu_milli if self.num_gpu else 0
        return PodShape(self.cpu_milli, milli, self.num_gpu, self.gpu_spec)


def gpu_request(pod: OpenbPod) -> int:
    """Milli-GPUs asked: num_gpu × gpu_milli."""
    return pod.num_gpu * pod.gpu_milli


NODE_LIST = "openb/openb_node_list_gpu_node.csv"


def pod_list(trace: str) -> str:
    """The trace's pod list, relative to the data directory."""
    return f"openb/openb_pod_list_{trace}.csv"


@lru_cache(maxsize=4)
def _node_rows(data: str) -> tuple[tuple[str, int, int, int, str], ...]:
    with open_csv(Path(data), NODE_LIST) as f:
        return tuple(
            (r["sn"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"]), r["model"])
            for r in csv.DictReader(f)
        )


def load_nodes(data: Path = DEFAULT_DATA) -> list[Node]:
    """The 1213 GPU nodes of openb as fresh `Node`s (GPU model as the GFD product label)."""
    rows = _node_rows(str(data))
    return [
        Node(
            name=name,
            labels={GPU_PRODUCT_LABEL: model, "nvidia.com/gpu.count": str(gpus),
                    "kubernetes.io/hostname": name},
            cpu_milli=cpu, memory_mib=mem, max_pods=110, gpu_product=model,
            gpu_memory_mib=_VRAM.get(model, 0), gpu_free=[GPU_WHOLE] * gpus,
            free_cpu_milli=cpu, free_memory_mib=mem, free_pods=110,
        )
        for name, cpu, mem, gpus, model in rows
    ]


@lru_cache(maxsize=8)
def load_pods(trace: str, data: Path = DEFAULT_DATA) -> tuple[OpenbPod, ...]:
    """One of `TRACES`: default, multigpu50, gpuspec33."""
    if trace not in TRACES:
        raise ValueError(f"unknown openb trace {trace!r}; known: {list(TRACES)}")
    out = []
    with open_csv(data, pod_list(trace)) as f:
        for r in csv.DictReader(f):
            spec = tuple(s for s in (r.get("gpu_spec") or "").split("|") if s)
            out.append(OpenbPod(r["name"], int(r["cpu_milli"]), int(r["memory_mib"]),
                                int(r["num_gpu"]), int(r["gpu_milli"]), spec))
    return tuple(out)


def workload_distribution(pods: Sequence[OpenbPod]) -> WorkloadDistribution:
    """The trace's typical pods (95 % coverage, CPU-only pods included), as in the paper."""
    return WorkloadDistribution.from_shapes((p.shape for p in pods), coverage=0.95)


def inflate(
    pods: Sequence[OpenbPod], capacity_milli: int, ratio: float, seed: int
) -> list[OpenbPod]:
    """Step 1 and 2 of the protocol: reach `ratio` × capacity of GPU request by appending
    pods sampled with replacement (stopping before the first that would overshoot) or by
    dropping random pods, then shuffle. Deterministic in `seed`."""
    rng = random.Random(seed)
    target = ratio * capacity_milli
    out = list(pods)
    total = sum(gpu_request(p) for p in out)
    if total < target:
        while True:
            pick = pods[rng.randrange(len(pods))]
            if total + gpu_request(pick) > target:
                break
            out.append(pick)
            total += gpu_request(pick)
    else:
        while total > target and out:
            drop = out.pop(rng.randrange(len(out)))
            total -= gpu_request(drop)
    rng.shuffle(out)
    return out


_POD_SETS: dict[tuple[int, int, int, int, tuple[str, ...]], PodSet] = {}


def pod_set(pod: OpenbPod) -> PodSet:
    """The one-pod set of an openb pod (shared across pods of one shape)."""
    key = (pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)
    ps = _POD_SETS.get(key)
    if ps is None:
        terms = ((NodeSelectorRequirement(GPU_PRODUCT_LABEL, "In", pod.gpu_spec),),) \
            if pod.gpu_spec else ()
        ps = PodSet(
            "main", 1, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib, gpus=pod.num_gpu,
            gpu_milli=pod.gpu_milli if pod.num_gpu else GPU_WHOLE, affinity_terms=terms,
        )
        _POD_SETS[key] = ps
    return ps


def cluster_fragmentation(
    snapshot: TrackedSnapshot, dist: WorkloadDistribution
) -> tuple[float, int, int, int]:
    """(Σ node fragmentation in milli-GPUs, idle milli-GPUs, 8-GPU nodes no longer pristine,
    8-GPU nodes no longer pristine that still have GPU share idle). The last is the
    engine's islandsBroken: a node filled whole by 8-GPU pods is used as an island is
    meant to be, and counts only in the third."""
    nodes = list(snapshot)
    width = max(n.gpu_count for n in nodes)
    gpu = np.zeros((len(nodes), width), dtype=np.int64)
    for i, n in enumerate(nodes):
        gpu[i, : n.gpu_count] = n.gpu_free
    cpu = np.fromiter((n.free_cpu_milli for n in nodes), np.int64, len(nodes))
    models = [n.gpu_product for n in nodes]
    frag = node_fragmentation(gpu, cpu, dist.access_matrix(models), dist)
    broken = [n for n in nodes if n.gpu_count == 8 and not n.is_pristine()]
    partial = sum(1 for n in broken if n.free_gpu_milli > 0)
    return float(frag.sum()), int(gpu.sum()), len(broken), partial


@dataclass
class OpenbRun:
    trace: str
    policy: str
    seed: int
    pods: int
    failed: int
    capacity_milli: int
    seconds: float
    place_seconds: float
    alloc_100: float
    alloc_130: float
    # per integer arrived % (0..130): allocation %, fragmentation % of capacity, 8-GPU
    # nodes no longer pristine, and those of them left partly idle (islands broken)
    curve_arrived: list[int] = field(default_factory=list)
    curve_alloc: list[float] = field(default_factory=list)
    curve_frag: list[float] = field(default_factory=list)
    curve_broken8: list[int] = field(default_factory=list)
    curve_partial8: list[int] = field(default_factory=list)
    nodes8: int = 0
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def allocation_at(arrived_pct: np.ndarray, alloc_pct: np.ndarray, level: int) -> float:
    """The paper's reading: mean allocation over the pods whose arrived % rounds to
    `level` (widened to ±1 when none does)."""
    rounded = np.round(arrived_pct)
    sel = rounded == level
    if not sel.any():
        sel = np.abs(rounded - level) <= 1
    if not sel.any():
        return float(alloc_pct[-1]) if len(alloc_pct) else 0.0
    return float(alloc_pct[sel].mean())


def make_openb_policy(name: str, seed: int, pods: Sequence[OpenbPod]) -> PlacementPolicy:
    return policy_for(name, seed, lambda: workload_distribution(pods))


def run_openb(
    trace: str,
    policy_name: str,
    seed: int,
    data: Path = DEFAULT_DATA,
    *,
    ratio: float = 1.3,
    limit: int | None = None,
    node_fraction: float = 1.0,
    config: PlacementConfig | None = None,
    policy_factory: Callable[[str, int, Sequence[OpenbPod]], PlacementPolicy] | None = None,
) -> OpenbRun:
    """One run of the protocol. `limit` stops after that many pods (smoke tests);
    `node_fraction` < 1 keeps a fixed random sample of the nodes (a smaller cluster; the
    pod list is then cut down to 1.3 × its capacity by the same step 1)."""
    started = time.perf_counter()
    original = load_pods(trace, data)
    nodes = load_nodes(data)
    if node_fraction < 1.0:
        keep = max(1, round(node_fraction * len(nodes)))
        nodes = sorted(random.Random(0).sample(nodes, keep), key=lambda n: n.name)
    snapshot = TrackedSnapshot.of(nodes)
    capacity = GPU_WHOLE * snapshot.total_gpus
    pods = inflate(original, capacity, ratio, seed)
    if limit is not None:
        pods = pods[:limit]
    policy = (policy_factory or make_openb_policy)(policy_name, seed, original)
    if config is None:
        config = OPENB_NEXUS_CONFIG if policy_name == "nexus" else PlacementConfig()
    dist = workload_distribution(original)
    placer = OrderedPlacer(policy, snapshot)
    nodes8 = sum(1 for n in snapshot if n.gpu_count == 8)
    arrived_pct = np.zeros(len(pods))
    alloc_pct = np.zeros(len(pods))
    arrived = allocated = failed = 0
    place_seconds = 0.0
    curve: dict[str, list[Any]] = {
        "arrived": [], "alloc": [], "frag": [], "broken": [], "partial": []
    }
    next_mark = 0
    for k, pod in enumerate(pods):
        gang = Gang(pod.name, (pod_set(pod),))
        arrived += gpu_request(pod)
        t0 = time.perf_counter()
        placement = placer.place(gang, config)
        place_seconds += time.perf_counter() - t0
        if placement.feasible:
            allocated += gpu_request(pod)
        else:
            failed += 1
        arrived_pct[k] = 100.0 * arrived / capacity
        alloc_pct[k] = 100.0 * allocated / capacity
        while arrived_pct[k] >= next_mark:
            frag, _, broken, partial = cluster_fragmentation(snapshot, dist)
            curve["arrived"].append(next_mark)
            curve["alloc"].append(round(float(alloc_pct[k]), 3))
            curve["frag"].append(round(100.0 * frag / capacity, 3))
            curve["broken"].append(broken)
            curve["partial"].append(partial)
            next_mark += 1
    return OpenbRun(
        trace=trace, policy=policy_name, seed=seed, pods=len(pods), failed=failed,
        capacity_milli=capacity, seconds=round(time.perf_counter() - started, 3),
        place_seconds=round(place_seconds, 3),
        alloc_100=round(allocation_at(arrived_pct, alloc_pct, 100), 3),
        alloc_130=round(allocation_at(arrived_pct, alloc_pct, 130), 3),
        curve_arrived=curve["arrived"], curve_alloc=curve["alloc"], curve_frag=curve["frag"],
        curve_broken8=curve["broken"], curve_partial8=curve["partial"], nodes8=nodes8,
    )
