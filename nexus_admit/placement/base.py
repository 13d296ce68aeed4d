"""The one interface every placement policy implements.

The table of policies by name is `nexus_admit.placement.policies`; this module depends on the
model only, so every policy can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from nexus_admit.model import ClusterSnapshot, Gang, Placement, PlacementConfig

__all__ = ["PlacementPolicy", "PolicyFactory", "Warms"]


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


PolicyFactory = Callable[[int], PlacementPolicy]  # seed -> policy
