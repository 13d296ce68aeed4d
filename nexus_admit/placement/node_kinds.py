"""What a node's labels and shape fix, for every node of a snapshot at once: its kind (what
a static filter and a hardware class read of it) and its NVLink clique, as columns in
snapshot order, each derived in one pass over the nodes and kept in the snapshot's
`static_cache` like every label-derived fact.

A cold decision (a fresh snapshot) pays for these once; reading them node by node, by name,
was most of a one-pod decision on 12,500 nodes. The passes are C-level (`map` over
attribute getters, one `dict.setdefault` per node to number the distinct values) and the
rest is numpy over the codes.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from itertools import pairwise, repeat
from operator import attrgetter
from typing import cast

import numpy as np
import numpy.typing as npt

from nexus_admit.model import ClusterSnapshot

__all__ = ["CliqueCodes", "FloatArray", "IntArray", "NodeKinds", "clique_codes", "dense_codes",
           "first_order_codes", "label_codes", "node_kinds"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
GPU_FREE = attrgetter("gpu_free")
# everything `PodSet.static_fit` and a hardware class read of a node but its GPU count
# (the length of `gpu_free`) and its name and labels
_SHAPE = attrgetter("schedulable", "taints", "gpu_memory_mib", "cpu_milli", "memory_mib",
                    "gpu_product")
_VRAM_AT = 2  # gpu_memory_mib's place in a `_SHAPE` tuple
_CLIQUE = attrgetter("clique")
_LABELS = attrgetter("labels")


def dense_codes(values: Iterable[Hashable], count: int, index: dict[Hashable, int] | None = None
                ) -> tuple[IntArray, list[Hashable]]:
    """Each of `count` values as the index of its value among the distinct ones in order of
    first appearance, and those values, in one C-level pass: `setdefault` gives a value not
    seen yet the number seen before it. `index` may hold values numbered in advance."""
    index = {} if index is None else index
    codes = np.fromiter(map(index.setdefault, values, map(len, repeat(index))),
                        dtype=np.int64, count=count)
    return codes, list(index)


def first_order_codes(keys: IntArray) -> tuple[IntArray, IntArray]:
    """`keys` renumbered 0, 1, ... in order of each key's first place, and that place per
    code (an ascending array)."""
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return rank[inverse.reshape(-1)], first[order].astype(np.int64)


@dataclass(frozen=True, slots=True)
class NodeKinds:
    """Every node's kind in snapshot order: nodes alike in state, taints, VRAM per GPU, CPU,
    memory, GPU product and GPU count share one (all a static filter without selector,
    affinity or node list reads, and all a hardware class reads), kinds numbered in order
    of their first node."""

    names: list[str]  # the snapshot's node names, in its order
    kind: IntArray  # per node
    first: IntArray  # per kind: its first node's place
    vram: FloatArray  # per kind: VRAM per GPU (floats: a label may hold any integer)
    gpu_count: IntArray  # per node (a node's GPU count never changes)

    def __len__(self) -> int:
        return len(self.names)


def node_kinds(snapshot: ClusterSnapshot) -> NodeKinds:
    """`NodeKinds` of `snapshot`, kept in its static cache."""
    key = ("node-kinds",)
    cached = cast("NodeKinds | None", snapshot.static_cache.get(key))
    if cached is not None and len(cached) == len(snapshot):
        return cached
    nodes, count = snapshot.nodes.values(), len(snapshot)
    shape, shapes = dense_codes(map(_SHAPE, nodes), count)
    gpus = np.fromiter(map(len, map(GPU_FREE, nodes)), dtype=np.int64, count=count)
    kind, first = first_order_codes(shape * (int(gpus.max(initial=0)) + 1) + gpus)
    vram = [cast(tuple[object, ...], shapes[s])[_VRAM_AT] for s in shape[first].tolist()]
    made = NodeKinds(list(snapshot.nodes), kind, first, np.array(vram, dtype=np.float64), gpus)
    snapshot.static_cache[key] = made
    return made


@dataclass(frozen=True, slots=True)
class CliqueCodes:
    """Every node's NVLink clique in snapshot order, as an index into `cliques` (-1: in
    none), the cliques in order of their first node, each with its members' names."""

    codes: IntArray
    cliques: list[str]
    index: dict[str, int]  # clique -> its code
    members: list[list[str]]  # per clique, in snapshot order (shared: never change them)


def clique_codes(snapshot: ClusterSnapshot) -> CliqueCodes:
    """`CliqueCodes` of `snapshot`, kept in its static cache."""
    key = ("clique-codes",)
    cached = cast("CliqueCodes | None", snapshot.static_cache.get(key))
    if cached is not None and len(cached.codes) == len(snapshot):
        return cached
    # None numbered first, so a clique's code is one less than its number
    numbered, seen = dense_codes(map(_CLIQUE, snapshot.nodes.values()), len(snapshot),
                                 {None: 0})
    codes = numbered - 1
    cliques = cast(list[str], seen[1:])
    inside = np.flatnonzero(codes >= 0)
    by_clique = inside[np.argsort(codes[inside], kind="stable")]  # snapshot order in each
    names = list(snapshot.nodes)
    ordered = list(map(names.__getitem__, by_clique.tolist()))
    ends = np.cumsum(np.bincount(codes[inside], minlength=len(cliques))).tolist()
    members = [ordered[start:end] for start, end in pairwise([0, *ends])]
    made = CliqueCodes(codes, cliques, {c: i for i, c in enumerate(cliques)}, members)
    snapshot.static_cache[key] = made
    return made


def label_codes(snapshot: ClusterSnapshot, keys: tuple[str, ...]) -> IntArray:
    """Every node's values of the labels `keys` (None where absent) as a code, in snapshot
    order, nodes of equal values sharing one; kept in the snapshot's static cache."""
    key = ("label-codes", keys)
    cached = cast("IntArray | None", snapshot.static_cache.get(key))
    if cached is not None and len(cached) == len(snapshot):
        return cached
    values = (tuple(map(labels.get, keys)) for labels in map(_LABELS, snapshot.nodes.values()))
    codes, _ = dense_codes(values, len(snapshot))
    snapshot.static_cache[key] = codes
    return codes
