"""Nodes, pods, ResourceReservations, NodeResourceTopologies and DRA ResourceSlices →
a `ClusterSnapshot` with real free capacity.

Free capacity = allocatable − effective requests of bound, non-terminated pods − slots of live
ResourceReservations of other workloads whose pods are not bound yet. Over-commitment (e.g.
a pod bound before a reservation was noticed) clamps free capacity at zero.

GPUs
  * Devices on a node: allocatable `nvidia.com/gpu` (divided by the GFD label
    `nvidia.com/gpu.replicas` when time-slicing/MPS replicas are advertised); without the
    extended resource, the GPU devices of DRA ResourceSlices of driver `gpu.nvidia.com`.
  * Model / VRAM: GFD labels `nvidia.com/gpu.product`, `nvidia.com/gpu.memory` (MiB);
    otherwise the DRA device attribute `productName` and capacity `memory`.
  * Shared GPUs: a pod that requests `nvidia.com/gpu: 1` with the annotation
    `scheduling.kubenexus.io/gpu-fraction` ("0.25" or "250m") takes that share of one device.
    On a node advertising `nvidia.com/gpu.replicas: R`, a pod without the annotation takes
    units × 1/R of one device. Every other unit is a whole device.
  * Which device: the pod's reservation slot (pod label `scheduling.kubenexus.io/reservation`
    + annotation `scheduling.kubenexus.io/slot: <podSet>/<index>`) names the device indices;
    pods whose devices are unknown take them after all known claims, lowest free whole devices
    first, a share from the fullest device that still has room (the way fit_pod places them).

NUMA zones, in order of preference
  1. NodeResourceTopology (`topology.node.k8s.io/v1alpha2`, named after the node): zones of
     type `Node`, ordered by the number in their name (`node-0`, `node-1`); per zone the
     allocatable `cpu` and the `nvidia.com/gpu` count. GPU devices are given to zones in order
     (zone 0 gets the first k0 devices...); without GPU counts in the zones they are split
     evenly. A zone's free CPU is min(NRT `available`, allocatable − pods/slots known to sit in
     that zone).
  2. DRA: a GPU device attribute `numaNode` (int) gives that device's zone; CPU is split evenly.
     (`resource.kubernetes.io/pcieRoot` is read but is not a NUMA id, so it is not used to
     build zones: partial support.)
  3. Node label `scheduling.kubenexus.io/numa-zones: "<n>"`: n zones, devices and CPU split
     evenly by index order.
  4. None: the node has no NUMA zones (the engine treats every pod as aligned).
A pod sits in the zone of its annotation `scheduling.kubenexus.io/numa-zone`, else of its slot,
else of its first GPU; otherwise its CPU is taken from the node only.

Malformed objects (`skipped` given: the controller's passes)
  One object that cannot be read is left out and listed in `skipped`; everyone else is
  placed. Never freer than the truth: a bound pod whose `gpu-fraction` cannot be read takes
  its `nvidia.com/gpu` units as whole devices, one whose `numa-zone` cannot be read takes its
  CPU from every zone of its node, a reservation whose expiry cannot be read is live; a pod
  or a reservation whose use of capacity cannot be read at all takes its node(s) out of
  placement. A malformed Node (or its NodeResourceTopology or ResourceSlice) is left out.
  Without `skipped` (`nexus-admit plan`) the first one raises `TranslationError`.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import (
    Obj,
    Skipped,
    TranslationError,
    mapping,
    meta,
    object_ref,
    sequence,
)
from nexus_admit.kube.quantity import (
    parse_count,
    parse_cpu_milli,
    parse_memory_mib,
    parse_milli,
    parse_quantity,
    parse_time,
)
from nexus_admit.kube.requests import PodRequests, pod_requests
from nexus_admit.kube.reservations import (
    reservation_is_live,
    reservation_slots,
    reservation_workload_key,
    slot_key,
)
from nexus_admit.kube.versioned import VersionedCache
from nexus_admit.model import GPU_WHOLE, ClusterSnapshot, Node, NumaZone, Taint

_log = logging.getLogger(__name__)
_MAX_NODE_GPUS = 1024  # more GPU devices on one node is a typo, not hardware
_MAX_NUMA_ZONES = 64

__all__ = [
    "build_snapshot",
    "gpu_fraction_milli",
    "node_from_object",
    "parse_time",
    "pod_is_active",
    "topologies_from_objects",
]

# bounds on what one Node may claim: the snapshot holds one entry per GPU and per zone
MAX_GPUS_PER_NODE = 1024
MAX_NUMA_ZONES = 64
_TERMINAL_PHASES = ("Succeeded", "Failed")  # a tuple: `in` must not hash a malformed phase
_ZONE_NUM = re.compile(r"(\d+)$")


# ---------------------------------------------------------------- small parsers


def _label_int(obj: Obj, labels: Mapping[str, Any], key: str) -> int | None:
    value = labels.get(key)
    if value is None or value == "":
        return None
    try:
        n = int(str(value))
    except ValueError:
        raise TranslationError(
            object_ref(obj),
            f"metadata.labels[{key}]",
            f"{value!r} is not a whole number",
        ) from None
    if n < 0:
        raise TranslationError(object_ref(obj), f"metadata.labels[{key}]", f"negative {n}")
    return n


def gpu_fraction_milli(obj: Obj, annotations: Mapping[str, Any], field: str) -> int | None:
    """The `gpu-fraction` annotation as milli-GPUs in (0, 1000], or None when absent."""
    value = annotations.get(L.ANN_GPU_FRACTION)
    if value is None or value == "":
        return None
    where = f"{field}[{L.ANN_GPU_FRACTION}]"
    try:
        milli = parse_milli(value)
    except ValueError:
        raise TranslationError(
            object_ref(obj),
            where,
            f"{value!r} is not a GPU share; write a number above 0 and at most 1, "
            f'e.g. "0.5" or "250m"',
        ) from None
    if not 0 < milli <= GPU_WHOLE:
        raise TranslationError(
            object_ref(obj),
            where,
            f"{value!r} is not a share of one GPU; it must be above 0 and at most 1 "
            f'(e.g. "0.5"); to use several whole GPUs request {L.GPU_RESOURCE} instead',
        )
    return milli


# ---------------------------------------------------------------- nodes


@dataclass(slots=True)
class _Dra:
    count: int = 0
    product: str = ""
    memory_mib: int = 0
    numa: list[int | None] = field(default_factory=list)


def _dra_attr(device: Mapping[str, Any], driver: str, name: str) -> Any:
    attrs = device.get("attributes")
    if not isinstance(attrs, Mapping):
        return None  # read as no attribute: a device without it is skipped or defaulted
    raw = attrs.get(name, attrs.get(f"{driver}/{name}"))
    if isinstance(raw, Mapping):
        for kind in ("string", "int", "bool", "version"):
            if kind in raw:
                return raw[kind]
        return None
    return raw


def _dra_gpus(slices: Sequence[Obj]) -> _Dra:
    """GPU devices of the `gpu.nvidia.com` driver (resource.k8s.io v1 flat devices, or
    v1beta1 devices with a `basic` block)."""
    devices: list[tuple[int, int, Mapping[str, Any], Obj]] = []
    order = 0
    for sl in slices:
        spec = mapping(sl, sl.get("spec"), "spec")
        if spec.get("driver") != L.DRA_GPU_DRIVER:
            continue
        for i, dev in enumerate(sequence(sl, spec.get("devices"), "spec.devices")):
            dev = mapping(sl, dev, f"spec.devices[{i}]")
            body = dev.get("basic", dev)
            if not isinstance(body, Mapping):
                continue
            dtype = _dra_attr(body, L.DRA_GPU_DRIVER, L.DRA_ATTR_TYPE)
            if dtype not in (None, "gpu"):
                continue  # MIG slices and other device types are not whole GPUs
            idx = _dra_attr(body, L.DRA_GPU_DRIVER, L.DRA_ATTR_INDEX)
            key = int(idx) if isinstance(idx, int) and not isinstance(idx, bool) else 10**6
            devices.append((key, order, body, sl))
            order += 1
    devices.sort(key=lambda d: (d[0], d[1]))
    out = _Dra(count=len(devices))
    mems: list[int] = []
    for _, _, body, sl in devices:
        product = _dra_attr(body, L.DRA_GPU_DRIVER, L.DRA_ATTR_PRODUCT)
        if product and not out.product:
            out.product = str(product).replace(" ", "-")
        capacity = body.get("capacity")
        cap = capacity.get(L.DRA_CAP_MEMORY) if isinstance(capacity, Mapping) else None
        if isinstance(cap, Mapping):
            cap = cap.get("value")
        if cap is not None:
            try:
                mems.append(parse_memory_mib(cap))
            except ValueError as e:
                raise TranslationError(
                    object_ref(sl), "spec.devices[*].capacity.memory", str(e)
                ) from None
        numa = _dra_attr(body, L.DRA_GPU_DRIVER, L.DRA_ATTR_NUMA_NODE)
        out.numa.append(int(numa) if isinstance(numa, int) and not isinstance(numa, bool) else None)
    out.memory_mib = min(mems) if mems else 0
    return out


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _zones_from_nrt(
    nrt: Obj, gpu_count: int, node_cpu: int
) -> tuple[list[NumaZone], dict[int, int]]:
    """NUMA zones of an NRT, and each zone's NRT `available` CPU (millicores)."""
    raw = [
        mapping(nrt, z, f"zones[{i}]")
        for i, z in enumerate(sequence(nrt, nrt.get("zones"), "zones"))
    ]
    zones = [z for z in raw if z.get("type", L.NRT_ZONE_TYPE_NODE) == L.NRT_ZONE_TYPE_NODE]
    parsed: list[tuple[int, int, int | None, int]] = []  # id, cpu, available, gpus
    for pos, z in enumerate(zones):
        m = _ZONE_NUM.search(str(z.get("name", "")))
        zid = int(m.group(1)) if m else pos
        cpu = 0
        avail: int | None = None
        gpus = 0
        for j, r in enumerate(sequence(nrt, z.get("resources"), f"zones[{pos}].resources")):
            r = mapping(nrt, r, f"zones[{pos}].resources[{j}]")
            name = r.get("name")
            fld = f"zones[{pos}].resources[{j}]"
            try:
                if name == "cpu":
                    cpu = parse_cpu_milli(r.get("allocatable", r.get("capacity", 0)))
                    if r.get("available") is not None:
                        avail = parse_cpu_milli(r["available"])
                elif name == L.GPU_RESOURCE:
                    gpus = parse_count(r.get("allocatable", r.get("capacity", 0)))
            except ValueError as e:
                raise TranslationError(object_ref(nrt), fld, str(e)) from None
        parsed.append((zid, cpu, avail, gpus))
    parsed.sort()
    if not parsed:
        return [], {}
    counts = [p[3] for p in parsed]
    if sum(counts) == 0:
        counts = _split(gpu_count, len(parsed))
    if all(p[1] == 0 for p in parsed):
        cpus = _split(node_cpu, len(parsed))
        parsed = [(p[0], c, p[2], p[3]) for p, c in zip(parsed, cpus, strict=True)]
    out: list[NumaZone] = []
    available: dict[int, int] = {}
    nxt = 0
    for (zid, cpu, avail, _), k in zip(parsed, counts, strict=True):
        idx = tuple(i for i in range(nxt, min(nxt + k, gpu_count)))
        nxt += k
        out.append(NumaZone(zid, idx, cpu, cpu))
        if avail is not None:
            available[zid] = avail
    return out, available


def _even_zones(n: int, gpu_count: int, cpu: int) -> list[NumaZone]:
    gpus = _split(gpu_count, n)
    cpus = _split(cpu, n)
    out = []
    nxt = 0
    for zid in range(n):
        out.append(NumaZone(zid, tuple(range(nxt, nxt + gpus[zid])), cpus[zid], cpus[zid]))
        nxt += gpus[zid]
    return out


def _zones_from_dra(numa: list[int | None], cpu: int) -> list[NumaZone]:
    ids = sorted({z for z in numa if z is not None})
    cpus = _split(cpu, len(ids))
    return [
        NumaZone(zid, tuple(i for i, z in enumerate(numa) if z == zid), c, c)
        for zid, c in zip(ids, cpus, strict=True)
    ]


def node_from_object(
    node: Obj,
    *,
    nrt: Obj | None = None,
    resource_slices: Sequence[Obj] = (),
) -> tuple[Node, dict[int, int]]:
    """A Node object → model Node with free capacity = allocatable (nothing subtracted yet),
    plus each NUMA zone's NRT `available` CPU (empty without an NRT)."""
    ref = object_ref(node)
    m = meta(node)
    name = m.get("name")
    if not name:
        raise TranslationError(ref, "metadata.name", "a Node needs a name")
    labels = {str(k): str(v) for k, v in mapping(node, m.get("labels"), "metadata.labels").items()}
    spec = mapping(node, node.get("spec"), "spec")
    status = mapping(node, node.get("status"), "status")
    alloc = mapping(node, status.get("allocatable"), "status.allocatable")
    if not alloc:
        alloc = mapping(node, status.get("capacity"), "status.capacity")

    def res(key: str, conv: Any, default: int) -> int:
        if key not in alloc:
            return default
        try:
            negative = parse_quantity(alloc[key]) < 0  # -3 bytes would round up to 0 MiB
            v = int(conv(alloc[key]))
        except ValueError as e:
            raise TranslationError(ref, f"status.allocatable[{key}]", str(e)) from None
        if negative or v < 0:
            raise TranslationError(
                ref, f"status.allocatable[{key}]", f"negative quantity {alloc[key]!r}"
            )
        return v

    cpu = res("cpu", parse_cpu_milli, 0)
    memory = res("memory", parse_memory_mib, 0)
    pods = res("pods", parse_count, 110)

    replicas = _label_int(node, labels, L.GFD_GPU_REPLICAS) or 1
    dra = _dra_gpus(resource_slices)
    if L.GPU_RESOURCE in alloc:
        gpu_count = res(L.GPU_RESOURCE, parse_count, 0) // replicas
    else:
        gpu_count = dra.count
        replicas = 1
    if gpu_count > _MAX_NODE_GPUS:
        raise TranslationError(
            ref,
            f"status.allocatable[{L.GPU_RESOURCE}]",
            f"{gpu_count} GPUs on one node is not plausible (at most {_MAX_NODE_GPUS})",
        )
    product = labels.get(L.GFD_GPU_PRODUCT) or dra.product
    gpu_mem = _label_int(node, labels, L.GFD_GPU_MEMORY)
    if gpu_mem is None:
        gpu_mem = dra.memory_mib

    taints: list[Taint] = []
    for i, t in enumerate(sequence(node, spec.get("taints"), "spec.taints")):
        t = mapping(node, t, f"spec.taints[{i}]")
        if not t.get("key"):
            raise TranslationError(ref, f"spec.taints[{i}].key", "a taint needs a key")
        effect = t.get("effect") or "NoSchedule"
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise TranslationError(ref, f"spec.taints[{i}].effect", f"unknown effect {effect!r}")
        taints.append(Taint(str(t["key"]), str(t.get("value") or ""), effect))

    available: dict[int, int] = {}
    zones: list[NumaZone] = []
    if nrt is not None:
        zones, available = _zones_from_nrt(nrt, gpu_count if gpu_count else 0, cpu)
    elif gpu_count and len(dra.numa) == gpu_count and any(z is not None for z in dra.numa):
        zones = _zones_from_dra(dra.numa, cpu)
    else:
        n = _label_int(node, labels, L.LABEL_NUMA_ZONES)
        if n and n > _MAX_NUMA_ZONES:
            raise TranslationError(
                ref,
                f"metadata.labels[{L.LABEL_NUMA_ZONES}]",
                f"{n} NUMA zones is not plausible (at most {_MAX_NUMA_ZONES})",
            )
        if n:
            zones = _even_zones(n, gpu_count, cpu)

    model = Node(
        name=str(name),
        labels=labels,
        taints=tuple(taints),
        cpu_milli=cpu,
        memory_mib=memory,
        max_pods=pods,
        gpu_product=product if gpu_count else "",
        gpu_memory_mib=gpu_mem if gpu_count else 0,
        gpu_free=[GPU_WHOLE] * gpu_count,
        free_cpu_milli=cpu,
        free_memory_mib=memory,
        free_pods=pods,
        numa_zones=zones,
        clique=labels.get(L.GFD_GPU_CLIQUE) or None,
        schedulable=not bool(spec.get("unschedulable")),
    )
    return model, available


# ---------------------------------------------------------------- claims on capacity


@dataclass(slots=True)
class _Claim:
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


def _slot_ref(pod: Obj) -> tuple[str, str, str] | None:
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


def _gpu_share(units: int, fraction: int | None, replicas: int) -> tuple[int, int]:
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
    version = _version(pod)
    if version is None:
        return pod_requests(pod, pod.get("spec"))
    uid, rv = version
    return _POD_REQUESTS.get(uid, rv, lambda: pod_requests(pod, pod.get("spec")))


def _pod_claim(
    pod: Obj,
    node: Node,
    replicas: int,
    rr_slots: Mapping[tuple[str, str, str], Mapping[str, Any]],
    skipped: list[Skipped] | None = None,
) -> _Claim:
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
        _skip(skipped, pod, e, "counted-whole", f"counted as {req.gpus} whole GPU(s)")
    whole, share = _gpu_share(req.gpus, fraction, replicas)
    devices: tuple[int, ...] | None = None
    try:
        zone = _int_or_none(
            pod, annotations.get(L.ANN_NUMA_ZONE), f"metadata.annotations[{L.ANN_NUMA_ZONE}]"
        )
    except TranslationError as e:
        if skipped is None:
            raise
        zone, every_zone = None, True
        _skip(skipped, pod, e, "counted-every-zone", "its CPU counted in every NUMA zone")
    ref = _slot_ref(pod)
    if ref is not None and ref in rr_slots:
        slot = rr_slots[ref]
        gpus = slot.get("gpus")
        if isinstance(gpus, list) and all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus
        ):
            devices = tuple(gpus)
        if zone is None and not every_zone and isinstance(slot.get("numaZone"), int):
            zone = slot["numaZone"]
    return _Claim(
        node.name, req.cpu_milli, req.memory_mib, whole, share, devices, zone, every_zone
    )


def _skip(
    skipped: list[Skipped], obj: Obj, error: Exception, reason: str, outcome: str, owner: str = ""
) -> None:
    """List `obj` as skipped: what is wrong (the field when known) and what the pass did."""
    if isinstance(error, TranslationError):
        field, message = error.field, error.message
    else:  # a shape no parser expected: named by its type, never a crash of the pass
        field, message = "", f"cannot be read ({type(error).__name__}: {error})"[:300]
    kind = str(obj.get("kind") or "object")
    skipped.append(Skipped.of(obj, kind, field, reason, f"{message}; {outcome}", owner))


def _culprit(error: Exception, candidates: Iterable[Obj | None]) -> Obj:
    """Which of a node's objects (Node, NRT, ResourceSlices) the error names; the Node when
    it names none of them."""
    objs = [o for o in candidates if o is not None]
    if isinstance(error, TranslationError):
        for o in objs:
            if object_ref(o) == error.obj_ref:
                return o
    return objs[0]


def _reservation_claims(
    rr: Obj,
    nodes: Mapping[str, Node],
    claimed: set[tuple[str, str, str]],
    template_requests: Mapping[tuple[str, str], tuple[int, int, int]],
) -> list[_Claim]:
    ref = object_ref(rr)
    m = meta(rr)
    ns = str(m.get("namespace") or "default")
    rr_name = str(m.get("name") or "")
    wl_key = reservation_workload_key(rr)
    spec = mapping(rr, rr.get("spec"), "spec")
    out: list[_Claim] = []
    for i, ps in enumerate(sequence(rr, spec.get("podSets"), "spec.podSets")):
        fld = f"spec.podSets[{i}]"
        ps = mapping(rr, ps, fld)
        ps_name = str(ps.get("name") or "main")
        reqs = mapping(rr, ps.get("requests"), f"{fld}.requests")
        try:
            if reqs:
                cpu = parse_cpu_milli(reqs.get("cpu", 0))
                mem = parse_memory_mib(reqs.get("memory", 0))
            elif (wl_key, ps_name) in template_requests:
                cpu, mem, _ = template_requests[(wl_key, ps_name)]
            else:
                # Counted, not refused: one stale reservation must not stop every plan.
                # Its slots still hold their GPUs; their CPU and memory are unknown.
                _log.warning(
                    "%s, %s: no requests and Workload %s (pod set %r) is missing or "
                    "malformed; its slots hold their GPUs but no CPU or memory",
                    ref,
                    fld,
                    wl_key,
                    ps_name,
                )
                cpu, mem = 0, 0
        except ValueError as e:
            raise TranslationError(ref, f"{fld}.requests", str(e)) from None
        try:
            share = parse_milli(ps.get("gpuShare", 1))
        except ValueError as e:
            raise TranslationError(ref, f"{fld}.gpuShare", str(e)) from None
        if not 0 < share <= GPU_WHOLE:
            raise TranslationError(ref, f"{fld}.gpuShare", "must be above 0 and at most 1")
        for j, slot in enumerate(sequence(rr, ps.get("slots"), f"{fld}.slots")):
            sfld = f"{fld}.slots[{j}]"
            slot = mapping(rr, slot, sfld)
            index = slot.get("index", j)
            if (ns, rr_name, f"{ps_name}/{index}") in claimed:
                continue  # its pod is bound and already counted
            node = slot.get("node")
            if not isinstance(node, str) or node not in nodes:
                # node gone: nothing to hold; say so, a typo here would free capacity
                _log.info(
                    "%s, %s.node: node %r is not in the snapshot; slot skipped", ref, sfld, node
                )
                continue
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
                out.append(_Claim(str(node), cpu, mem, 0, share if count else 0, devices, zone))
            else:
                out.append(_Claim(str(node), cpu, mem, count, 0, devices, zone))
    return out


def _apply(node: Node, claim: _Claim, zone_used: dict[tuple[str, int], int]) -> None:
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


def topologies_from_objects(
    topologies: Iterable[Obj], skipped: list[Skipped] | None = None
) -> dict[str, tuple[str, ...]]:
    """Kueue Topology objects → {name: level label keys, highest first}. With `skipped`,
    a malformed Topology is left out and listed there."""
    out: dict[str, tuple[str, ...]] = {}
    for t in topologies:
        try:
            name, levels = _topology(t)
        except Exception as e:
            if skipped is None:
                raise
            _skip(skipped, t, e, "malformed", "left out (as if it did not exist)")
            continue
        out[name] = levels
    return out


def _topology(t: Obj) -> tuple[str, tuple[str, ...]]:
    name = meta(t).get("name")
    if not name:
        raise TranslationError(object_ref(t), "metadata.name", "a Topology needs a name")
    spec = mapping(t, t.get("spec"), "spec")
    levels = []
    for i, lv in enumerate(sequence(t, spec.get("levels"), "spec.levels")):
        lv = mapping(t, lv, f"spec.levels[{i}]")
        label = lv.get("nodeLabel")
        if not label:
            raise TranslationError(
                object_ref(t), f"spec.levels[{i}].nodeLabel", "each level needs a nodeLabel"
            )
        levels.append(str(label))
    if not levels:
        raise TranslationError(object_ref(t), "spec.levels", "a Topology needs levels")
    return str(name), tuple(levels)


# A fleet's Nodes, NRTs and ResourceSlices rarely change between two passes: one
# translation per node, reused while the versions (uid and resourceVersion) of its objects
# stay the same, copied out since the snapshot mutates its nodes. Objects without a
# version (a dump file, a test) are translated every time.
_NODES: VersionedCache[tuple[Node, dict[int, int]]] = VersionedCache()


def _version(obj: Obj | None) -> tuple[str, str] | None:
    m = obj.get("metadata") if obj is not None else None
    if not isinstance(m, Mapping) or not m.get("uid") or not m.get("resourceVersion"):
        return None
    return (str(m["uid"]), str(m["resourceVersion"]))


def _translated_node(
    obj: Obj, nrt: Obj | None, resource_slices: Sequence[Obj]
) -> tuple[Node, dict[int, int]]:
    versions = [_version(o) for o in (obj, *resource_slices)]
    nrt_version = _version(nrt) if nrt is not None else ("", "")
    name = str(meta(obj).get("name") or "")
    if not name or any(v is None for v in versions) or nrt_version is None:
        return node_from_object(obj, nrt=nrt, resource_slices=resource_slices)
    key = tuple(v for v in (*versions, nrt_version) if v is not None)
    node, avail = _NODES.get(
        name, key, lambda: node_from_object(obj, nrt=nrt, resource_slices=resource_slices)
    )
    return node.copy(), dict(avail)


def build_snapshot(
    nodes: Iterable[Obj],
    pods: Iterable[Obj] = (),
    reservations: Iterable[Obj] = (),
    *,
    node_resource_topologies: Iterable[Obj] = (),
    resource_slices: Iterable[Obj] = (),
    topologies: Iterable[Obj] = (),
    exclude_workloads: Iterable[str] = (),
    template_requests: Mapping[tuple[str, str], tuple[int, int, int]] | None = None,
    now: datetime | None = None,
    skipped: list[Skipped] | None = None,
) -> ClusterSnapshot:
    """Every object kind that shapes capacity → a ClusterSnapshot with real free capacity.

    `exclude_workloads` ("ns/name") are the workloads being (re)placed: their own
    reservations do not count against them. `template_requests[(workload, podSet)]` gives
    (cpu milli, memory MiB, GPUs) per pod for reservations that do not state `requests`.
    `skipped`: malformed objects are left out and listed there (never freer than the truth,
    see the module's doc) instead of raising `TranslationError`.
    """
    now = now or datetime.now(UTC)
    nrt_by_node = {str(meta(o).get("name")): o for o in node_resource_topologies}
    slices_by_node: dict[str, list[Obj]] = {}
    for sl in resource_slices:
        try:
            node_name = mapping(sl, sl.get("spec"), "spec").get("nodeName")
        except TranslationError as e:
            if skipped is None:
                raise
            _skip(skipped, sl, e, "malformed", "left out")
            continue
        if node_name:
            slices_by_node.setdefault(str(node_name), []).append(sl)
    model_nodes: dict[str, Node] = {}
    available: dict[tuple[str, int], int] = {}
    replicas: dict[str, int] = {}
    for obj in nodes:
        name = str(meta(obj).get("name") or "")
        nrt, slices = nrt_by_node.get(name), slices_by_node.get(name, ())
        try:
            node, avail = _translated_node(obj, nrt, slices)
            if node.name in model_nodes:
                raise TranslationError(object_ref(obj), "metadata.name", "duplicate Node name")
            node_replicas = _label_int(obj, node.labels, L.GFD_GPU_REPLICAS) or 1
        except Exception as e:
            if skipped is None:
                raise
            culprit = _culprit(e, (obj, nrt, *slices))
            _skip(skipped, culprit, e, "malformed", f"Node {name} is left out of placement")
            continue
        model_nodes[node.name] = node
        replicas[node.name] = node_replicas
        for zid, a in avail.items():
            available[(node.name, zid)] = a

    reservations, pods = list(reservations), list(pods)
    rr_slots: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for rr in reservations:
        try:
            rr_slots.update(_slots_by_key(rr))
        except Exception:
            if skipped is None:
                raise
            # its pods' devices are unknown (they take the lowest free ones); the
            # reservation itself is listed when its claims are read below
            continue

    # nodes a bound pod or a live reservation takes an unknowable part of: out of placement
    unusable: set[str] = set()
    claims: list[_Claim] = []
    claimed: set[tuple[str, str, str]] = set()
    for pod in pods:
        try:
            if not pod_is_active(pod):
                continue
            target = model_nodes.get(str(mapping(pod, pod.get("spec"), "spec").get("nodeName")))
            if target is None:
                continue
        except Exception as e:
            if skipped is None:
                raise
            _skip(skipped, pod, e, "malformed", "left out: not known to be bound to a node")
            continue
        try:
            claims.append(_pod_claim(pod, target, replicas[target.name], rr_slots, skipped))
            ref = _slot_ref(pod)
        except Exception as e:
            if skipped is None:
                raise
            unusable.add(target.name)
            _skip(
                skipped,
                pod,
                e,
                "node-left-out",
                f"what it takes of node {target.name} is unknown, so that node is left out "
                "of placement",
            )
            continue
        if ref is not None:
            claimed.add(ref)

    # reservations with a bound pod: past their TTL they still hold (reservation_is_live)
    bound_reservations: set[tuple[str, str]] = set()
    for pod in pods:
        try:
            if pod_is_active(pod):
                m = meta(pod)
                rr_label = mapping(pod, m.get("labels"), "metadata.labels").get(
                    L.LABEL_RESERVATION
                )
                if rr_label:
                    bound_reservations.add((str(m.get("namespace") or "default"), str(rr_label)))
        except Exception:  # listed above
            continue

    excluded = set(exclude_workloads)
    for rr in reservations:
        owner = f"Workload {reservation_workload_key(rr)}"
        if reservation_workload_key(rr) in excluded:
            continue
        try:
            rr_ref = (str(meta(rr).get("namespace") or "default"), str(meta(rr).get("name")))
            live = reservation_is_live(rr, now, bound=rr_ref in bound_reservations)
        except Exception as e:
            if skipped is None:
                raise
            live = True  # an unreadable expiry holds: never freer than the truth
            _skip(skipped, rr, e, "counted-live", "counted as live", owner)
        if not live:
            continue
        try:
            claims.extend(_reservation_claims(rr, model_nodes, claimed, template_requests or {}))
        except Exception as e:
            if skipped is None:
                raise
            try:
                named = {s.node for s in reservation_slots(rr)} & model_nodes.keys()
            except Exception:
                named = set()
            unusable |= named
            _skip(
                skipped,
                rr,
                e,
                "node-left-out",
                "what it holds is unknown, so the nodes it names are left out of placement"
                + (f" ({', '.join(sorted(named))})" if named else ""),
                owner,
            )

    zone_used: dict[tuple[str, int], int] = {}
    # claims with known devices first, so the others cannot take their devices
    for claim in sorted(claims, key=lambda c: c.devices is None):
        if claim.node not in unusable:
            _apply(model_nodes[claim.node], claim, zone_used)
    for name in unusable:
        del model_nodes[name]
    for node in model_nodes.values():
        for z in node.numa_zones:
            free = z.cpu_milli - zone_used.get((node.name, z.id), 0)
            if (node.name, z.id) in available:
                free = min(free, available[(node.name, z.id)])
            z.free_cpu_milli = max(0, min(free, node.free_cpu_milli))

    return ClusterSnapshot(model_nodes, topologies_from_objects(topologies, skipped))


def _slots_by_key(rr: Obj) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    """(namespace, reservation, "<podSet>/<index>") → the slot as written."""
    out: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    m = meta(rr)
    ns = str(m.get("namespace") or "default")
    spec = mapping(rr, rr.get("spec"), "spec")
    for i, ps in enumerate(sequence(rr, spec.get("podSets"), "spec.podSets")):
        if not isinstance(ps, Mapping):
            continue
        slots = sequence(rr, ps.get("slots"), f"spec.podSets[{i}].slots")
        for j, slot in enumerate(slots):
            if isinstance(slot, Mapping):
                key = (
                    ns,
                    str(m.get("name")),
                    slot_key(str(ps.get("name") or "main"), slot.get("index", j)),
                )
                out[key] = slot
    return out
