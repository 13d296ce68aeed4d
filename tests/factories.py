"""Small hand-built nodes, snapshots and configs for the model and placement scenario tests.

Every node has 8 GPUs (unless told otherwise) in two NUMA zones of 4, lives in a rack of a
block, and has plenty of CPU, memory and pod slots, so a scenario only states what matters
to it: which GPUs are taken, the product, the rack.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nexus_admit.model import (
    GPU_WHOLE,
    ClusterSnapshot,
    Node,
    NumaZone,
    PlacementConfig,
    Taint,
)

BLOCK = "example.com/block"
RACK = "example.com/rack"
HOST = "kubernetes.io/hostname"
LEVELS = (BLOCK, RACK, HOST)

H100 = ("NVIDIA-H100-80GB-HBM3", 81559)  # premium
A100 = ("NVIDIA-A100-SXM4-80GB", 81920)  # standard
L40S = ("NVIDIA-L40S", 46068)  # standard
T4 = ("Tesla-T4", 15360)  # economy (matched only by "*")


def gpu_node(
    name: str,
    *,
    gpu: tuple[str, int] = H100,
    gpus: int = 8,
    used: Iterable[int] = (),
    shares: Mapping[int, int] | None = None,
    rack: str = "r0",
    block: str = "b0",
    labels: Mapping[str, str] | None = None,
    taints: tuple[Taint, ...] = (),
    cpu_milli: int = 128_000,
    memory_mib: int = 1_048_576,
    free_pods: int = 110,
    numa: bool = True,
    clique: str | None = None,
) -> Node:
    """A node whose GPUs in `used` are fully taken and whose GPUs in `shares` have that
    much share (milli) still free; CPU is free in proportion to the zones' GPUs."""
    product, vram = gpu
    free = [GPU_WHOLE] * gpus
    for g in used:
        free[g] = 0
    for g, share in (shares or {}).items():
        free[g] = share
    zones: list[NumaZone] = []
    if numa and gpus:
        half = gpus // 2
        zones = [
            NumaZone(0, tuple(range(half)), cpu_milli // 2, cpu_milli // 2),
            NumaZone(1, tuple(range(half, gpus)), cpu_milli // 2, cpu_milli // 2),
        ]
    all_labels = {BLOCK: block, RACK: rack, HOST: name}
    if gpus:
        all_labels["nvidia.com/gpu.product"] = product
    all_labels.update(labels or {})
    return Node(
        name=name,
        labels=all_labels,
        taints=taints,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        max_pods=110,
        gpu_product=product if gpus else "",
        gpu_memory_mib=vram if gpus else 0,
        gpu_free=free,
        free_cpu_milli=cpu_milli,
        free_memory_mib=memory_mib,
        free_pods=free_pods,
        numa_zones=zones,
        clique=clique,
    )


def snapshot(*nodes: Node, **kueue_topologies: tuple[str, ...]) -> ClusterSnapshot:
    return ClusterSnapshot.of(nodes, kueue_topologies)


def config(
    levels: tuple[str, ...] = LEVELS, time_limit: float = 10.0, **spec: object
) -> PlacementConfig:
    """A config with explicit levels and a time limit generous enough to prove optimality
    of the tiny scenarios (they solve in milliseconds; the limit only guards slow CI)."""
    return PlacementConfig.from_spec(
        {"topology": {"levels": list(levels)}, "solver": {"timeLimitSeconds": time_limit}, **spec}
    )


def node_state(snap: ClusterSnapshot) -> dict[str, tuple[object, ...]]:
    """Everything placement may change on a node, for before/after comparisons."""
    return {
        n.name: (
            tuple(n.gpu_free),
            n.free_cpu_milli,
            n.free_memory_mib,
            n.free_pods,
            tuple((z.id, z.free_cpu_milli) for z in n.numa_zones),
        )
        for n in snap
    }
