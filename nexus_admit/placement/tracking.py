"""A cluster snapshot that records which nodes changed, so vectorised policies can keep a
numpy mirror of free capacity and re-read only what moved (the simulator places tens of
thousands of gangs on one long-lived snapshot).

Policies never require it: on a plain `ClusterSnapshot` they rebuild their mirror from all
nodes, which is what the controller does on every fresh snapshot anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from nexus_admit.model import ClusterSnapshot, Gang, Node, Slot, apply_slots, release_slots

__all__ = ["TrackedSnapshot"]


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
