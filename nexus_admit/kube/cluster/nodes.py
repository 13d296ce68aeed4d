"""Node objects (with their NodeResourceTopology and DRA ResourceSlices) → model Nodes whose
free capacity is their allocatable; Kueue Topology objects → level label keys. What pods
and reservations take is subtracted later (`capacity`, `snapshot`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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
from nexus_admit.kube.quantity import (
    parse_count,
    parse_cpu_milli,
    parse_memory_mib,
    parse_quantity,
)
from nexus_admit.model import GPU_WHOLE, Node, NumaZone, Taint

__all__ = [
    "dra_device_indices",
    "label_int",
    "node_from_object",
    "node_not_ready",
    "topologies_from_objects",
]

# bounds on what one Node may claim: the snapshot holds one entry per GPU and per zone
MAX_GPUS_PER_NODE = 1024  # more GPU devices on one node is a typo, not hardware
MAX_NUMA_ZONES = 64
_ZONE_NUM = re.compile(r"(\d+)$")


def label_int(obj: Obj, labels: Mapping[str, Any], key: str) -> int | None:
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


DraDevice = tuple[str, str, str]  # (driver, pool, device name), as a claim's allocation names it


def _sorted_dra_devices(slices: Sequence[Obj]) -> list[tuple[Mapping[str, Any], Obj, DraDevice]]:
    """The whole-GPU devices of the `gpu.nvidia.com` driver in device-index order (their
    `index` attribute, then the slices' order): position i is the node's GPU i."""
    devices: list[tuple[int, int, Mapping[str, Any], Obj, DraDevice]] = []
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
            pool = mapping(sl, spec.get("pool"), "spec.pool").get("name")
            name = (L.DRA_GPU_DRIVER, str(pool or ""), str(dev.get("name") or ""))
            devices.append((key, order, body, sl, name))
            order += 1
    devices.sort(key=lambda d: (d[0], d[1]))
    return [(body, sl, name) for _, _, body, sl, name in devices]


def dra_device_indices(slices: Sequence[Obj]) -> dict[DraDevice, int]:
    """(driver, pool, device) → the node's GPU index it is, for a node's ResourceSlices."""
    return {name: i for i, (_, _, name) in enumerate(_sorted_dra_devices(slices))}


def _dra_gpus(slices: Sequence[Obj]) -> _Dra:
    """GPU devices of the `gpu.nvidia.com` driver (resource.k8s.io v1 flat devices, or
    v1beta1 devices with a `basic` block)."""
    devices = _sorted_dra_devices(slices)
    out = _Dra(count=len(devices))
    mems: list[int] = []
    for body, sl, _ in devices:
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
    m = meta(node)
    name = m.get("name")
    if not name:
        raise TranslationError(object_ref(node), "metadata.name", "a Node needs a name")
    labels = {str(k): str(v) for k, v in mapping(node, m.get("labels"), "metadata.labels").items()}
    spec = mapping(node, node.get("spec"), "spec")
    alloc = _allocatable(node)
    cpu = _allocatable_int(node, alloc, "cpu", parse_cpu_milli, 0)
    memory = _allocatable_int(node, alloc, "memory", parse_memory_mib, 0)
    pods = _allocatable_int(node, alloc, "pods", parse_count, 110)
    gpus = _gpus(node, labels, alloc, resource_slices)
    taints = _taints(node, spec)
    zones, available = _numa_zones(node, labels, nrt, gpus, cpu)
    model = Node(
        name=str(name),
        labels=labels,
        taints=taints,
        cpu_milli=cpu,
        memory_mib=memory,
        max_pods=pods,
        gpu_product=gpus.product if gpus.count else "",
        gpu_memory_mib=gpus.memory_mib if gpus.count else 0,
        gpu_free=[GPU_WHOLE] * gpus.count,
        free_cpu_milli=cpu,
        free_memory_mib=memory,
        free_pods=pods,
        numa_zones=zones,
        clique=labels.get(L.GFD_GPU_CLIQUE) or None,
        schedulable=not spec.get("unschedulable") and node_not_ready(node) is None,
    )
    return model, available


def node_not_ready(node: Obj) -> str | None:
    """Why the node is not Ready (its Ready condition False or Unknown: the kubelet says
    so, or stopped reporting), or None. No nexus placement goes there, whatever the pod
    tolerates: kube-scheduler would bind it, and nothing would run it. A node without a
    Ready condition (not reported yet) counts as Ready, as kube-scheduler counts it.
    Raises TranslationError for a malformed condition list."""
    status = mapping(node, node.get("status"), "status")
    for i, c in enumerate(sequence(node, status.get("conditions"), "status.conditions")):
        c = mapping(node, c, f"status.conditions[{i}]")
        if c.get("type") != "Ready":
            continue
        state = c.get("status")
        if state not in ("True", "False", "Unknown"):
            raise TranslationError(object_ref(node), f"status.conditions[{i}].status",
                                   f"{state!r} is not True, False or Unknown")
        if state == "True":
            return None
        return f"NotReady (Ready {state}{': ' + str(c['reason']) if c.get('reason') else ''})"
    return None


def _allocatable(node: Obj) -> Mapping[str, Any]:
    """`status.allocatable`, or `status.capacity` when allocatable is empty."""
    status = mapping(node, node.get("status"), "status")
    alloc = mapping(node, status.get("allocatable"), "status.allocatable")
    if not alloc:
        alloc = mapping(node, status.get("capacity"), "status.capacity")
    return alloc


def _allocatable_int(
    node: Obj, alloc: Mapping[str, Any], key: str, conv: Callable[[Any], int], default: int
) -> int:
    if key not in alloc:
        return default
    ref = object_ref(node)
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


@dataclass(frozen=True, slots=True)
class _Gpus:
    """A node's GPU devices: how many, which model, VRAM, and each DRA device's NUMA node."""

    count: int
    product: str
    memory_mib: int
    dra_numa: list[int | None]


def _gpus(
    node: Obj, labels: Mapping[str, str], alloc: Mapping[str, Any], slices: Sequence[Obj]
) -> _Gpus:
    """The extended resource (divided by time-slicing replicas) and GFD labels first, the
    DRA ResourceSlices otherwise."""
    replicas = label_int(node, labels, L.GFD_GPU_REPLICAS) or 1
    dra = _dra_gpus(slices)
    if L.GPU_RESOURCE in alloc:
        count = _allocatable_int(node, alloc, L.GPU_RESOURCE, parse_count, 0) // replicas
    else:
        count = dra.count
    if count > MAX_GPUS_PER_NODE:
        raise TranslationError(
            object_ref(node),
            f"status.allocatable[{L.GPU_RESOURCE}]",
            f"{count} GPUs on one node is not plausible (at most {MAX_GPUS_PER_NODE})",
        )
    product = labels.get(L.GFD_GPU_PRODUCT) or dra.product
    memory = label_int(node, labels, L.GFD_GPU_MEMORY)
    if memory is None:
        memory = dra.memory_mib
    return _Gpus(count, product, memory, dra.numa)


def _taints(node: Obj, spec: Mapping[str, Any]) -> tuple[Taint, ...]:
    ref = object_ref(node)
    taints: list[Taint] = []
    for i, t in enumerate(sequence(node, spec.get("taints"), "spec.taints")):
        t = mapping(node, t, f"spec.taints[{i}]")
        if not t.get("key"):
            raise TranslationError(ref, f"spec.taints[{i}].key", "a taint needs a key")
        effect = t.get("effect") or "NoSchedule"
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise TranslationError(ref, f"spec.taints[{i}].effect", f"unknown effect {effect!r}")
        taints.append(Taint(str(t["key"]), str(t.get("value") or ""), effect))
    return tuple(taints)


def _numa_zones(
    node: Obj, labels: Mapping[str, str], nrt: Obj | None, gpus: _Gpus, cpu: int
) -> tuple[list[NumaZone], dict[int, int]]:
    """The node's NUMA zones in order of preference (NRT, DRA `numaNode`, the numa-zones
    label, none), and each zone's NRT `available` CPU."""
    if nrt is not None:
        return _zones_from_nrt(nrt, gpus.count, cpu)
    if (
        gpus.count
        and len(gpus.dra_numa) == gpus.count
        and any(z is not None for z in gpus.dra_numa)
    ):
        return _zones_from_dra(gpus.dra_numa, cpu), {}
    n = label_int(node, labels, L.LABEL_NUMA_ZONES)
    if n and n > MAX_NUMA_ZONES:
        raise TranslationError(
            object_ref(node),
            f"metadata.labels[{L.LABEL_NUMA_ZONES}]",
            f"{n} NUMA zones is not plausible (at most {MAX_NUMA_ZONES})",
        )
    return (_even_zones(n, gpus.count, cpu) if n else []), {}


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
            skip(skipped, t, e, "malformed", "left out (as if it did not exist)")
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
