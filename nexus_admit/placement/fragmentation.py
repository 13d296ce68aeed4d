"""GPU fragmentation as defined by Weng et al. (USENIX ATC 2023, "Beware of Fragmentation"),
written from the paper's definition, vectorised over nodes.

For a node and a *typical* pod shape m (CPU, GPU share per GPU, GPU count, allowed GPU
models) with popularity p_m, the node's idle GPU share counts as fragment for m

* entirely, when m cannot run on the node now (wrong GPU model, too few GPUs with m's
  share free, too little CPU left), and always for a CPU-only m (it cannot use GPUs);
* otherwise, the idle share of those GPUs whose free share is below m's per-GPU request.

Node fragmentation F(node) = Σ_m p_m × fragment(node, m), in milli-GPUs. FGD places a pod
where F grows least; the simulator reports Σ_nodes F as the cluster's fragmentation.

The workload distribution (typical shapes and their popularity) is a property of the target
workload, not of one gang: the simulator builds it from the trace; a controller without a
trace uses `WorkloadDistribution.default()`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

from nexus_admit.model import GPU_WHOLE, Node

__all__ = [
    "PodShape",
    "TypicalPod",
    "WorkloadAware",
    "WorkloadDistribution",
    "accessible",
    "fill_rank",
    "gradient_table",
    "node_fragmentation",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class PodShape:
    """What fragmentation looks at in a pod: CPU, share per GPU, GPU count, GPU models."""

    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for a CPU-only pod
    gpus: int
    gpu_models: tuple[str, ...] = ()  # allowed GPU products; () = any


@dataclass(frozen=True, slots=True)
class TypicalPod:
    shape: PodShape
    popularity: float


def accessible(models: Sequence[str], allowed: tuple[str, ...]) -> BoolArray:
    """Per node (given its GPU model): may a pod restricted to `allowed` run there."""
    if not allowed:
        return np.ones(len(models), dtype=bool)
    allowed_set = set(allowed)
    return np.fromiter((m in allowed_set for m in models), dtype=bool, count=len(models))


@dataclass(frozen=True)
class WorkloadDistribution:
    """Typical pod shapes with popularity summing to 1."""

    pods: tuple[TypicalPod, ...]
    _arrays: dict[object, object] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_shapes(
        cls, shapes: Iterable[PodShape], coverage: float = 0.95
    ) -> WorkloadDistribution:
        """The most frequent shapes, in decreasing count, until they cover `coverage` of all
        pods (CPU-only pods included), popularity renormalised over the kept shapes — the
        paper's "typical pods"."""
        counts = Counter(shapes)
        total = sum(counts.values())
        if total == 0:
            return cls.default()
        ranked = sorted(
            counts.items(),
            key=lambda kv: (-kv[1], kv[0].cpu_milli, kv[0].gpu_milli, kv[0].gpus, kv[0].gpu_models),
        )
        kept: list[tuple[PodShape, int]] = []
        covered = 0
        for shape, n in ranked:
            if covered >= coverage * total:
                break
            kept.append((shape, n))
            covered += n
        return cls(tuple(TypicalPod(s, n / covered) for s, n in kept))

    @classmethod
    def default(cls) -> WorkloadDistribution:
        """Used when the target workload is unknown: whole 1/2/4/8-GPU pods and common
        GPU shares, no CPU or model constraint. A guess, stated as such."""
        mix = [
            (PodShape(0, GPU_WHOLE, 1), 0.35),
            (PodShape(0, 500, 1), 0.15),
            (PodShape(0, 250, 1), 0.10),
            (PodShape(0, GPU_WHOLE, 2), 0.15),
            (PodShape(0, GPU_WHOLE, 4), 0.10),
            (PodShape(0, GPU_WHOLE, 8), 0.15),
        ]
        return cls(tuple(TypicalPod(s, p) for s, p in mix))

    def __len__(self) -> int:
        return len(self.pods)

    # ---- arrays for the vectorised measure (built once per distribution) ----
    def arrays(self) -> tuple[IntArray, IntArray, IntArray, IntArray, FloatArray, IntArray]:
        """(distinct GPU shares D, share index per pod K, gpus K, cpu K, popularity K,
        is-GPU-pod K as 0/1)."""
        cached = self._arrays.get("a")
        if cached is None:
            shares = sorted({p.shape.gpu_milli for p in self.pods if p.shape.gpu_milli > 0})
            shares = shares or [GPU_WHOLE]
            index = {d: i for i, d in enumerate(shares)}
            cached = (
                np.array(shares, dtype=np.int64),
                np.array([index.get(p.shape.gpu_milli, 0) for p in self.pods], dtype=np.int64),
                np.array([p.shape.gpus for p in self.pods], dtype=np.int64),
                np.array([p.shape.cpu_milli for p in self.pods], dtype=np.int64),
                np.array([p.popularity for p in self.pods], dtype=np.float64),
                np.array([1 if p.shape.gpu_milli > 0 and p.shape.gpus > 0 else 0
                          for p in self.pods], dtype=np.int64),
            )
            self._arrays["a"] = cached
        return cached  # type: ignore[return-value]

    def access_matrix(self, models: Sequence[str]) -> BoolArray:
        """K × nodes: may typical pod k run on the node's GPU model."""
        key = ("access", tuple(models))
        cached = self._arrays.get(key)
        if cached is None:
            cached = np.stack([accessible(models, p.shape.gpu_models) for p in self.pods]) \
                if self.pods else np.zeros((0, len(models)), dtype=bool)
            self._arrays[key] = cached
        return cached  # type: ignore[return-value]


def node_fragmentation(
    gpu_free: IntArray, cpu_free: IntArray, access: BoolArray, dist: WorkloadDistribution
) -> FloatArray:
    """F per node (milli-GPUs) for nodes given as rows: `gpu_free` (rows × GPUs, padded
    with 0 for absent GPUs), `cpu_free` (rows), `access` (K × rows)."""
    shares, share_idx, gpus, cpus, popularity, is_gpu = dist.arrays()
    if len(popularity) == 0:
        return np.zeros(len(cpu_free))
    total = gpu_free.sum(axis=1)
    # per distinct share d: GPUs that can still take d, and idle share on GPUs that cannot
    fits = gpu_free[None, :, :] >= shares[:, None, None]  # D × rows × G
    count = fits.sum(axis=2)  # D × rows
    small = np.where(fits, 0, gpu_free[None, :, :]).sum(axis=2)  # D × rows
    can_run = (
        access
        & (count[share_idx] >= gpus[:, None])
        & (cpu_free[None, :] >= cpus[:, None])
        & (is_gpu[:, None] > 0)
    )  # K × rows
    frag = np.where(can_run, small[share_idx], total[None, :])
    return np.asarray(popularity @ frag, dtype=np.float64)


@runtime_checkable
class WorkloadAware(Protocol):
    """A policy that can be told the target workload's distribution (FGD does)."""

    def set_workload(self, dist: WorkloadDistribution) -> None: ...


# ---- scalar forms for the CP-SAT engine (a handful of candidate nodes per solve) ----


def gradient_table(
    gpu_free: Sequence[int],
    free_cpu_milli: int,
    gpu_product: str,
    cpu_milli: int,
    gpus: int,
    gpu_milli: int,
    count: int,
    dist: WorkloadDistribution,
) -> list[float]:
    """F(after k pods) − F(now) for k = 0..count pods of one shape on one node, each pod
    put where F grows least (a shared pod on its best GPU, lowest index on ties; whole GPUs
    on free ones); stops early (shorter table) when the next pod does not fit. Memoised per
    distribution on the node's sorted GPU state (F does not depend on GPU order)."""
    memo = dist._arrays.setdefault("gradient-memo", {})
    assert isinstance(memo, dict)
    key = (tuple(sorted(gpu_free)), free_cpu_milli, gpu_product, cpu_milli, gpus, gpu_milli,
           count)
    hit = memo.get(key)
    if hit is not None:
        return list(hit)
    if len(memo) > 200_000:
        memo.clear()
    # one node's F per state (sorted GPUs, CPU, model), shared by every pod shape's table
    states = cast(dict[tuple[object, ...], float], dist._arrays.setdefault("node-frag", {}))
    if len(states) > 200_000:
        states.clear()
    access = dist.access_matrix((gpu_product,))
    gpu = list(gpu_free)
    cpu = free_cpu_milli

    def frag(rows: list[list[int]], cpu_left: int) -> FloatArray:
        # rows of one node, all as wide (its GPU count, at least one), so as an array as is
        arr = np.array(rows, dtype=np.int64)
        return node_fragmentation(arr, np.full(len(rows), cpu_left, dtype=np.int64),
                                  access if len(rows) == 1 else np.repeat(access, len(rows),
                                                                          axis=1), dist)

    def frag_of_one(row: list[int], cpu_left: int) -> float:
        # a row alone is reduced over its GPUs in integers and its F taken in one dot
        # product, so any order of its GPUs gives the same F, to the bit
        state = (tuple(sorted(row)), cpu_left, gpu_product)
        value = states.get(state)
        if value is None:
            value = states[state] = float(frag([row], cpu_left)[0]) if row else 0.0
        return value

    base = frag_of_one(gpu, cpu)
    table = [0.0]
    for _ in range(count):
        cpu -= cpu_milli
        if cpu < 0:
            break
        if gpus == 0:
            after = frag_of_one(gpu, cpu)
        elif gpus == 1 and gpu_milli < GPU_WHOLE:
            options = [j for j, free in enumerate(gpu) if free >= gpu_milli]
            if not options:
                break
            trials = []
            for j in options:
                trial = list(gpu)
                trial[j] -= gpu_milli
                trials.append(trial)
            values = frag(trials, cpu)
            best = int(np.argmin(values))
            after = float(values[best])
            gpu[options[best]] -= gpu_milli
        else:
            free_idx = [j for j, free in enumerate(gpu) if free == GPU_WHOLE][:gpus]
            if len(free_idx) < gpus:
                break
            for j in free_idx:
                gpu[j] = 0
            after = frag_of_one(gpu, cpu)
        table.append(after - base)
    memo[key] = tuple(table)
    return table


def fill_rank(nodes: Sequence[Node], island_min_gpus: int) -> dict[str, float]:
    """Each node's place in the fill order, scaled to [0, 1): nodes that are not GPU islands
    first, islands (≥ `island_min_gpus` GPUs) last, each in the given (cluster) order. An
    objective term w · rank(node) per node used makes successive gangs fill the same small
    nodes first and reach whole islands last (first fit with islands kept for the gangs
    that need them; on openb it beats FGD on allocation and on 8-GPU nodes kept whole)."""
    n = max(len(nodes), 1)
    order = sorted(range(len(nodes)),
                   key=lambda i: (nodes[i].gpu_count >= island_min_gpus, i))
    return {nodes[i].name: k / n for k, i in enumerate(order)}
