"""The candidates and the symmetry reduction of a gang of one pod set, kept on a
`TrackedSnapshot` from its change log: consecutive decisions recompute only the nodes that
changed (and the members of a clique that turned pristine or stopped being so).

What `candidates`, `shortfall` and `reduce_symmetry` (reduction.py) answer from every
candidate node, a tracker answers from what it keeps: each candidate's room (`cap`) and
symmetry key, the candidates of every class of interchangeable nodes in snapshot order, the
room in total and per domain of the required level. The answer is the same `Reduction`,
in the same order (the one-pod scan breaks ties by it). It also keeps the one-pod scan's
lower bound of each node with what the bound read besides the node
(`onepod.bound_contexts`).

Only for the gangs whose reduction reads nothing but the node, the config and the pod
set's shape: one pod set, no siblings, no spread limit per node, no ComputeDomain kept out
of held cliques. Others, and every plain `ClusterSnapshot`, take the full path.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Sequence
from functools import partial
from typing import cast

from nexus_admit.model import Domain, PodSet
from nexus_admit.placement.memo import NodeMemo, pod_shape
from nexus_admit.placement.objective import term_weights
from nexus_admit.placement.onepod import Ranking, bound_contexts, gradient_bounds, lower_bounds
from nexus_admit.placement.order_terms import OrderTerms
from nexus_admit.placement.problem import Problem
from nexus_admit.placement.reduction import (
    LoneStates,
    Reduction,
    domain_shortfall,
    keeps_off_gpus,
    lone_entries,
    lone_entry,
    per_node_limit,
    room_shortfall,
)
from nexus_admit.placement.tracking import ChangeCursor, TrackedSnapshot, too_many_changes

__all__ = ["KEPT_RANKINGS", "LiveReduction", "live_reduction"]

# one-pod rankings kept per tracker, one per what the lower bound reads of the gang (tier,
# workload type, GPUs): Workloads of several tiers with one pod shape share a tracker, and
# one ranking reset at each change of tier ranked the whole fleet again each time
KEPT_RANKINGS = 8
# node states whose room and key parts a tracker keeps, at most (then forgets them all)
_KEPT_STATES = 20_000


class LiveReduction:
    """One gang shape's candidates on one TrackedSnapshot (see the module)."""

    def __init__(self, problem: Problem, memo: NodeMemo) -> None:
        snapshot = problem.snapshot
        assert isinstance(snapshot, TrackedSnapshot)
        self.config = problem.config
        self.paths = problem.paths
        self.node_class = problem.node_class
        self.names = problem.candidates[problem.gang.pod_sets[0].name]
        self.position = {name: i for i, name in enumerate(self.names)}
        required = problem.gang.required_level
        self.level = problem.levels.index(required) if required is not None else None
        # clique -> its candidates (labels: fixed for this tracker)
        self.clique_names: dict[str, list[str]] = defaultdict(list)
        for name in self.names:
            clique = problem.node(name).clique
            if clique is not None:
                self.clique_names[clique].append(name)
        self.cliques: set[str] = set(problem.pristine_cliques)
        # candidate -> (room, its class key or None when kept as a pristine clique's member)
        self.entries: dict[str, tuple[int, tuple[object, ...] | None]] = {}
        self.classes: dict[tuple[object, ...], list[int]] = {}  # key -> positions, sorted
        self.members: set[int] = set()  # positions of pristine cliques' members with room
        self.room = 0
        self.per_domain: dict[Domain | None, int] = defaultdict(int)
        # candidates per rack: a change in a rack changes its mates' lower bounds (nodes
        # without a rack read no rack's free GPUs)
        self.rack_level = len(problem.levels) - 2
        self.rack_names: dict[Domain, list[str]] = defaultdict(list)
        if self.rack_level >= 0:
            for name in self.names:
                rack = self.paths[name][self.rack_level]
                if rack is not None:
                    self.rack_names[rack].append(name)
        # the one-pod scan's rankings by the gang's signature, least recently used first
        # (a plain dict in that order: an OrderedDict hashes each key as it iterates)
        self.scans: dict[tuple[object, ...], _ScanRanking] = {}
        # room and key parts per node state, for the nodes read now and on later syncs
        self.states: LoneStates = {}
        for name, cap, key in lone_entries(problem, self.names, memo, self.states):
            self._enter(problem, name, cap, key)
        self.cursor = ChangeCursor(snapshot)
        # built by the last `live_reduction` call, over every candidate (not synced)
        self.fresh = True

    def fits(self, problem: Problem) -> bool:
        """Whether this tracker answers for `problem` (the same snapshot, config, labels)."""
        return (
            self.cursor.follows(problem.snapshot)
            and self.config is problem.config
            and self.paths is problem.paths
            and self.node_class is problem.node_class
            and self.names is problem.candidates[problem.gang.pod_sets[0].name]
        )

    def sync(self, problem: Problem, memo: NodeMemo) -> bool:
        """Read again the nodes changed since the last call, however many (a rebuild reads
        each candidate as a sync reads a changed one, and would forget the rankings'
        bounds of the nodes that did not change); False when a rebuild is due."""
        changed = self.cursor.changed(cast(TrackedSnapshot, problem.snapshot), bounded=False)
        if changed is None:
            return False
        if len(self.states) > _KEPT_STATES:
            self.states.clear()
        now = set(problem.pristine_cliques)
        for clique in self.cliques ^ now:  # its members are kept whole or classed now
            changed.update(self.clique_names.get(clique, ()))
        self.cliques = now
        for name in changed:
            if name in self.position:
                self._drop(name)
                self._add(problem, name, memo)
        if not self.scans:  # no one-pod ranking kept (the gradient scan ranks anew)
            return True
        dirty = {n for n in changed if n in self.position}
        if self.rack_level >= 0:
            for name in changed:  # the rack's free GPUs, which its mates' bounds read
                rack = self.paths[name][self.rack_level]
                if rack is not None:
                    dirty.update(self.rack_names.get(rack, ()))
        for scan in self.scans.values():
            scan.dirty |= dirty
            if too_many_changes(len(scan.dirty), len(self.names)):
                scan.forget()
        return True

    def _add(self, problem: Problem, name: str, memo: NodeMemo) -> None:
        entry = lone_entry(problem, name, memo, self.states)
        if entry is not None:
            self._enter(problem, name, *entry)

    def _enter(
        self, problem: Problem, name: str, cap: int, key: tuple[object, ...] | None
    ) -> None:
        """Keep a candidate with room for `cap` pods, in its class (`key`) or, with None,
        as a pristine clique's member (filling a clique needs every member)."""
        self.room += cap
        if self.level is not None:
            self.per_domain[self.paths[name][self.level]] += cap
        if key is None:
            self.members.add(self.position[name])
        else:
            members = self.classes.setdefault(key, [])
            if members and self.position[name] < members[0]:
                self._dirty(self.names[members[0]])  # no longer its class's first
            insort(members, self.position[name])
        self.entries[name] = (cap, key)

    def _dirty(self, name: str) -> None:
        for scan in self.scans.values():
            scan.dirty.add(name)

    def _drop(self, name: str) -> None:
        for scan in self.scans.values():
            scan.bounds.pop(name, None)
        entry = self.entries.pop(name, None)
        if entry is None:
            return
        cap, key = entry
        self.room -= cap
        if self.level is not None:
            self.per_domain[self.paths[name][self.level]] -= cap
        position = self.position[name]
        if key is None:
            self.members.discard(position)
            return
        members = self.classes[key]
        first = members[0] == position
        del members[bisect_left(members, position)]  # sorted, as `_enter` keeps them
        if not members:
            del self.classes[key]
        elif first:
            self._dirty(self.names[members[0]])  # its class's first now

    def shortfall(self, problem: Problem) -> str:
        """`reduction.shortfall` of the candidates."""
        ps = problem.gang.pod_sets[0]
        if self.room < ps.count:
            return room_shortfall(problem, ps, self.room)
        if self.level is not None:
            return domain_shortfall(problem, self.per_domain)
        return ""

    def notes(self, kept: int) -> list[str]:
        """What `reduce_symmetry` notes when `kept` candidates are left."""
        if kept < len(self.entries):
            return [f"{len(self.entries)} candidate nodes, {kept} after symmetry"]
        return []

    def reduction(self, problem: Problem) -> Reduction:
        """`reduce_symmetry(candidates(...))`: each class's first `need` candidates in
        snapshot order, every pristine clique's members, the classes' kept candidates as
        twins in the order of their first."""
        need = problem.gang.pod_count
        firsts = [members[:need] for members in self.classes.values()]
        kept = sorted([*self.members, *(p for group in firsts for p in group)])
        names = [self.names[p] for p in kept]
        ps_name = problem.gang.pod_sets[0].name
        caps = {(ps_name, name): self.entries[name][0] for name in names}
        groups = sorted(group for group in firsts if len(group) > 1)
        twins = [[self.names[p] for p in group] for group in groups]
        return Reduction(names, caps, True, self.notes(len(kept)), twins)

    def ranking(self, problem: Problem, terms: OrderTerms | None = None) -> Ranking:
        """The one-pod scan's `Ranking` of `reduction(problem)` (a gang of one pod), kept
        up to date from the nodes that changed. With `terms` (a gang under fragGradient),
        `gradient_scan`'s ranking of it, each bound raised by the node's order terms."""
        assert problem.gang.pod_count == 1
        weights = term_weights(problem)
        gang = problem.gang
        signature: tuple[object, ...] = (
            gang.tier, gang.workload_type, _bound_shape(gang.pod_sets[0]),
            tuple(weights.items()))
        if terms is not None:  # by id (a workload hashes slowly): the ranking holds both
            signature = (*signature, id(terms), id(terms.workload))
        scan = self.scans.pop(signature, None)  # put back last: the most recently used
        if scan is None:
            scan = _ScanRanking(terms)
            if len(self.scans) >= KEPT_RANKINGS:
                del self.scans[next(iter(self.scans))]
        self.scans[signature] = scan
        fresh = scan.sorted is None
        ranked = scan.ranked(problem, self, weights)
        if terms is not None:  # as `gradient_scan` reports the reduction it ranks
            return Ranking(ranked, len(ranked), self.notes(len(ranked)), True, fresh)
        # as the scan over the candidates reports it: how many have room, no reduction note
        return Ranking(ranked, len(self.entries), [], True, fresh)

    def kept(self, name: str) -> bool:
        """Whether the reduction of a one-pod gang keeps `name`."""
        entry = self.entries.get(name)
        if entry is None:
            return False
        key = entry[1]
        return key is None or self.classes[key][0] == self.position[name]

    def kept_names(self) -> list[str]:
        """The nodes the reduction of a one-pod gang keeps, in candidate order."""
        kept = sorted([*self.members, *(members[0] for members in self.classes.values())])
        return [self.names[p] for p in kept]


class _ScanRanking:
    """The one-pod scan's ranked candidates of one tracker for one gang signature, updated
    for its `dirty` nodes (changed, their rack mates, those that became or stopped being
    their class's first); every lower bound remembered with what it read of the rest of
    the snapshot. With `terms`, the bounds are `gradient_bounds`, which also read the
    node's fill rank (kept with the rest) and its fragGradient (a value of its state)."""

    def __init__(self, terms: OrderTerms | None = None) -> None:
        self.terms = terms
        # held, so no other workload takes its id while this ranking is kept
        self.workload = terms.workload if terms is not None else None
        self.dirty: set[str] = set()
        self.bounds: dict[str, tuple[tuple[object, ...], float]] = {}
        self.sorted: list[tuple[float, int, str]] | None = None
        self.entry: dict[str, tuple[float, int, str]] = {}

    def forget(self) -> None:
        """Rank every candidate again on the next call."""
        self.sorted = None
        self.dirty.clear()

    def ranked(
        self, problem: Problem, tracker: LiveReduction, weights: dict[str, int]
    ) -> list[tuple[float, int, str]]:
        if self.sorted is None:
            names = tracker.kept_names()
            values = self._bounds(problem, names, weights)
            self.sorted = sorted(
                zip(values, (tracker.position[n] for n in names), names, strict=True)
            )
            self.entry = {entry[2]: entry for entry in self.sorted}
            self.dirty.clear()
            return self.sorted
        ranked = self.sorted
        for name in self.dirty:
            old = self.entry.pop(name, None)
            if old is not None:
                del ranked[bisect_left(ranked, old)]
        names = [name for name in self.dirty if tracker.kept(name)]
        for name, value in zip(names, self._bounds(problem, names, weights), strict=True):
            entry = (value, tracker.position[name], name)
            insort(ranked, entry)
            self.entry[name] = entry
        self.dirty.clear()
        return ranked

    def _bounds(
        self, problem: Problem, names: Sequence[str], weights: dict[str, int]
    ) -> list[float]:
        """`scan_lower_bound` of each node, remembered until the node changes or what
        `bound_contexts` names of the rest of the snapshot does."""
        remembered = self.bounds
        contexts = bound_contexts(problem, names)
        if self.terms is not None:
            rank = self.terms.fill_rank(problem)
            contexts = [(*around, rank.get(name))
                        for name, around in zip(names, contexts, strict=True)]
        stale = [
            i for i, (name, around) in enumerate(zip(names, contexts, strict=True))
            if (entry := remembered.get(name)) is None or entry[0] != around
        ]
        if stale:
            bounds = lower_bounds if self.terms is None else partial(
                gradient_bounds, terms=self.terms)
            fresh = bounds(problem, [names[i] for i in stale], weights)
            for i, value in zip(stale, fresh, strict=True):
                remembered[names[i]] = (contexts[i], value)
        return [remembered[name][1] for name in names]


def _bound_shape(ps: PodSet) -> tuple[object, ...]:
    """What the lower bound reads of the pod set besides its place (tier, VRAM, GPUs)."""
    return (ps.gpus, ps.gpu_milli_per_pod, ps.vram_mib, ps.fractional)


def live_reduction(problem: Problem, memo: NodeMemo) -> LiveReduction | None:
    """The tracker for `problem`'s gang on its snapshot, synced (created when missing or
    stale), or None when the gang or the snapshot takes the full path. Call `memo.sync`
    for the snapshot first."""
    gang = problem.gang
    snapshot = problem.snapshot
    if not isinstance(snapshot, TrackedSnapshot) or len(gang.pod_sets) != 1 or gang.siblings:
        return None
    ps = gang.pod_sets[0]
    if (ps.compute_domain is not None and gang.closed_cliques) or keeps_off_gpus(problem, ps):
        return None
    if per_node_limit(problem) is not None:
        return None
    names = problem.candidates[ps.name]
    # the tracker holds `names`, so its id is not reused while the entry lives
    key = ("live-reduction", id(names), pod_shape(ps), ps.count, gang.numa_policy,
           problem.levels, gang.required_level)
    tracker = cast(LiveReduction | None, snapshot.static_cache.get(key))
    if tracker is None or not tracker.fits(problem) or not tracker.sync(problem, memo):
        tracker = LiveReduction(problem, memo)
        snapshot.static_cache[key] = tracker
    else:
        tracker.fresh = False
    return tracker
