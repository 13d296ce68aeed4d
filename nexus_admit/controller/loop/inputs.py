"""What a pass decides from: step 1 of `loop/cycle.place_pending`.

The Workloads waiting on our checks in Kueue's order and those waiting for quota in our
queues (kept per stored object: one Workload's event does not walk them all), their Jobs
read, the ledger settled against what the watch has shown. Read on the loop's thread,
which owns the store, from its Workload and reservation views (`kube/views.py`); the pass
works on those views, and reads their objects (`view.raw`) only where it translates them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from nexus_admit.controller.context import Context
from nexus_admit.controller.demand import queues_using, waiting_queue
from nexus_admit.controller.inflight import Withdrawn
from nexus_admit.controller.loop.place import (
    DrainRechecks,
    hold_for_provisioning,
    needs_decision,
    our_pending_check,
)
from nexus_admit.controller.owning_jobs import (
    OWNER_KIND,
    fetch_owner_jobs,
    prefetch_owner_jobs,
    prune_owner_jobs,
)
from nexus_admit.controller.store import PerObject
from nexus_admit.controller.writes import Answered
from nexus_admit.kube import labels as L
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.kueue import provisioning_check_names
from nexus_admit.kube.views import WorkloadView

__all__ = ["PassInputs", "Views", "read_inputs", "settle_ledger", "workload_views"]


# a Workload's view, its place in Kueue's order when it waits on our check (else None),
# and whether it waits for quota in a queue of ours (`workload_views`)
_Sorted = tuple[WorkloadView, tuple[int, str, str] | None, bool]


@dataclass(frozen=True, slots=True)
class _Found:
    read: tuple[object, ...]  # the lists they were derived from
    pending: list[WorkloadView]
    waiting: list[WorkloadView]


@dataclass
class Views:
    """The Workloads of the last pass (`workload_views`), with the store's lists they were
    derived from, and what each Workload's view says kept while the store holds it."""

    views: _Found | None = None
    view_memo: PerObject[_Sorted] = field(default_factory=PerObject)

    def reset(self) -> None:
        self.views, self.view_memo = None, PerObject()


@dataclass(frozen=True)
class PassInputs:
    """What a pass decides from, read from the store and the ledger on the loop's thread."""

    dump: ClusterDump
    pending: list[WorkloadView]  # waiting on one of our active checks, in Kueue's order
    waiting: list[WorkloadView]  # still waiting for quota in a queue of ours
    unread: set[str]  # not decided this pass: held for provisioning, or their Job unread
    unreserved: frozenset[str]  # pending whose reservation of this attempt is not stored
    deciding: bool  # one of them is ours to decide now


async def read_inputs(ctx: Context, active: set[str]) -> PassInputs:
    """The Workloads the pass looks at, their Jobs read (on demand: not watched),
    and the ledger settled against the store."""
    prune_owner_jobs(ctx)
    dump = ctx.store.dump()
    found = _found(ctx, dump, active)
    pending, waiting = found.pending, found.waiting
    # the Jobs of Workloads still waiting for quota in our queues are read ahead
    prefetch_owner_jobs(ctx, waiting)
    # those that wait for Kueue's provisioning check are not decided (nor their Jobs read)
    held = await hold_for_provisioning(
        ctx, pending, provisioning_check_names(dump.kind("AdmissionCheck")))
    # a Workload whose Job could not be read waits
    unread = held | await fetch_owner_jobs(
        ctx, [w for w in pending if w.key not in held] if held else pending)
    if ctx.store.items(OWNER_KIND) != dump.kind(OWNER_KIND):
        dump = ctx.store.dump()
    stored = settle_ledger(ctx, pending)
    deciding = any(
        our_pending_check(w, ctx) is not None and needs_decision(ctx, w)
        for w in pending
        if w.key not in unread
    )
    # a pending Workload's reservation of this very attempt (we died or failed before its
    # Ready) holds capacity for every Workload of the pass, also those earlier in order;
    # older attempts' reservations are released by lifecycle before this step
    unreserved = frozenset(w.key for w in pending if w.reservation_key not in stored)
    return PassInputs(dump, pending, waiting, unread, unreserved, deciding)


# the kinds `workload_views` reads besides the Workloads (the Kueue index's)
_VIEWED_KINDS = ("ClusterQueue", "LocalQueue", "ResourceFlavor", "AdmissionCheck", OWNER_KIND)


def workload_views(
    ctx: Context, dump: ClusterDump, active: set[str]
) -> tuple[list[WorkloadView], list[WorkloadView]]:
    """The Workloads waiting on one of our `active` checks, in Kueue's order, and those
    still waiting for quota in a queue of ours; derived again only when a list they read
    is another object than last time (the store replaces a kind's list on any change of
    it), since a pass runs on every event, most of them pods'. Then only the Workloads
    that changed are looked at again (`store.PerObject`): one Workload's event no longer
    walks every Workload in the store."""
    found = _found(ctx, dump, active)
    return found.pending, found.waiting


def _found(ctx: Context, dump: ClusterDump, active: set[str]) -> _Found:
    """`workload_views`, with the lists they were derived from."""
    workloads = ctx.store.workloads()
    read: tuple[object, ...] = (
        workloads, *(dump.kind(k) for k in _VIEWED_KINDS), frozenset(active))
    state = ctx.component(Views)
    kept = state.views
    if kept is not None and all(
            a is b for a, b in zip(read[:-1], kept.read[:-1], strict=True)) \
            and read[-1] == kept.read[-1]:
        return kept
    kueue = dump.kueue_index()

    def view(wl: WorkloadView) -> _Sorted:
        """Kueue's order of a Workload waiting on our check (None: not waiting on it), and
        whether it waits for quota in a queue of ours."""
        order = wl.order if wl.pending_on(active) else None
        return wl, order, order is None and waiting_queue(wl.raw, kueue, active) is not None

    views = state.view_memo.values(
        workloads, view, (frozenset(active), *queues_using(kueue, active)))
    pending = [v[0] for v in sorted((v for v in views if v[1] is not None),
                                    key=lambda v: cast(tuple[int, str, str], v[1]))]
    waiting = [v[0] for v in views if v[2]]
    state.views = _Found(read, pending, waiting)
    return state.views


def settle_ledger(ctx: Context, pending: list[WorkloadView]) -> set[str]:
    """Forget what the watch has shown (answers, reservations); the stored reservation
    keys. An assumption ends once the snapshot counts its reservation, or when
    `--lost-write-seconds` went by without it (released, or never made: a failed pass must
    not leave its Workload waiting on it for ever; a watch gap re-lists the kind, so a
    reservation that was made shows within that time)."""
    waiting = {w.uid: w.attempt for w in pending}
    answered = ctx.component(Answered)
    answered.attempts = {u: a for u, a in answered.attempts.items() if waiting.get(u) == a}
    stored = set(ctx.store.by_key(L.KIND_RESOURCE_RESERVATION))  # keyed "namespace/name"
    tick = ctx.clocks.monotonic()
    drains = ctx.component(DrainRechecks)
    drains.at = {k: t for k, t in drains.at.items() if k in stored}
    withdrawn = ctx.component(Withdrawn)
    withdrawn.held = {k: w for k, w in withdrawn.held.items()
                      if tick - w[0] <= ctx.options.lost_write_seconds}
    ctx.ledger.settle(
        lambda a: a.reservation in stored or tick - a.since > ctx.options.lost_write_seconds
    )
    return stored
