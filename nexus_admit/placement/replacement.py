"""Where a reserved slot whose node failed goes: a node of the same domain with room now.

Who calls it: `controller/failed_nodes.py`, for the slots of a reservation whose node was
deleted, cordoned or went NotReady while no live pod of the gang held them. As Kueue TAS
replaces a failed node (`findReplacementAssignment`: the rest of the assignment kept, the
failed node's pods placed again inside the domain the request requires), only those slots
move; the gang's other slots, and its pods that run, stay where they are. No solve: each
slot takes the fullest node of its domain that holds it (whole nodes stay whole), its GPUs
from one NUMA zone when one has them. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from nexus_admit.model import (
    GPU_WHOLE,
    ClusterSnapshot,
    Gang,
    Node,
    NumaPolicy,
    PodSet,
    Slot,
    apply_slots,
)

__all__ = ["replacement_slots", "shared_domain"]


def shared_domain(labels: Iterable[Mapping[str, str]], keys: Sequence[str]) -> dict[str, str]:
    """The value of each of `keys` that every one of these nodes' labels has alike: the
    tightest domain (rack, block, clique...) holding them all. Keys a node lacks, or on
    which two nodes differ, are left out."""
    out: dict[str, str] | None = None
    for node_labels in labels:
        here = {k: node_labels[k] for k in keys if k in node_labels}
        out = here if out is None else {k: v for k, v in out.items() if here.get(k) == v}
    return out or {}


def replacement_slots(
    snapshot: ClusterSnapshot,
    gang: Gang,
    moving: Sequence[Slot],
    domains: Mapping[str, Mapping[str, str]],
) -> list[Slot] | None:
    """A new slot for each of `moving` (same pod set and index) on a node its pod set may
    use (schedulable, Ready, tolerated, selected, of its shape) inside the pod set's domain
    (`domains`: pod set name → labels the node must carry) with room now; None when one of
    them has no such node. Takes the capacity it hands out from `snapshot`, in place (pass
    a copy), so two moving slots never get the same GPUs."""
    by_name = {ps.name: ps for ps in gang.pod_sets}
    out: list[Slot] = []
    for slot in moving:
        ps = by_name.get(slot.pod_set)
        if ps is None:
            return None
        domain = domains.get(ps.name, {})
        best: tuple[tuple[int, str], Slot] | None = None
        for node in snapshot.nodes.values():
            if node.name == slot.node or ps.static_fit(node) is not None:
                continue
            if any(node.labels.get(k) != v for k, v in domain.items()):
                continue
            placed = _fit(node, ps, slot.index, gang.numa_policy)
            if placed is None:
                continue
            rank = (node.free_gpu_milli, node.name)
            if best is None or rank < best[0]:
                best = (rank, placed)
        if best is None:
            return None
        apply_slots(snapshot, gang, [best[1]])
        out.append(best[1])
    return out


def _fit(node: Node, ps: PodSet, index: int, numa: NumaPolicy) -> Slot | None:
    """One pod of `ps` on `node` now (its devices and NUMA zone), or None."""
    if (node.free_cpu_milli < ps.cpu_milli or node.free_memory_mib < ps.memory_mib
            or node.free_pods < 1):
        return None
    if not ps.gpus:
        return Slot(ps.name, index, node.name)
    if ps.fractional:  # the fullest device that still holds the share
        shared = sorted((free, g) for g, free in enumerate(node.gpu_free) if free >= ps.gpu_milli)
        if not shared:
            return None
        g = shared[0][1]
        return Slot(ps.name, index, node.name, (g,), node.numa_zone_of_gpu(g))
    for zone in node.numa_zones:
        whole = [g for g in zone.gpu_indices
                 if 0 <= g < len(node.gpu_free) and node.gpu_free[g] == GPU_WHOLE]
        if len(whole) >= ps.gpus and zone.free_cpu_milli >= ps.cpu_milli:
            return Slot(ps.name, index, node.name, tuple(whole[: ps.gpus]), zone.id)
    if numa is NumaPolicy.SINGLE_NUMA_NODE and node.numa_zones:
        return None
    whole = [g for g, free in enumerate(node.gpu_free) if free == GPU_WHOLE]
    if len(whole) < ps.gpus:
        return None
    return Slot(ps.name, index, node.name, tuple(whole[: ps.gpus]))
