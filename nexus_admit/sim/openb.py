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

A user's own pod and node lists (`simulate --pods/--nodes-file`) take openb's columns
(`POD_COLUMNS`, `NODE_COLUMNS`); a row the protocol cannot read stops the run with a
`TraceError` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import gzip
import random
import time
from collections.abc import Callable, Iterator, Sequence
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
from nexus_admit.sim.data import csv_path, default_data, open_text
from nexus_admit.sim.policies import policy_for

__all__ = [
    "DEFAULT_DATA",
    "GPU_PRODUCT_LABEL",
    "NODE_COLUMNS",
    "NODE_LIST",
    "OPENB_NEXUS_CONFIG",
    "POD_COLUMNS",
    "PUBLISHED",
    "TRACES",
    "OpenbPod",
    "OpenbRun",
    "TraceError",
    "allocation_at",
    "cluster_fragmentation",
    "gpu_request",
    "inflate",
    "load_nodes",
    "load_pods",
    "pod_list",
    "pod_set",
    "read_nodes",
    "read_pods",
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
# the columns the protocol reads (openb's names); others are ignored, gpu_spec is optional
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")


class TraceError(ValueError):
    """A pod or node list the protocol cannot read: the message names the file, the line
    and the column."""


def pod_list(trace: str) -> str:
    """The trace's pod list, relative to the data directory."""
    return f"openb/openb_pod_list_{trace}.csv"


def _bundled(data: Path, relative: str) -> Path:
    path = csv_path(data, relative)
    if path is None:
        raise FileNotFoundError(f"{Path(data) / relative} not found (nor its .gz)")
    return path


def _rows(path: Path, columns: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, row) of a CSV file whose header holds `columns`."""
    line = 1
    try:
        with open_text(path) as f:
            reader = csv.DictReader(f)
            missing = [c for c in columns if c not in (reader.fieldnames or ())]
            if missing:
                raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)} "
                                 f"(wants {', '.join(columns)})")
            for row in reader:
                line = reader.line_num
                yield line, row
    except (UnicodeDecodeError, csv.Error, gzip.BadGzipFile, EOFError) as err:
        raise TraceError(f"{path}: not a readable CSV file after line {line} ({err})") from None


def _int(path: Path, line: int, row: dict[str, str], column: str, most: int | None = None
         ) -> int:
    text = row.get(column)
    try:
        value = int(text or "")
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column}: {text!r} is not a whole "
                         "number") from None
    if value < 0 or (most is not None and value > most):
        bound = f"0 to {most}" if most is not None else ">= 0"
        raise TraceError(f"{path}:{line}: column {column}: {value} is out of range ({bound})")
    return value


def _text(path: Path, line: int, row: dict[str, str], column: str) -> str:
    text = (row.get(column) or "").strip()
    if not text:
        raise TraceError(f"{path}:{line}: column {column} is empty")
    return text


@lru_cache(maxsize=4)
def _node_rows(path: Path) -> tuple[tuple[str, int, int, int, str], ...]:
    rows: dict[str, tuple[str, int, int, int, str]] = {}
    for line, r in _rows(path, NODE_COLUMNS):
        name = _text(path, line, r, "sn")
        if name in rows:
            raise TraceError(f"{path}:{line}: column sn: node {name!r} is listed twice")
        gpus, model = _int(path, line, r, "gpu"), (r.get("model") or "").strip()
        if gpus and not model:
            raise TraceError(f"{path}:{line}: column model is empty for a node with {gpus} GPUs")
        rows[name] = (name, _int(path, line, r, "cpu_milli"), _int(path, line, r, "memory_mib"),
                      gpus, model)
    if not any(gpus for _, _, _, gpus, _ in rows.values()):
        raise TraceError(f"{path}: no node with a GPU (column gpu)")
    return tuple(rows.values())


def read_nodes(path: Path) -> list[Node]:
    """A node list in openb's columns as fresh `Node`s (GPU model as the GFD product label)."""
    return [
        Node(
            name=name,
            labels={GPU_PRODUCT_LABEL: model, "nvidia.com/gpu.count": str(gpus),
                    "kubernetes.io/hostname": name},
            cpu_milli=cpu, memory_mib=mem, max_pods=110, gpu_product=model,
            gpu_memory_mib=_VRAM.get(model, 0), gpu_free=[GPU_WHOLE] * gpus,
            free_cpu_milli=cpu, free_memory_mib=mem, free_pods=110,
        )
        for name, cpu, mem, gpus, model in _node_rows(Path(path))
    ]


def load_nodes(data: Path = DEFAULT_DATA) -> list[Node]:
    """The 1213 GPU nodes of openb as fresh `Node`s."""
    return read_nodes(_bundled(data, NODE_LIST))


@lru_cache(maxsize=8)
def read_pods(path: Path) -> tuple[OpenbPod, ...]:
    """A pod list in openb's columns; gpu_milli is per GPU (at most 1000), gpu_spec the GPU
    models allowed, separated by |."""
    out = [_pod(path, line, r) for line, r in _rows(path, POD_COLUMNS)]
    # the protocol inflates the list by its GPU request: without one it never ends
    if not any(gpu_request(p) for p in out):
        raise TraceError(f"{path}: no pod requests a GPU (columns num_gpu, gpu_milli)")
    return tuple(out)


def _pod(path: Path, line: int, r: dict[str, str]) -> OpenbPod:
    gpus, milli = _int(path, line, r, "num_gpu"), _int(path, line, r, "gpu_milli", GPU_WHOLE)
    if gpus and not milli:
        raise TraceError(f"{path}:{line}: column gpu_milli: 0 for a pod with num_gpu {gpus}")
    if gpus > 1 and milli != GPU_WHOLE:
        raise TraceError(f"{path}:{line}: column gpu_milli: a share of a GPU ({milli}) needs "
                         f"num_gpu 1, not {gpus}")
    spec = tuple(s for s in (r.get("gpu_spec") or "").split("|") if s)
    return OpenbPod(_text(path, line, r, "name"), _int(path, line, r, "cpu_milli"),
                    _int(path, line, r, "memory_mib"), gpus, milli, spec)


def load_pods(trace: str, data: Path = DEFAULT_DATA) -> tuple[OpenbPod, ...]:
    """One of `TRACES`: default, multigpu50, gpuspec33."""
    if trace not in TRACES:
        raise ValueError(f"unknown openb trace {trace!r}; known: {list(TRACES)}")
    return read_pods(_bundled(data, pod_list(trace)))


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
    pods_file: Path | None = None,
    nodes_file: Path | None = None,
) -> OpenbRun:
    """One run of the protocol. `limit` stops after that many pods (smoke tests);
    `node_fraction` < 1 keeps a fixed random sample of the nodes (a smaller cluster; the
    pod list is then cut down to 1.3 × its capacity by the same step 1). `pods_file`,
    `nodes_file`: a user's own lists instead of the bundled ones (`trace` names the run)."""
    started = time.perf_counter()
    original = load_pods(trace, data) if pods_file is None else read_pods(pods_file)
    nodes = load_nodes(data) if nodes_file is None else read_nodes(nodes_file)
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
