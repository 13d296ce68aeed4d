"""What bound pods and live ResourceReservations take of the nodes: one `Claim` each (per
pod, per reserved slot), applied to a node's free CPU, memory, pods, GPU devices and NUMA
zones. Never freer than the truth: over-commitment clamps free capacity at zero."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.skipping import skip
from nexus_admit.kube.errors import (
    Obj,
    Skipped,
    TranslationError,
    mapping,
    meta,
    object_ref,
    sequence,
)
from nexus_admit.kube.quantity import parse_cpu_milli, parse_memory_mib, parse_milli
from nexus_admit.kube.requests import PodRequests, gpu_fraction_milli, pod_requests
from nexus_admit.kube.reservations import (
    reservation_pod_label,
    reservation_workload_key,
    slot_key,
)
from nexus_admit.kube.versioned import VersionedCache, object_version
from nexus_admit.model import GPU_WHOLE, Node

__all__ = [
    "Claim",
    "SlotKey",
    "apply_claim",
    "claim_fits",
    "gpu_fraction_milli",
    "gpu_share",
    "gpus_served_by_dra",
    "pod_claim",
    "pod_is_active",
    "reservation_claims",
    "reservation_slot_claims",
    "slot_ref",
    "slots_by_key",
]

_log = logging.getLogger(__name__)
_TERMINAL_PHASES = ("Succeeded", "Failed")  # a tuple: `in` must not hash a malformed phase

SlotKey = tuple[str, str, str]  # (namespace, reservation, "<podSet>/<index>")


@dataclass(slots=True)
class Claim:
    """Capacity one bound pod or one reserved slot takes on a node."""

    node: str
    cpu_milli: int
    memory_mib: int
    whole_gpus: int  # devices taken whole
    share_milli: int  # share of one device (0 = none)
    devices: tuple[int, ...] | None  # known device indices, None = choose
    zone: int | None
    every_zone: bool = False  # its zone cannot be read: its CPU counts in every zone


def pod_is_active(pod: Obj) -> bool:
    """Bound to a node and not terminated (phase not Succeeded/Failed)."""
    spec = mapping(pod, pod.get("spec"), "spec")
    status = mapping(pod, pod.get("status"), "status")
    return bool(spec.get("nodeName")) and str(status.get("phase")) not in _TERMINAL_PHASES


def slot_ref(pod: Obj) -> SlotKey | None:
    """(namespace, reservation, "<podSet>/<index>") a pod claims, if any."""
    m = meta(pod)
    rr = mapping(pod, m.get("labels"), "metadata.labels").get(L.LABEL_RESERVATION)
    slot = mapping(pod, m.get("annotations"), "metadata.annotations").get(L.ANN_SLOT)
    if rr and slot:
        return (str(m.get("namespace") or "default"), str(rr), str(slot))
    return None


def _int_or_none(obj: Obj, value: Any, field: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        n = int(str(value))
    except ValueError:
        raise TranslationError(object_ref(obj), field, f"{value!r} is not a whole number") from None
    if n < 0:
        raise TranslationError(object_ref(obj), field, f"negative {n}")
    return n


def gpu_share(units: int, fraction: int | None, replicas: int) -> tuple[int, int]:
    """(whole devices, share of one device) for `units` of nvidia.com/gpu."""
    if units <= 0:
        return 0, 0
    if fraction is not None and fraction < GPU_WHOLE:
        return 0, fraction
    if replicas > 1:
        share = units * GPU_WHOLE // replicas
        return (0, share) if share < GPU_WHOLE else (math.ceil(share / GPU_WHOLE), 0)
    return units, 0


# A pod's requests, translated once per version (uid and resourceVersion): a pass's snapshot
# reads every bound pod, and a burst runs passes back to back.
_POD_REQUESTS: VersionedCache[PodRequests] = VersionedCache()


def _pod_requests(pod: Obj) -> PodRequests:
    version = object_version(pod)
    if version is None:
        return pod_requests(pod, pod.get("spec"))
    uid, rv = version
    return _POD_REQUESTS.get(uid, rv, lambda: pod_requests(pod, pod.get("spec")))


def pod_claim(
    pod: Obj,
    node: Node,
    replicas: int,
    rr_slots: Mapping[SlotKey, Mapping[str, Any]],
    skipped: list[Skipped] | None = None,
) -> Claim:
    """What a bound pod takes. Its requests must be read (else this raises); with `skipped`,
    an unreadable share or zone is counted at its most and listed there."""
    m = meta(pod)
    req = _pod_requests(pod)
    annotations = mapping(pod, m.get("annotations"), "metadata.annotations")
    every_zone = False
    try:
        fraction = gpu_fraction_milli(pod, annotations, "metadata.annotations")
    except TranslationError as e:
        if skipped is None:
            raise
        fraction, replicas = None, 1  # every unit a whole device: never freer than the truth
        skip(skipped, pod, e, "counted-whole", f"counted as {req.gpus} whole GPU(s)")
    whole, share = gpu_share(req.gpus, fraction, replicas)
    if whole and gpus_served_by_dra(pod):
        whole = 0  # counted once: as the devices its extended-resource claim holds
    devices: tuple[int, ...] | None = None
    try:
        zone = _int_or_none(
            pod, annotations.get(L.ANN_NUMA_ZONE), f"metadata.annotations[{L.ANN_NUMA_ZONE}]"
        )
    except TranslationError as e:
        if skipped is None:
            raise
        zone, every_zone = None, True
        skip(skipped, pod, e, "counted-every-zone", "its CPU counted in every NUMA zone")
    ref = slot_ref(pod)
    if ref is not None and ref in rr_slots:
        slot = rr_slots[ref]
        gpus = slot.get("gpus")
        # a pod asking its GPUs through DRA claims holds what its claims' allocations say
        # (counted from the claims), not the devices its slot named
        if (whole or share) and isinstance(gpus, list) and all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus
        ):
            devices = tuple(gpus)
        if zone is None and not every_zone and isinstance(slot.get("numaZone"), int):
            zone = slot["numaZone"]
    return Claim(node.name, req.cpu_milli, req.memory_mib, whole, share, devices, zone, every_zone)


def gpus_served_by_dra(pod: Obj) -> bool:
    """Did kube-scheduler serve the pod's `nvidia.com/gpu` through DRA (extended-resource
    mapping, GA in 1.37: a DeviceClass with `extendedResourceName`, on a node whose GPUs
    only a DRA driver publishes)? Then a ResourceClaim it made for the pod, named in
    `status.extendedResourceClaimStatus`, holds the devices, and the snapshot counts them
    from that claim's allocation. Anything unreadable answers no: counted from the request
    as well, never freer than the truth."""
    status = pod.get("status")
    claim = status.get("extendedResourceClaimStatus") if isinstance(status, Mapping) else None
    if not isinstance(claim, Mapping) or not claim.get("resourceClaimName"):
        return False
    mappings = claim.get("requestMappings")
    if not isinstance(mappings, list):
        return False
    return any(isinstance(m, Mapping) and m.get("resourceName") == L.GPU_RESOURCE
               for m in mappings)


def reservation_claims(
    rr: Obj,
    nodes: Mapping[str, Node],
    claimed: set[SlotKey],
    template_requests: Mapping[tuple[str, str], tuple[int, int, int]],
) -> list[Claim]:
    """What a live reservation holds: one claim per slot on a node of the snapshot whose pod
    is not bound yet (a bound pod's slot is in `claimed`, counted as the pod)."""
    return [c for _, c in reservation_slot_claims(rr, nodes, claimed, template_requests)]


def reservation_slot_claims(
    rr: Obj,
    nodes: Mapping[str, Node],
    claimed: set[SlotKey],
    template_requests: Mapping[tuple[str, str], tuple[int, int, int]],
    *,
    on_node: str | None = None,
) -> list[tuple[str, Claim]]:
    """`reservation_claims`, each with its slot's key ("<podSet>/<index>"). `on_node`: only
    the slots on that node (the others are left out without a word: not missing, just not
    asked for)."""
    m = meta(rr)
    ns = str(m.get("namespace") or "default")
    # a Workload slice's pods carry the label of the slice before it (kube/slices.py)
    names = {str(m.get("name") or ""), reservation_pod_label(rr)}
    wl_key = reservation_workload_key(rr)
    spec = mapping(rr, rr.get("spec"), "spec")
    out: list[tuple[str, Claim]] = []
    for i, ps in enumerate(sequence(rr, spec.get("podSets"), "spec.podSets")):
        fld = f"spec.podSets[{i}]"
        ps = mapping(rr, ps, fld)
        ps_name = str(ps.get("name") or "main")
        cpu, mem = _pod_set_requests(rr, ps, fld, (wl_key, ps_name), template_requests)
        share = _pod_set_gpu_share(rr, ps, fld)
        for j, slot in enumerate(sequence(rr, ps.get("slots"), f"{fld}.slots")):
            sfld = f"{fld}.slots[{j}]"
            slot = mapping(rr, slot, sfld)
            index = slot.get("index", j)
            if any((ns, name, f"{ps_name}/{index}") in claimed for name in names):
                continue  # its pod is bound and already counted
            if on_node is not None and slot.get("node") != on_node:
                continue
            claim = _slot_claim(rr, slot, sfld, nodes, (cpu, mem, share))
            if claim is not None:
                out.append((slot_key(ps_name, index), claim))
    return out


def _pod_set_requests(
    rr: Obj,
    ps: Mapping[str, Any],
    fld: str,
    pod_set: tuple[str, str],
    template_requests: Mapping[tuple[str, str], tuple[int, int, int]],
) -> tuple[int, int]:
    """(cpu milli, memory MiB) per slot: as the reservation states them, else from its
    Workload's pod template, else none (with a warning)."""
    ref = object_ref(rr)
    reqs = mapping(rr, ps.get("requests"), f"{fld}.requests")
    try:
        if reqs:
            return parse_cpu_milli(reqs.get("cpu", 0)), parse_memory_mib(reqs.get("memory", 0))
        if pod_set in template_requests:
            cpu, mem, _ = template_requests[pod_set]
            return cpu, mem
    except ValueError as e:
        raise TranslationError(ref, f"{fld}.requests", str(e)) from None
    # Counted, not refused: one stale reservation must not stop every plan.
    # Its slots still hold their GPUs; their CPU and memory are unknown.
    _log.warning(
        "%s, %s: no requests and Workload %s (pod set %r) is missing or "
        "malformed; its slots hold their GPUs but no CPU or memory",
        ref,
        fld,
        pod_set[0],
        pod_set[1],
    )
    return 0, 0


def _pod_set_gpu_share(rr: Obj, ps: Mapping[str, Any], fld: str) -> int:
    ref = object_ref(rr)
    try:
        share = parse_milli(ps.get("gpuShare", 1))
    except ValueError as e:
        raise TranslationError(ref, f"{fld}.gpuShare", str(e)) from None
    if not 0 < share <= GPU_WHOLE:
        raise TranslationError(ref, f"{fld}.gpuShare", "must be above 0 and at most 1")
    return share


def _slot_claim(
    rr: Obj,
    slot: Mapping[str, Any],
    sfld: str,
    nodes: Mapping[str, Node],
    per_slot: tuple[int, int, int],
) -> Claim | None:
    """What one reserved slot holds (`per_slot`: cpu milli, memory MiB, GPU share); None
    when its node is not in the snapshot."""
    ref = object_ref(rr)
    cpu, mem, share = per_slot
    node = slot.get("node")
    if not isinstance(node, str) or node not in nodes:
        # node gone: nothing to hold; say so, a typo here would free capacity
        _log.info("%s, %s.node: node %r is not in the snapshot; slot skipped", ref, sfld, node)
        return None
    gpus = slot.get("gpus", [])
    devices: tuple[int, ...] | None
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        count, devices = gpus, None
    elif isinstance(gpus, list) and all(
        isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus
    ):
        count, devices = len(gpus), tuple(gpus)
    else:
        raise TranslationError(
            ref, f"{sfld}.gpus", "expected a list of GPU device indices or a count"
        )
    if count < 0:
        raise TranslationError(ref, f"{sfld}.gpus", f"negative count {count}")
    zone = _int_or_none(rr, slot.get("numaZone"), f"{sfld}.numaZone")
    if share < GPU_WHOLE:
        return Claim(str(node), cpu, mem, 0, share if count else 0, devices, zone)
    return Claim(str(node), cpu, mem, count, 0, devices, zone)


def claim_fits(node: Node, claim: Claim) -> bool:
    """Is there room on `node` for `claim` now, as kube-scheduler counts it: CPU, memory, a
    pod, and its GPUs (whole free devices, or one device with the share free), whichever
    devices those are."""
    if (node.free_cpu_milli < claim.cpu_milli or node.free_memory_mib < claim.memory_mib
            or node.free_pods < 1):
        return False
    if claim.share_milli:
        return any(free >= claim.share_milli for free in node.gpu_free)
    return sum(1 for free in node.gpu_free if free == GPU_WHOLE) >= claim.whole_gpus


def apply_claim(node: Node, claim: Claim, zone_used: dict[tuple[str, int], int]) -> None:
    node.free_cpu_milli = max(0, node.free_cpu_milli - claim.cpu_milli)
    node.free_memory_mib = max(0, node.free_memory_mib - claim.memory_mib)
    node.free_pods = max(0, node.free_pods - 1)
    devices: list[int] = []
    n = node.gpu_count
    if claim.devices is not None:
        devices = [d for d in claim.devices if 0 <= d < n]
        if claim.share_milli:
            for d in devices[:1]:
                node.gpu_free[d] = max(0, node.gpu_free[d] - claim.share_milli)
        else:
            for d in devices:
                node.gpu_free[d] = 0
    elif claim.share_milli:
        fits = [i for i in range(n) if node.gpu_free[i] >= claim.share_milli]
        if fits:
            d = min(fits, key=lambda i: (node.gpu_free[i], i))
        elif n:
            d = max(range(n), key=lambda i: (node.gpu_free[i], -i))
        else:
            d = -1
        if d >= 0:
            node.gpu_free[d] = max(0, node.gpu_free[d] - claim.share_milli)
            devices = [d]
    elif claim.whole_gpus:
        free = [i for i in range(n) if node.gpu_free[i] == GPU_WHOLE]
        # prefer devices of one NUMA zone, as the device plugin usually does
        if claim.zone is not None:
            in_zone = [i for i in free if node.numa_zone_of_gpu(i) == claim.zone]
            free = in_zone + [i for i in free if i not in in_zone]
        devices = free[: claim.whole_gpus]
        if len(devices) < claim.whole_gpus:  # over-committed: take the least used ones
            rest = sorted(
                (i for i in range(n) if i not in devices), key=lambda i: (-node.gpu_free[i], i)
            )
            devices += rest[: claim.whole_gpus - len(devices)]
        for d in devices:
            node.gpu_free[d] = 0
    if claim.every_zone:
        for z in node.numa_zones:
            zone_used[(node.name, z.id)] = zone_used.get((node.name, z.id), 0) + claim.cpu_milli
        return
    zone = claim.zone
    if zone is None and devices:
        zone = node.numa_zone_of_gpu(devices[0])
    if zone is not None:
        zone_used[(node.name, zone)] = zone_used.get((node.name, zone), 0) + claim.cpu_milli


def slots_by_key(rr: Obj) -> dict[SlotKey, Mapping[str, Any]]:
    """(namespace, reservation, "<podSet>/<index>") → the slot as written, under the label
    its pods carry as well when that is not its name (a Workload slice's)."""
    out: dict[SlotKey, Mapping[str, Any]] = {}
    m = meta(rr)
    ns = str(m.get("namespace") or "default")
    names = {str(m.get("name")), reservation_pod_label(rr)}
    spec = mapping(rr, rr.get("spec"), "spec")
    for i, ps in enumerate(sequence(rr, spec.get("podSets"), "spec.podSets")):
        if not isinstance(ps, Mapping):
            continue
        slots = sequence(rr, ps.get("slots"), f"spec.podSets[{i}].slots")
        for j, slot in enumerate(slots):
            if isinstance(slot, Mapping):
                for name in names:
                    out[(ns, name, slot_key(str(ps.get("name") or "main"),
                                            slot.get("index", j)))] = slot
    return out
