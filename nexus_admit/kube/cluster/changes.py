"""Which nodes' free capacity an object's change can move, for a snapshot kept up to date
from watch events (`live`).

Who calls it: the controller's store (`controller/store.py`) calls `record_change` for every
object it adds, replaces or drops, once per subscribed `Changes`, before its own indexes move.
What a node's free capacity reads (`snapshot.build_snapshot`), and so what marks it:

  Node, NodeResourceTopology   that node (its translation; whether it is in the fleet)
  Pod                          its old and new node, and, while it is bound and running, the
                               slots' nodes of the reservation its label names (its slot is
                               counted as the pod, and it keeps a reservation past its TTL)
  ResourceReservation          the nodes of its old and new slots, and the nodes of its pods
                               (their devices and zone are read from their slot)
  Workload                     the slots' nodes of its reservations that state no requests
                               (they are read from its pod templates); with a Kueue TAS
                               topology assignment, the nodes its old and new ones name
  ResourceSlice                its old and new node (its GPUs are that node's), and every
                               node with a slice of its old or new pool (a claim names a
                               device by driver, pool and name, found through the slices)
  ResourceClaim                every node with a slice of a pool its old or new allocation
                               names (the devices it holds are on those nodes)
Topologies are read whole on every pass (a handful of objects). Time moves capacity too: a
reservation expires without an event (`live` keeps the expiries).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.capacity import pod_is_active
from nexus_admit.kube.cluster.tas import assignment_nodes, has_topology_assignment
from nexus_admit.kube.errors import Obj, meta, object_key
from nexus_admit.kube.reservations import reservation_slots

__all__ = [
    "Changes",
    "FleetSource",
    "claim_pools",
    "needs_templates",
    "pod_node",
    "pod_reservation",
    "record_change",
    "slice_node",
    "slice_pool",
    "slot_nodes",
]


class FleetSource(Protocol):
    """What the live snapshot reads of the watched objects (the controller's store)."""

    def by_key(self, kind: str) -> Mapping[str, dict[str, Any]]: ...

    def get(self, kind: str, key: str) -> dict[str, Any] | None: ...

    def pods_on_node(self, node: str) -> Iterable[dict[str, Any]]: ...

    def reservations_on_node(self, node: str) -> Iterable[dict[str, Any]]: ...

    def reservations_of_workload(self, key: str) -> Iterable[dict[str, Any]]: ...

    def pods_of_reservation(self, namespace: str, name: str) -> list[dict[str, Any]]: ...

    def slices_on_node(self, node: str) -> Iterable[dict[str, Any]]: ...

    def nodes_of_pool(self, pool: str) -> set[str]: ...

    def claims_in_pool(self, pool: str) -> Iterable[dict[str, Any]]: ...

    def order(self, kind: str, key: str) -> int: ...


@dataclass(slots=True)
class Changes:
    """What changed since the live snapshot last read it."""

    nodes: set[str] = field(default_factory=set)  # nodes whose free capacity may have moved
    # those of `nodes` an object on or of the node changed: all but the nodes marked only
    # because a running pod keeps its reservation's other slots (a count of a node alone,
    # `overcommit.py`, need not look at them again)
    touched: set[str] = field(default_factory=set)
    node_objects: set[str] = field(default_factory=set)  # a Node or NRT of these changed
    pods: dict[str, Obj] = field(default_factory=dict)  # key → newest (the last if gone)
    reservations: dict[str, Obj] = field(default_factory=dict)
    slices: dict[str, Obj] = field(default_factory=dict)
    claims: dict[str, Obj] = field(default_factory=dict)
    workloads: dict[str, Obj] = field(default_factory=dict)  # with a TAS assignment
    everything: bool = False  # a new subscriber: its first read is a full one
    reordered: bool = False  # a Node was dropped: the store's node order may change

    def take(self) -> Changes:
        """What was recorded, and start afresh."""
        out = Changes(self.nodes, self.touched, self.node_objects, self.pods,
                      self.reservations, self.slices, self.claims, self.workloads,
                      self.everything, self.reordered)
        self.nodes, self.touched, self.node_objects = set(), set(), set()
        self.pods, self.reservations = {}, {}
        self.slices, self.claims, self.workloads = {}, {}, {}
        self.everything = self.reordered = False
        return out

    def mark(self, *names: str) -> None:
        """Nodes an object on or of them changed (`nodes` and `touched`)."""
        self.nodes.update(names)
        self.touched.update(names)


def pod_node(pod: Obj) -> str | None:
    """The node a pod is bound to, as far as it can be read."""
    spec = pod.get("spec")
    name = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return str(name) if name else None


def pod_reservation(pod: Obj) -> tuple[str, str] | None:
    """(namespace, name) of the reservation a pod's label names, as far as it can be read."""
    m = meta(pod)
    labels = m.get("labels")
    name = labels.get(L.LABEL_RESERVATION) if isinstance(labels, Mapping) else None
    return (str(m.get("namespace") or "default"), str(name)) if name else None


def slot_nodes(rr: Obj) -> set[str]:
    """Every node a reservation's slots name, as far as they can be read."""
    return {s.node for s in reservation_slots(rr)}


def slice_node(sl: Obj) -> str | None:
    """The node a ResourceSlice's devices are on, as far as it can be read."""
    spec = sl.get("spec")
    name = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return str(name) if name else None


def _pool(driver: Any, pool: Any) -> str:
    # driver names are DNS subdomains, pool names may hold "/": a newline parts them
    return f"{driver or ''}\n{pool or ''}"


def slice_pool(sl: Obj) -> str | None:
    """The (driver, pool) a ResourceSlice's devices belong to, as one key, if readable."""
    spec = sl.get("spec")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("pool"), Mapping):
        return None
    return _pool(spec.get("driver"), spec["pool"].get("name"))


def claim_pools(claim: Obj) -> set[str]:
    """The (driver, pool) keys of the devices a ResourceClaim's allocation names, as far as
    they can be read."""
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list):
        return set()
    return {_pool(r.get("driver"), r.get("pool")) for r in results if isinstance(r, Mapping)}


def needs_templates(rr: Obj) -> bool:
    """A pod set without `requests` is read from its Workload's templates (or unreadable)."""
    spec = rr.get("spec")
    pod_sets = spec.get("podSets") if isinstance(spec, Mapping) else None
    if not isinstance(pod_sets, list):
        return True
    return any(not isinstance(ps, Mapping) or not isinstance(ps.get("requests"), Mapping)
               or not ps.get("requests") for ps in pod_sets)


def _active(pod: Obj) -> bool:
    """Bound and running, as the snapshot counts pods (unreadable: not counted)."""
    try:
        return pod_is_active(pod)
    except Exception:
        return False


def _reservation_nodes(source: FleetSource, pod: Obj) -> set[str]:
    ref = pod_reservation(pod)
    rr = source.get(L.KIND_RESOURCE_RESERVATION, f"{ref[0]}/{ref[1]}") if ref else None
    return slot_nodes(rr) if rr is not None else set()


def record_change(
    changes: Changes, kind: str, key: str, old: Obj | None, new: Obj | None,
    source: FleetSource,
) -> None:
    """Mark what `old` → `new` (None: absent) of `kind` can move (the module's table).
    Called before the store's indexes move: `source` still holds `old`."""
    if kind == "ResourceSlice":
        for sl in (old, new):
            if sl is None:
                continue
            node = slice_node(sl)
            if node:  # its node's GPUs, and whether the node is in the fleet at all
                changes.mark(node)
                changes.node_objects.add(node)
            pool = slice_pool(sl)
            if pool is not None:
                changes.mark(*source.nodes_of_pool(pool))
        changes.slices[key] = new or old or {}
    elif kind == "ResourceClaim":
        for claim in (old, new):
            for pool in claim_pools(claim) if claim is not None else ():
                changes.mark(*source.nodes_of_pool(pool))
        changes.claims[key] = new or old or {}
    elif kind in ("Node", "NodeResourceTopology"):
        name = str(meta(new or old or {}).get("name") or key)
        changes.mark(name)
        changes.node_objects.add(name)
        changes.reordered |= kind == "Node" and new is None
    elif kind == "Pod":
        for pod in (old, new):
            if pod is not None:
                node = pod_node(pod)
                if node:
                    changes.mark(node)
                if _active(pod):  # a gated or finished pod holds no slot of its reservation
                    changes.nodes |= _reservation_nodes(source, pod)
        changes.pods[key] = new or old or {}
    elif kind == L.KIND_RESOURCE_RESERVATION:
        for rr in (old, new):
            if rr is not None:
                changes.mark(*slot_nodes(rr))
        m = meta(new or old or {})
        for pod in source.pods_of_reservation(str(m.get("namespace") or "default"),
                                              str(m.get("name"))):
            node = pod_node(pod)
            if node:
                changes.mark(node)
        changes.reservations[key] = new or old or {}
    elif kind == "Workload":
        for rr in source.reservations_of_workload(object_key(new or old or {})):
            if needs_templates(rr):
                changes.mark(*slot_nodes(rr))
        tas = [wl for wl in (old, new) if wl is not None and has_topology_assignment(wl)]
        for wl in tas:
            changes.mark(*assignment_nodes(wl))
        if tas:
            changes.workloads[key] = new or old or {}
