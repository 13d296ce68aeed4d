"""The snapshot's node facts as columns (numpy arrays), for the steps that read every node
of the fleet: a one-pod decision's candidates with room and their lower bounds
(`fleet_scan.py`), the free GPU share per domain (`Problem.domain_free_gpu_milli`).

What labels fix (a node's domain at a level as a code, its hardware class, VRAM, GPU count,
clique) is kept per snapshot in `static_cache`, like every label-derived fact; free
capacity is read once per decision, in one pass per column over the nodes, never per node
in the scoring (a plain snapshot says nothing of what changed since the last decision).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter, methodcaller
from typing import cast

import numpy as np
import numpy.typing as npt

from nexus_admit.model import GPU_WHOLE, ClusterSnapshot, Domain, Node, domain_path

__all__ = ["GPU_FREE", "Candidates", "IntArray", "LevelCodes", "candidate_columns",
           "free_gpu_column", "gpu_nodes", "level_codes", "level_free", "positions", "whole_gpus"]

IntArray = npt.NDArray[np.int64]
_HOST = "kubernetes.io/hostname"  # named by the node itself, not a label
GPU_FREE = attrgetter("gpu_free")
_WHOLE = methodcaller("count", GPU_WHOLE)
_VRAM = attrgetter("gpu_memory_mib")
_LABELS = attrgetter("labels")


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
    a node's domain is then its labels' values, read in one pass; None when a node lacks
    one."""
    get = itemgetter(*down_to)
    try:
        values = list(map(get, map(_LABELS, snapshot.nodes.values())))
    except KeyError:
        return None
    index = {v: i for i, v in enumerate(dict.fromkeys(values))}
    codes = np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))
    if len(down_to) == 1:
        return LevelCodes(codes, [(v,) for v in index])
    return LevelCodes(codes, list(index))


def _one(level: str) -> Callable[[dict[str, str]], tuple[str]]:
    """`itemgetter(level)` as a tuple (as `itemgetter` of several keys answers)."""
    return lambda labels: (labels[level],)


def _path_of(levels: tuple[str, ...], level_index: int) -> Callable[[dict[str, str]], object]:
    """Levels naming the hostname: nothing shared between nodes to key on (KeyError: take
    the node's path)."""

    def fail(labels: dict[str, str]) -> object:
        raise KeyError(levels[level_index])

    return fail


def free_gpu_column(snapshot: ClusterSnapshot) -> IntArray:
    """Every node's free GPU share (`Node.free_gpu_milli`), in snapshot order."""
    return np.fromiter(map(sum, map(GPU_FREE, snapshot.nodes.values())), dtype=np.int64,
                       count=len(snapshot))


def level_free(snapshot: ClusterSnapshot, codes: LevelCodes, free: IntArray) -> dict[Domain, int]:
    """Free GPU share per domain of the level `codes` are of, over the nodes with GPUs and a
    domain there; the domains in order of their first such node (the count over every node
    in `Problem.domain_free_gpu_milli`, as a dict in the same order)."""
    gpus = gpu_nodes(snapshot)
    sel = (codes.codes >= 0) & gpus
    inside = codes.codes[sel]
    sums = np.bincount(inside, weights=free[sel], minlength=len(codes.domains))
    present, first = np.unique(inside, return_index=True)
    order = present[np.argsort(first, kind="stable")]
    domains = codes.domains
    return {domains[c]: int(sums[c]) for c in order.tolist()}


def gpu_nodes(snapshot: ClusterSnapshot) -> npt.NDArray[np.bool_]:
    """Which nodes have GPUs (a non-empty `gpu_free`; its length never changes)."""
    key = ("gpu-nodes",)
    cached = cast("npt.NDArray[np.bool_] | None", snapshot.static_cache.get(key))
    if cached is None or len(cached) != len(snapshot):
        cached = np.fromiter(map(bool, map(GPU_FREE, snapshot.nodes.values())),
                             dtype=np.bool_, count=len(snapshot))
        snapshot.static_cache[key] = cached
    return cached


@dataclass(frozen=True, slots=True)
class Candidates:
    """What labels fix of a list of candidate nodes, as columns in its order: where each is
    in the snapshot (and, per snapshot node, its place in the list or -1), its hardware
    class (an index into `classes`), VRAM per GPU and GPU count."""

    names: Sequence[str]  # the list they were made from (its identity checks the cache)
    fetch: Callable[[dict[str, Node]], object]  # their Node objects from `snapshot.nodes`
    where: IntArray
    place: IntArray
    hw_class: IntArray
    classes: list[str | None]
    vram: IntArray
    gpu_count: IntArray

    def nodes(self, snapshot: ClusterSnapshot) -> tuple[Node, ...]:
        """The candidates' nodes as the snapshot holds them now."""
        if len(self.names) == 1:
            return (cast(Node, self.fetch(snapshot.nodes)),)
        return cast("tuple[Node, ...]", self.fetch(snapshot.nodes))


def candidate_columns(snapshot: ClusterSnapshot, names: Sequence[str],
                      node_class: dict[str, str | None]) -> Candidates:
    """`Candidates` of `names` (a non-empty candidate list of `Problem.candidates`), kept in
    the snapshot's static cache while that list is."""
    key = ("candidate-columns", id(names))
    cached = cast("Candidates | None", snapshot.static_cache.get(key))
    if cached is not None and cached.names is names:
        return cached
    fetch = itemgetter(*names)
    made = Candidates(names, fetch, *_static_columns(snapshot, names, fetch, node_class))
    snapshot.static_cache[key] = made
    return made


def positions(snapshot: ClusterSnapshot) -> dict[str, int]:
    """Node name -> its place in snapshot order, kept in the snapshot's static cache."""
    position = cast("dict[str, int] | None", snapshot.static_cache.get(("positions",)))
    if position is None or len(position) != len(snapshot):
        position = {name: i for i, name in enumerate(snapshot.nodes)}
        snapshot.static_cache[("positions",)] = position
    return position


def _static_columns(
    snapshot: ClusterSnapshot, names: Sequence[str], fetch: Callable[[dict[str, Node]], object],
    node_class: dict[str, str | None],
) -> tuple[IntArray, IntArray, IntArray, list[str | None], IntArray, IntArray]:
    """`Candidates`' columns after its names and `fetch`, in its order."""
    count = len(names)
    got = fetch(snapshot.nodes)
    nodes = (cast(Node, got),) if count == 1 else cast("tuple[Node, ...]", got)
    where = np.fromiter(map(positions(snapshot).__getitem__, names), dtype=np.int64,
                        count=count)
    place = np.full(len(snapshot), -1, dtype=np.int64)
    place[where] = np.arange(count, dtype=np.int64)
    of_node = list(map(node_class.__getitem__, names))
    classes = list(dict.fromkeys(of_node))
    code = {c: i for i, c in enumerate(classes)}
    return (
        where,
        place,
        np.fromiter(map(code.__getitem__, of_node), dtype=np.int64, count=count),
        classes,
        np.fromiter(map(_VRAM, nodes), dtype=np.int64, count=count),
        np.fromiter(map(len, map(GPU_FREE, nodes)), dtype=np.int64, count=count),
    )


def whole_gpus(nodes: Sequence[Node]) -> IntArray:
    """Each node's whole free GPUs (`Node.free_whole_gpus`)."""
    return np.fromiter(map(_WHOLE, map(GPU_FREE, nodes)), dtype=np.int64, count=len(nodes))
