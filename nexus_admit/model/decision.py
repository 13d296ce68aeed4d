"""What the engine answers (Placement) and how a placement takes and gives back capacity.

`fit_pod` is the single definition of "this pod fits on this node now" (CPU, memory, pod
slots, GPUs with their shares, NUMA alignment); every policy, the slot builder, the
validator and the simulator use it.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from nexus_admit.model.cluster import GPU_WHOLE, ClusterSnapshot, Node
from nexus_admit.model.gang import Gang, NumaPolicy, PodSet

__all__ = [
    "Assignment",
    "Fit",
    "Placement",
    "Slot",
    "SolveStatus",
    "apply_slots",
    "fit_pod",
    "pod_capacity",
    "release_slots",
]


class SolveStatus(enum.StrEnum):
    OPTIMAL = "optimal"  # proven optimal for the model that was solved
    FEASIBLE = "feasible"  # a solution, optimality not proven within the time limit
    INFEASIBLE = "infeasible"  # no placement exists now
    IMPOSSIBLE = "impossible"  # no placement can ever exist (e.g. no GPU has enough VRAM)
    # no node may take it now, though nodes of its shape exist (cordoned, tainted, NotReady,
    # not there yet): it waits for one, where a gang merely short of room is retried
    UNAVAILABLE = "unavailable"
    HEURISTIC = "heuristic"  # a baseline's answer (no optimality claim)


@dataclass(frozen=True, slots=True)
class Slot:
    """One pod's place: node, the GPU devices (indices on the node), NUMA zone."""

    pod_set: str
    index: int
    node: str
    gpu_indices: tuple[int, ...] = ()
    numa_zone: int | None = None


@dataclass(frozen=True, slots=True)
class Assignment:
    pod_set: str
    node: str
    pods: int
    gpus: int  # distinct GPU devices touched
    numa_zones: tuple[int, ...]


@dataclass(slots=True)
class Placement:
    gang: str
    policy: str
    feasible: bool
    status: SolveStatus
    slots: list[Slot] = field(default_factory=list)
    reason: str = ""
    terms: dict[str, float] = field(default_factory=dict)
    objective: float = 0.0
    solve_seconds: float = 0.0
    # the solver's own objective for `slots` (same units as `objective`); None for policies
    # that do not solve a model
    model_objective: float | None = None
    explanation: list[str] = field(default_factory=list)
    # an infeasible placement that is a deliberate hold (PlacementConfig.localityWait): ask
    # again after this long at the latest, when the hold ends
    retry_after_seconds: float | None = None
    # whether deciding derived the gang's facts over every candidate node, O(fleet), for
    # want of facts kept from earlier decisions (the first of a pod shape, or after the
    # snapshot was renewed); None: a policy that keeps no facts
    fleet_scan: bool | None = None

    @property
    def retryable(self) -> bool:
        """Infeasible now but could fit later (Kueue Retry) rather than never (Rejected)."""
        return not self.feasible and self.status is not SolveStatus.IMPOSSIBLE

    def assignments(self) -> list[Assignment]:
        grouped: dict[tuple[str, str], list[Slot]] = defaultdict(list)
        for slot in self.slots:
            grouped[(slot.pod_set, slot.node)].append(slot)
        out = []
        for (pod_set, node), slots in grouped.items():
            zones = sorted({s.numa_zone for s in slots if s.numa_zone is not None})
            gpus = len({g for s in slots for g in s.gpu_indices})
            out.append(Assignment(pod_set, node, len(slots), gpus, tuple(zones)))
        return out

    def pods_per_node(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for slot in self.slots:
            counts[slot.node] += 1
        return dict(counts)


@dataclass(frozen=True, slots=True)
class Fit:
    gpu_indices: tuple[int, ...]
    numa_zone: int | None
    numa_aligned: bool


def _zone_cpu_ok(node: Node, zone_id: int, cpu: int) -> bool:
    return any(z.id == zone_id and z.free_cpu_milli >= cpu for z in node.numa_zones)


def fit_pod(
    node: Node,
    pod_set: PodSet,
    numa_policy: NumaPolicy = NumaPolicy.PREFERRED,
    gpu_choice: int | None = None,
) -> Fit | None:
    """Where on `node` one pod of `pod_set` would go now, or None if it does not fit.

    Whole GPUs come from one NUMA zone when possible (required under single-numa-node);
    a GPU share goes to the fullest GPU that still has room (or `gpu_choice` if given),
    among them first one whose NUMA zone has the pod's CPUs free.
    """
    if (
        node.free_pods < 1
        or node.free_cpu_milli < pod_set.cpu_milli
        or node.free_memory_mib < pod_set.memory_mib
    ):
        return None
    strict = numa_policy is NumaPolicy.SINGLE_NUMA_NODE and bool(node.numa_zones)
    if pod_set.gpus == 0:
        zones = sorted(node.numa_zones, key=lambda z: -z.free_cpu_milli)
        for z in zones:
            if z.free_cpu_milli >= pod_set.cpu_milli:
                return Fit((), z.id, True)
        if strict:
            return None
        return Fit((), None, not node.numa_zones)
    if pod_set.fractional:
        need = pod_set.gpu_milli
        if gpu_choice is not None:
            candidates = [gpu_choice] if node.gpu_free[gpu_choice] >= need else []
        else:
            candidates = sorted(
                (i for i, free in enumerate(node.gpu_free) if free >= need),
                key=lambda i: (node.gpu_free[i], i),
            )
        unaligned: int | None = None
        for i in candidates:
            zone = node.numa_zone_of_gpu(i)
            if zone is None or _zone_cpu_ok(node, zone, pod_set.cpu_milli):
                return Fit((i,), zone, True)
            if unaligned is None:
                unaligned = i
        if strict or unaligned is None:
            return None
        # no GPU with room sits in a zone with the pod's CPUs free: no zone is reported
        return Fit((unaligned,), None, False)
    free = [i for i, f in enumerate(node.gpu_free) if f == GPU_WHOLE]
    if len(free) < pod_set.gpus:
        return None
    # Prefer one NUMA zone: the fullest zone that still has enough whole GPUs and CPU.
    options = []
    for z in node.numa_zones:
        zfree = [i for i in z.gpu_indices if node.gpu_free[i] == GPU_WHOLE]
        if len(zfree) >= pod_set.gpus and z.free_cpu_milli >= pod_set.cpu_milli:
            options.append((len(zfree), z.id, tuple(zfree[: pod_set.gpus])))
    if options:
        _, zone_id, gpus = min(options)
        return Fit(gpus, zone_id, True)
    if strict:
        return None
    return Fit(tuple(free[: pod_set.gpus]), None, not node.numa_zones)


def pod_capacity(
    node: Node, pod_set: PodSet, numa_policy: NumaPolicy = NumaPolicy.PREFERRED
) -> int:
    """How many pods of `pod_set` alone fit on `node` now (an upper bound the engine uses
    for its integer variables; exact for a single pod set)."""
    cap = node.free_pods
    if pod_set.cpu_milli:
        cap = min(cap, node.free_cpu_milli // pod_set.cpu_milli)
    if pod_set.memory_mib:
        cap = min(cap, node.free_memory_mib // pod_set.memory_mib)
    strict = numa_policy is NumaPolicy.SINGLE_NUMA_NODE and bool(node.numa_zones)
    if cap <= 0:
        return 0
    if pod_set.gpus == 0:
        if strict and pod_set.cpu_milli:
            cap = min(cap, sum(z.free_cpu_milli // pod_set.cpu_milli for z in node.numa_zones))
        return cap
    if pod_set.fractional:
        per_gpu = [free // pod_set.gpu_milli for free in node.gpu_free]
        if strict:
            total = 0
            for z in node.numa_zones:
                zone_pods = sum(per_gpu[i] for i in z.gpu_indices)
                if pod_set.cpu_milli:
                    zone_pods = min(zone_pods, z.free_cpu_milli // pod_set.cpu_milli)
                total += zone_pods
            return min(cap, total)
        return min(cap, sum(per_gpu))
    if strict:
        total = 0
        for z in node.numa_zones:
            zfree = sum(1 for i in z.gpu_indices if node.gpu_free[i] == GPU_WHOLE)
            zone_pods = zfree // pod_set.gpus
            if pod_set.cpu_milli:
                zone_pods = min(zone_pods, z.free_cpu_milli // pod_set.cpu_milli)
            total += zone_pods
        return min(cap, total)
    return min(cap, node.free_whole_gpus // pod_set.gpus)


def _take(node: Node, pod_set: PodSet, slot: Slot, sign: int, floor: int | None = None) -> None:
    def sub(value: int, amount: int) -> int:
        left = value - sign * amount
        return left if floor is None else max(floor, left)

    node.free_cpu_milli = sub(node.free_cpu_milli, pod_set.cpu_milli)
    node.free_memory_mib = sub(node.free_memory_mib, pod_set.memory_mib)
    node.free_pods = sub(node.free_pods, 1)
    for g in slot.gpu_indices:
        if 0 <= g < len(node.gpu_free):
            node.gpu_free[g] = sub(node.gpu_free[g], pod_set.gpu_milli)
    if slot.numa_zone is not None:
        for z in node.numa_zones:
            if z.id == slot.numa_zone:
                z.free_cpu_milli = sub(z.free_cpu_milli, pod_set.cpu_milli)


def apply_slots(
    snapshot: ClusterSnapshot, gang: Gang, slots: Sequence[Slot], *, clamp: bool = False
) -> None:
    """Take the capacity of `slots` from `snapshot` (in place). `clamp` stops at zero: for
    capacity that may overlap what the snapshot already counts (a promise the cluster may
    already show, a reservation held while the pods it waits for still run); a clamped
    take cannot be given back exactly."""
    by_name = {p.name: p for p in gang.pod_sets}
    for slot in slots:
        _take(snapshot.nodes[slot.node], by_name[slot.pod_set], slot, +1, 0 if clamp else None)


def release_slots(snapshot: ClusterSnapshot, gang: Gang, slots: Sequence[Slot]) -> None:
    """Give the capacity of `slots` back to `snapshot` (in place)."""
    by_name = {p.name: p for p in gang.pod_sets}
    for slot in slots:
        _take(snapshot.nodes[slot.node], by_name[slot.pod_set], slot, -1)
