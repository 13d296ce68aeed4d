"""BestFit and Random as defined in the FGD paper's simulator.

BestFit: the node with the least weighted leftover Σ_i w_i (free_i − req_i) / max_i over
cpu, memory and GPU (weights 1), i.e. the tightest node that still fits.
"""

from __future__ import annotations

from nexus_admit.model import GPU_WHOLE, Fit, Node, PodSet
from nexus_admit.placement.baselines.podbypod import (
    PodByPodPolicy,
    RandomPolicy,
    single_fit_options,
)
from nexus_admit.placement.problem import Problem

__all__ = ["bestfit_score"]


def bestfit_score(node: Node, pod_set: PodSet, fit: Fit, problem: Problem) -> float:
    leftover = (node.free_cpu_milli - pod_set.cpu_milli) / max(node.cpu_milli, 1)
    leftover += (node.free_memory_mib - pod_set.memory_mib) / max(node.memory_mib, 1)
    if node.gpu_count:
        leftover += (node.free_gpu_milli - pod_set.gpu_milli_per_pod) / (node.gpu_count * GPU_WHOLE)
    return leftover


def bestfit_policy(seed: int) -> PodByPodPolicy:
    return PodByPodPolicy("bestfit", single_fit_options(bestfit_score))


def random_policy(seed: int) -> RandomPolicy:
    return RandomPolicy(seed)
