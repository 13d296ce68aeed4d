"""The benchmark's Workloads: generated once from a seed, submitted identically to both phases.

Gangs of 1, 8 and 32 pods in three tiers (gold, silver, bronze). The first `burst` arrive
together, the rest as a steady stream. Each tier's GPU demand is kept within a share of its
own pool, so that under Kueue alone (quota = pool) every gang can eventually run at once
and the phase ends with all pods Running rather than with gangs waiting for capacity.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nexus_admit.kube import labels as L

TIERS = ("gold", "silver", "bronze")
GANG_SIZES = (1, 8, 32)
# 1-pod gangs are the most common, 32-pod gangs the rarest
GANG_SIZE_WEIGHTS = (0.5, 0.35, 0.15)
# GPUs per pod, by tier and gang size. Only gold (h100, Kueue TAS in the Kueue-alone phase)
# gets whole 8-GPU pods: on the plain flavors kube-scheduler spreads pods, and a whole-node
# pod could then find no empty node although the quota admitted it.
GPUS_PER_POD: dict[str, dict[int, tuple[int, ...]]] = {
    "gold": {1: (1, 2, 4, 8), 8: (1, 2, 4), 32: (1, 2)},
    "silver": {1: (1, 2, 4), 8: (1, 2), 32: (1,)},
    "bronze": {1: (1, 2), 8: (1,), 32: (1,)},
}
# the most of a pool's GPUs one tier's Workloads may ask for in total
POOL_BUDGET = 0.6

GPU = "nvidia.com/gpu"
QUEUE_LABEL = L.KUEUE_QUEUE_NAME_LABEL
WORKLOAD_LABEL = "bench.kubenexus.io/workload"
POD_COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"
PREFERRED_TOPOLOGY = L.KUEUE_PODSET_PREFERRED_TOPOLOGY
RACK_LABEL = "cloud.google.com/gce-topology-subblock"


@dataclass(frozen=True, slots=True)
class BenchWorkload:
    name: str
    tier: str
    pods: int
    gpus_per_pod: int
    arrival_s: float  # offset from the phase start

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod


def generate(
    count: int,
    seed: int,
    pool_gpus: Mapping[str, int],
    *,
    burst: int,
    stream_per_s: float,
    prefix: str = "wl",
    pool_budget: float | None = POOL_BUDGET,
) -> list[BenchWorkload]:
    """`count` Workloads, the same for the same arguments. `pool_gpus` maps each tier to the
    GPUs of the pool its Kueue-alone ClusterQueue covers; a gang that would take its tier
    over `pool_budget` of that in total is shrunk (fewer GPUs per pod, then fewer pods).
    None: no budget (the soak, where Workloads finish and free their GPUs)."""
    if count < 0 or burst < 0 or stream_per_s <= 0:
        raise ValueError("count and burst must be >= 0, stream_per_s > 0")
    rng = random.Random(seed)
    used = dict.fromkeys(TIERS, 0)
    out = []
    for i in range(count):
        tier = rng.choice(TIERS)
        pods = rng.choices(GANG_SIZES, weights=GANG_SIZE_WEIGHTS)[0]
        gpus = rng.choice(GPUS_PER_POD[tier][pods])
        budget = int(pool_gpus[tier] * pool_budget) if pool_budget is not None else None
        while budget is not None and used[tier] + pods * gpus > budget and (pods, gpus) != (1, 1):
            if gpus > 1:
                gpus //= 2
            else:
                pods = max(p for p in GANG_SIZES if p < pods)
        used[tier] += pods * gpus
        arrival = 0.0 if i < burst else (i - burst + 1) / stream_per_s
        out.append(
            BenchWorkload(f"{prefix}-{i:04d}-{tier}-{pods}x{gpus}", tier, pods, gpus, arrival)
        )
    return out


def demand_by_tier(workloads: list[BenchWorkload]) -> dict[str, int]:
    out = dict.fromkeys(TIERS, 0)
    for w in workloads:
        out[w.tier] += w.gpus
    return out


def job_manifest(
    w: BenchWorkload,
    queue: str,
    *,
    rack_preference: bool = False,
    complete_after: str | None = None,
    ttl_after_finished_s: int | None = None,
) -> dict[str, Any]:
    """An Indexed Job for `w` on LocalQueue `queue`. `rack_preference` asks Kueue TAS to keep
    the gang in one rack if it can (the Kueue-alone gold path); `complete_after` lets KWOK
    finish the pods after that long (the soak)."""
    annotations: dict[str, str] = {}
    if rack_preference and w.pods > 1:
        annotations[PREFERRED_TOPOLOGY] = RACK_LABEL
    if complete_after:
        annotations[POD_COMPLETE_DELAY] = complete_after
    requests = {"cpu": str(4 * w.gpus_per_pod), "memory": f"{16 * w.gpus_per_pod}Gi"}
    spec: dict[str, Any] = {
        "parallelism": w.pods,
        "completions": w.pods,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": {
            "metadata": {"labels": {WORKLOAD_LABEL: w.name}, "annotations": annotations},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "worker",
                        "image": "registry.invalid/nexus/worker:bench",
                        "resources": {
                            "requests": {**requests, GPU: str(w.gpus_per_pod)},
                            "limits": {GPU: str(w.gpus_per_pod)},
                        },
                    }
                ],
            },
        },
    }
    if ttl_after_finished_s is not None:
        spec["ttlSecondsAfterFinished"] = ttl_after_finished_s
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": w.name, "labels": {QUEUE_LABEL: queue, WORKLOAD_LABEL: w.name}},
        "spec": spec,
    }
