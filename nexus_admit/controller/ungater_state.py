"""The ungater's own state (`ungating/ungater.py`), in a layer below the pass steps: the
lifecycle must respect its claims too (`lifecycle_plan.held_slots` keeps a slot just
handed to a pod whose pin the watch has not shown yet)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from nexus_admit.controller.context import Context
from nexus_admit.controller.pod_owners import OwnerChains
from nexus_admit.controller.tasks import Background

__all__ = ["UngaterState"]


@dataclass
class UngaterState:
    """The ungater's own state: its claims (pod uid → slot key, "" for a gate lift) on pods
    patched but not yet seen ungated through the watch, the pods already told they are
    not their reservation's, its pass and pin patches in flight, and the owners above
    pods (`pod_owners.py`, read on the main loop)."""

    claims: dict[str, str] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    # the pin patches in flight (its loop does not wait for a pass's patches)
    writes: Background = field(default_factory=lambda: Background(limit=16))
    chains: OwnerChains | None = None

    def owner_chains(self, ctx: Context) -> OwnerChains:
        if self.chains is None:
            self.chains = OwnerChains(ctx.read_owner)
        return self.chains

    def stop(self) -> None:
        """Cancel its pass and pin patches in flight."""
        if self.task is not None:
            self.task.cancel()
        self.writes.cancel()

    def reset(self) -> None:
        """Only a leader patches: its pass and patches stop, and its claims die with them
        (the next leader re-reads the pods); who was told is told again by that leader."""
        self.stop()
        self.claims.clear()
        self.refused = set()
