"""The cluster as the engine sees it: nodes with their free capacity, GPUs, NUMA zones,
islands and topology path.

Units throughout the model: CPU in millicores, memory in MiB, GPU share in milli-GPUs
(1000 = one whole GPU), VRAM in MiB. Free capacity is already net of bound pods and of
other workloads' live reservations (the kube/ layer computes it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

__all__ = [
    "GPU_WHOLE",
    "ClusterSnapshot",
    "Node",
    "NumaZone",
    "Taint",
]

GPU_WHOLE = 1000  # milli-GPUs in one whole GPU


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(slots=True)
class NumaZone:
    """One NUMA zone of a node: which GPUs hang off it and the CPU free there."""

    id: int
    gpu_indices: tuple[int, ...]
    cpu_milli: int
    free_cpu_milli: int


@dataclass(slots=True)
class Node:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    # allocatable
    cpu_milli: int = 0
    memory_mib: int = 0
    max_pods: int = 110
    # GPUs: one entry per device, the share still free on it (GPU_WHOLE = untouched)
    gpu_product: str = ""
    gpu_memory_mib: int = 0
    gpu_free: list[int] = field(default_factory=list)
    # free (allocatable minus what is bound or reserved)
    free_cpu_milli: int = 0
    free_memory_mib: int = 0
    free_pods: int = 110
    numa_zones: list[NumaZone] = field(default_factory=list)
    # NVLink domain spanning several nodes (nvidia.com/gpu.clique); None = node-local only
    clique: str | None = None
    schedulable: bool = True

    # ---- GPU views ----
    @property
    def gpu_count(self) -> int:
        return len(self.gpu_free)

    @property
    def free_whole_gpus(self) -> int:
        return self.gpu_free.count(GPU_WHOLE)  # C's count: read per node of every scan

    @property
    def free_gpu_milli(self) -> int:
        return sum(self.gpu_free)

    @property
    def used_gpu_milli(self) -> int:
        return self.gpu_count * GPU_WHOLE - self.free_gpu_milli

    def is_pristine(self) -> bool:
        """A node none of whose GPUs is in use (the node-local NVSwitch island is whole)."""
        free = self.gpu_free
        return bool(free) and free.count(GPU_WHOLE) == len(free)

    def numa_zone_of_gpu(self, gpu_index: int) -> int | None:
        for zone in self.numa_zones:
            if gpu_index in zone.gpu_indices:
                return zone.id
        return None

    def emptied(self) -> Node:
        """This node with nothing running on it: its capacity rather than what is free now."""
        node = self.copy()
        node.gpu_free = [GPU_WHOLE] * self.gpu_count
        node.free_cpu_milli = self.cpu_milli
        node.free_memory_mib = self.memory_mib
        node.free_pods = self.max_pods
        node.numa_zones = [NumaZone(z.id, z.gpu_indices, z.cpu_milli, z.cpu_milli)
                           for z in self.numa_zones]
        return node

    def copy(self) -> Node:
        return Node(
            name=self.name,
            labels=self.labels,  # labels and taints are never mutated by placement
            taints=self.taints,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            max_pods=self.max_pods,
            gpu_product=self.gpu_product,
            gpu_memory_mib=self.gpu_memory_mib,
            gpu_free=list(self.gpu_free),
            free_cpu_milli=self.free_cpu_milli,
            free_memory_mib=self.free_memory_mib,
            free_pods=self.free_pods,
            numa_zones=[
                NumaZone(z.id, z.gpu_indices, z.cpu_milli, z.free_cpu_milli)
                for z in self.numa_zones
            ],
            clique=self.clique,
            schedulable=self.schedulable,
        )


@dataclass(slots=True)
class ClusterSnapshot:
    """Nodes by name plus the Kueue Topology objects known (name → level label keys)."""

    nodes: dict[str, Node] = field(default_factory=dict)
    kueue_topologies: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Facts derived from labels/taints only (never from free capacity), memoised by the
    # placement layer across calls; cleared whenever the node set changes.
    static_cache: dict[object, object] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(
        cls, nodes: Iterable[Node], kueue_topologies: Mapping[str, tuple[str, ...]] | None = None
    ) -> ClusterSnapshot:
        return cls({n.name: n for n in nodes}, dict(kueue_topologies or {}))

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def __len__(self) -> int:
        return len(self.nodes)

    def copy(self) -> ClusterSnapshot:
        # Copies keep the same nodes by name and labels, so the static cache stays valid.
        return ClusterSnapshot(
            {name: n.copy() for name, n in self.nodes.items()},
            dict(self.kueue_topologies),
            self.static_cache,
        )

    @property
    def total_gpus(self) -> int:
        return sum(n.gpu_count for n in self.nodes.values())

    @property
    def allocated_gpu_milli(self) -> int:
        return sum(n.used_gpu_milli for n in self.nodes.values())

    def pristine_cliques(self) -> set[str]:
        """NVLink cliques all of whose nodes are pristine."""
        broken: set[str] = set()
        seen: set[str] = set()
        for n in self.nodes.values():
            if n.clique is None:
                continue
            seen.add(n.clique)
            if not n.is_pristine():
                broken.add(n.clique)
        return seen - broken
