"""The controller's view of the cluster: the objects of every watched kind, by key.

Who calls it: `informer.py` feeds it from the watch streams and `watches.py` from the
full lists; `loop/`, `ungating/ungater.py`, `lifecycle.py` and `webhook/review.py`
read it. It is pure (no kopf, no client) and answers with a `ClusterDump`, so the controller
and `nexus-admit plan` translate the cluster through the same code.

Why re-lists: a watch stream resumes after an apiserver restart, but an object deleted
while nobody watched never produces a DELETED event. `replace()` drops what a fresh list no
longer holds (unless an event newer than the list already updated it), the way an informer's
re-list does. Objects are kept without the fields no reader uses (`kube/stored.py`), from
watch events and lists alike. Events carry a resourceVersion; one older than what the store
holds is stale (a duplicate or out-of-order delivery) and is ignored.

Indexes over pods are kept up to date on every change, because the loop asks them on every
pass and a scan of every pod per reservation grows with pods × reservations (300
reservations × 2,000 pods on the load benchmark): pods by the reservation their label names,
the pods that carry our scheduling gate (the ungater's whole work list), and pod uids.

A view that could not read a field of its object names it (`view.problem`); the store keeps
those problems while it keeps that version (`view_problems`), so the pass tells each once
(`skipped.with_view_problems`). A well-formed object costs one `is None` test there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.changes import (
    Changes,
    claim_pools,
    pod_node,
    record_change,
    slice_node,
    slice_pool,
    slot_nodes,
)
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.errors import Skipped, meta
from nexus_admit.kube.reservations import reservation_workload_key
from nexus_admit.kube.stored import stripped
from nexus_admit.kube.views import PodView, ReservationView, WorkloadView, view_of

__all__ = ["FETCHED_KINDS", "WATCHED_KINDS", "PerObject", "Store", "resource_version"]

T = TypeVar("T")
Obj = TypeVar("Obj")  # a store object, or its view: kept by identity

# every kind the controller watches; the names are the `kind` of the objects (as in a dump)
WATCHED_KINDS = (
    "Node",
    "Pod",
    "Workload",
    "LocalQueue",
    "ClusterQueue",
    "ResourceFlavor",
    "Topology",
    "AdmissionCheck",
    "NodeResourceTopology",
    "ResourceSlice",
    # GPUs asked through DRA: templates are read per pod set, claims for what they hold
    "ResourceClaim",
    "ResourceClaimTemplate",
    # taints put on devices by a rule, not by their slices (GA in 1.37; not served before)
    "DeviceTaintRule",
    "ResourceReservation",
    "PlacementConfig",
    # their pod overhead joins the requests of a pod set naming them (kube/podspec.py)
    "RuntimeClass",
    # their container defaults join the requests of a pod set in their namespace
    "LimitRange",
    # only their queue label is read (`kube/queues.gated_queues`): kept trimmed
    "StatefulSet",
)

# the kinds the store keeps a typed view of (`kube/views.py`)
_VIEWED_KINDS = ("Workload", L.KIND_RESOURCE_RESERVATION, "Pod")

# kinds kept as their identity and labels only: their specs are large and never read
_TRIMMED_KINDS = frozenset({"StatefulSet"})

# read on demand and kept while needed (`owning_jobs.py`): a Workload's Job
FETCHED_KINDS = ("Job",)


def resource_version(obj: Mapping[str, Any]) -> int | None:
    """The object's resourceVersion as a number (etcd's revision), None if absent/opaque."""
    rv = meta(obj).get("resourceVersion")
    try:
        return int(str(rv))
    except (TypeError, ValueError):
        return None


def _key(obj: Mapping[str, Any]) -> str:
    m = meta(obj)
    ns = m.get("namespace")
    return f"{ns}/{m.get('name')}" if ns else str(m.get("name"))


def _reservation_of(pod: PodView) -> tuple[str, str] | None:
    """(namespace, reservation name) the pod's reservation label names, if any."""
    return (pod.namespace, pod.reservation) if pod.reservation else None


def _carried_label(rr: ReservationView | None) -> tuple[str, str] | None:
    """(namespace, label) a Workload slice's reservation took over, when not its own name."""
    if rr is None:
        return None
    label = rr.pod_label
    return (rr.namespace, label) if label and label != rr.name else None


def _trimmed(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    m = meta(obj)
    kept = ("name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp")
    return {"kind": kind, "metadata": {k: m[k] for k in kept if k in m}}


def _same_but_version(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Are the two the same object but for `metadata.resourceVersion`?"""
    a, b = old.get("metadata"), new.get("metadata")
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return old == new
    return {**old, "metadata": {**a, "resourceVersion": None}} == {
        **new, "metadata": {**b, "resourceVersion": None}}


def _newer_or_same(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    if old is None:
        return True
    a, b = resource_version(new), resource_version(old)
    return a is None or b is None or a >= b


@dataclass(slots=True)
class Store:
    """Objects by kind, then by 'namespace/name'. Single-threaded: only the event loop
    touches it."""

    objects: dict[str, dict[str, dict[str, Any]]] = field(
        default_factory=lambda: {k: {} for k in (*WATCHED_KINDS, *FETCHED_KINDS)}
    )
    # deleted keys with the resourceVersion of their deletion, so a late ADDED/MODIFIED of
    # the same object (a stale event) cannot bring it back
    tombstones: dict[tuple[str, str], int] = field(default_factory=dict)
    generation: int = 0  # bumps on every change; lets readers skip work when nothing moved
    # pod key → pod, by the (namespace, reservation name) its reservation label names
    _pods_by_reservation: dict[tuple[str, str], dict[str, dict[str, Any]]] = field(
        default_factory=dict
    )
    _gated_pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # pod key → pod
    # reservations of Workload slices by the (namespace, label) their pods carry when that
    # is not their own name (`kube/slices.py`): reservation key → reservation
    _carriers: dict[tuple[str, str], dict[str, dict[str, Any]]] = field(default_factory=dict)
    # for the live snapshot (kube/cluster/live.py): what changed since each subscriber last
    # read, and the indexes it reads a changed node's objects through
    _feeds: list[Changes] = field(default_factory=list)
    _fleet: _FleetIndex = field(default_factory=lambda: _FleetIndex())
    # each kind's objects as the list `dump()` hands out, until that kind changes: a pass
    # takes several dumps (checks, placing, capacity) and copied 20,000 pods for each
    _lists: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # the typed view of each Workload, reservation and pod (`kube/views.py`), built once
    # when the object is accepted, and each kind's views as one list (as `_lists`)
    _views: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {k: {} for k in _VIEWED_KINDS})
    _view_lists: dict[str, list[Any]] = field(default_factory=dict)
    # (kind, key) → what the stored version's view could not read (`view.problem`)
    _problems: dict[tuple[str, str], Skipped] = field(default_factory=dict)

    def _put(self, kind: str, key: str, obj: dict[str, Any]) -> None:
        self._lists.pop(kind, None)
        bucket = self.objects.setdefault(kind, {})
        self._track(kind, key, bucket.get(key), obj)
        view = view_of(kind, obj)  # never raises: a malformed object's view names why
        if view is not None:
            self._view_lists.pop(kind, None)
            views = self._views[kind]
            if isinstance(view, PodView):
                self._unindex(key, views.get(key))
                ref = _reservation_of(view)
                if ref is not None:
                    self._pods_by_reservation.setdefault(ref, {})[key] = obj
                if view.gated:
                    self._gated_pods[key] = obj
            elif isinstance(view, ReservationView):
                self._uncarry(key, views.get(key))
                carried = _carried_label(view)
                if carried is not None:
                    self._carriers.setdefault(carried, {})[key] = obj
            views[key] = view
            if view.problem is not None:
                self._problems[(kind, key)] = view.problem
            elif self._problems:  # fixed, perhaps
                self._problems.pop((kind, key), None)
        bucket[key] = obj
        self.generation += 1

    def _drop(self, kind: str, key: str) -> None:
        self._lists.pop(kind, None)
        self._track(kind, key, self.objects.setdefault(kind, {}).get(key), None)
        self.objects.setdefault(kind, {}).pop(key, None)
        if kind in _VIEWED_KINDS:
            self._view_lists.pop(kind, None)
            old = self._views[kind].pop(key, None)
            if kind == "Pod":
                self._unindex(key, old)
            elif kind == L.KIND_RESOURCE_RESERVATION:
                self._uncarry(key, old)
            if self._problems:
                self._problems.pop((kind, key), None)
        self.generation += 1

    def _uncarry(self, key: str, rr: ReservationView | None) -> None:
        carried = _carried_label(rr)
        if carried is not None:
            carriers = self._carriers.get(carried)
            if carriers is not None:
                carriers.pop(key, None)
                if not carriers:
                    del self._carriers[carried]

    def _unindex(self, key: str, pod: PodView | None) -> None:
        if pod is None:
            return
        ref = _reservation_of(pod)
        if ref is not None:
            pods = self._pods_by_reservation.get(ref)
            if pods is not None:
                pods.pop(key, None)
                if not pods:
                    del self._pods_by_reservation[ref]
        self._gated_pods.pop(key, None)

    def upsert(self, kind: str, obj: Mapping[str, Any]) -> bool:
        """Add or update; False, and nothing changes, when no reader would see a change: a
        stale event, or a newer version equal to the stored one but for its resourceVersion
        once stripped. The stored version is kept then, so every cache keyed on it (the
        node translations, the per-version skip reports) stays: node heartbeats (KWOK's,
        the kubelet's) touch only stripped fields, and at 5,000 nodes each one woke both
        loops and marked its node for translating again."""
        key = _key(obj)
        bucket = self.objects.setdefault(kind, {})
        gone = self.tombstones.get((kind, key))
        rv = resource_version(obj)
        if gone is not None and rv is not None and rv <= gone:
            return False
        old = bucket.get(key)
        if not _newer_or_same(obj, old):
            return False
        # what no reader uses is dropped on the way in (kube/stored.py)
        new = _trimmed(kind, obj) if kind in _TRIMMED_KINDS else stripped(kind, obj)
        self.tombstones.pop((kind, key), None)
        if old is not None and (old is new or _same_but_version(old, new)):
            return False
        self._put(kind, key, new)
        return True

    def forget(self, kind: str, key: str) -> None:
        """Drop an object read on demand (no watch brings its deletion, so no tombstone)."""
        self._drop(kind, key)

    def delete(self, kind: str, obj: Mapping[str, Any]) -> bool:
        key = _key(obj)
        bucket = self.objects.setdefault(kind, {})
        old = bucket.get(key)
        if old is not None and not _newer_or_same(obj, old):
            return False
        self._drop(kind, key)
        rv = resource_version(obj)
        if rv is not None:
            self.tombstones[(kind, key)] = rv
        return old is not None

    def replace(
        self, kind: str, items: Iterable[Mapping[str, Any]], list_version: int | None
    ) -> None:
        """A fresh list of `kind` at resourceVersion `list_version`: objects it lacks are
        dropped unless an event newer than the list updated them."""
        listed = {}
        for obj in items:
            listed[_key(obj)] = obj
            self.upsert(kind, obj)
        bucket = self.objects.setdefault(kind, {})
        for key in [k for k in bucket if k not in listed]:
            rv = resource_version(bucket[key])
            if list_version is None or rv is None or rv <= list_version:
                self._drop(kind, key)
        if list_version is not None:
            self.tombstones = {
                k: v for k, v in self.tombstones.items() if k[0] != kind or v > list_version
            }

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        return self.objects.get(kind, {}).get(key)

    def by_key(self, kind: str) -> Mapping[str, dict[str, Any]]:
        """The store's own objects of `kind` by key ('namespace/name', or the name of a
        cluster-scoped object): a live view, not a copy; readers must not change it."""
        return MappingProxyType(self.objects.get(kind, {}))

    def items(self, kind: str) -> list[dict[str, Any]]:
        return list(self.objects.get(kind, {}).values())

    def listed(self, kind: str) -> list[dict[str, Any]]:
        """The objects of `kind` as one list, the same list object until the kind changes
        (so a reader may keep what it derived from it while `listed(kind) is` its list);
        shared: readers must not mutate it."""
        listed = self._lists.get(kind)
        if listed is None:
            listed = self._lists[kind] = list(self.objects.setdefault(kind, {}).values())
        return listed

    def dump(self) -> ClusterDump:
        """Every object as a `ClusterDump`, as the store holds it now (the objects and the
        lists of a kind that did not change since the last dump are shared, not copied:
        readers must not mutate them)."""
        return ClusterDump(
            by_kind={k: self.listed(k) for k in self.objects},
            keyed=MappingProxyType({k: MappingProxyType(v) for k, v in self.objects.items()}),
        )

    def pods_of_reservation(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The pods whose reservation label names `namespace/name`, and for a Workload
        slice's reservation the pods carrying the label it took over (from the index)."""
        pods = self._pods_by_reservation.get((namespace, name), {})
        carried = _carried_label(self.reservation(f"{namespace}/{name}"))
        if carried is None:
            return list(pods.values())
        return [*pods.values(), *self._pods_by_reservation.get(carried, {}).values()]

    # ---- the typed views (`kube/views.py`), built once when an object is accepted

    def workload(self, key: str) -> WorkloadView | None:
        """The view of the Workload `key` ('namespace/name')."""
        view: WorkloadView | None = self._views["Workload"].get(key)
        return view

    def reservation(self, key: str) -> ReservationView | None:
        """The view of the ResourceReservation `key` ('namespace/name')."""
        view: ReservationView | None = self._views[L.KIND_RESOURCE_RESERVATION].get(key)
        return view

    def pod(self, key: str) -> PodView | None:
        """The view of the Pod `key` ('namespace/name')."""
        view: PodView | None = self._views["Pod"].get(key)
        return view

    def workloads(self) -> list[WorkloadView]:
        """Every Workload's view, the same list until a Workload changes (as `listed`)."""
        return self._viewed("Workload")

    def reservations(self) -> list[ReservationView]:
        """Every ResourceReservation's view, the same list until one changes."""
        return self._viewed(L.KIND_RESOURCE_RESERVATION)

    def view_problems(self) -> list[Skipped]:
        """What the views of the stored Workloads, reservations and pods could not read,
        one per object (its stored version); empty when every one is well-formed."""
        return list(self._problems.values())

    def _viewed(self, kind: str) -> list[Any]:
        listed = self._view_lists.get(kind)
        if listed is None:
            listed = self._view_lists[kind] = list(self._views[kind].values())
        return listed

    def pod_views_of_reservation(self, namespace: str, name: str) -> list[PodView]:
        """`pods_of_reservation`'s pods, as their views."""
        pods = self._pods_by_reservation.get((namespace, name), {})
        carried = _carried_label(self.reservation(f"{namespace}/{name}"))
        views = self._views["Pod"]
        out = [views[k] for k in pods]
        if carried is not None:
            out += [views[k] for k in self._pods_by_reservation.get(carried, {})]
        return out

    def reservation_for_label(self, namespace: str, label: str) -> dict[str, Any] | None:
        """The reservation that holds the pods carrying reservation label `label`: the
        newest Workload slice's that took that label over, else the one of that name."""
        carriers = self._carriers.get((namespace, label))
        if carriers:
            return max(carriers.values(), key=lambda rr: (
                str(meta(rr).get("creationTimestamp") or ""),
                self.order(L.KIND_RESOURCE_RESERVATION, _key(rr))))
        return self.get(L.KIND_RESOURCE_RESERVATION, f"{namespace}/{label}")

    def reservation_view_for_label(self, namespace: str, label: str) -> ReservationView | None:
        """`reservation_for_label`'s reservation, as its view."""
        rr = self.reservation_for_label(namespace, label)
        return None if rr is None else self.reservation(_key(rr))

    def gated_pods(self) -> list[dict[str, Any]]:
        """The pods that carry our scheduling gate (from the index)."""
        return list(self._gated_pods.values())

    def gated_pod_views(self) -> list[PodView]:
        """`gated_pods`, as their views."""
        views = self._views["Pod"]
        return [views[k] for k in self._gated_pods]

    # ---- the live snapshot's feed and indexes (kube/cluster/live.py)

    def subscribe(self) -> Changes:
        """A new record of changes, filled from now on (`Changes.take` reads and clears it)."""
        feed = Changes(everything=True)
        self._feeds.append(feed)
        return feed

    def _track(self, kind: str, key: str, old: dict[str, Any] | None,
               new: dict[str, Any] | None) -> None:
        """Mark what the change moves for every subscriber, then index it. The same version
        again (a re-list) moves nothing."""
        if old is None and new is None:
            return
        # a re-list brings every object again: the same version, unchanged, moves nothing
        same = old is not None and new is not None and (
            old is new or (resource_version(old) is not None
                           and resource_version(old) == resource_version(new) and old == new))
        if not same:
            for feed in self._feeds:
                record_change(feed, kind, key, old, new, self)
        self._fleet.move(kind, key, old, new)

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        """The pods whose `spec.nodeName` is `node` (from the index)."""
        return list(self._fleet.pods_on_node.get(node, {}).values())

    def reservations_on_node(self, node: str) -> list[dict[str, Any]]:
        """The ResourceReservations with a slot on `node` (from the index)."""
        return list(self._fleet.reservations_on_node.get(node, {}).values())

    def pod_views_on_node(self, node: str) -> list[PodView]:
        """`pods_on_node`'s pods, as their views."""
        views = self._views["Pod"]
        return [views[k] for k in self._fleet.pods_on_node.get(node, {})]

    def reservation_views_on_node(self, node: str) -> list[ReservationView]:
        """`reservations_on_node`'s reservations, as their views."""
        views = self._views[L.KIND_RESOURCE_RESERVATION]
        return [views[k] for k in self._fleet.reservations_on_node.get(node, {})]

    def reservations_of_workload(self, key: str) -> list[dict[str, Any]]:
        """The ResourceReservations whose workloadRef names `key` ('namespace/name')."""
        return list(self._fleet.reservations_of_workload.get(key, {}).values())

    def slices_on_node(self, node: str) -> list[dict[str, Any]]:
        """The ResourceSlices whose `spec.nodeName` is `node` (from the index)."""
        return list(self._fleet.slices_on_node.get(node, {}).values())

    def nodes_of_pool(self, pool: str) -> set[str]:
        """The nodes with a ResourceSlice of `pool` (`changes.slice_pool`'s key)."""
        slices = self._fleet.slices_of_pool.get(pool, {}).values()
        return {n for sl in slices if (n := slice_node(sl))}

    def claims_in_pool(self, pool: str) -> list[dict[str, Any]]:
        """The ResourceClaims whose allocation names a device of `pool` (from the index)."""
        return list(self._fleet.claims_in_pool.get(pool, {}).values())

    def order(self, kind: str, key: str) -> int:
        """Where the object stands in its kind's order (first added first, as the store's
        own maps hold them): a snapshot reads Nodes, slices, pods and reservations in this
        order."""
        return self._fleet.order.get((kind, key), 0)


# the kinds whose order of insertion is kept (`Store.order`)
_ORDERED_KINDS = frozenset({"Node", "Pod", "ResourceSlice", "ResourceClaim",
                            L.KIND_RESOURCE_RESERVATION})


@dataclass(slots=True)
class _FleetIndex:
    """Pods by node, reservations by node and by Workload, ResourceSlices by node and by
    pool, ResourceClaims by the pools they hold devices of, and the order of insertion."""

    pods_on_node: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    reservations_on_node: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    reservations_of_workload: dict[str, dict[str, dict[str, Any]]] = field(
        default_factory=dict)
    slices_on_node: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    slices_of_pool: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    claims_in_pool: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    order: dict[tuple[str, str], int] = field(default_factory=dict)
    added: int = 0

    def move(self, kind: str, key: str, old: dict[str, Any] | None,
             new: dict[str, Any] | None) -> None:
        if kind not in _ORDERED_KINDS:
            return
        if new is None:
            self.order.pop((kind, key), None)
        elif old is None:
            self.added += 1
            self.order[(kind, key)] = self.added
        if kind == "Pod":
            self._file(self.pods_on_node, key, old, new, lambda p: _one(pod_node(p)))
        elif kind == L.KIND_RESOURCE_RESERVATION:
            self._file(self.reservations_on_node, key, old, new, slot_nodes)
            self._file(self.reservations_of_workload, key, old, new,
                       lambda rr: {reservation_workload_key(rr)})
        elif kind == "ResourceSlice":
            self._file(self.slices_on_node, key, old, new, lambda sl: _one(slice_node(sl)))
            self._file(self.slices_of_pool, key, old, new, lambda sl: _one(slice_pool(sl)))
        elif kind == "ResourceClaim":
            self._file(self.claims_in_pool, key, old, new, claim_pools)

    @staticmethod
    def _file(index: dict[str, dict[str, dict[str, Any]]], key: str,
              old: dict[str, Any] | None, new: dict[str, Any] | None,
              where: Callable[[dict[str, Any]], set[str]]) -> None:
        for place in where(old) if old is not None else ():
            bucket = index.get(place)
            if bucket is not None:
                bucket.pop(key, None)
                if not bucket:
                    del index[place]
        if new is not None:
            for place in where(new):
                index.setdefault(place, {})[key] = new


def _one(name: str | None) -> set[str]:
    return {name} if name else set()


class PerObject(Generic[T]):
    """What a pass derives from each object of a store list, kept while the store holds
    that very object: the store puts a new object in place of one that changed, so a pass
    after one Workload event derives one value and looks up the others, where deriving
    them all grew with the Workloads (e2e/bench_e2e/pass_bench.py: with 5,000 waiting, a
    pass took 57 ms of CPU walking them all, 16 ms with the values kept). Values are
    derived afresh for all when `context` (what `derive` reads besides the object: lists
    compared by identity, other values by equality) is not what it was."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[object, T]] = {}
        self._context: tuple[object, ...] | None = None

    def __len__(self) -> int:
        """How many objects' values are held (at most about twice those last listed)."""
        return len(self._kept)

    def values(
        self,
        objects: Sequence[Obj],
        derive: Callable[[Obj], T],
        context: tuple[object, ...] = (),
    ) -> list[T]:
        """`derive(o)` for each of `objects`, in their order."""
        if self._context is None or len(context) != len(self._context) or not all(
            a is b or (not isinstance(a, list) and a == b)
            for a, b in zip(context, self._context, strict=True)
        ):
            self._kept = {}
        self._context = context
        kept = self._kept
        out: list[T] = []
        for obj in objects:
            entry = kept.get(id(obj))
            if entry is None or entry[0] is not obj:  # new, or the id of an object let go
                entry = kept[id(obj)] = (obj, derive(obj))
            out.append(entry[1])
        if len(kept) > 2 * len(objects) + 64:  # let go of the objects no longer listed
            self._kept = {id(o): kept[id(o)] for o in objects}
        return out
