"""Synthetic heterogeneous GPU fleets, pre-loaded with realistic fragmentation.

Layout: zone > block (16 racks) > rack (8 nodes) > host. Racks are homogeneous: H100 (some
racks form an NVL-style clique), A100-40GB and L40 pools. Every node has 8 GPUs in two
NUMA zones of 4. Load is drawn per rack (busy racks next to idle ones, as in real fleets),
then per node: pristine, full, or partly used with a few GPUs taken and some shared.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from nexus_admit.model import (
    GPU_WHOLE,
    ClusterSnapshot,
    Gang,
    Node,
    NumaZone,
    PlacementConfig,
    PodSet,
    WorkloadType,
)

__all__ = ["BENCH_LEVELS", "GANG_SIZES", "bench_config", "bench_gang", "generate_fleet"]

ZONE = "topology.kubernetes.io/zone"
BLOCK = "cloud.google.com/gce-topology-block"
RACK = "cloud.google.com/gce-topology-subblock"
BENCH_LEVELS = (ZONE, BLOCK, RACK, "kubernetes.io/hostname")
NODES_PER_RACK = 8
RACKS_PER_BLOCK = 16
BLOCKS_PER_ZONE = 8

# product, VRAM MiB, share of racks, NVL clique probability for a rack
POOLS = (
    ("NVIDIA-H100-80GB-HBM3", 81559, 0.40, 0.5),
    ("NVIDIA-A100-SXM4-40GB", 40960, 0.35, 0.0),
    ("NVIDIA-L40", 46068, 0.25, 0.0),
)
GANG_SIZES = (1, 8, 64, 256)


@dataclass(frozen=True, slots=True)
class _Shape:
    cpu_milli: int = 128_000
    memory_mib: int = 1_048_576
    gpus: int = 8


def bench_config(time_limit: float = 1.0) -> PlacementConfig:
    return PlacementConfig.model_validate(
        {"topology": {"levels": list(BENCH_LEVELS)}, "solver": {"timeLimitSeconds": time_limit}}
    )


def _load_node(node: Node, load: float, rng: random.Random) -> None:
    """Take GPUs (and proportional CPU/memory) from `node` to reach about `load`."""
    roll = rng.random()
    if roll > load * 1.15:
        return  # pristine
    if roll < load * 0.8:
        used = node.gpu_count  # fully busy
    else:
        used = rng.choice((1, 2, 3, 4, 5, 6, 7))
    order = list(range(node.gpu_count))
    rng.shuffle(order)
    for g in order[:used]:
        node.gpu_free[g] = 0
    if used < node.gpu_count and rng.random() < 0.25:
        node.gpu_free[order[used]] = rng.choice((250, 500, 750))  # a shared GPU
    taken = node.gpu_count * GPU_WHOLE - node.free_gpu_milli
    frac = taken / (node.gpu_count * GPU_WHOLE)
    node.free_cpu_milli = int(node.cpu_milli * (1 - 0.8 * frac))
    node.free_memory_mib = int(node.memory_mib * (1 - 0.8 * frac))
    node.free_pods = node.max_pods - used * 2
    for z in node.numa_zones:
        zone_taken = sum(GPU_WHOLE - node.gpu_free[i] for i in z.gpu_indices)
        z.free_cpu_milli = int(z.cpu_milli * (1 - 0.8 * zone_taken / (4 * GPU_WHOLE)))


def generate_fleet(
    nodes: int, seed: int = 0, load: tuple[float, float] = (0.4, 0.8)
) -> ClusterSnapshot:
    """A fleet of `nodes` 8-GPU nodes, loaded to a level drawn from `load`."""
    rng = random.Random(seed)
    shape = _Shape()
    target = rng.uniform(*load)
    out: list[Node] = []
    racks = -(-nodes // NODES_PER_RACK)
    for r in range(racks):
        block = r // RACKS_PER_BLOCK
        zone = block // BLOCKS_PER_ZONE
        product, vram, _, clique_p = rng.choices(POOLS, weights=[p[2] for p in POOLS])[0]
        clique = f"nvl-{r}" if rng.random() < clique_p else None
        rack_load = min(1.0, max(0.0, rng.gauss(target, 0.25)))
        for i in range(NODES_PER_RACK):
            if len(out) == nodes:
                break
            name = f"gpu-{r:04d}-{i}"
            half = shape.cpu_milli // 2
            node = Node(
                name=name,
                labels={
                    ZONE: f"zone-{zone}",
                    BLOCK: f"block-{block}",
                    RACK: f"rack-{r}",
                    "kubernetes.io/hostname": name,
                    "nvidia.com/gpu.product": product,
                },
                cpu_milli=shape.cpu_milli,
                memory_mib=shape.memory_mib,
                max_pods=110,
                gpu_product=product,
                gpu_memory_mib=vram,
                gpu_free=[GPU_WHOLE] * shape.gpus,
                free_cpu_milli=shape.cpu_milli,
                free_memory_mib=shape.memory_mib,
                free_pods=110,
                numa_zones=[
                    NumaZone(0, (0, 1, 2, 3), half, half),
                    NumaZone(1, (4, 5, 6, 7), half, half),
                ],
                clique=clique,
            )
            _load_node(node, rack_load, rng)
            out.append(node)
    return ClusterSnapshot.of(out)


# gang size -> (name, pod set, tier, workload type, preferred topology level)
_GANGS: dict[int, tuple[str, PodSet, str, WorkloadType, str | None]] = {
    1: (
        "inference-1",
        PodSet("server", 1, cpu_milli=8000, memory_mib=65536, gpus=1, vram_mib=24 * 1024),
        "silver",
        WorkloadType.INFERENCE,
        None,
    ),
    8: (
        "train-8",
        PodSet(
            "workers",
            8,
            cpu_milli=96000,
            memory_mib=786432,
            gpus=8,
            vram_mib=70 * 1024,
            indexed=True,
        ),
        "gold",
        WorkloadType.TRAINING,
        RACK,
    ),
    64: (
        "train-64",
        PodSet(
            "workers",
            64,
            cpu_milli=40000,
            memory_mib=262144,
            gpus=4,
            vram_mib=30 * 1024,
            indexed=True,
        ),
        "gold",
        WorkloadType.TRAINING,
        BLOCK,
    ),
    256: (
        "batch-256",
        PodSet("tasks", 256, cpu_milli=4000, memory_mib=16384, gpus=1, vram_mib=16 * 1024),
        "bronze",
        WorkloadType.BATCH,
        None,
    ),
}


def bench_gang(size: int) -> Gang:
    """The benchmark's gang of `size` pods (1, 8, 64 or 256), each a realistic shape."""
    try:
        name, pod_set, tier, kind, preferred = _GANGS[size]
    except KeyError:
        raise ValueError(f"no bench gang of size {size}; sizes: {GANG_SIZES}") from None
    return Gang(
        f"bench/{name}", (pod_set,), tier=tier, workload_type=kind, preferred_level=preferred
    )
