"""kube-scheduler's default scoring and its MostAllocated bin-packing variant, pod by pod.

default: NodeResourcesFit LeastAllocated + NodeResourcesBalancedAllocation over cpu and
memory (the default scoring resources; extended resources such as GPUs are not scored).
binpack: NodeResourcesFit MostAllocated over cpu, memory and nvidia.com/gpu, weight 1 each.
"""

from __future__ import annotations

import statistics

from nexus_admit.model import GPU_WHOLE, Fit, Node, PodSet
from nexus_admit.placement.baselines.podbypod import PodByPodPolicy, single_fit_options
from nexus_admit.placement.problem import Problem

__all__ = ["binpack_score", "default_score"]


def _used_fractions(node: Node, pod_set: PodSet, with_gpu: bool) -> list[float]:
    """Requested/allocatable after adding the pod, per scored resource."""
    cpu = (node.cpu_milli - node.free_cpu_milli + pod_set.cpu_milli) / max(node.cpu_milli, 1)
    mem = (node.memory_mib - node.free_memory_mib + pod_set.memory_mib) / max(node.memory_mib, 1)
    out = [cpu, mem]
    if with_gpu and node.gpu_count:
        used = node.used_gpu_milli + pod_set.gpu_milli_per_pod
        out.append(used / (node.gpu_count * GPU_WHOLE))
    return [min(f, 1.0) for f in out]


def default_score(node: Node, pod_set: PodSet, fit: Fit, problem: Problem) -> float:
    fractions = _used_fractions(node, pod_set, with_gpu=False)
    least_allocated = sum((1.0 - f) * 100 for f in fractions) / len(fractions)
    balanced = (1.0 - statistics.pstdev(fractions)) * 100
    return -(least_allocated + balanced)  # lower is better here


def binpack_score(node: Node, pod_set: PodSet, fit: Fit, problem: Problem) -> float:
    fractions = _used_fractions(node, pod_set, with_gpu=True)
    return -sum(f * 100 for f in fractions) / len(fractions)


def default_policy(seed: int) -> PodByPodPolicy:
    return PodByPodPolicy("default", single_fit_options(default_score))


def binpack_policy(seed: int) -> PodByPodPolicy:
    return PodByPodPolicy("binpack", single_fit_options(binpack_score))
