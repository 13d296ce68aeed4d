"""One pass's record: what every Workload of the pass is decided on, read once, and the
capacity `decide` solves on (the pass's snapshot, or one rebuilt without some drains)."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from nexus_admit.controller.context import Context
from nexus_admit.controller.inflight import WritePipeline
from nexus_admit.controller.ledger import Assumed
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.kueue import KueueIndex
from nexus_admit.kube.views import ReservationView
from nexus_admit.model import ClusterSnapshot, Gang, Placement, PlacementConfig
from nexus_admit.placement.base import PlacementPolicy
from nexus_admit.placement.sequence import OrderedPlacer
from nexus_admit.placement.tracking import TrackedSnapshot

__all__ = [
    "SLOW_SOLVE_SECONDS",
    "PassCapacity",
    "PassRecord",
    "Solve",
    "TimedPolicy",
    "drain_reservation_keys",
    "ledger_holds",
]

log = logging.getLogger(__name__)

# a solve this long (wall) is logged with how much the engine looked at: the tail of the
# solve histograms, read per decision (a one-pod decision takes a few milliseconds)
SLOW_SOLVE_SECONDS = 0.1


@dataclass(slots=True)
class PassRecord:
    """What one pass decides on; its Workloads are placed one after another on `placer`,
    so each sees the capacity the ones before it took."""

    ctx: Context
    dump: ClusterDump
    kueue: KueueIndex
    placer: OrderedPlacer
    now: datetime
    # (tier, GPU milli) of every Workload waiting on our checks: backfill
    demands: Sequence[tuple[str, int]] = ()
    # where feasible placements' creates go, to overlap the next Workloads' solves
    # (controller/inflight.py; awaited at once when None)
    writes: WritePipeline | None = None
    # the Workloads whose reservations the pass's snapshot leaves out (no reservation of
    # their current attempt yet)
    unreserved: frozenset[str] = frozenset()

    @property
    def snapshot(self) -> ClusterSnapshot:
        return self.placer.snapshot


@dataclass(frozen=True, slots=True)
class Solve:
    outcome: str  # "feasible", else the placement's status
    pods: str  # the gang's size: "1" or "several"
    seconds: float  # wall time
    cpu_seconds: float  # the solving thread's CPU time: without waits for a core or the GIL
    # "fleet": the engine derived the gang's facts over every candidate node, O(fleet) (the
    # first decision of a pod shape, or after a snapshot renewal); "kept": it reused them
    facts: str = "kept"


@dataclass(slots=True)
class TimedPolicy:
    """The engine, with each solve's time kept for the solve metrics (observed by the loop:
    the solves run in the solver's thread)."""

    engine: PlacementPolicy
    solves: list[Solve] = field(default_factory=list)
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.engine.name

    def place(self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig) -> Placement:
        started, cpu_started = time.perf_counter(), time.thread_time()
        placement = self.engine.place(snapshot, gang, config)
        seconds, cpu_seconds = time.perf_counter() - started, time.thread_time() - cpu_started
        outcome = "feasible" if placement.feasible else placement.status.value
        size = "1" if gang.pod_count == 1 else "several"
        facts = "kept" if placement.fleet_scan is False else "fleet"
        self.solves.append(Solve(outcome, size, seconds, cpu_seconds, facts))
        if seconds >= SLOW_SOLVE_SECONDS:
            log.info(
                "slow solve of %s (pods %d, %s, %d nodes, facts %s): %.0f ms, %.0f ms CPU: %s",
                gang.name, gang.pod_count, outcome, len(snapshot.nodes), facts, seconds * 1000,
                cpu_seconds * 1000, "; ".join(placement.explanation[-2:]),
            )
        return placement


@dataclass(slots=True)
class PassCapacity:
    """The pass's capacity for `decide`: its snapshot, where drains are reservations that
    hold their slots like any other. Without some drains, the snapshot is rebuilt from the
    pass's objects without those reservations, with everything this run has promised held
    again (`held`, copied from the ledger before the solve thread starts), so it is never
    freer than the pass's snapshot but where those drains were."""

    snapshot: ClusterSnapshot
    policy: TimedPolicy
    dump: ClusterDump
    now: datetime
    unreserved: frozenset[str]
    drain_reservations: Mapping[str, str]  # draining Workload -> its reservation key
    held: Sequence[Assumed] = ()

    def admit(self, gang: Gang) -> Gang:
        return gang  # drains hold their slots in the snapshot itself

    def without(self, drains: Collection[str]) -> _Rebuilt | None:
        skip = frozenset(self.drain_reservations[d] for d in drains
                         if d in self.drain_reservations)
        # the pass's snapshot was built from the same objects and reported what it left out
        bare = self.dump.snapshot(exclude_workloads=self.unreserved | frozenset(drains),
                                  now=self.now, skipped=[])
        side = OrderedPlacer(self.policy, TrackedSnapshot(bare.nodes, bare.kueue_topologies))
        for a in self.held:
            if a.reservation not in skip:
                # a preemptor's or a drain's slots overlap pods that are still leaving
                side.hold(a.gang, a.slots, over=True)
        return _Rebuilt(side.snapshot, self.policy)


@dataclass(frozen=True, slots=True)
class _Rebuilt:
    snapshot: ClusterSnapshot
    policy: PlacementPolicy

    def admit(self, gang: Gang) -> Gang:
        return gang

    def without(self, drains: Collection[str]) -> None:
        return None  # one rebuild per decision


def ledger_holds(ctx: Context) -> tuple[Assumed, ...]:
    """Every assumption of this run, and this pass's unsure creates (copied: the solve
    thread must not read the ledger the loop changes)."""
    return (*ctx.ledger.assumed.values(), *ctx.ledger.unsure.values())


def drain_reservation_keys(reservations: Sequence[ReservationView]) -> dict[str, str]:
    """Draining Workload -> its reservation key."""
    return {rr.workload_key: rr.key for rr in reservations}
