"""Placing gangs one after another against one snapshot: each sees the capacity taken by the
ones placed before it. The step `plan`, both simulators and the controller share.

The caller orders the gangs (Kueue's order: `kube.kueue.admission_order_key`; a
simulator's queue) and decides what an infeasible answer means: a retryable answer
(capacity, fragmentation, a locality hold with `retry_after_seconds`) takes nothing and the
gang waits; an impossible one never fits. Only a feasible placement takes capacity, at once,
so the next gang cannot get the same GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nexus_admit.model import (
    ClusterSnapshot,
    Gang,
    Placement,
    PlacementConfig,
    Slot,
    apply_slots,
    release_slots,
)
from nexus_admit.placement.base import PlacementPolicy
from nexus_admit.placement.tracking import TrackedSnapshot

__all__ = ["OrderedPlacer"]


@dataclass(slots=True)
class OrderedPlacer:
    policy: PlacementPolicy
    snapshot: ClusterSnapshot

    def place(self, gang: Gang, config: PlacementConfig) -> Placement:
        """The policy's answer for `gang`; a feasible one takes its capacity now."""
        placement = self.policy.place(self.snapshot, gang, config)
        if placement.feasible:
            self.hold(gang, placement.slots)
        return placement

    def hold(self, gang: Gang, slots: Sequence[Slot], *, over: bool = False) -> None:
        """Take the capacity of slots decided earlier (a reservation, an assumption); slots
        on nodes the snapshot no longer has hold nothing. `over`: the slots may overlap what
        the snapshot already counts as taken, so capacity stops at zero (never undone)."""
        kept = [s for s in slots if s.node in self.snapshot.nodes]
        if over:
            apply_slots(self.snapshot, gang, kept, clamp=True)
            if isinstance(self.snapshot, TrackedSnapshot):
                self.snapshot.touch(s.node for s in kept)
        elif isinstance(self.snapshot, TrackedSnapshot):
            self.snapshot.apply(gang, kept)
        else:
            apply_slots(self.snapshot, gang, kept)

    def undo(self, gang: Gang, slots: Sequence[Slot]) -> None:
        """Give back what `place` or `hold` took (a write that failed)."""
        kept = [s for s in slots if s.node in self.snapshot.nodes]
        if isinstance(self.snapshot, TrackedSnapshot):
            self.snapshot.release(gang, kept)
        else:
            release_slots(self.snapshot, gang, kept)
