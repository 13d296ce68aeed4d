"""Hypothesis strategies for random small clusters and gangs (shared by the tests)."""

from __future__ import annotations

from hypothesis import strategies as st

from nexus_admit.model import (
    GPU_WHOLE,
    ClusterSnapshot,
    Gang,
    Node,
    NumaPolicy,
    NumaZone,
    PlacementConfig,
    PodSet,
    Taint,
    Toleration,
    WorkloadType,
)

RACK = "example.com/rack"
BLOCK = "example.com/block"
LEVELS = (BLOCK, RACK, "kubernetes.io/hostname")
PRODUCTS = (
    ("NVIDIA-H100-80GB-HBM3", 81559),
    ("NVIDIA-A100-SXM4-40GB", 40960),
    ("NVIDIA-L40S", 46068),
)
CONFIG = PlacementConfig.model_validate({"topology": {"levels": list(LEVELS)}})


@st.composite
def nodes(draw: st.DrawFn, name: str) -> Node:
    gpus = draw(st.sampled_from((0, 2, 4, 8)))
    product, vram = draw(st.sampled_from(PRODUCTS))
    free = [
        draw(st.sampled_from((GPU_WHOLE, GPU_WHOLE, GPU_WHOLE, 0, 500, 250))) for _ in range(gpus)
    ]
    cpu = draw(st.sampled_from((16_000, 64_000)))
    free_cpu = draw(st.integers(min_value=cpu // 4, max_value=cpu))
    half = gpus // 2
    zones = []
    if gpus and draw(st.booleans()):
        zones = [
            NumaZone(0, tuple(range(half)), cpu // 2, free_cpu // 2),
            NumaZone(1, tuple(range(half, gpus)), cpu // 2, free_cpu - free_cpu // 2),
        ]
    taints: tuple[Taint, ...] = ()
    if draw(st.integers(0, 5)) == 0:
        taints = (Taint("dedicated", "infer"),)
    return Node(
        name=name,
        labels={
            BLOCK: draw(st.sampled_from(("b0", "b1"))),
            RACK: draw(st.sampled_from(("r0", "r1"))),
            "pool": draw(st.sampled_from(("a", "b"))),
        },
        taints=taints,
        cpu_milli=cpu,
        memory_mib=262_144,
        max_pods=16,
        gpu_product=product if gpus else "",
        gpu_memory_mib=vram if gpus else 0,
        gpu_free=free,
        free_cpu_milli=free_cpu,
        free_memory_mib=draw(st.sampled_from((65_536, 262_144))),
        free_pods=draw(st.integers(2, 16)),
        numa_zones=zones,
        clique=draw(st.sampled_from((None, None, "c0"))) if gpus == 8 else None,
    )


@st.composite
def snapshots(draw: st.DrawFn, max_nodes: int = 4) -> ClusterSnapshot:
    n = draw(st.integers(1, max_nodes))
    return ClusterSnapshot.of([draw(nodes(f"n{i}")) for i in range(n)])


@st.composite
def pod_sets(draw: st.DrawFn, name: str, max_count: int = 3) -> PodSet:
    kind = draw(st.sampled_from(("cpu", "whole", "whole", "share")))
    gpus, milli = 0, GPU_WHOLE
    if kind == "whole":
        gpus = draw(st.sampled_from((1, 2, 4)))
    elif kind == "share":
        gpus, milli = 1, draw(st.sampled_from((250, 500)))
    return PodSet(
        name=name,
        count=draw(st.integers(1, max_count)),
        cpu_milli=draw(st.sampled_from((1000, 4000, 8000))),
        memory_mib=draw(st.sampled_from((1024, 16_384))),
        gpus=gpus,
        gpu_milli=milli,
        vram_mib=draw(st.sampled_from((0, 0, 20_000, 45_000))) if gpus else 0,
        tolerations=(Toleration("dedicated", "Exists"),) if draw(st.booleans()) else (),
        node_selector={"pool": "a"} if draw(st.integers(0, 4)) == 0 else {},
        indexed=draw(st.booleans()),
    )


@st.composite
def gangs(draw: st.DrawFn, max_sets: int = 2, max_count: int = 3) -> Gang:
    k = draw(st.integers(1, max_sets))
    return Gang(
        name="ns/g",
        pod_sets=tuple(draw(pod_sets(f"ps{i}", max_count)) for i in range(k)),
        tier=draw(st.sampled_from(("gold", "silver", "bronze"))),
        workload_type=draw(st.sampled_from(list(WorkloadType))),
        required_level=draw(st.sampled_from((None, None, RACK, BLOCK))),
        numa_policy=draw(st.sampled_from(list(NumaPolicy))),
    )
