"""Effective resource requests of a pod spec, the way kube-scheduler computes them.

effective = max(sum of app containers + restartable (sidecar) init containers,
                max over classic init containers of (its request + sidecars started before it))
            + pod overhead

A container without a request for a resource but with a limit requests the limit (the API
server defaults it that way for pods; Kueue does the same for Workload pod templates).

Pod-level `spec.resources` (PodLevelResources, on since 1.34) replace the containers' figure
for the resources they name (CPU, memory, hugepages): a pod-level request, else a pod-level
limit where no container requests that resource (the apiserver defaults the pod's request to
it then). Kueue's Workload template carries the pod-level figures as the Job states them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import Obj, TranslationError, mapping, object_ref, sequence
from nexus_admit.kube.quantity import parse_milli, parse_quantity
from nexus_admit.model import GPU_WHOLE

__all__ = [
    "PodRequests",
    "effective_requests",
    "gpu_fraction_milli",
    "pod_level_requests",
    "pod_requests",
]

Resources = dict[str, Fraction]


@dataclass(frozen=True, slots=True)
class PodRequests:
    """A pod's effective requests in model units. `gpus` counts `nvidia.com/gpu` units."""

    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    raw: Mapping[str, Fraction] | None = None  # every resource, base units


def _add(a: Resources, b: Mapping[str, Fraction]) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, Fraction(0)) + v
    return out


def _max(a: Resources, b: Mapping[str, Fraction]) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = max(out.get(k, Fraction(0)), v)
    return out


def _resource_list(obj: Obj, value: Any, field: str) -> Resources:
    out: Resources = {}
    for name, qty in mapping(obj, value, field).items():
        try:
            q = parse_quantity(qty)
        except ValueError as e:
            raise TranslationError(object_ref(obj), f"{field}[{name}]", str(e)) from None
        if q < 0:
            raise TranslationError(
                object_ref(obj), f"{field}[{name}]", f"negative quantity {qty!r}"
            )
        out[str(name)] = q
    return out


def _container(obj: Obj, c: Any, field: str) -> Resources:
    c = mapping(obj, c, field)
    res = mapping(obj, c.get("resources"), f"{field}.resources")
    requests = _resource_list(obj, res.get("requests"), f"{field}.resources.requests")
    limits = _resource_list(obj, res.get("limits"), f"{field}.resources.limits")
    for name, q in limits.items():
        requests.setdefault(name, q)
    return requests


def _pod_level_resource(name: str) -> bool:
    """Whether pod-level `spec.resources` may name this resource (kube-scheduler overrides
    the containers' sum only for these)."""
    return name in ("cpu", "memory") or name.startswith("hugepages-")


def pod_level_requests(obj: Obj, spec: Any, field: str = "spec") -> Resources:
    """The pod-level requests the apiserver admits the pod with (empty without pod-level
    resources): those stated, and a pod-level limit's value for a resource that neither
    the pod nor any of its containers requests."""
    spec = mapping(obj, spec, field)
    return _pod_level(obj, spec, field, None)


def _pod_level(
    obj: Obj, spec: Mapping[str, Any], field: str, by_containers: Resources | None
) -> Resources:
    res = mapping(obj, spec.get("resources"), f"{field}.resources")
    requests = {
        k: v
        for k, v in _resource_list(obj, res.get("requests"), f"{field}.resources.requests").items()
        if _pod_level_resource(k)
    }
    limits = _resource_list(obj, res.get("limits"), f"{field}.resources.limits")
    unstated = [k for k in limits if _pod_level_resource(k) and k not in requests]
    if unstated:
        if by_containers is None:
            by_containers = _containers_requests(obj, spec, field)
        for k in unstated:
            if k not in by_containers:
                requests[k] = limits[k]
    return requests


def effective_requests(obj: Obj, spec: Any, field: str = "spec") -> Resources:
    """Effective requests of the pod spec `spec` (inside `obj`, at path `field`), every
    resource in base units (cores, bytes, devices)."""
    spec = mapping(obj, spec, field)
    total = _containers_requests(obj, spec, field)
    total.update(_pod_level(obj, spec, field, total))
    return _add(total, _resource_list(obj, spec.get("overhead"), f"{field}.overhead"))


def _containers_requests(obj: Obj, spec: Mapping[str, Any], field: str) -> Resources:
    """What the containers request together, as kube-scheduler sums them."""
    main: Resources = {}
    for i, c in enumerate(sequence(obj, spec.get("containers"), f"{field}.containers")):
        main = _add(main, _container(obj, c, f"{field}.containers[{i}]"))
    sidecars: Resources = {}
    init_peak: Resources = {}
    for i, c in enumerate(sequence(obj, spec.get("initContainers"), f"{field}.initContainers")):
        r = _container(obj, c, f"{field}.initContainers[{i}]")
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always":
            sidecars = _add(sidecars, r)
        else:
            init_peak = _max(init_peak, _add(sidecars, r))
    return _max(_add(main, sidecars), init_peak)


def _resources_key(spec: Any) -> tuple[object, ...] | None:
    """Everything `effective_requests` reads of a pod spec, as a hashable key; None when a
    part of it is not plain JSON of the expected shape (then it is translated, and its
    error reported, the long way)."""
    if type(spec) is not dict:
        return None
    parts: list[object] = []
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        if containers is None:
            parts.append(None)
            continue
        if type(containers) is not list:
            return None
        for c in containers:
            if type(c) is not dict:
                return None
            res = c.get("resources")
            if res is None:
                parts.append((None, None, c.get("restartPolicy")))
                continue
            if type(res) is not dict:
                return None
            req, lim = res.get("requests"), res.get("limits")
            if (req is not None and type(req) is not dict) or (
                lim is not None and type(lim) is not dict
            ):
                return None
            parts.append((_quantities(req), _quantities(lim), c.get("restartPolicy")))
        parts.append(field)  # where the containers end and the init containers start
    overhead = spec.get("overhead")
    if overhead is not None and type(overhead) is not dict:
        return None
    parts.append(_quantities(overhead))
    pod_level = spec.get("resources")
    if pod_level is not None:
        if type(pod_level) is not dict:
            return None
        req, lim = pod_level.get("requests"), pod_level.get("limits")
        if (req is not None and type(req) is not dict) or (
            lim is not None and type(lim) is not dict
        ):
            return None
        parts.append(("pod", _quantities(req), _quantities(lim)))
    return tuple(parts)


def _quantities(resources: dict[str, Any] | None) -> tuple[tuple[str, str], ...] | None:
    """A resource list as a key; strings only, as the apiserver writes quantities (a
    number or a boolean would hash equal to another: `true` to 1)."""
    if not resources:
        return None
    items = tuple(resources.items())
    for name, qty in items:
        if type(qty) is not str or type(name) is not str:
            raise TypeError("not a plain quantity")
    return items


# pods of one cluster repeat a few shapes of requests: each shape is translated once
_BY_RESOURCES: dict[tuple[object, ...], PodRequests] = {}
_BY_RESOURCES_MAX = 4096


def pod_requests(obj: Obj, spec: Any, field: str = "spec") -> PodRequests:
    """Effective requests in model units: CPU millicores and memory MiB rounded up, GPUs as
    a whole number of `nvidia.com/gpu` units (a fractional GPU request is an error: use the
    `scheduling.kubenexus.io/gpu-fraction` annotation instead)."""
    try:
        key = _resources_key(spec)
        known = _BY_RESOURCES.get(key) if key is not None else None
    except TypeError:  # not strings throughout: the long way
        key = known = None
    if known is not None:
        return known
    found = _pod_requests(obj, spec, field)
    if key is not None:
        if len(_BY_RESOURCES) >= _BY_RESOURCES_MAX:
            _BY_RESOURCES.clear()
        _BY_RESOURCES[key] = found
    return found


def _pod_requests(obj: Obj, spec: Any, field: str) -> PodRequests:
    raw = effective_requests(obj, spec, field)
    gpu = raw.get(L.GPU_RESOURCE, Fraction(0))
    if gpu.denominator != 1:
        raise TranslationError(
            object_ref(obj),
            f"{field}.containers[*].resources[{L.GPU_RESOURCE}]",
            f"requests {float(gpu):g} GPUs; {L.GPU_RESOURCE} counts whole devices. To share a "
            f"GPU request {L.GPU_RESOURCE}: 1 and set the annotation {L.ANN_GPU_FRACTION} "
            f'(e.g. "0.5")',
        )
    cpu = raw.get("cpu", Fraction(0)) * 1000
    mem = raw.get("memory", Fraction(0)) / 2**20
    return PodRequests(
        cpu_milli=int(-(-cpu.numerator // cpu.denominator)),
        memory_mib=int(-(-mem.numerator // mem.denominator)),
        gpus=int(gpu),
        raw=raw,
    )


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
