"""A cluster snapshot that records which nodes changed, so the caches kept on it re-read
only what moved: the simulator places tens of thousands of gangs on one long-lived
snapshot, and the controller's passes keep one from event to event (`kube/cluster/live.py`).

Nothing requires it: on a plain `ClusterSnapshot` every cache starts from all nodes.

Every cache kept from the log (`memo.NodeMemo`, `live_facts`, `live_reduction`,
`baselines/vector.NodeMirror`) reads it through a `ChangeCursor`, with one rebuild rule
(`too_many_changes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from nexus_admit.model import ClusterSnapshot, Gang, Node, Slot, apply_slots, release_slots

__all__ = ["ChangeCursor", "TrackedSnapshot", "too_many_changes"]


class TrackedSnapshot(ClusterSnapshot):
    """`change_log` lists node names whose free capacity changed, append-only. Change free
    capacity only through `apply` / `release` / `touch`."""

    def __init__(
        self,
        nodes: Mapping[str, Node] | None = None,
        kueue_topologies: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        super().__init__(dict(nodes or {}), dict(kueue_topologies or {}))
        self.change_log: list[str] = []

    @classmethod
    def of(
        cls, nodes: Iterable[Node], kueue_topologies: Mapping[str, tuple[str, ...]] | None = None
    ) -> TrackedSnapshot:
        return cls({n.name: n for n in nodes}, kueue_topologies)

    def apply(self, gang: Gang, slots: Sequence[Slot]) -> None:
        apply_slots(self, gang, slots)
        self.change_log.extend(s.node for s in slots)

    def release(self, gang: Gang, slots: Sequence[Slot]) -> None:
        release_slots(self, gang, slots)
        self.change_log.extend(s.node for s in slots)

    def touch(self, names: Iterable[str]) -> None:
        """Record nodes changed by other means (e.g. a node made unschedulable)."""
        self.change_log.extend(names)


def too_many_changes(changed: int, size: int) -> bool:
    """The one rebuild rule of the caches kept from a change log: past 64 changes and a
    quarter of the `size` items a cache keeps, rebuilding costs less than reading each."""
    return changed > 64 + size // 4


class ChangeCursor:
    """A cache's place in one snapshot's change log: `changed` gives the nodes changed
    since its last call, or None when the cache must be rebuilt instead."""

    __slots__ = ("log", "seen")

    def __init__(self, snapshot: TrackedSnapshot) -> None:
        self.log = snapshot.change_log
        self.seen = len(self.log)

    def follows(self, snapshot: ClusterSnapshot) -> bool:
        """Is this cursor on `snapshot`'s log (the same snapshot object)?"""
        return isinstance(snapshot, TrackedSnapshot) and snapshot.change_log is self.log

    def changed(self, snapshot: TrackedSnapshot, *, bounded: bool = True) -> set[str] | None:
        """The names changed since the last call that `snapshot` still has, the cursor
        moved past them; None (the cursor unmoved) for another log, a log shorter than
        the cursor (never, for an append-only log) or, when `bounded`,
        `too_many_changes`."""
        log = snapshot.change_log
        if (log is not self.log or self.seen > len(log)
                or (bounded and too_many_changes(len(log) - self.seen, len(snapshot.nodes)))):
            return None
        names = {name for name in log[self.seen:] if name in snapshot.nodes}
        self.seen = len(log)
        return names
