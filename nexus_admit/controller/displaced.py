"""Reserved slots whose node something else took: found here, moved as a failed node's.

Who calls it: `loop/cycle.py`, in the lifecycle step, after `sync_lifecycle`; the slots it
finds go to `failed_nodes.move_stranded` with the stranded ones. kube-scheduler and the
other queues do not see our holds, so a pod nexus-admit does not place (a plain pod, a
pod of a queue without our check, a Kueue TAS Workload's pod) can be bound onto capacity
a reservation holds before its pods bind, or a TAS assignment name it. Each such node is
counted again (`kube/cluster/overcommit.py`: bound pods and TAS assignments first, then
the slots pinned pods hold, then the others, oldest reservation first); a slot that no
longer fits and that no live pod holds moves to a node of its pod set's domain with room,
the reservation patched in place (Event `SlotMoved`), else its gang alone goes through
Retry. Only the displaced gang: a gang whose slots still fit is never touched. The
ungater pins no pod to such a slot meanwhile (`is_displaced`). A pinned pod whose slot no
longer fits cannot move (a pin is fixed once ungated): kube-scheduler binds it when room
comes back, else the lifecycle's unschedulable grace sends its gang back.

Cheap: only the nodes whose pods, reservations, node objects, devices or TAS assignments
changed since the last step are counted again (a `Changes` feed of the store, as the live
snapshot keeps: its `touched` nodes), and the nodes found over-committed until they are not.

It reads the store's views (`kube/views.py`); the objects (`view.raw`) only where the
translation counts a node again (`overcommit.py`) and reads the Workloads' TAS assignments
(`kube/cluster/tas.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.lifecycle_plan import Stranded
from nexus_admit.controller.reservation_pods import failed_node, holders
from nexus_admit.controller.store import Store
from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.changes import Changes, claim_pools, needs_templates, slice_pool
from nexus_admit.kube.cluster.live import admission_defaults
from nexus_admit.kube.cluster.overcommit import DisplacedSlot, displaced_slots
from nexus_admit.kube.cluster.tas import assignment_nodes, has_topology_assignment
from nexus_admit.kube.errors import TranslationError, object_key
from nexus_admit.kube.podspec import workload_template_requests
from nexus_admit.kube.reservations import ReservedSlot
from nexus_admit.kube.views import PodView, ReservationView

__all__ = ["DisplacedState", "find_displaced", "is_displaced"]

log = logging.getLogger(__name__)


@dataclass
class DisplacedState:
    """The store's changes since the last step, and the slots found displaced per node."""

    store: Store | None = None  # the store `feed` is subscribed to
    feed: Changes | None = None
    found: dict[str, list[DisplacedSlot]] = field(default_factory=dict)
    # Workloads with a Kueue TAS assignment by the nodes it names, and the other way round
    tas_nodes: dict[str, frozenset[str]] = field(default_factory=dict)
    tas_on_node: dict[str, set[str]] = field(default_factory=dict)

    def reset(self) -> None:
        """Count every node again (a new leader's store holds what it re-listed)."""
        self.found = {}
        if self.feed is not None:
            self.feed.everything = True

    def changes(self, store: Store) -> Changes:
        if self.store is not store or self.feed is None:
            self.store, self.feed = store, store.subscribe()
        changes = self.feed.take()
        if changes.everything:
            self.tas_nodes, self.tas_on_node = {}, {}
            workloads: Mapping[str, Mapping[str, Any]] = store.by_key("Workload")
        else:
            workloads = changes.workloads
        for key in workloads:
            self._index_tas(key, store.get("Workload", key))
        return changes

    def _index_tas(self, key: str, workload: Mapping[str, Any] | None) -> None:
        for name in self.tas_nodes.pop(key, frozenset()):
            on_node = self.tas_on_node.get(name)
            if on_node is not None:
                on_node.discard(key)
                if not on_node:
                    del self.tas_on_node[name]
        if workload is None or not has_topology_assignment(workload):
            return
        named = frozenset(assignment_nodes(workload))
        self.tas_nodes[key] = named
        for name in named:
            self.tas_on_node.setdefault(name, set()).add(key)


def is_displaced(ctx: Context, rr: ReservationView, slot: str, node: str) -> bool:
    """Was the reservation's slot on `node` found with no room there (the ungater pins
    no pod to it: it moves first)?"""
    found = ctx.component(DisplacedState).found.get(node, [])
    return any(d.reservation == rr.key and d.slot == slot and not d.held for d in found)


# nodes counted between two turns of the event loop (the webhook and the watches go on)
YIELD_EVERY = 16


async def find_displaced(ctx: Context, skip: Iterable[str] = ()) -> list[Stranded]:
    """The live reservations with slots that no longer fit on their node and that no live
    pod holds, each with why (`skip`: reservations "namespace/name" already moving)."""
    state = ctx.component(DisplacedState)
    store = ctx.store
    changes = state.changes(store)
    if changes.everything:
        nodes = {s.node for rr in store.reservations() for s in rr.slots}
    else:
        # a running pod's bind marks its reservation's other nodes for the live snapshot
        # (`changes.py`); nothing on them changed, so they are not counted again. A pin
        # moves which slots come first only where slots no longer fit: the nodes found
        nodes = set(changes.touched) | set(state.found)
    for i, name in enumerate(nodes):
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)
        found = _count_node(ctx, name)
        if found:
            state.found[name] = found
        else:
            state.found.pop(name, None)
    return _stranded(ctx, state.found.values(), set(skip))


def _count_node(ctx: Context, name: str) -> list[DisplacedSlot]:
    store, now = ctx.store, ctx.clocks.wall()
    node = store.get("Node", name)
    if node is None or failed_node(node) is not None:
        return []  # a failed node's slots move as stranded (`failed_nodes.py`)
    on_node = store.reservation_views_on_node(name)
    if not _unbound_slots(on_node, store.pod_views_on_node(name), name):
        return []  # every slot there is its bound pod's (counted as the pod): the usual case
    reservations: list[Mapping[str, Any]] = []  # the live ones, as the translation reads them
    pinned: set[tuple[str, str]] = set()
    templates: dict[tuple[str, str], tuple[int, int, int]] = {}
    admitted = admission_defaults(store)
    for rr in on_node:
        if rr.deleting or L.ANN_PREEMPTS in rr.annotations:
            # a preemptor's or a drain's slots sit on pods that are to leave: over-committed
            # by design, and the preemption step waits for them (or gives up), not this one
            continue
        pods = store.pod_views_of_reservation(rr.namespace, rr.name)
        workload = store.workload(rr.workload_key)
        try:
            if workload is None or not rr.live(now, bound=any(p.node for p in pods)):
                continue  # the lifecycle releases it
            if needs_templates(rr.raw):
                templates.update(workload_template_requests(workload.raw, admitted))
        except (TranslationError, ValueError):
            continue  # told by the snapshot
        reservations.append(rr.raw)
        pinned |= {(rr.key, slot) for slot, pod in holders(pods).items() if not pod.node}
    if not reservations:
        return []
    slices = store.slices_on_node(name)
    pools = {p for sl in slices if (p := slice_pool(sl)) is not None}
    claims = {object_key(c): c for pool in pools for c in store.claims_in_pool(pool)
              if claim_pools(c) & pools}
    tas = ctx.component(DisplacedState).tas_on_node.get(name, set())
    return displaced_slots(
        node, store.pods_on_node(name), reservations, pinned,
        workloads=[w for k in sorted(tas) if (w := store.get("Workload", k)) is not None],
        node_resource_topology=store.get("NodeResourceTopology", name),
        resource_slices=slices, resource_claims=claims.values(),
        template_requests=templates, admitted=admitted, now=now)


def _unbound_slots(
    reservations: Sequence[ReservationView], pods: Iterable[PodView], node: str
) -> bool:
    """Does a reservation hold a slot on `node` that no pod bound there claims? (A pod's
    slot annotation as written: the translation reads it so, `capacity.slot_ref`.)"""
    if not reservations:
        return False
    bound = {(p.namespace, p.reservation, str(p.annotations.get(L.ANN_SLOT))) for p in pods
             if not p.terminated}
    for rr in reservations:
        names = {rr.name, rr.pod_label}
        for slot in rr.slots:
            if slot.node == node and not any(
                    (rr.namespace, n, slot.key) in bound for n in names):
                return True
    return False


def _stranded(
    ctx: Context, found: Iterable[list[DisplacedSlot]], skip: set[str]
) -> list[Stranded]:
    by_rr: dict[str, list[DisplacedSlot]] = {}
    for on_node in found:
        for d in on_node:
            if not d.held and d.reservation not in skip:
                by_rr.setdefault(d.reservation, []).append(d)
    out: list[Stranded] = []
    for key, displaced in sorted(by_rr.items()):
        rr = ctx.store.reservation(key)
        workload = ctx.store.workload(rr.workload_key) if rr else None
        if rr is None or workload is None:
            continue
        written = {(s.key, s.node): s for s in rr.slots}
        slots: list[tuple[ReservedSlot, str]] = []
        for d in displaced:
            slot = written.get((d.slot, d.node))
            if slot is None:
                continue  # moved since it was counted
            others = f" ({', '.join(d.others)})" if d.others else ""
            slots.append((slot, "has no room left for it: what nexus-admit does not place "
                                f"took it{others}"))
        if slots:
            log.info("reservation %s: %d slot(s) displaced by pods bound beside them", key,
                     len(slots))
            out.append(Stranded(rr, workload, tuple(slots)))
    return out
