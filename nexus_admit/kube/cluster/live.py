"""A cluster snapshot kept up to date from watch events: a pass costs what changed since
the last one, not the size of the fleet.

Who calls it: the controller's loop (`controller/loop/cycle.py`), with the store as its
`FleetSource` and the store's `Changes` (`changes.record_change` says which nodes an event
marks). The translation is `build_snapshot`'s own, run on the marked nodes and what they
read (the pods on them, the reservations with slots there, the pods of those reservations,
the reservations those pods name, and those objects' nodes; the Workloads whose Kueue TAS
assignment names them, from an index of its own): one translation, so the live
snapshot equals a full `build_snapshot` of the same objects (tests/kube/test_live.py checks
it after random event sequences). Two steps: `gather` on the loop's thread (the store
changes there), `build` in a worker.

- Each node's free capacity is kept (`_base`, never handed out) and the pass gets a
  `TrackedSnapshot` of copies that lives from pass to pass: nodes the last pass changed
  (its placements, the ledger's holds) and nodes the events marked are copied again when
  their state differs, the rest are untouched, and the change log names only the copied
  ones, so the engine's node memo, its trackers and its label-derived facts
  (`static_cache`) carry over between passes and sync what moved, not what was marked.
  A node added, removed or left out, or a Node deleted, rebuilds the mapping in the
  store's order (as a full build has it); a node whose labels, taints or allocatable
  changed clears `static_cache`.
- The pass's `exclude_workloads` (Workloads being placed again) are an overlay: the nodes
  their reservations name are translated without them for this pass only, and copied back
  from `_base` on the next.
- Time: a reservation's TTL ends without an event; each reservation read with an expiry
  still ahead is remembered, and the nodes it names are read again once that time passes.
- Malformed objects: what each object was skipped for is kept with the object (a Node with
  its NRT, a pod, a reservation) and replaced whenever the object is read again; every pass
  lists them all, as a full build would, so nothing is lost because its node did not change.
- DRA: a marked node is read with its ResourceSlices, every node with a slice of the same
  pool (a full build gives a device named twice to the later node), and the ResourceClaims
  holding devices of those pools; a changed slice or claim is read too, so a malformed one
  is listed on the pass that sees it.
- A full build instead: the first pass, a clock that went backwards, or a pass that did not
  finish its build.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.changes import (
    Changes,
    FleetSource,
    needs_templates,
    pod_node,
    pod_reservation,
    slice_pool,
    slot_nodes,
)
from nexus_admit.kube.cluster.nodes import topologies_from_objects
from nexus_admit.kube.cluster.snapshot import build_snapshot
from nexus_admit.kube.cluster.tas import assignment_nodes, has_topology_assignment
from nexus_admit.kube.errors import Obj, Skipped, TranslationError, meta, object_key
from nexus_admit.kube.kueue import KueueIndex
from nexus_admit.kube.podspec import AdmissionDefaults, workload_template_requests
from nexus_admit.kube.quantity import parse_time
from nexus_admit.kube.reservations import reservation_workload_key
from nexus_admit.model import ClusterSnapshot, Node
from nexus_admit.placement.tracking import TrackedSnapshot

__all__ = ["LivePlan", "LiveSnapshot", "WithoutReservations", "admission_defaults"]

# the working snapshot's change log grows with every pass; past this it starts afresh
_LOG_LIMIT = 200_000
_Role = tuple[str, ...]  # whose skips: ("node", name), ("pod", key), ("rr", key), ...


@dataclass(slots=True)
class _Inputs:
    """The objects one translation reads (gathered where the store is safe to read)."""

    targets: frozenset[str] | None  # the nodes whose state is taken; None: every node
    nodes: list[Obj]
    nrts: list[Obj]
    slices: list[Obj]
    claims: list[Obj]
    pods: list[Obj]
    reservations: list[Obj]
    # those whose pod templates give reservations their requests, and those whose TAS
    # assignment names a target node (or changed)
    workloads: list[Obj]
    excluded: frozenset[str] = frozenset()
    # RuntimeClasses and LimitRanges: a TAS pod set's template counted as its pods admit
    admitted: AdmissionDefaults | None = None


@dataclass(slots=True)
class LivePlan:
    """What one pass's `build` reads, taken on the loop's thread."""

    base: _Inputs
    overlay: _Inputs | None
    order: list[str]  # every Node's name, in the store's order
    topologies: Sequence[Obj]
    gone: list[_Role]  # deleted pods and reservations: their skips are dropped
    reorder: bool
    now: datetime
    epoch: object = None


@dataclass(slots=True)
class LiveSnapshot:
    feed: Changes
    _base: dict[str, Node] = field(default_factory=dict)
    _skips: dict[_Role, list[Skipped]] = field(default_factory=dict)
    _expiry: list[tuple[datetime, int, frozenset[str]]] = field(default_factory=list)
    _expiring: dict[str, tuple[datetime, frozenset[str]]] = field(default_factory=dict)
    _counter: itertools.count[int] = field(default_factory=itertools.count)
    # Workloads with a Kueue TAS assignment: the nodes it names, and per node the Workloads
    _tas_nodes: dict[str, frozenset[str]] = field(default_factory=dict)
    _tas_on_node: dict[str, set[str]] = field(default_factory=dict)
    _working: TrackedSnapshot | None = None
    _mark: int = 0  # change-log entries of the working snapshot already restored
    _overlaid: frozenset[str] = frozenset()  # nodes holding the last pass's overlay
    _now: datetime | None = None
    _building: bool = False  # a gathered plan not built yet: the next one is full
    _epoch: object = None
    # why the last `build` dropped what the engine derived from the fleet's labels (a new
    # snapshot object, or its static_cache cleared), so its next solve derives it again:
    # "first", "nodes-dropped", "log-full", "epoch", "membership" (a node joined or left
    # the snapshot), "static" (a node's labels, taints or allocatable), "topologies";
    # None: kept, only the nodes that changed copied again
    renewed: str | None = None
    # a build left running by a cancelled pass (its thread goes on) must finish before
    # the next pass gathers or builds: its state is this object's
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------------ loop thread
    def gather(
        self, source: FleetSource, *, exclude_workloads: Iterable[str] = (), now: datetime,
        epoch: object = None,
    ) -> LivePlan:
        """Take the changes and the objects the next `build` reads (O(changed)). `epoch`:
        what else the engine's caches read (the placement configs): when it changes the
        pass gets a new snapshot object, so nothing the engine kept carries over."""
        with self._lock:
            return self._gather(source, frozenset(exclude_workloads), now, epoch)

    def _gather(
        self, source: FleetSource, excluded: frozenset[str], now: datetime, epoch: object
    ) -> LivePlan:
        changes = self.feed.take()
        full = (
            self._working is None or self._building or changes.everything
            or (self._now is not None and now < self._now)
        )
        self._now, self._building = now, True
        if full:
            self._expiry.clear()
            self._expiring.clear()
            self._tas_nodes.clear()
            self._tas_on_node.clear()
            for key, wl in source.by_key("Workload").items():
                self._index_tas(key, wl)
            base = _everything(source)
        else:
            targets = set(changes.nodes)
            expired = False
            while self._expiry and self._expiry[0][0] <= now:
                targets |= heapq.heappop(self._expiry)[2]
                expired = True
            if expired:
                self._expiring = {k: v for k, v in self._expiring.items() if v[0] > now}
            for name in changes.node_objects:
                # whether a node is in the fleet decides if its pods' slots count elsewhere,
                # and whether a reservation's slot there is read at all
                for pod in source.pods_on_node(name):
                    targets |= _named_reservation_nodes(source, pod)
                for rr in source.reservations_on_node(name):
                    targets |= slot_nodes(rr)
            pods = [p for k in changes.pods if (p := source.get("Pod", k)) is not None]
            rrs = [r for k in changes.reservations
                   if (r := source.get(L.KIND_RESOURCE_RESERVATION, k)) is not None]
            slices = [sl for k in changes.slices
                      if (sl := source.get("ResourceSlice", k)) is not None]
            claims = [c for k in changes.claims
                      if (c := source.get("ResourceClaim", k)) is not None]
            for k in changes.workloads:
                self._index_tas(k, source.get("Workload", k))
            base = _closure(source, targets, pods, rrs, frozenset(), slices, claims,
                            self._tas_of(targets) | changes.workloads.keys())
        overlay_targets: set[str] = set()
        for workload in excluded:
            for rr in source.reservations_of_workload(workload):
                overlay_targets |= slot_nodes(rr)
        overlay = (_closure(source, overlay_targets, [], [], excluded,
                            tas_workloads=self._tas_of(overlay_targets))
                   if overlay_targets else None)
        base.admitted = admission_defaults(source)
        if overlay is not None:
            overlay.admitted = base.admitted
        gone: list[_Role] = [("pod", k) for k in changes.pods if source.get("Pod", k) is None]
        gone += [("rr", k) for k in changes.reservations
                 if source.get(L.KIND_RESOURCE_RESERVATION, k) is None]
        gone += [("slice", k) for k in changes.slices if source.get("ResourceSlice", k) is None]
        gone += [("claim", k) for k in changes.claims if source.get("ResourceClaim", k) is None]
        gone += [("wl", k) for k in changes.workloads if source.get("Workload", k) is None]
        topologies = [
            o for o in source.by_key("Topology").values()
            if str(o.get("apiVersion", L.KUEUE_API_GROUP)).startswith(L.KUEUE_API_GROUP)
        ]
        return LivePlan(base, overlay, list(source.by_key("Node")), topologies, gone,
                        changes.reordered, now, epoch)

    def _index_tas(self, key: str, workload: Obj | None) -> None:
        """Index the nodes the Workload's TAS assignment names (None: it is gone)."""
        for name in self._tas_nodes.pop(key, frozenset()):
            on_node = self._tas_on_node.get(name)
            if on_node is not None:
                on_node.discard(key)
                if not on_node:
                    del self._tas_on_node[name]
        if workload is None or not has_topology_assignment(workload):
            return
        named = frozenset(assignment_nodes(workload))
        self._tas_nodes[key] = named
        for name in named:
            self._tas_on_node.setdefault(name, set()).add(key)

    def _tas_of(self, nodes: Iterable[str]) -> set[str]:
        """The Workloads whose TAS assignment names one of `nodes`."""
        out: set[str] = set()
        for name in nodes:
            out |= self._tas_on_node.get(name, set())
        return out

    # ------------------------------------------------------------------ worker thread
    def build(self, plan: LivePlan, skipped: list[Skipped]) -> TrackedSnapshot:
        """The pass's snapshot: a full build's nodes, free capacity and order, its
        malformed objects listed in `skipped`. Valid until the next `build`."""
        with self._lock:
            return self._build(plan, skipped)

    def _build(self, plan: LivePlan, skipped: list[Skipped]) -> TrackedSnapshot:
        base = plan.base
        nodes = self._translate(base, plan.now)
        if base.targets is None:
            self._base = dict(nodes)
            changed: set[str] = set(plan.order) | set(self._base)
        else:
            changed = set(base.targets)
            for name in base.targets:
                if name in nodes:
                    self._base[name] = nodes[name]
                else:
                    self._base.pop(name, None)
        for role in plan.gone:
            self._skips.pop(role, None)
        overlay: dict[str, Node] = {}
        overlay_targets: frozenset[str] = frozenset()
        if plan.overlay is not None:
            overlay = _translate(plan.overlay, plan.now, [])
            overlay_targets = plan.overlay.targets or frozenset()
        topology_skips: list[Skipped] = []
        topologies = topologies_from_objects(plan.topologies, topology_skips)
        snapshot = self._assemble(plan, changed, overlay, overlay_targets, topologies)
        excluded = plan.overlay.excluded if plan.overlay is not None else frozenset()
        for entries in self._skips.values():
            skipped.extend(s for s in entries
                           if not (s.owner and s.owner.partition(" ")[2] in excluded))
        skipped.extend(topology_skips)
        self._building = False
        return snapshot

    def _translate(self, inputs: _Inputs, now: datetime) -> dict[str, Node]:
        """Translate `inputs`, keep each read object's skips, remember expiries."""
        found: list[Skipped] = []
        nodes = _translate(inputs, now, found)
        if inputs.targets is None:
            self._skips.clear()
        else:
            for name in inputs.targets:
                self._skips.pop(("node", name), None)
        roles = _roles(inputs)
        for role in set(roles.values()):
            self._skips.pop(role, None)
        for s in found:
            role = roles.get((s.kind, s.namespace, s.name, s.uid), ("other", s.kind,
                                                                       s.namespace, s.name))
            self._skips.setdefault(role, []).append(s)
        for rr in inputs.reservations:
            expires, nodes_named = _expires(rr), frozenset(slot_nodes(rr))
            # once per expiry and nodes: a reservation is read again on many passes
            if (expires is not None and expires > now
                    and self._expiring.get(object_key(rr)) != (expires, nodes_named)):
                self._expiring[object_key(rr)] = (expires, nodes_named)
                heapq.heappush(self._expiry, (expires, next(self._counter), nodes_named))
        if inputs.targets is None:
            return nodes
        return {n: nodes[n] for n in inputs.targets if n in nodes}

    def _assemble(
        self,
        plan: LivePlan,
        changed: set[str],
        overlay: Mapping[str, Node],
        overlay_targets: frozenset[str],
        topologies: dict[str, tuple[str, ...]],
    ) -> TrackedSnapshot:
        """The working snapshot with every node the events, the overlay or the last pass
        changed copied again from `_base` (or the overlay)."""

        def state(name: str) -> Node | None:
            return overlay.get(name) if name in overlay_targets else self._base.get(name)

        w = self._working
        restore = changed | self._overlaid | overlay_targets
        if w is not None:
            restore.update(w.change_log[self._mark:])
        self._overlaid = overlay_targets
        epoch, self._epoch = self._epoch, plan.epoch
        # a new snapshot object (a new mapping) when the node set, the order, a node's
        # labels, taints or allocatable, or the epoch change: the engine keeps facts per
        # snapshot object (static_cache) and per mapping (fillOrder's rank)
        self.renewed = _renewed(w, plan, epoch, restore, state)
        if w is None or self.renewed is not None:
            members = ((n, state(n)) for n in plan.order)
            w = TrackedSnapshot({n: s.copy() for n, s in members if s is not None}, topologies)
            self._working, self._mark = w, 0
            return w
        moved = []
        for name in restore:
            if name not in w.nodes:
                continue
            node = state(name)
            assert node is not None  # membership is unchanged (checked above)
            # most marks move nothing (a node's heartbeat, a pod turning Running, a
            # reservation's status): logged, they would have every tracker of the engine
            # sync them, so a decision's cost would grow with the fleet's event rate
            if w.nodes[name] != node:
                w.nodes[name] = node.copy()
                moved.append(name)
        w.touch(moved)
        if w.kueue_topologies != topologies:
            w.kueue_topologies = dict(topologies)
            w.static_cache.clear()
            self.renewed = "topologies"
        self._mark = len(w.change_log)
        return w


@dataclass(frozen=True, slots=True)
class WithoutReservations:
    """`source` as if it held no ResourceReservations: what bound pods alone take."""

    source: FleetSource

    def by_key(self, kind: str) -> Mapping[str, dict[str, Any]]:
        return {} if kind == L.KIND_RESOURCE_RESERVATION else self.source.by_key(kind)

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        return None if kind == L.KIND_RESOURCE_RESERVATION else self.source.get(kind, key)

    def pods_on_node(self, node: str) -> Iterable[dict[str, Any]]:
        return self.source.pods_on_node(node)

    def reservations_on_node(self, node: str) -> Iterable[dict[str, Any]]:
        return ()

    def reservations_of_workload(self, key: str) -> Iterable[dict[str, Any]]:
        return ()

    def pods_of_reservation(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self.source.pods_of_reservation(namespace, name)

    def slices_on_node(self, node: str) -> Iterable[dict[str, Any]]:
        return self.source.slices_on_node(node)

    def nodes_of_pool(self, pool: str) -> set[str]:
        return self.source.nodes_of_pool(pool)

    def claims_in_pool(self, pool: str) -> Iterable[dict[str, Any]]:
        return self.source.claims_in_pool(pool)

    def order(self, kind: str, key: str) -> int:
        return self.source.order(kind, key)


# ---------------------------------------------------------------- gathering


def _everything(source: FleetSource) -> _Inputs:
    def every(kind: str) -> list[Obj]:
        return list(source.by_key(kind).values())

    return _Inputs(None, every("Node"), every("NodeResourceTopology"), every("ResourceSlice"),
                   every("ResourceClaim"), every("Pod"), every(L.KIND_RESOURCE_RESERVATION),
                   every("Workload"))


def _named_reservation_nodes(source: FleetSource, pod: Obj) -> set[str]:
    rr = _named_reservation(source, pod)
    return slot_nodes(rr) if rr is not None else set()


def _named_reservation(source: FleetSource, pod: Obj) -> Obj | None:
    ref = pod_reservation(pod)
    return source.get(L.KIND_RESOURCE_RESERVATION, f"{ref[0]}/{ref[1]}") if ref else None


def _closure(
    source: FleetSource,
    targets: set[str],
    changed_pods: Sequence[Obj],
    changed_reservations: Sequence[Obj],
    excluded: frozenset[str],
    changed_slices: Sequence[Obj] = (),
    changed_claims: Sequence[Obj] = (),
    tas_workloads: Iterable[str] = (),
) -> _Inputs:
    """The objects `targets`' free capacity reads (the module's doc), and the nodes those
    objects name, so each object is read exactly as a full build reads it."""
    pods: dict[str, Obj] = {object_key(p): p for p in changed_pods}
    rrs: dict[str, Obj] = {object_key(r): r for r in changed_reservations}
    for name in targets:
        pods.update((object_key(p), p) for p in source.pods_on_node(name))
        rrs.update((object_key(r), r) for r in source.reservations_on_node(name))
    for pod in list(pods.values()):
        rr = _named_reservation(source, pod)
        if rr is not None:
            rrs[object_key(rr)] = rr
    for rr in list(rrs.values()):
        m = meta(rr)
        ns, name = str(m.get("namespace") or "default"), str(m.get("name"))
        pods.update((object_key(p), p) for p in source.pods_of_reservation(ns, name))
    names = set(targets)
    for pod in pods.values():
        names.update(n for n in (pod_node(pod),) if n)
    for rr in rrs.values():
        names |= slot_nodes(rr)
    slices, claims = _dra_closure(source, names, changed_slices, changed_claims)
    node_objects, nrts = source.by_key("Node"), source.by_key("NodeResourceTopology")
    workloads = {reservation_workload_key(r) for r in rrs.values() if needs_templates(r)}
    workloads.update(tas_workloads)
    return _Inputs(
        frozenset(targets),
        [node_objects[n] for n in sorted(names, key=lambda n: source.order("Node", n))
         if n in node_objects],
        [nrts[n] for n in names if n in nrts],
        sorted(slices.values(), key=lambda sl: source.order("ResourceSlice", object_key(sl))),
        sorted(claims.values(), key=lambda c: source.order("ResourceClaim", object_key(c))),
        sorted(pods.values(), key=lambda p: source.order("Pod", object_key(p))),
        sorted(rrs.values(),
               key=lambda r: source.order(L.KIND_RESOURCE_RESERVATION, object_key(r))),
        [w for k in sorted(workloads) if (w := source.get("Workload", k)) is not None],
        excluded,
    )


def _dra_closure(
    source: FleetSource, names: set[str], changed_slices: Sequence[Obj],
    changed_claims: Sequence[Obj],
) -> tuple[dict[str, Obj], dict[str, Obj]]:
    """The ResourceSlices and ResourceClaims the translation of `names` reads (the module's
    doc); `names` grows by the nodes that share a pool with them."""
    slices: dict[str, Obj] = {object_key(sl): sl for sl in changed_slices}
    for name in names:
        slices.update((object_key(sl), sl) for sl in source.slices_on_node(name))
    pools = {p for sl in slices.values() if (p := slice_pool(sl)) is not None}
    for pool in pools:
        for name in source.nodes_of_pool(pool) - names:
            names.add(name)
            slices.update((object_key(sl), sl) for sl in source.slices_on_node(name))
    claims: dict[str, Obj] = {object_key(c): c for c in changed_claims}
    for pool in pools:
        claims.update((object_key(c), c) for c in source.claims_in_pool(pool))
    return slices, claims


# ---------------------------------------------------------------- translating


def _translate(inputs: _Inputs, now: datetime, skipped: list[Skipped]) -> dict[str, Node]:
    template_requests: dict[tuple[str, str], tuple[int, int, int]] = {}
    for wl in inputs.workloads:
        # a malformed Workload is reported when it is translated, not here
        with contextlib.suppress(TranslationError):
            template_requests.update(workload_template_requests(wl, inputs.admitted))
    snapshot: ClusterSnapshot = build_snapshot(
        inputs.nodes,
        inputs.pods,
        inputs.reservations,
        node_resource_topologies=inputs.nrts,
        resource_slices=inputs.slices,
        resource_claims=inputs.claims,
        workloads=inputs.workloads,
        exclude_workloads=inputs.excluded,
        template_requests=template_requests,
        admitted=inputs.admitted,
        now=now,
        skipped=skipped,
    )
    return snapshot.nodes


def admission_defaults(source: FleetSource) -> KueueIndex:
    """The RuntimeClasses and LimitRanges the store holds (a change of one marks no node:
    the nodes a TAS Workload names are read again when they change)."""
    return KueueIndex.of(runtime_classes=source.by_key("RuntimeClass").values(),
                         limit_ranges=source.by_key("LimitRange").values())


def _roles(inputs: _Inputs) -> dict[tuple[str, str, str, str], _Role]:
    """Each read object as a skip names it → whose skips it holds."""
    out: dict[tuple[str, str, str, str], _Role] = {}

    def add(objs: Iterable[Obj], role: str, by_name: bool = False) -> None:
        for o in objs:
            m = meta(o)
            ident = (str(o.get("kind") or "object"), str(m.get("namespace") or ""),
                     str(m.get("name") or ""), str(m.get("uid") or ""))
            out[ident] = (role, str(m.get("name")) if by_name else object_key(o))

    add(inputs.nodes, "node", by_name=True)
    add(inputs.nrts, "node", by_name=True)
    add(inputs.slices, "slice")
    add(inputs.claims, "claim")
    add(inputs.pods, "pod")
    add(inputs.reservations, "rr")
    add(inputs.workloads, "wl")
    return out


def _expires(rr: Obj) -> datetime | None:
    spec = rr.get("spec")
    try:
        return parse_time(spec.get("expiresAt")) if isinstance(spec, Mapping) else None
    except (ValueError, TypeError):
        return None


def _renewed(
    w: TrackedSnapshot | None,
    plan: LivePlan,
    epoch: object,
    restore: set[str],
    state: Callable[[str], Node | None],
) -> str | None:
    """Why the working snapshot `w` cannot be kept for `plan` (`LiveSnapshot.renewed`), or
    None."""
    if w is None:
        return "first"
    if plan.reorder:
        return "nodes-dropped"
    if len(w.change_log) > _LOG_LIMIT:
        return "log-full"
    if epoch != plan.epoch:
        return "epoch"
    if any((state(n) is not None) != (n in w.nodes) for n in restore):
        return "membership"
    if any(_static(w.nodes[n]) != _static(s) for n in restore
           if n in w.nodes and (s := state(n)) is not None):
        return "static"
    return None


def _static(node: Node) -> tuple[Any, ...]:
    """What the engine's label-derived facts read of a node (never its free capacity)."""
    return (node.labels, node.taints, node.cpu_milli, node.memory_mib, node.max_pods,
            node.gpu_product, node.gpu_memory_mib, node.gpu_count, node.clique,
            node.schedulable, [(z.id, z.gpu_indices, z.cpu_milli) for z in node.numa_zones])
