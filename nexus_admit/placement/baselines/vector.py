"""Vectorised pod-by-pod baselines: the scheduling loop of kube-scheduler (filter every node,
score every feasible node, take the highest score), with ties between equally scored nodes
broken by a fixed order of the nodes drawn from the seed (`tie_break = "rank"`, the
paper simulator's rule; paper-random alone draws uniformly for every pod), and node scores
computed by numpy over all nodes at once.

Scores depend only on a node's own state and the pod's shape, so each policy keeps, per pod
shape, the last score of every node and recomputes only nodes whose state changed since
(node versions in a numpy mirror of free capacity). On a `TrackedSnapshot` the mirror
itself is refreshed from the change log (`tracking.ChangeCursor`, rebuilt past its rule);
on any other snapshot it is rebuilt.

The final GPU indices and NUMA zone of every pod still come from `fit_pod` (the one
definition of "fits"), so these policies obey the same hard constraints as every other.
"""

from __future__ import annotations

import itertools
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from nexus_admit.model import (
    GPU_WHOLE,
    ClusterSnapshot,
    Gang,
    Node,
    Placement,
    PlacementConfig,
    PodSet,
    Slot,
    apply_slots,
    fit_pod,
)
from nexus_admit.placement.baselines.podbypod import domain_choices, finish, infeasible
from nexus_admit.placement.problem import prepare
from nexus_admit.placement.tracking import ChangeCursor, TrackedSnapshot

__all__ = ["NodeMirror", "VectorPolicy", "best_fit_gpu"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class NodeMirror:
    """Free capacity of every node of one snapshot as numpy arrays (GPU rows padded with 0)."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        nodes = list(snapshot)
        n = len(nodes)
        self.snapshot = snapshot
        self.cursor = ChangeCursor(snapshot) if isinstance(snapshot, TrackedSnapshot) else None
        self.size = n
        self.names = [node.name for node in nodes]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.models = [node.gpu_product if node.gpu_count else "" for node in nodes]
        self.gpu_count = np.fromiter((node.gpu_count for node in nodes), np.int64, n)
        width = max(int(self.gpu_count.max()) if n else 0, 1)
        self.cpu_cap = np.fromiter((node.cpu_milli for node in nodes), np.int64, n)
        self.mem_cap = np.fromiter((node.memory_mib for node in nodes), np.int64, n)
        self.cpu = np.fromiter((node.free_cpu_milli for node in nodes), np.int64, n)
        self.mem = np.fromiter((node.free_memory_mib for node in nodes), np.int64, n)
        self.pods = np.fromiter((node.free_pods for node in nodes), np.int64, n)
        self.gpu = np.zeros((n, width), dtype=np.int64)
        if n and int(self.gpu_count.sum()):
            flat = np.fromiter(
                itertools.chain.from_iterable(node.gpu_free for node in nodes), np.int64
            )
            rows = np.repeat(np.arange(n), self.gpu_count)
            cols = np.arange(len(flat)) - np.repeat(np.cumsum(self.gpu_count) - self.gpu_count,
                                                    self.gpu_count)
            self.gpu[rows, cols] = flat
        self.version = np.zeros(n, dtype=np.int64)
        self.stale: set[int] = set()
        self.rank = np.arange(n, dtype=np.int64)  # tie-break order, set by the policy
        self._masks: dict[int, tuple[Sequence[str], BoolArray]] = {}

    def matches(self, snapshot: ClusterSnapshot) -> bool:
        return (
            snapshot is self.snapshot
            and self.cursor is not None
            and self.cursor.follows(snapshot)
            and len(snapshot.nodes) == self.size
        )

    def catch_up(self) -> bool:
        """Re-read nodes named in the change log since last time, and our own stale ones;
        False (nothing read) when the mirror must be rebuilt instead."""
        assert self.cursor is not None and isinstance(self.snapshot, TrackedSnapshot)
        names = self.cursor.changed(self.snapshot)
        if names is None:
            return False
        changed = {self.index[name] for name in names} | self.stale
        self.stale = set()
        nodes = self.snapshot.nodes
        for i in changed:
            self.read(i, nodes[self.names[i]])
        return True

    def read(self, i: int, node: Node) -> None:
        self.cpu[i] = node.free_cpu_milli
        self.mem[i] = node.free_memory_mib
        self.pods[i] = node.free_pods
        row = self.gpu[i]
        row[:] = 0
        row[: len(node.gpu_free)] = node.gpu_free
        self.version[i] += 1

    def candidate_mask(self, names: Sequence[str]) -> BoolArray:
        """Mask of `names` (the cached candidate list of a pod set); memoised by identity."""
        hit = self._masks.get(id(names))
        if hit is not None and hit[0] is names:
            return hit[1]
        mask = np.zeros(self.size, dtype=bool)
        mask[[self.index[name] for name in names]] = True
        self._masks[id(names)] = (names, mask)
        return mask

    def feasible(self, idx: IntArray, ps: PodSet) -> BoolArray:
        ok: BoolArray = (
            (self.cpu[idx] >= ps.cpu_milli)
            & (self.mem[idx] >= ps.memory_mib)
            & (self.pods[idx] >= 1)
        )
        if ps.gpus:
            if ps.fractional:
                ok &= (self.gpu[idx] >= ps.gpu_milli).any(axis=1)
            else:
                ok &= (self.gpu[idx] == GPU_WHOLE).sum(axis=1) >= ps.gpus
        return ok


def best_fit_gpu(row: IntArray, need: int) -> int:
    """The GPU with the least free share that still takes `need` (lowest index on ties)."""
    free = np.where(row >= need, row, GPU_WHOLE + 1)
    return int(np.argmin(free))


@dataclass(slots=True)
class _ShapeScores:
    seen: IntArray
    feasible: BoolArray
    score: FloatArray
    gpu: IntArray  # chosen GPU for a shared pod (-1: let the policy choose)


class VectorPolicy:
    """Base class. Subclasses implement `scores(mirror, idx, pod_set)` → (score, gpu choice)
    for the nodes `idx` (higher score is better), and may override `choose_gpu`.

    Ties between equally scored nodes: `tie_break = "rank"` takes the node first in a fixed
    pseudo-random order of node names drawn from the seed (what the FGD paper's simulator
    does: it prefixes node names with a seeded random permutation and keeps the first best
    node), `"random"` draws uniformly for every pod."""

    tie_break = "rank"

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._mirror: NodeMirror | None = None
        self._cache: dict[tuple[object, ...], _ShapeScores] = {}

    # ---- to implement ----
    def scores(self, m: NodeMirror, idx: IntArray, ps: PodSet) -> tuple[FloatArray, IntArray]:
        raise NotImplementedError

    def shape_key(self, ps: PodSet) -> tuple[object, ...]:
        return (ps.cpu_milli, ps.memory_mib, ps.gpus, ps.gpu_milli)

    def choose_gpu(self, m: NodeMirror, i: int, ps: PodSet, hint: int) -> int:
        return hint if hint >= 0 else best_fit_gpu(m.gpu[i], ps.gpu_milli)

    def placed(self, m: NodeMirror, i: int, ps: PodSet) -> None:
        """Called for every pod placed (policies with their own per-node state)."""

    # ---- machinery ----
    def mirror(self, snapshot: ClusterSnapshot) -> NodeMirror:
        m = self._mirror
        if m is not None and m.matches(snapshot) and m.catch_up():
            return m
        m = NodeMirror(snapshot)
        m.rank = np.fromiter(
            (zlib.crc32(f"{self._seed}/{name}".encode()) for name in m.names), np.int64, m.size
        )
        self._mirror = m
        self._cache.clear()
        return m

    def _shape_scores(self, m: NodeMirror, ps: PodSet) -> _ShapeScores:
        key = self.shape_key(ps)
        entry = self._cache.get(key)
        if entry is None:
            idx = np.arange(m.size)
            score, gpu = self.scores(m, idx, ps)
            entry = _ShapeScores(m.version.copy(), m.feasible(idx, ps), score, gpu)
            self._cache[key] = entry
            return entry
        dirty = np.flatnonzero(entry.seen != m.version)
        if dirty.size:
            score, gpu = self.scores(m, dirty, ps)
            entry.score[dirty] = score
            entry.gpu[dirty] = gpu
            entry.feasible[dirty] = m.feasible(dirty, ps)
            entry.seen[dirty] = m.version[dirty]
        return entry

    def place(self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig) -> Placement:
        started = time.perf_counter()
        problem = prepare(snapshot, gang, config)
        if problem.impossible:
            return infeasible(gang, self.name, problem.impossible, started, impossible=True)
        m = self.mirror(snapshot)

        def rank(_: object, members: Sequence[str]) -> float:
            """Under a required level, try first the domain holding the best node."""
            entry = self._shape_scores(m, gang.pod_sets[0])
            idx = np.array([m.index[n] for n in members], dtype=np.int64)
            ok = entry.feasible[idx]
            return -float(entry.score[idx][ok].max()) if ok.any() else float("inf")

        for allowed in domain_choices(problem, rank):
            mask = None
            if allowed is not None:
                mask = np.zeros(m.size, dtype=bool)
                mask[[m.index[n] for n in allowed]] = True
            slots = self._place_all(m, snapshot, gang, problem.candidates, mask)
            if slots is not None:
                return finish(problem, self.name, slots, started)
        where = f" inside one {gang.required_level} domain" if gang.required_level else ""
        return infeasible(
            gang, self.name, f"the gang's {gang.pod_count} pods do not all fit{where} now", started
        )

    def _place_all(
        self,
        m: NodeMirror,
        snapshot: ClusterSnapshot,
        gang: Gang,
        candidates: dict[str, list[str]],
        domain: BoolArray | None,
    ) -> list[Slot] | None:
        scratch: dict[str, ClusterSnapshot] = {}
        touched: set[int] = set()
        placed: list[tuple[int, PodSet]] = []
        slots: list[Slot] = []
        try:
            for ps in gang.pod_sets:
                allowed = m.candidate_mask(candidates[ps.name])
                if domain is not None:
                    allowed = allowed & domain
                one = Gang(gang.name, (ps,), numa_policy=gang.numa_policy)
                for index in range(ps.count):
                    slot = self._place_one(m, snapshot, scratch, touched, allowed, ps, one, index)
                    if slot is None:
                        return None
                    placed.append((m.index[slot.node], ps))
                    slots.append(slot)
        finally:
            # the mirror follows the snapshot, not our tentative pods: re-read what we moved
            nodes = snapshot.nodes
            for i in touched:
                m.read(i, nodes[m.names[i]])
        for i, ps in placed:
            self.placed(m, i, ps)
        return slots

    def _place_one(
        self,
        m: NodeMirror,
        snapshot: ClusterSnapshot,
        scratch: dict[str, ClusterSnapshot],
        touched: set[int],
        allowed: BoolArray,
        ps: PodSet,
        one: Gang,
        index: int,
    ) -> Slot | None:
        entry = self._shape_scores(m, ps)
        ok = entry.feasible & allowed
        while True:
            if not ok.any():
                return None
            best = entry.score[ok].max()
            top = ok & (entry.score == best)
            if self.tie_break == "rank":
                i = int(np.argmin(np.where(top, m.rank, np.iinfo(np.int64).max)))
            else:
                ties = np.flatnonzero(top)
                i = int(ties[self._rng.integers(len(ties))]) if len(ties) > 1 else int(ties[0])
            name = m.names[i]
            sub = scratch.get(name)
            if sub is None:
                sub = ClusterSnapshot({name: snapshot.nodes[name].copy()})
                scratch[name] = sub
            node = sub.nodes[name]
            choice = self.choose_gpu(m, i, ps, int(entry.gpu[i])) if ps.fractional else None
            fit = fit_pod(node, ps, one.numa_policy, choice)
            if fit is None:  # e.g. single-numa-node cannot be met there: next best node
                ok = ok.copy()
                ok[i] = False
                continue
            slot = Slot(ps.name, index, name, fit.gpu_indices, fit.numa_zone)
            apply_slots(sub, one, [slot])
            m.read(i, node)
            touched.add(i)
            return slot

