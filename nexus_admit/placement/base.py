"""The one interface every placement policy implements.

The table of policies by name is `nexus_admit.placement.policies`; this module depends on the
model only, so every policy can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from threading import Event
from typing import Protocol, runtime_checkable

from nexus_admit.model import ClusterSnapshot, Gang, Placement, PlacementConfig

__all__ = ["Alongside", "PlacementPolicy", "PolicyFactory", "SolvesBeside", "Warms"]


@runtime_checkable
class PlacementPolicy(Protocol):
    """`place` never mutates `snapshot`; callers apply the returned slots themselves."""

    name: str

    def place(
        self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig
    ) -> Placement: ...


@runtime_checkable
class Warms(Protocol):
    """A policy that can derive ahead, on a snapshot it keeps facts of, what a later
    `place` of a gang reads; that `place` then costs only what changed in between."""

    def warm(self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig) -> bool: ...


# work run beside a solve, in a thread of its own: called with an event that is set when the
# solve is done; it returns soon after (the decision waits for it)
Alongside = Callable[[Event], None]


@runtime_checkable
class SolvesBeside(Protocol):
    """A policy whose solves leave the interpreter's lock free for a while (CP-SAT's): the
    work set here runs in another thread for the length of each such solve, and never
    beside the policy's own Python code, so it may call the policy's `warm`."""

    def work_beside_solves(self, work: Alongside | None) -> None: ...


PolicyFactory = Callable[[int], PlacementPolicy]  # seed -> policy
