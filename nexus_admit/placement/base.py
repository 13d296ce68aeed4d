"""The one interface every placement policy implements.

The table of policies by name is `nexus_admit.placement.policies`; this module depends on the
model only, so every policy can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from nexus_admit.model import ClusterSnapshot, Gang, Placement, PlacementConfig

__all__ = ["PlacementPolicy", "PolicyFactory"]


@runtime_checkable
class PlacementPolicy(Protocol):
    """`place` never mutates `snapshot`; callers apply the returned slots themselves."""

    name: str

    def place(
        self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig
    ) -> Placement: ...


PolicyFactory = Callable[[int], PlacementPolicy]  # seed -> policy
