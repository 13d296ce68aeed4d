"""The snapshot's node facts as columns (numpy arrays), for the steps that read every node
of the fleet: a one-pod decision's candidates with room and their lower bounds
(`fleet_scan.py`), the free GPU share per domain (`Problem.domain_free_gpu_milli`).

What labels fix (a node's domain at a level as a code; through `node_kinds.py` its kind,
hardware class, VRAM, GPU count and clique; where a candidate list's nodes are) is kept per
snapshot in `static_cache`, like every label-derived fact, each derived in one pass over
the nodes; free capacity is read once per decision, every GPU of the fleet in one pass
(`gpu_columns`), never per node in the scoring (a plain snapshot says nothing of what
changed since the last decision).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter
from typing import cast

import numpy as np
import numpy.typing as npt

from nexus_admit.model import (
    GPU_WHOLE,
    ClusterSnapshot,
    Domain,
    Node,
    NumaPolicy,
    PodSet,
    domain_path,
)
from nexus_admit.placement.node_kinds import (
    GPU_FREE,
    FloatArray,
    IntArray,
    dense_codes,
    node_kinds,
)

__all__ = ["Candidates", "GpuColumns", "IntArray", "LevelCodes", "candidate_columns",
           "gpu_columns", "level_codes", "level_free", "pod_capacities", "positions",
           "positions_of", "remember_positions"]

_HOST = "kubernetes.io/hostname"  # named by the node itself, not a label
_LABELS = attrgetter("labels")
_PODS, _CPU, _MEMORY = (attrgetter(a) for a in ("free_pods", "free_cpu_milli", "free_memory_mib"))


@dataclass(frozen=True, slots=True)
class LevelCodes:
    """Every node's domain at one level, in snapshot order, as an index into `domains`
    (-1: the node has no domain there), the domains in order of their first node."""

    codes: IntArray
    domains: list[Domain]


def level_codes(snapshot: ClusterSnapshot, levels: tuple[str, ...], level_index: int
                ) -> LevelCodes:
    """`LevelCodes` of one level (`domain_path(node, levels)[level_index]` of every node),
    kept in the snapshot's static cache. Read from the labels of the levels down to it, a
    domain worked out once per distinct combination of them (a rack's nodes share it)."""
    key = ("level-codes", levels, level_index)
    cached = cast("LevelCodes | None", snapshot.static_cache.get(key))
    if cached is not None and len(cached.codes) == len(snapshot):
        return cached
    down_to = levels[: level_index + 1]
    index: dict[Domain, int] = {}
    seen: dict[object, int] = {}  # label values (or a node's domain) -> code

    def code(node: Node) -> int:
        try:
            values: object = labels_of(node.labels)
        except KeyError:  # a level without its label: the path ends above
            values = domain_path(node, levels)[level_index]
        found = seen.get(values)
        if found is None:
            domain = domain_path(node, levels)[level_index]
            found = seen[values] = -1 if domain is None else index.setdefault(domain, len(index))
        return found

    if _HOST in down_to:  # a node's own name: no two share a domain there
        labels_of = _path_of(levels, level_index)
    else:
        labels_of = itemgetter(*down_to) if len(down_to) > 1 else _one(down_to[0])
    made = _labelled(snapshot, down_to) if _HOST not in down_to else None
    if made is None:
        codes = np.fromiter(map(code, snapshot.nodes.values()), dtype=np.int64,
                            count=len(snapshot))
        made = LevelCodes(codes, list(index))
    snapshot.static_cache[key] = made
    return made


def _labelled(snapshot: ClusterSnapshot, down_to: tuple[str, ...]) -> LevelCodes | None:
    """`LevelCodes` when every node has every label of `down_to` (no hostname among them):
    a node's domain is then its labels' values, read and numbered in one pass; None when a
    node lacks one."""
    get = itemgetter(*down_to)
    try:
        codes, values = dense_codes(map(get, map(_LABELS, snapshot.nodes.values())),
                                    len(snapshot))
    except KeyError:
        return None
    if len(down_to) == 1:
        return LevelCodes(codes, [(cast(str, v),) for v in values])
    return LevelCodes(codes, cast(list[Domain], values))


def _one(level: str) -> Callable[[dict[str, str]], tuple[str]]:
    """`itemgetter(level)` as a tuple (as `itemgetter` of several keys answers)."""
    return lambda labels: (labels[level],)


def _path_of(levels: tuple[str, ...], level_index: int) -> Callable[[dict[str, str]], object]:
    """Levels naming the hostname: nothing shared between nodes to key on (KeyError: take
    the node's path)."""

    def fail(labels: dict[str, str]) -> object:
        raise KeyError(levels[level_index])

    return fail


@dataclass(frozen=True, slots=True)
class GpuColumns:
    """Every node's free GPU share (`Node.free_gpu_milli`) and whole free GPUs
    (`Node.free_whole_gpus`), in snapshot order, with its GPU count."""

    free: IntArray
    whole: IntArray
    count: IntArray

    def pristine(self) -> npt.NDArray[np.bool_]:
        """`Node.is_pristine` of every node."""
        pristine: npt.NDArray[np.bool_] = (self.count > 0) & (self.whole == self.count)
        return pristine


def gpu_columns(snapshot: ClusterSnapshot) -> GpuColumns:
    """`GpuColumns` of the snapshot as it is now: every node's GPUs read in one pass (one
    array of them all, cut at the nodes' GPU counts)."""
    nodes = snapshot.nodes.values()
    count = node_kinds(snapshot).gpu_count
    gpus = chain.from_iterable(map(GPU_FREE, nodes))
    try:  # as many GPUs as the kept counts say: read into an array made to size
        flat = np.fromiter(gpus, dtype=np.int64, count=int(count.sum()))
        counted = next(gpus, None) is None
    except ValueError:  # fewer
        counted = False
    if not counted:  # a GPU count changed under a kept cache: count again
        count = np.fromiter(map(len, map(GPU_FREE, nodes)), dtype=np.int64, count=len(nodes))
        flat = np.fromiter(chain.from_iterable(map(GPU_FREE, nodes)), dtype=np.int64)
    free = np.zeros(len(count), dtype=np.int64)
    whole = np.zeros(len(count), dtype=np.int64)
    has = np.flatnonzero(count)
    if len(has):  # summed per node from its first GPU (a node without GPUs has none)
        starts = (np.cumsum(count) - count)[has]
        free[has] = np.add.reduceat(flat, starts)
        whole[has] = np.add.reduceat(flat == GPU_WHOLE, starts, dtype=np.int64)
    return GpuColumns(free, whole, count)


def level_free(snapshot: ClusterSnapshot, codes: LevelCodes, free: IntArray) -> dict[Domain, int]:
    """Free GPU share per domain of the level `codes` are of, over the nodes with GPUs and a
    domain there; the domains in order of their first such node (the count over every node
    in `Problem.domain_free_gpu_milli`, as a dict in the same order)."""
    sel = (codes.codes >= 0) & (node_kinds(snapshot).gpu_count > 0)
    inside = codes.codes[sel]
    sums = np.bincount(inside, weights=free[sel], minlength=len(codes.domains))
    present, first = np.unique(inside, return_index=True)
    order = present[np.argsort(first, kind="stable")]
    in_order = map(codes.domains.__getitem__, order.tolist())
    return dict(zip(in_order, sums[order].astype(np.int64).tolist(), strict=True))


@dataclass(frozen=True, slots=True)
class Candidates:
    """What labels fix of a list of candidate nodes, as columns in its order: where each is
    in the snapshot (and, per snapshot node, its place in the list or -1), its hardware
    class (an index into `classes`), VRAM per GPU and GPU count."""

    names: Sequence[str]  # the list they were made from (its identity checks the cache)
    where: IntArray
    place: IntArray
    hw_class: IntArray
    classes: list[str | None]
    vram: FloatArray
    gpu_count: IntArray


def candidate_columns(snapshot: ClusterSnapshot, names: Sequence[str],
                      node_class: Mapping[str, str | None]) -> Candidates:
    """`Candidates` of `names` (a non-empty candidate list of `Problem.candidates`), kept in
    the snapshot's static cache while that list is."""
    key = ("candidate-columns", id(names))
    cached = cast("Candidates | None", snapshot.static_cache.get(key))
    if cached is not None and cached.names is names:
        return cached
    made = Candidates(names, *_static_columns(snapshot, names, node_class))
    snapshot.static_cache[key] = made
    return made


def positions(snapshot: ClusterSnapshot) -> dict[str, int]:
    """Node name -> its place in snapshot order, kept in the snapshot's static cache."""
    position = cast("dict[str, int] | None", snapshot.static_cache.get(("positions",)))
    if position is None or len(position) != len(snapshot):
        position = dict(zip(snapshot.nodes, range(len(snapshot)), strict=True))
        snapshot.static_cache[("positions",)] = position
    return position


def remember_positions(snapshot: ClusterSnapshot, names: list[str], where: IntArray) -> None:
    """Keep where the nodes of `names` (a list kept in the static cache) are in snapshot
    order, as the filter that made the list found them: `positions_of` reads it."""
    snapshot.static_cache[("positions-of", id(names))] = (names, where)


def positions_of(snapshot: ClusterSnapshot, names: Sequence[str]) -> IntArray:
    """Where each of `names` is in snapshot order: as `remember_positions` kept it for this
    list, else looked up by name."""
    kept = cast("tuple[Sequence[str], IntArray] | None",
                snapshot.static_cache.get(("positions-of", id(names))))
    if kept is not None and kept[0] is names:
        return kept[1]
    position = positions(snapshot)
    return np.fromiter(map(position.__getitem__, names), dtype=np.int64, count=len(names))


def _static_columns(
    snapshot: ClusterSnapshot, names: Sequence[str], node_class: Mapping[str, str | None],
) -> tuple[IntArray, IntArray, IntArray, list[str | None], FloatArray, IntArray]:
    """`Candidates`' columns after its names, in its order: gathered from the
    snapshot's `NodeKinds`, a class looked up once per kind."""
    kinds = node_kinds(snapshot)
    where = positions_of(snapshot, names)
    place = np.full(len(snapshot), -1, dtype=np.int64)
    place[where] = np.arange(len(names), dtype=np.int64)
    kind = kinds.kind[where]
    present = np.unique(kind).tolist()
    of_kind = [node_class[kinds.names[f]] for f in kinds.first[present].tolist()]
    classes = list(dict.fromkeys(of_kind))
    class_of_kind = np.zeros(len(kinds.first), dtype=np.int64)
    class_of_kind[present] = [classes.index(c) for c in of_kind]
    return (where, place, class_of_kind[kind], classes, kinds.vram[kind],
            kinds.gpu_count[where])


def pod_capacities(snapshot: ClusterSnapshot, names: Sequence[str], whole: IntArray,
                   ps: PodSet, policy: NumaPolicy) -> IntArray | None:
    """`pod_capacity(node, ps, policy)` of each of `names` (`whole`: every snapshot node's
    free whole GPUs), for whole GPUs (or none) placed without a strict NUMA zone: the
    same integer arithmetic on columns, read only off the nodes with a pod's GPUs free.
    None for a GPU share, a strict NUMA policy or a quantity past 64 bits (node by node
    then)."""
    if ps.fractional or policy is NumaPolicy.SINGLE_NUMA_NODE:
        return None
    where = positions_of(snapshot, names)
    free_whole = whole[where]
    at = np.flatnonzero(free_whole >= ps.gpus) if ps.gpus else np.arange(len(names))
    nodes = list(snapshot.nodes.values())
    picked = list(map(nodes.__getitem__, where[at].tolist()))
    count = len(picked)
    try:
        cap = np.fromiter(map(_PODS, picked), dtype=np.int64, count=count)
        if ps.cpu_milli:
            cap = np.minimum(cap, np.fromiter(map(_CPU, picked), dtype=np.int64, count=count)
                             // ps.cpu_milli)
        if ps.memory_mib:
            cap = np.minimum(cap, np.fromiter(map(_MEMORY, picked), dtype=np.int64,
                                              count=count) // ps.memory_mib)
    except OverflowError:  # a quantity past 64 bits (a malformed dump): node by node
        return None
    if ps.gpus:
        cap = np.minimum(cap, free_whole[at] // ps.gpus)
    out = np.zeros(len(names), dtype=np.int64)
    out[at] = np.maximum(cap, 0)
    return out
