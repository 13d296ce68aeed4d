"""FGD, Fragmentation Gradient Descent (Weng et al., USENIX ATC 2023), from its definition:
put the pod on the node, and for a shared pod on the GPU, where the node's fragmentation
(`placement.fragmentation`) grows least for the target workload's typical pod shapes.

Scored like the paper's simulator: score = ⌊100 · sigmoid((F_before − F_after)/1000)⌋, the
highest-scoring feasible node wins, ties to the node first in a fixed order drawn from
the seed (not a fresh draw per pod); on a node, the first GPU
(by index) with the best score. Whole-GPU pods take the first free GPUs.

The workload distribution comes from `set_workload` (the simulator builds it from the
trace); `make_policy("fgd")` starts with `WorkloadDistribution.default()`.
"""

from __future__ import annotations

import numpy as np

from nexus_admit.model import GPU_WHOLE, PodSet
from nexus_admit.placement.baselines.vector import (
    FloatArray,
    IntArray,
    NodeMirror,
    VectorPolicy,
)
from nexus_admit.placement.fragmentation import WorkloadDistribution, node_fragmentation

__all__ = ["FgdPolicy", "fgd_scores"]

MAX_SCORE = 100


def _score(before: FloatArray, after: FloatArray) -> FloatArray:
    return np.floor(MAX_SCORE / (1.0 + np.exp(-(before - after) / GPU_WHOLE)))


def fgd_scores(
    m: NodeMirror, idx: IntArray, ps: PodSet, dist: WorkloadDistribution
) -> tuple[FloatArray, IntArray, FloatArray]:
    """(score, GPU choice for a shared pod or -1, fragmentation increase) for nodes `idx`."""
    access = dist.access_matrix(m.models)[:, idx]
    gpu = m.gpu[idx]
    cpu = m.cpu[idx]
    before = node_fragmentation(gpu, cpu, access, dist)
    cpu_after = cpu - ps.cpu_milli
    if ps.fractional:
        best = np.full(len(idx), -np.inf)
        delta = np.full(len(idx), np.inf)
        choice = np.full(len(idx), -1, dtype=np.int64)
        for j in range(gpu.shape[1]):
            fits = gpu[:, j] >= ps.gpu_milli
            if not fits.any():
                continue
            after_gpu = gpu.copy()
            after_gpu[:, j] -= ps.gpu_milli
            after = node_fragmentation(after_gpu, cpu_after, access, dist)
            score = _score(before, after)
            better = fits & (score > best)
            best = np.where(better, score, best)
            delta = np.where(better, after - before, delta)
            choice = np.where(better, j, choice)
        return np.where(choice >= 0, best, 0.0), choice, delta
    after_gpu = gpu
    if ps.gpus:
        full = gpu == GPU_WHOLE
        taken = full & (np.cumsum(full, axis=1) <= ps.gpus)
        after_gpu = np.where(taken, 0, gpu)
    after = node_fragmentation(after_gpu, cpu_after, access, dist)
    return _score(before, after), np.full(len(idx), -1, dtype=np.int64), after - before


class FgdPolicy(VectorPolicy):
    def __init__(self, seed: int = 0, workload: WorkloadDistribution | None = None) -> None:
        super().__init__("fgd", seed)
        self.workload = workload or WorkloadDistribution.default()

    def set_workload(self, dist: WorkloadDistribution) -> None:
        self.workload = dist
        self._cache.clear()

    def scores(self, m: NodeMirror, idx: IntArray, ps: PodSet) -> tuple[FloatArray, IntArray]:
        score, choice, _ = fgd_scores(m, idx, ps, self.workload)
        return score, choice


def fgd_policy(seed: int) -> FgdPolicy:
    return FgdPolicy(seed)
