"""Every object kind that shapes capacity → one `ClusterSnapshot`, one step per kind:
translate the nodes, count what bound pods take, count what live reservations and Kueue TAS
assignments hold, apply the claims. With `skipped`, each step leaves a malformed object out
and lists it (see the package's doc for what each case counts)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.allocations import allocated_devices
from nexus_admit.kube.cluster.capacity import (
    Claim,
    SlotKey,
    apply_claim,
    gpu_share,
    pod_claim,
    pod_is_active,
    reservation_claims,
    slot_ref,
    slots_by_key,
)
from nexus_admit.kube.cluster.nodes import (
    dra_device_indices,
    label_int,
    node_from_object,
    topologies_from_objects,
)
from nexus_admit.kube.cluster.skipping import culprit, skip
from nexus_admit.kube.cluster.tas import has_topology_assignment, holds_quota, tas_pod_sets_of
from nexus_admit.kube.errors import Obj, Skipped, TranslationError, mapping, meta, object_ref
from nexus_admit.kube.podspec import AdmissionDefaults, workload_template_requests
from nexus_admit.kube.reservations import (
    reservation_is_live,
    reservation_pod_label,
    reservation_slots,
    reservation_workload_key,
)
from nexus_admit.kube.versioned import VersionedCache, object_version
from nexus_admit.model import ClusterSnapshot, Node

__all__ = ["build_snapshot"]


def build_snapshot(
    nodes: Iterable[Obj],
    pods: Iterable[Obj] = (),
    reservations: Iterable[Obj] = (),
    *,
    node_resource_topologies: Iterable[Obj] = (),
    resource_slices: Iterable[Obj] = (),
    resource_claims: Iterable[Obj] = (),
    topologies: Iterable[Obj] = (),
    workloads: Iterable[Obj] = (),
    exclude_workloads: Iterable[str] = (),
    template_requests: Mapping[tuple[str, str], tuple[int, int, int]] | None = None,
    admitted: AdmissionDefaults | None = None,
    now: datetime | None = None,
    skipped: list[Skipped] | None = None,
) -> ClusterSnapshot:
    """Every object kind that shapes capacity → a ClusterSnapshot with real free capacity.

    `exclude_workloads` ("ns/name") are the workloads being (re)placed: their own
    reservations do not count against them. `template_requests[(workload, podSet)]` gives
    (cpu milli, memory MiB, GPUs) per pod for reservations that do not state `requests`.
    `resource_claims`: the GPU devices their allocations hold are taken (kube/cluster/
    allocations.py).
    `workloads`: what Kueue TAS assignments hold is taken (kube/cluster/tas.py); the
    excluded workloads' too (TAS holds it for them, nexus does not); with `admitted`, each
    pod's template requests as the apiserver admits it (RuntimeClass overhead, LimitRange
    defaults).
    `skipped`: malformed objects are left out and listed there (never freer than the truth,
    see the package's doc) instead of raising `TranslationError`.
    """
    now = now or datetime.now(UTC)
    fleet = _translate_nodes(nodes, node_resource_topologies, resource_slices, skipped)
    reservations, pods = list(reservations), list(pods)
    ledger = _Ledger()
    _count_allocations(resource_claims, fleet, ledger, skipped)
    _count_pods(pods, fleet, _reserved_slots(reservations, skipped), ledger, skipped)
    counting = _ReservationCounting(
        excluded=set(exclude_workloads),
        bound=_bound_reservations(pods),
        template_requests=template_requests or {},
        now=now,
    )
    for rr in reservations:
        _count_reservation(rr, fleet, ledger, counting, skipped)
    _count_tas(workloads, pods, fleet, ledger, skipped, admitted)
    _apply_claims(fleet, ledger)
    return ClusterSnapshot(fleet.nodes, topologies_from_objects(topologies, skipped))


@dataclass(slots=True)
class _Fleet:
    """The translated nodes, before anything is subtracted."""

    nodes: dict[str, Node] = field(default_factory=dict)
    available: dict[tuple[str, int], int] = field(default_factory=dict)  # NRT CPU per zone
    replicas: dict[str, int] = field(default_factory=dict)  # GFD time-slicing replicas
    # a DRA GPU (driver, pool, device) → (node, the node's GPU index)
    dra_devices: dict[tuple[str, str, str], tuple[str, int]] = field(default_factory=dict)


@dataclass(slots=True)
class _Ledger:
    """What bound pods and live reservations take, as counted so far."""

    claims: list[Claim] = field(default_factory=list)
    claimed: set[SlotKey] = field(default_factory=set)  # slots whose pod is bound and counted
    # nodes a bound pod or a live reservation takes an unknowable part of: out of placement
    unusable: set[str] = field(default_factory=set)
    allocated: set[tuple[str, int]] = field(default_factory=set)  # GPUs DRA claims hold


# ---------------------------------------------------------------- nodes

# A fleet's Nodes, NRTs and ResourceSlices rarely change between two passes: one
# translation per node, reused while the versions (uid and resourceVersion) of its objects
# stay the same, copied out since the snapshot mutates its nodes. Objects without a
# version (a dump file, a test) are translated every time.
_NODES: VersionedCache[tuple[Node, dict[int, int]]] = VersionedCache()


def _translated_node(
    obj: Obj, nrt: Obj | None, resource_slices: Sequence[Obj]
) -> tuple[Node, dict[int, int]]:
    versions = [object_version(o) for o in (obj, *resource_slices)]
    nrt_version = object_version(nrt) if nrt is not None else ("", "")
    name = str(meta(obj).get("name") or "")
    if not name or any(v is None for v in versions) or nrt_version is None:
        return node_from_object(obj, nrt=nrt, resource_slices=resource_slices)
    key = tuple(v for v in (*versions, nrt_version) if v is not None)
    node, avail = _NODES.get(
        name, key, lambda: node_from_object(obj, nrt=nrt, resource_slices=resource_slices)
    )
    return node.copy(), dict(avail)


def _slices_by_node(
    resource_slices: Iterable[Obj], skipped: list[Skipped] | None
) -> dict[str, list[Obj]]:
    out: dict[str, list[Obj]] = {}
    for sl in resource_slices:
        try:
            node_name = mapping(sl, sl.get("spec"), "spec").get("nodeName")
        except TranslationError as e:
            if skipped is None:
                raise
            skip(skipped, sl, e, "malformed", "left out")
            continue
        if node_name:
            out.setdefault(str(node_name), []).append(sl)
    return out


def _translate_nodes(
    nodes: Iterable[Obj],
    node_resource_topologies: Iterable[Obj],
    resource_slices: Iterable[Obj],
    skipped: list[Skipped] | None,
) -> _Fleet:
    """Each Node with its NRT and ResourceSlices; a malformed one is left out."""
    nrt_by_node = {str(meta(o).get("name")): o for o in node_resource_topologies}
    slices_by_node = _slices_by_node(resource_slices, skipped)
    fleet = _Fleet()
    for obj in nodes:
        name = str(meta(obj).get("name") or "")
        nrt, slices = nrt_by_node.get(name), slices_by_node.get(name, ())
        try:
            node, avail = _translated_node(obj, nrt, slices)
            if node.name in fleet.nodes:
                raise TranslationError(object_ref(obj), "metadata.name", "duplicate Node name")
            node_replicas = label_int(obj, node.labels, L.GFD_GPU_REPLICAS) or 1
        except Exception as e:
            if skipped is None:
                raise
            named = culprit(e, (obj, nrt, *slices))
            skip(skipped, named, e, "malformed", f"Node {name} is left out of placement")
            continue
        fleet.nodes[node.name] = node
        fleet.replicas[node.name] = node_replicas
        _index_dra_devices(fleet, node, slices)
        for zid, a in avail.items():
            fleet.available[(node.name, zid)] = a
    return fleet


def _index_dra_devices(fleet: _Fleet, node: Node, slices: Sequence[Obj]) -> None:
    """The node's DRA GPUs by the names claims use. With both `nvidia.com/gpu` and slices
    the extended resource gives the count, and the slice devices are GPUs 0..n-1 in index
    order: a device taken either way is one GPU, counted once."""
    if not slices:
        return
    for device, index in dra_device_indices(slices).items():
        if index < node.gpu_count:
            fleet.dra_devices[device] = (node.name, index)


# ---------------------------------------------------------------- DRA claims


def _count_allocations(
    claims: Iterable[Obj], fleet: _Fleet, ledger: _Ledger, skipped: list[Skipped] | None
) -> None:
    # every claim is read, on any fleet: a malformed one is listed whichever nodes a pass
    # translates (the live snapshot reads only the claims of the nodes it marked)
    for claim in claims:
        try:
            ledger.allocated.update(allocated_devices(claim, fleet.dra_devices))
        except Exception as e:
            if skipped is None:
                raise
            skip(skipped, claim, e, "malformed",
                 "left out: the GPUs its allocation holds are not known")


# ---------------------------------------------------------------- bound pods


def _reserved_slots(
    reservations: Iterable[Obj], skipped: list[Skipped] | None
) -> dict[SlotKey, Mapping[str, Any]]:
    """Every slot as written, to learn a bound pod's devices and zone."""
    out: dict[SlotKey, Mapping[str, Any]] = {}
    for rr in reservations:
        try:
            out.update(slots_by_key(rr))
        except Exception:
            if skipped is None:
                raise
            # its pods' devices are unknown (they take the lowest free ones); the
            # reservation itself is listed when its claims are read
            continue
    return out


def _count_pods(
    pods: Iterable[Obj],
    fleet: _Fleet,
    rr_slots: Mapping[SlotKey, Mapping[str, Any]],
    ledger: _Ledger,
    skipped: list[Skipped] | None,
) -> None:
    for pod in pods:
        try:
            if not pod_is_active(pod):
                continue
            target = fleet.nodes.get(str(mapping(pod, pod.get("spec"), "spec").get("nodeName")))
            if target is None:
                continue
        except Exception as e:
            if skipped is None:
                raise
            skip(skipped, pod, e, "malformed", "left out: not known to be bound to a node")
            continue
        try:
            ledger.claims.append(
                pod_claim(pod, target, fleet.replicas[target.name], rr_slots, skipped)
            )
            ref = slot_ref(pod)
        except Exception as e:
            if skipped is None:
                raise
            ledger.unusable.add(target.name)
            skip(
                skipped,
                pod,
                e,
                "node-left-out",
                f"what it takes of node {target.name} is unknown, so that node is left out "
                "of placement",
            )
            continue
        if ref is not None:
            ledger.claimed.add(ref)


# ---------------------------------------------------------------- live reservations


def _bound_reservations(pods: Iterable[Obj]) -> set[tuple[str, str]]:
    """Reservations with a bound pod: past their TTL they still hold (reservation_is_live)."""
    out: set[tuple[str, str]] = set()
    for pod in pods:
        try:
            if pod_is_active(pod):
                m = meta(pod)
                rr_label = mapping(pod, m.get("labels"), "metadata.labels").get(L.LABEL_RESERVATION)
                if rr_label:
                    out.add((str(m.get("namespace") or "default"), str(rr_label)))
        except Exception:  # listed when its pod was counted
            continue
    return out


@dataclass(frozen=True, slots=True)
class _ReservationCounting:
    excluded: set[str]  # "ns/name" of the workloads being (re)placed
    bound: set[tuple[str, str]]  # (namespace, name) of reservations with a bound pod
    template_requests: Mapping[tuple[str, str], tuple[int, int, int]]
    now: datetime


def _count_reservation(
    rr: Obj,
    fleet: _Fleet,
    ledger: _Ledger,
    counting: _ReservationCounting,
    skipped: list[Skipped] | None,
) -> None:
    owner = f"Workload {reservation_workload_key(rr)}"
    if reservation_workload_key(rr) in counting.excluded:
        return
    try:
        ns = str(meta(rr).get("namespace") or "default")
        bound = any((ns, name) in counting.bound
                    for name in (str(meta(rr).get("name")), reservation_pod_label(rr)))
        live = reservation_is_live(rr, counting.now, bound=bound)
    except Exception as e:
        if skipped is None:
            raise
        live = True  # an unreadable expiry holds: never freer than the truth
        skip(skipped, rr, e, "counted-live", "counted as live", owner)
    if not live:
        return
    try:
        ledger.claims.extend(
            reservation_claims(rr, fleet.nodes, ledger.claimed, counting.template_requests)
        )
    except Exception as e:
        if skipped is None:
            raise
        named = _named_nodes(rr, fleet.nodes)
        ledger.unusable |= named
        skip(
            skipped,
            rr,
            e,
            "node-left-out",
            "what it holds is unknown, so the nodes it names are left out of placement"
            + (f" ({', '.join(sorted(named))})" if named else ""),
            owner,
        )


def _named_nodes(rr: Obj, nodes: Mapping[str, Node]) -> set[str]:
    """The snapshot's nodes a reservation's slots name, as far as they can be read."""
    try:
        return {s.node for s in reservation_slots(rr)} & nodes.keys()
    except Exception:
        return set()


# ---------------------------------------------------------------- Kueue TAS assignments


def _tas_bound_pods(pods: Iterable[Obj]) -> dict[tuple[str, str, str, str], int]:
    """(namespace, Workload, pod set, node) → its pods bound there and running (Kueue
    stamps them with the Workload annotation and the pod set label)."""
    out: dict[tuple[str, str, str, str], int] = {}
    for pod in pods:
        try:
            if not pod_is_active(pod):
                continue
            m = meta(pod)
            wl = mapping(pod, m.get("annotations"), "metadata.annotations").get(
                L.KUEUE_WORKLOAD_ANNOTATION)
            ps = mapping(pod, m.get("labels"), "metadata.labels").get(L.KUEUE_PODSET_LABEL)
            node = mapping(pod, pod.get("spec"), "spec").get("nodeName")
        except Exception:  # listed when its pod was counted
            continue
        if wl and ps:
            k = (str(m.get("namespace") or "default"), str(wl), str(ps), str(node))
            out[k] = out.get(k, 0) + 1
    return out


def _count_tas(
    workloads: Iterable[Obj],
    pods: Iterable[Obj],
    fleet: _Fleet,
    ledger: _Ledger,
    skipped: list[Skipped] | None,
    admitted: AdmissionDefaults | None = None,
) -> None:
    """Each pod a TAS assignment puts on a node of the snapshot and that is not bound there
    yet takes its pod set's per-pod requests (tas.py)."""
    # in name order: which devices a claim of unknown devices takes depends on the order
    holders = sorted((w for w in workloads if has_topology_assignment(w) and holds_quota(w)),
                     key=lambda w: (str(meta(w).get("namespace") or ""),
                                    str(meta(w).get("name") or "")))
    if not holders:
        return
    bound = _tas_bound_pods(pods)
    for wl in holders:
        m = meta(wl)
        ns, name = str(m.get("namespace") or "default"), str(m.get("name") or "")
        try:
            pod_sets = tas_pod_sets_of(wl)
            requests = workload_template_requests(wl, admitted)
        except Exception as e:
            if skipped is None:
                raise
            skip(skipped, wl, e, "malformed",
                 "left out: what its topology assignment holds is not counted")
            continue
        for ps in pod_sets:
            if not ps.names_nodes:
                _tell_not_counted(wl, ps.name, ps.lowest_level, skipped)
                continue
            cpu, mem, gpus = requests.get((f"{ns}/{name}", ps.name), (0, 0, 0))
            for node, count in ps.pods.items():
                if node not in fleet.nodes:
                    continue
                whole, share = gpu_share(gpus, None, fleet.replicas[node])
                for _ in range(count - bound.get((ns, name, ps.name, node), 0)):
                    ledger.claims.append(Claim(node, cpu, mem, whole, share, None, None))


def _tell_not_counted(wl: Obj, pod_set: str, level: str, skipped: list[Skipped] | None) -> None:
    error = TranslationError(
        object_ref(wl), "status.admission.podSetAssignments",
        f"pod set {pod_set}'s topology assignment ends at level {level!r}, which names no "
        f"node (kube-scheduler picks one in the domain); end the TAS flavor's Topology at "
        f"{L.HOSTNAME_LABEL} for nexus to count it")
    if skipped is None:
        return  # a plan: nothing is wrong with the Workload itself
    skip(skipped, wl, error, "not-counted", "what it holds is not counted")


# ---------------------------------------------------------------- free capacity


def _apply_claims(fleet: _Fleet, ledger: _Ledger) -> None:
    """Subtract every claim, drop the unusable nodes, then each NUMA zone's free CPU."""
    zone_used: dict[tuple[str, int], int] = {}
    for name, index in ledger.allocated:
        fleet.nodes[name].gpu_free[index] = 0
    # claims with known devices first, so the others cannot take their devices
    for claim in sorted(ledger.claims, key=lambda c: c.devices is None):
        if claim.node not in ledger.unusable:
            apply_claim(fleet.nodes[claim.node], claim, zone_used)
    for name in ledger.unusable:
        del fleet.nodes[name]
    for node in fleet.nodes.values():
        for z in node.numa_zones:
            free = z.cpu_milli - zone_used.get((node.name, z.id), 0)
            if (node.name, z.id) in fleet.available:
                free = min(free, fleet.available[(node.name, z.id)])
            z.free_cpu_milli = max(0, min(free, node.free_cpu_milli))
