"""Capacity the controller has promised but the cluster does not show yet.

Who calls it: `loop/` (place, writes), around every placement it writes. The order follows Kueue's
scheduler (`assumeWorkload`): the placement is *assumed* before its ResourceReservation is
created, so the next decision already sees the GPUs as taken, and it is *forgotten* if the
write fails. Once the watch delivers the reservation the snapshot counts it and the
assumption is dropped. Nothing here survives a restart, and nothing needs to: after a
restart every promise is a ResourceReservation in the cluster.

Pure: no kopf, no client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from nexus_admit.model import Gang, Slot
from nexus_admit.placement.sequence import OrderedPlacer

__all__ = ["Assumed", "Ledger"]


@dataclass(frozen=True, slots=True)
class Assumed:
    reservation: str  # the ResourceReservation's "namespace/name"
    workload: str  # "namespace/name"
    gang: Gang
    slots: tuple[Slot, ...]
    since: float  # monotonic seconds when assumed


@dataclass(slots=True)
class Ledger:
    assumed: dict[str, Assumed] = field(default_factory=dict)
    # creates whose answer was lost: the reservation may exist, so its slots stay taken
    # until the watch shows it or the same time as an assumption has passed without (a
    # later pass must not promise them again meanwhile)
    unsure: dict[str, Assumed] = field(default_factory=dict)

    def assume(
        self, reservation: str, workload: str, gang: Gang, slots: tuple[Slot, ...], now: float
    ) -> None:
        self.assumed[reservation] = Assumed(reservation, workload, gang, slots, now)

    def forget(self, reservation: str) -> None:
        self.assumed.pop(reservation, None)

    def lost(self, reservation: str) -> None:
        """The create's answer was lost: no longer assumed, but possibly written."""
        a = self.assumed.pop(reservation, None)
        if a is not None:
            self.unsure[reservation] = a

    def withdraw(self, reservation: str) -> None:
        """A withdrawn placement's reservation is deleted: nothing of it is held any more."""
        self.assumed.pop(reservation, None)
        self.unsure.pop(reservation, None)

    def keep_unsure(
        self, reservation: str, workload: str, gang: Gang, slots: tuple[Slot, ...], now: float
    ) -> None:
        """A reservation that may exist on `slots` (a withdrawn one whose delete failed):
        held like a lost create until the watch shows it or the same time has passed."""
        self.assumed.pop(reservation, None)
        self.unsure[reservation] = Assumed(reservation, workload, gang, slots, now)

    def settle(self, counted: Callable[[Assumed], bool]) -> None:
        """Drop the assumptions, and the lost creates, the cluster's own objects now
        account for (or that `counted` says are over)."""
        for held in (self.assumed, self.unsure):
            for key in [k for k, a in held.items() if counted(a)]:
                del held[key]

    def hold_in(self, placer: OrderedPlacer, skip: frozenset[str] = frozenset()) -> None:
        """Take every outstanding assumption's capacity (and the lost creates')
        from the placer's snapshot, but the reservations in `skip`."""
        for a in (*self.assumed.values(), *self.unsure.values()):
            if a.reservation in skip:
                continue
            # a preemptor's or a drain's slots overlap pods that are still leaving
            placer.hold(a.gang, a.slots, over=True)
