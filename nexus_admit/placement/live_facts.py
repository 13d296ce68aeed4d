"""Facts every solve reads of the whole fleet, kept on a `TrackedSnapshot` from its change
log: which NVLink cliques are pristine, and the free GPU share per domain of a level.

A one-pod decision on a 5,000-node snapshot spent a fifth of its time recounting these over
every node although a pass changes a handful. Each tracker lives in the snapshot's
`static_cache` (dropped with it whenever labels, taints or the node set change) and reads
the change-log entries appended since its last call (`tracking.ChangeCursor`); it answers
exactly what the full count over the snapshot answers, in the same order. A plain
`ClusterSnapshot` has no tracker: `Problem` counts over every node, as always.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import compress
from typing import cast

from nexus_admit.model import ClusterSnapshot, Domain
from nexus_admit.placement.columns import gpu_columns, level_codes, level_free
from nexus_admit.placement.node_kinds import node_kinds
from nexus_admit.placement.tracking import ChangeCursor, TrackedSnapshot

__all__ = ["live_domain_free", "live_pristine_cliques"]

Paths = dict[str, tuple[Domain | None, ...]]


class _Cliques:
    """Members per clique (in snapshot order, cliques in order of their first member) and
    how many members of each are not pristine."""

    def __init__(self, snapshot: TrackedSnapshot) -> None:
        self.cursor = ChangeCursor(snapshot)
        self.members: dict[str, list[str]] = {}
        self.pristine: dict[str, bool] = {}  # node -> pristine, nodes of cliques only
        self.broken: dict[str, int] = defaultdict(int)
        self.pristine_now: dict[str, list[str]] | None = None  # the answer, until one flips
        for node in snapshot:
            if node.clique is None:
                continue
            self.members.setdefault(node.clique, []).append(node.name)
            self.pristine[node.name] = node.is_pristine()
            self.broken[node.clique] += not self.pristine[node.name]

    def sync(self, snapshot: TrackedSnapshot) -> bool:
        """Apply the changes since the last call; False when a rebuild is needed."""
        changed = self.cursor.changed(snapshot)
        if changed is None:
            return False
        for name in changed:
            node = snapshot.nodes[name]
            before = self.pristine.get(name)
            if before is None or node.clique is None:
                continue  # no clique (a node's clique is a label: it never changes here)
            now = node.is_pristine()
            if now != before:
                self.pristine[name] = now
                self.broken[node.clique] += -1 if now else 1
                self.pristine_now = None
        return True

    def answer(self) -> dict[str, list[str]]:
        """A new dict each call (a caller may keep it); counted again only after a change."""
        if self.pristine_now is None:
            self.pristine_now = {
                c: members for c, members in self.members.items() if not self.broken[c]
            }
        return dict(self.pristine_now)


def live_pristine_cliques(snapshot: ClusterSnapshot) -> dict[str, list[str]] | None:
    """NVLink clique -> its node names, for the cliques all of whose nodes are pristine (as
    `prepare` counts them), or None for a snapshot without a change log. The member lists
    are shared between calls: read them, never change them."""
    if not isinstance(snapshot, TrackedSnapshot):
        return None
    key = ("live-cliques",)
    tracker = cast(_Cliques | None, snapshot.static_cache.get(key))
    if tracker is None or not tracker.sync(snapshot):
        tracker = _Cliques(snapshot)
        snapshot.static_cache[key] = tracker
    return tracker.answer()


class _DomainFree:
    """Free GPU share per domain of one level and what each GPU node adds to it."""

    def __init__(self, snapshot: TrackedSnapshot, paths: Paths, levels: tuple[str, ...],
                 level_index: int) -> None:
        self.cursor = ChangeCursor(snapshot)
        self.paths = paths
        # counted on the snapshot's columns, as a plain snapshot's count is
        codes = level_codes(snapshot, levels, level_index)
        free = gpu_columns(snapshot).free
        self.free: dict[Domain, int] = defaultdict(int, level_free(snapshot, codes, free))
        counted = (codes.codes >= 0) & (node_kinds(snapshot).gpu_count > 0)
        self.adds: dict[str, int] = dict(
            zip(compress(snapshot.nodes, counted.tolist()), free[counted].tolist(), strict=True)
        )
        self.level_index = level_index

    def sync(self, snapshot: TrackedSnapshot) -> bool:
        changed = self.cursor.changed(snapshot)
        if changed is None:
            return False
        for name in changed:
            before = self.adds.get(name)
            if before is None:
                continue  # no GPUs or no domain of the level: both are labels
            now = snapshot.nodes[name].free_gpu_milli
            domain = self.paths[name][self.level_index]
            assert domain is not None  # it added before
            self.free[domain] += now - before
            self.adds[name] = now
        return True


def live_domain_free(
    snapshot: ClusterSnapshot, paths: Paths, levels: tuple[str, ...], level_index: int
) -> dict[Domain, int] | None:
    """`Problem.domain_free_gpu_milli` of a snapshot with a change log (a fresh copy: the
    caller may add keys), or None for one without. `paths` are the snapshot's node paths
    under `levels`."""
    if not isinstance(snapshot, TrackedSnapshot):
        return None
    key = ("live-domain-free", levels, level_index, id(paths))  # the tracker keeps paths alive
    tracker = cast(_DomainFree | None, snapshot.static_cache.get(key))
    if (
        tracker is None
        or tracker.paths is not paths
        or not tracker.sync(snapshot)
    ):
        tracker = _DomainFree(snapshot, paths, levels, level_index)
        snapshot.static_cache[key] = tracker
    free: dict[Domain, int] = defaultdict(int)
    free.update(tracker.free)
    return free
