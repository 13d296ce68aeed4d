"""The baselines of the FGD paper's simulator (Weng et al., USENIX ATC 2023), written from
their published definitions, scored the way that simulator scores them: every plugin gives
an integer score in [0, 100] per feasible node, the highest wins, ties go to the node first
in a fixed order of the nodes drawn from the run's seed (that simulator prefixes node names
with a seeded permutation and keeps the first best node); the GPU a shared pod goes to is
chosen by best fit unless the policy says otherwise. Resources are normalised by the
largest node spec (128 CPUs, 8 GPUs).

* paper-random: a uniformly random feasible node; a random GPU that fits for a shared pod.
* dotprod: Tetris-style alignment of the request and free vectors (CPU, total GPU share)
  normalised by the largest spec; the smallest dot product scores highest.
* gpu-clustering: put pods with the same GPU request kind (shared, 1-, 2-, 4-, 8-GPU)
  together: nodes holding only that kind first, then nodes holding it among others, then
  GPU-idle nodes, then the rest; fuller nodes first within each band.
* gpu-packing: a partly used GPU first, then free GPUs on a partly used node, then a GPU-idle
  node (smaller nodes first).
* paper-bestfit: least weighted leftover ½·(CPU left − CPU asked)/128 CPUs +
  ½·(GPU left − GPU asked)/8 GPUs.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from nexus_admit.model import GPU_WHOLE, PodSet
from nexus_admit.placement.baselines.vector import (
    FloatArray,
    IntArray,
    NodeMirror,
    VectorPolicy,
)

__all__ = [
    "MAX_SPEC_CPU",
    "MAX_SPEC_GPU",
    "BestFitPaperPolicy",
    "DotProductPolicy",
    "GpuClusteringPolicy",
    "GpuPackingPolicy",
    "RandomPaperPolicy",
]

MAX_SPEC_CPU = 128_000  # milli-CPU of the largest node
MAX_SPEC_GPU = 8 * GPU_WHOLE  # milli-GPU of the largest node
MAX_SCORE = 100


def _no_choice(idx: IntArray) -> IntArray:
    return np.full(len(idx), -1, dtype=np.int64)


class RandomPaperPolicy(VectorPolicy):
    tie_break = "random"

    def __init__(self, seed: int = 0) -> None:
        super().__init__("paper-random", seed)

    def scores(self, m: NodeMirror, idx: IntArray, ps: PodSet) -> tuple[FloatArray, IntArray]:
        return np.zeros(len(idx)), _no_choice(idx)

    def choose_gpu(self, m: NodeMirror, i: int, ps: PodSet, hint: int) -> int:
        fitting = np.flatnonzero(m.gpu[i] >= ps.gpu_milli)
        return int(fitting[self._rng.integers(len(fitting))])


class DotProductPolicy(VectorPolicy):
    def __init__(self, seed: int = 0) -> None:
        super().__init__("dotprod", seed)

    def scores(self, m: NodeMirror, idx: IntArray, ps: PodSet) -> tuple[FloatArray, IntArray]:
        free_cpu = m.cpu[idx] / MAX_SPEC_CPU
        free_gpu = m.gpu[idx].sum(axis=1) / MAX_SPEC_GPU
        dot = free_cpu * (ps.cpu_milli / MAX_SPEC_CPU)
        dot += free_gpu * (ps.gpu_milli_per_pod / MAX_SPEC_GPU)
        return np.floor(MAX_SCORE * (1.0 - dot / 2.0)), _no_choice(idx)


class BestFitPaperPolicy(VectorPolicy):
    def __init__(self, seed: int = 0) -> None:
        super().__init__("paper-bestfit", seed)

    def scores(self, m: NodeMirror, idx: IntArray, ps: PodSet) -> tuple[FloatArray, IntArray]:
        left = 0.5 * (m.cpu[idx] - ps.cpu_milli) / MAX_SPEC_CPU
        left += 0.5 * (m.gpu[idx].sum(axis=1) - ps.gpu_milli_per_pod) / MAX_SPEC_GPU
        return np.floor((1.0 - left) * MAX_SCORE), _no_choice(idx)


class GpuPackingPolicy(VectorPolicy):
    def __init__(self, seed: int = 0) -> None:
        super().__init__("gpu-packing", seed)

    def scores(self, m: NodeMirror, idx: IntArray, ps: PodSet) -> tuple[FloatArray, IntArray]:
        if not ps.gpus:
            return np.zeros(len(idx)), _no_choice(idx)
        gpu = m.gpu[idx]
        count = m.gpu_count[idx]
        full = (gpu == GPU_WHOLE).sum(axis=1)
        idle_node = full == count
        score = np.maximum(MAX_SCORE // 3 - full, full).astype(np.float64)
        if ps.fractional:
            # the GPU best fit would take: the smallest free share that still fits
            fit_free = np.where(gpu >= ps.gpu_milli, gpu, GPU_WHOLE + 1).min(axis=1)
            uses_free_gpu = fit_free == GPU_WHOLE
            shared = np.maximum(MAX_SCORE - (fit_free * 100 // GPU_WHOLE) // 10, MAX_SCORE // 2)
            partial = np.where(uses_free_gpu, max(MAX_SCORE // 2 - 1, MAX_SCORE // 3), shared)
        else:
            partial = np.full(len(idx), max(MAX_SCORE // 2 - ps.gpus, MAX_SCORE // 3))
        score = np.where(idle_node, score, partial)
        return score.astype(np.float64), _no_choice(idx)


def _tag(ps: PodSet) -> str | None:
    if not ps.gpus:
        return None
    return "share" if ps.fractional else f"{ps.gpus}-gpu"


class GpuClusteringPolicy(VectorPolicy):
    """The kinds of GPU pods on each node are tracked from this policy's own placements
    (a snapshot holds free capacity, not pod shapes); a node found GPU-idle is reset."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__("gpu-clustering", seed)
        self._tags: dict[str, Counter[str]] = {}

    def shape_key(self, ps: PodSet) -> tuple[object, ...]:
        return (*super().shape_key(ps), _tag(ps))

    def placed(self, m: NodeMirror, i: int, ps: PodSet) -> None:
        tag = _tag(ps)
        if tag is not None:
            self._tags.setdefault(m.names[i], Counter())[tag] += 1

    def scores(self, m: NodeMirror, idx: IntArray, ps: PodSet) -> tuple[FloatArray, IntArray]:
        tag = _tag(ps)
        if tag is None:
            return np.zeros(len(idx)), _no_choice(idx)
        left = m.gpu[idx].sum(axis=1)
        idle = left == m.gpu_count[idx] * GPU_WHOLE
        band = np.zeros(len(idx))
        for k, i in enumerate(idx.tolist()):
            name = m.names[i]
            tags = self._tags.get(name)
            if idle[k] and tags:
                del self._tags[name]
                tags = None
            if not tags:
                band[k] = 25
            elif tags.get(tag, 0) > 0:
                band[k] = 75 if len(tags) == 1 else 50
        bonus = (MAX_SCORE // 4) * (MAX_SPEC_GPU - left) // MAX_SPEC_GPU
        return band + bonus, _no_choice(idx)


def paper_random_policy(seed: int) -> RandomPaperPolicy:
    return RandomPaperPolicy(seed)


def dotprod_policy(seed: int) -> DotProductPolicy:
    return DotProductPolicy(seed)


def paper_bestfit_policy(seed: int) -> BestFitPaperPolicy:
    return BestFitPaperPolicy(seed)


def gpu_packing_policy(seed: int) -> GpuPackingPolicy:
    return GpuPackingPolicy(seed)


def gpu_clustering_policy(seed: int) -> GpuClusteringPolicy:
    return GpuClusteringPolicy(seed)
