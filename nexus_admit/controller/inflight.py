"""Several reservation creates in flight in one pass, none double-booked.

Who calls it: `loop/cycle.py` makes one `WritePipeline` per pass, `loop/place.py` starts a
feasible placement's create on it and asks for `room` before it applies the next decision.

Each decision is made on the pass's placer, which already holds every placement decided
before it (the ledger's assumptions), so the next Workload is solved while up to
`RunOptions.creates_in_flight` creates are on the wire. The answers are taken in the order
the creates were started (`_take_head`):

- a Workload's check is written only once its own create and every earlier create of the
  pass have come back, so Kueue never admits a Workload on capacity an earlier answer
  could still take from it;
- a refused create gives its GPUs back (the later placements used less than was free:
  they stay valid); a lost answer keeps them held (the reservation may exist);
- a create that finds an earlier reservation of its attempt (AlreadyExists) on other
  slots takes those slots: every later placement of the pass on one of their nodes is
  *withdrawn* before any check is written from it: its reservation deleted, its
  assumption dropped, and the Workload placed again at the end of the pass. Its slots
  stay held for the rest of the pass (given back only by the next pass's snapshot), so
  nothing decided meanwhile can take them while the delete is unsure.

After a restart the same overlap is caught from the objects: `overlaps_other` tells the
answer-from-reservation path that a not yet answered reservation shares a GPU with another
live one (the crash fell between a withdrawal and its delete); it is deleted, not answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.metrics import Metrics
from nexus_admit.controller.outcome import Outcome
from nexus_admit.controller.writes import Reserved, answer, answer_refused, settle
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import meta, object_key
from nexus_admit.kube.quantity import parse_milli
from nexus_admit.kube.reservations import (
    reservation_is_live,
    reservation_pod_label,
    reservation_slots,
)
from nexus_admit.kube.views import WorkloadView
from nexus_admit.model import Gang, Placement, Slot
from nexus_admit.model.cluster import GPU_WHOLE
from nexus_admit.placement.sequence import OrderedPlacer

__all__ = [
    "InFlight",
    "Withdrawn",
    "WritePipeline",
    "held_by",
    "overlaps_other",
    "withdraw_reservation",
    "withdrawn_copy",
]

log = logging.getLogger(__name__)

# the decision modes of reservations that never share a GPU with another such one (a
# drain or a preemptor's reservation is written over gangs that are still leaving)
_EXCLUSIVE_MODES = frozenset({"placed", "borrowed"})


@dataclass(slots=True)
class InFlight:
    """One feasible placement whose create is on the wire."""

    workload: WorkloadView
    check: str
    gang: Gang
    solved: tuple[Slot, ...]  # what the placer holds for it
    ready: Callable[[Placement], Outcome]  # its check's answer from what the reservation holds
    task: asyncio.Task[Reserved]
    withdrawn: bool = False


class WritePipeline:
    """Up to `depth` creates in flight while the next Workloads are solved; their answers
    taken in order (module doc). `withdrawn`: Workloads to place again in this pass."""

    def __init__(self, ctx: Context, placer: OrderedPlacer, depth: int) -> None:
        self.ctx = ctx
        self.placer = placer
        self.depth = max(1, depth)
        self.entries: deque[InFlight] = deque()
        # their views: the pass places them again as it placed them first (`place_one`)
        self.withdrawn: list[tuple[WorkloadView, str | None]] = []
        # the loop's idle wait for the oldest create outside `room` and `flush` (a pass
        # waiting for its creates or for new Workloads), counted in that create's wait
        self.waited = 0.0

    def start(
        self, workload: WorkloadView, check: str, gang: Gang, solved: tuple[Slot, ...],
        ready: Callable[[Placement], Outcome], write: Coroutine[Any, Any, Reserved],
    ) -> None:
        assert len(self.entries) < self.depth, "room() before starting the next write"
        task = asyncio.create_task(write, name="reservation-write")
        self.entries.append(InFlight(workload, check, gang, solved, ready, task))

    async def room(self, metrics: Metrics | None = None) -> bool:
        """Take every answer already back in order, and wait for the oldest while `depth`
        creates are in flight; True when the placer now holds slots a decision made since
        those creates started did not see as taken (decide again)."""
        changed = False
        while self.entries and (self.entries[0].task.done() or len(self.entries) >= self.depth):
            changed = await self._take_head(metrics) or changed
        return changed

    async def flush(self, metrics: Metrics | None = None) -> bool:
        """Wait for every create in flight and take its answer."""
        changed = False
        while self.entries:
            changed = await self._take_head(metrics) or changed
        return changed

    async def _take_head(self, metrics: Metrics | None) -> bool:
        entry = self.entries.popleft()
        started = time.perf_counter()
        reserved = await entry.task
        if metrics is not None:
            # the part of the create's round trip the solves did not hide
            metrics.reservation_wait_seconds.observe(
                time.perf_counter() - started + self.waited)
        self.waited = 0.0
        if reserved.found is not None and _nodes(reserved.found) != _nodes(entry.solved):
            self._withdraw_overlapping(entry, reserved.found)
            if not entry.withdrawn:
                # GPUs this run promised to a Workload answered before it (an earlier
                # placement, or one the watch has not shown): the found one gives way
                later = {e.workload.reservation_key for e in self.entries}
                entry.withdrawn = _promised_elsewhere(
                    self.ctx, entry.workload.reservation_key,
                    _whole_of(entry.gang, reserved.found), later, self.ctx.clocks.wall())
        if entry.withdrawn:
            await self._take_back(entry, reserved)
            return False
        changed = _settle_held(self.placer, reserved)
        ctx = self.ctx
        if reserved.placement is not None:
            ctx.faults.hit("kill-after-reservation")
            ctx.workers.background.spawn(
                answer(ctx, entry.workload, entry.check, entry.ready(reserved.placement)),
                name="check-write")
        elif reserved.refusal is not None:
            ctx.workers.background.spawn(
                answer_refused(ctx, entry.workload, entry.check, reserved.refusal,
                               never=reserved.never),
                name="check-write")
        return changed

    def _withdraw_overlapping(self, earlier: InFlight, found: tuple[Slot, ...]) -> None:
        """Every later placement of the pass on a node `found` holds was decided without
        those GPUs taken: withdrawn (its check never written from this decision)."""
        nodes = {s.node for s in found}
        for later in self.entries:
            if not later.withdrawn and nodes.intersection(s.node for s in later.solved):
                later.withdrawn = True
                log.info("Workload %s: placement withdrawn, Workload %s's earlier "
                         "reservation holds GPUs on its nodes; placed again",
                         later.workload.key, earlier.workload.key)

    async def _take_back(self, entry: InFlight, reserved: Reserved) -> None:
        """Delete what the withdrawn placement's create may have written; its slots stay
        held in the placer for the rest of the pass (nothing decided now may take them
        while the delete is unsure). Placed again in this pass once nothing of it is left."""
        ctx = self.ctx
        rr_key = entry.workload.reservation_key
        may_exist = reserved.placement is not None or (
            not reserved.give_back and reserved.refusal is None)
        held = reserved.found or entry.solved
        if may_exist and not await withdraw_reservation(
                ctx, rr_key, frozenset((s.node, tuple(s.gpu_indices)) for s in held)):
            # it may still exist: its GPUs stay taken until the watch shows it (or not)
            if reserved.found is not None:
                self.placer.hold(entry.gang, reserved.found, over=True)
            ctx.ledger.keep_unsure(rr_key, entry.workload.key, entry.gang, held,
                                   ctx.clocks.monotonic())
            return
        ctx.ledger.withdraw(rr_key)
        # the view the pass handed to `place_one`
        self.withdrawn.append((entry.workload, entry.check))


def _whole_of(gang: Gang, slots: Iterable[Slot]) -> set[tuple[str, int]]:
    """(node, GPU index) of the slots whose pod set takes whole GPUs."""
    shared = {ps.name for ps in gang.pod_sets if ps.fractional}
    return {(s.node, g) for s in slots if s.pod_set not in shared for g in s.gpu_indices}


def _promised_elsewhere(
    ctx: Context, own_key: str, gpus: set[tuple[str, int]], skip: Iterable[str],
    now: datetime,
) -> bool:
    """Does another live plain reservation (stored) or another assumption of this run
    (not stored yet) hold one of these whole GPUs? Reservations in `skip`, and those this
    run deleted, do not count."""
    if not gpus:
        return False
    ignored = {own_key, *skip}
    stored: set[str] = set()
    for other in ctx.store.items(L.KIND_RESOURCE_RESERVATION):
        key = object_key(other)
        stored.add(key)
        if key in ignored or _mode(other) not in _EXCLUSIVE_MODES or withdrawn_copy(ctx, other):
            continue
        if reservation_is_live(other, now) and gpus & _whole_gpus(other):
            return True
    ledger = ctx.ledger
    for a in (*ledger.assumed.values(), *ledger.unsure.values()):
        if a.reservation in ignored or a.reservation in stored:
            continue
        if gpus & _whole_of(a.gang, a.slots):
            return True
    return False


def _nodes(slots: Iterable[Slot]) -> list[tuple[str, tuple[int, ...]]]:
    return sorted((s.node, tuple(sorted(s.gpu_indices))) for s in slots)


def _settle_held(placer: OrderedPlacer, reserved: Reserved) -> bool:
    """`settle`, but an earlier reservation found on other slots is held clamped: a later
    placement withdrawn for it still holds its own slots until the pass ends."""
    if reserved.found is None:
        return settle(placer, reserved)
    if not reserved.over:
        placer.undo(reserved.gang, reserved.solved)
    placer.hold(reserved.gang, reserved.found, over=True)
    return True


async def withdraw_reservation(
    ctx: Context, rr_key: str, held: frozenset[tuple[str, tuple[int, ...]]]
) -> bool:
    """Delete a reservation (holding `held`: node, GPUs) whose Workload must be placed
    again; True when it is gone. Remembered (`Withdrawn`) so a store that still shows
    it is not answered from, nor counted against the Workload's next placement."""
    ns, _, name = rr_key.partition("/")
    ctx.component(Withdrawn).held[rr_key] = (ctx.clocks.monotonic(), held)
    try:
        await asyncio.to_thread(ctx.api.delete, L.KIND_RESOURCE_RESERVATION, name, ns)
    except Exception as e:  # ApiException, urllib3's own: it may still be there
        ctx.metrics.errors.labels("reserve").inc()
        log.warning("could not delete withdrawn reservation %s: %s", rr_key, e)
        return False
    return True


def overlaps_other(ctx: Context, rr: Mapping[str, Any], now: datetime) -> bool:
    """Does this reservation (of a Workload not answered yet) share a whole GPU with
    another live reservation, or with a create of this run the watch has not shown? Only
    reservations of plain placements count: a drain or a preemptor's is written over
    gangs still leaving. An elastic Job's slices share the slots carried over: the
    reservations whose pods carry the same label do not count (`kube/slices.py`)."""
    if _mode(rr) not in _EXCLUSIVE_MODES:
        return False
    ns, label = meta(rr).get("namespace"), reservation_pod_label(rr)
    chain = [object_key(o) for o in ctx.store.items(L.KIND_RESOURCE_RESERVATION)
             if meta(o).get("namespace") == ns and reservation_pod_label(o) == label]
    return _promised_elsewhere(ctx, object_key(rr), _whole_gpus(rr), chain, now)


def held_by(rr: Mapping[str, Any]) -> frozenset[tuple[str, tuple[int, ...]]]:
    return frozenset((s.node, tuple(s.gpus)) for s in reservation_slots(rr))


@dataclass
class Withdrawn:
    """Reservation "namespace/name" this run deleted to place its Workload again →
    (monotonic time, the (node, GPUs) it held): a store that still shows the deleted one
    must not answer from it."""

    held: dict[str, tuple[float, frozenset[tuple[str, tuple[int, ...]]]]] = field(
        default_factory=dict)

    def reset(self) -> None:
        """Kept: a deleted reservation the store still shows stays deleted, whoever leads
        (an entry ends after `--lost-write-seconds`, `loop.inputs.settle_ledger`)."""


def withdrawn_copy(ctx: Context, rr: Mapping[str, Any]) -> bool:
    """Is this stored reservation the one this run deleted (same name, same slots: the
    Workload's next placement never takes the GPUs its withdrawn one held)?"""
    withdrawn = ctx.component(Withdrawn).held.get(object_key(rr))
    return withdrawn is not None and withdrawn[1] == held_by(rr)


def _mode(rr: Mapping[str, Any]) -> str:
    spec = rr.get("spec")
    decision = spec.get("decision") if isinstance(spec, Mapping) else None
    mode = decision.get("mode") if isinstance(decision, Mapping) else None
    return str(mode or "placed")


def _whole_gpus(rr: Mapping[str, Any]) -> set[tuple[str, int]]:
    """(node, GPU index) of the slots of pod sets that take whole GPUs (a shared GPU may
    hold several reservations' pods)."""
    spec = rr.get("spec")
    shared: set[str] = set()
    for ps in (spec.get("podSets") if isinstance(spec, Mapping) else None) or []:
        if not isinstance(ps, Mapping):
            continue
        try:
            whole = parse_milli(ps.get("gpuShare", 1)) >= GPU_WHOLE
        except (TypeError, ValueError):
            whole = False  # malformed: the snapshot builder reports it
        if not whole:
            shared.add(str(ps.get("name") or "main"))
    return {(s.node, g) for s in reservation_slots(rr) if s.pod_set not in shared
            for g in s.gpus}
