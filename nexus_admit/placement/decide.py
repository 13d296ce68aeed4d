"""One decision per gang, written once: what the controller's pass and the replay both do
with a gang that waits for a place.

`decide` walks the ladder, each rung tried only when the ones before it did not place the
gang:

1. a gang that drains for itself is placed as soon as it fits without its drain
   (`MoveOffDrain`), else it keeps draining (`KeepDraining`);
2. backfill: a lower tier keeps off hardware whose owning tier has a gang waiting that it
   could hold; solve (`Place`);
3. a drain never makes a higher tier wait that has no place off its nodes: solve as if the
   lower tiers' drains held nothing, and withdraw the drains that placement crosses
   (`PlaceOverDrains`);
4. preemption: the cheapest whole lower-tier gangs inside one domain (`Preempt`);
5. drain-to-fit: a gang that waited long enough gets the domain that frees soonest
   (`Drain`);
6. otherwise `Retry` (it may fit later; the caller keeps one whose placement is
   `UNAVAILABLE`, no node it may use is schedulable now, waiting instead) or `Reject` (it
   never can).

Pure: no client, no clock, no writes. Where capacity lives differs between the callers (the
controller counts a draining reservation's slots in its snapshot and rebuilds one without
it; the replay keeps drained nodes out of other gangs), so `decide` solves through a
`Capacity`, and the caller applies the `Decision` it returns: the controller with API
writes, the replay in memory. Neither decides anything itself.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from nexus_admit.model import ClusterSnapshot, Gang, Placement, PlacementConfig, SolveStatus
from nexus_admit.placement.base import PlacementPolicy
from nexus_admit.placement.preemption import (
    PreemptionPlan,
    RunningGang,
    answer_when_kept_off,
    owners_waiting,
    plan_drain,
    plan_preemption,
    restrict_borrowing,
)

__all__ = [
    "BACKFILL_REASON",
    "Capacity",
    "Decision",
    "DecisionRequest",
    "Drain",
    "KeepDraining",
    "LiveDrain",
    "MoveOffDrain",
    "NodesKeptFree",
    "Place",
    "PlaceOverDrains",
    "Preempt",
    "Reject",
    "Retry",
    "decide",
]

BACKFILL_REASON = "kept off the hardware a waiting higher tier owns (preemption.backfill)"
DRAINED_REASON = "kept off nodes drained for another gang"
MOVED_OFF_DRAIN = (
    "placed before its drain ended: it fits now without waiting for the Workloads the "
    "drain waited for"
)


@dataclass(frozen=True, slots=True)
class LiveDrain:
    """A gang's drain-to-fit in progress: the nodes it keeps for that gang."""

    name: str  # the draining gang's name
    tier: str
    nodes: frozenset[str]


class Capacity(Protocol):
    """The free capacity a gang is solved on, as its caller represents it."""

    @property
    def snapshot(self) -> ClusterSnapshot: ...

    @property
    def policy(self) -> PlacementPolicy: ...

    def admit(self, gang: Gang) -> Gang:
        """`gang` as this capacity lets it be placed (kept off nodes drained for others)."""
        ...

    def without(self, drains: Collection[str]) -> Capacity | None:
        """The same capacity as if the drains of these gangs held nothing; None when it
        cannot be had now (the caller looks again on its next pass)."""
        ...


@dataclass(frozen=True, slots=True)
class NodesKeptFree:
    """Capacity where a drain keeps its nodes free of other gangs' new placements (the
    in-memory representation: the replay, tests). `drains`: draining gang -> its nodes."""

    snapshot: ClusterSnapshot
    policy: PlacementPolicy
    drains: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def admit(self, gang: Gang) -> Gang:
        kept_out = frozenset().union(
            *(nodes for name, nodes in self.drains.items() if name != gang.name)
        )
        return avoid_nodes(gang, self.snapshot, kept_out)

    def without(self, drains: Collection[str]) -> NodesKeptFree:
        return replace(self, drains={k: v for k, v in self.drains.items() if k not in drains})


def avoid_nodes(gang: Gang, snapshot: ClusterSnapshot, nodes: frozenset[str]) -> Gang:
    """`gang` kept off `nodes`."""
    if not nodes:
        return gang
    everything = frozenset(snapshot.nodes)
    return replace(gang, pod_sets=tuple(
        replace(ps, allowed_nodes=(ps.allowed_nodes if ps.allowed_nodes is not None
                                   else everything) - nodes)
        for ps in gang.pod_sets))


@dataclass(frozen=True, slots=True)
class DecisionRequest:
    """What the decision for one gang depends on, besides the capacity."""

    gang: Gang  # as asked (translated from its Workload or job)
    config: PlacementConfig
    # (tier, GPU milli) of every gang waiting for a place: backfill keeps lower tiers off
    # the hardware of a tier that has one its free GPUs could hold
    waiting: Sequence[tuple[str, int]] = ()
    # the running gangs preemption and drains may consider; called only when needed
    running: Callable[[], Sequence[RunningGang]] = lambda: ()
    # other gangs' drains in progress that may give way to this one (each still waits
    # for its place); whether one does is decided here, by tier
    drains: Sequence[LiveDrain] = ()
    own_drain: LiveDrain | None = None  # this gang's own drain, when it drains
    # the caller's model of Kueue's pace: no more than one preemption per cycle (replay)
    may_preempt: bool = True


@dataclass(frozen=True, slots=True)
class Place:
    gang: Gang  # as solved (backfill may have narrowed its nodes)
    placement: Placement


@dataclass(frozen=True, slots=True)
class PlaceOverDrains:
    """Placed on nodes lower tiers' drains held: those drains are withdrawn."""

    gang: Gang
    placement: Placement
    withdrawn: tuple[LiveDrain, ...]


@dataclass(frozen=True, slots=True)
class MoveOffDrain:
    """A draining gang fits now without its drain: placed, the drain ends."""

    gang: Gang
    placement: Placement
    drain: LiveDrain


@dataclass(frozen=True, slots=True)
class KeepDraining:
    drain: LiveDrain


@dataclass(frozen=True, slots=True)
class Preempt:
    gang: Gang
    plan: PreemptionPlan  # the victims, the domain and the placement once they left


@dataclass(frozen=True, slots=True)
class Drain:
    gang: Gang
    plan: PreemptionPlan  # the Workloads waited for, the domain and the placement


@dataclass(frozen=True, slots=True)
class Retry:
    placement: Placement  # the infeasible answer: its reason, its hold

    @property
    def reason(self) -> str:
        return self.placement.reason

    @property
    def after_seconds(self) -> float | None:
        return self.placement.retry_after_seconds


@dataclass(frozen=True, slots=True)
class Reject:
    placement: Placement

    @property
    def reason(self) -> str:
        return self.placement.reason


Decision = (
    Place | PlaceOverDrains | MoveOffDrain | KeepDraining | Preempt | Drain | Retry | Reject
)


def solve(capacity: Capacity, gang: Gang, config: PlacementConfig) -> Placement:
    """The policy's answer on `capacity`; takes nothing (the caller applies a decision)."""
    return capacity.policy.place(capacity.snapshot, capacity.admit(gang), config)


def backfilled(snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig,
               waiting: Iterable[tuple[str, int]]) -> Gang:
    """`gang` kept off the hardware whose owning tier has a gang waiting that it could
    hold (only with preemption on)."""
    if not config.preemption.enabled:
        return gang
    return restrict_borrowing(snapshot, gang, config, owners_waiting(snapshot, config, waiting))


def decide(request: DecisionRequest, capacity: Capacity) -> Decision:
    """The one decision for `request.gang` on `capacity` (see the module's ladder)."""
    config = request.config
    gang = backfilled(capacity.snapshot, request.gang, config, request.waiting)
    if request.own_drain is not None:
        return _own_drain(request.own_drain, gang, config, capacity)
    admitted = capacity.admit(gang)
    placement = capacity.policy.place(capacity.snapshot, admitted, config)
    if admitted is not request.gang:
        why = [BACKFILL_REASON] if gang is not request.gang else []
        if admitted is not gang:
            why.append(DRAINED_REASON)
        placement = answer_when_kept_off(capacity.snapshot, request.gang, placement, config,
                                          "; ".join(why))
    if placement.feasible:
        return Place(gang, placement)
    waits_for_nodes = placement.status is SolveStatus.UNAVAILABLE  # no victim frees a node
    if placement.retryable and config.preemption.enabled and not waits_for_nodes:
        found = _over_drains(request, gang, capacity) or _preempt_or_drain(request, gang,
                                                                          capacity)
        if found is not None:
            return found
    return Retry(placement) if placement.retryable else Reject(placement)


def _own_drain(drain: LiveDrain, gang: Gang, config: PlacementConfig,
               capacity: Capacity) -> MoveOffDrain | KeepDraining:
    """A drain waits only while its gang fits nowhere else."""
    free = capacity.without({drain.name})
    if free is None:
        return KeepDraining(drain)
    placement = solve(free, gang, config)
    if not placement.feasible:
        return KeepDraining(drain)
    placement.explanation.append(MOVED_OFF_DRAIN)
    return MoveOffDrain(gang, placement, drain)


def _over_drains(request: DecisionRequest, gang: Gang,
                 capacity: Capacity) -> PlaceOverDrains | None:
    """A drain gives way to a gang of a higher tier that has no place off its nodes; it
    holds against its own tier and below, so their stream of small jobs cannot starve the
    gang it drains for."""
    config = request.config
    yielding = [d for d in request.drains
                if d.name != gang.name and config.tier_rank(gang.tier) < config.tier_rank(d.tier)]
    if not yielding:
        return None
    free = capacity.without({d.name for d in yielding})
    if free is None:
        return None
    placement = solve(free, gang, config)
    if not placement.feasible:
        return None
    used = {s.node for s in placement.slots}
    crossed = tuple(d for d in yielding if d.nodes & used)
    if not crossed:
        return None  # its lack of room was not the drains'
    names = ", ".join(d.name for d in crossed)
    placement.explanation.append(
        f"placed on nodes drained for {names}: no place off them; the drain was withdrawn"
    )
    return PlaceOverDrains(gang, placement, crossed)


def _preempt_or_drain(request: DecisionRequest, gang: Gang,
                      capacity: Capacity) -> Preempt | Drain | None:
    """Evict the cheapest lower tiers inside one domain; a tier that may evict no one, or
    finds no victims, drains a domain once it has waited `drainAfterSeconds`."""
    if not request.may_preempt:
        return None
    config = request.config
    admitted = capacity.admit(gang)
    running = [r for r in request.running() if r.name != gang.name]
    if config.evictable_tiers(gang.tier):
        if not running:
            return None
        plan = plan_preemption(capacity.policy, capacity.snapshot, admitted, running, config)
        if plan is not None:
            return Preempt(gang, plan)
    after = config.preemption.drain_after_seconds
    if after is None or gang.waited_seconds < after:
        return None
    drain = plan_drain(capacity.policy, capacity.snapshot, admitted, running, config)
    return Drain(gang, drain) if drain is not None else None
