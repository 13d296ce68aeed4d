"""GPUs asked through Dynamic Resource Allocation (resource.k8s.io/v1): a pod template's
`spec.resourceClaims` → GPUs per pod, VRAM per GPU and a GPU product, in the gang model.

A claim entry names a ResourceClaimTemplate (resolved in the Workload's namespace) or a
ResourceClaim. Each of its device requests on a GPU DeviceClass (PlacementConfig
`gpuDeviceClasses`) must be `exactly` with `allocationMode: ExactCount` (or unset) and a
`count`; its CEL selectors are read only in the forms below, which nexus can interpret
exactly. Anything else is a TranslationError naming the field, so the Workload is Rejected
with it and never placed as if it asked for no GPU:

    device.driver == "gpu.nvidia.com"
    device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"
    device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0     (or > 0)

joined by `&&` inside one expression or as several selectors (all must hold). Requests on
other DeviceClasses are left to kube-scheduler (nexus does not count those devices).
A pod placed through claims may only go to nodes whose GPUs the DRA driver publishes
(`DraIndex.gpu_nodes`): kube-scheduler's allocator can give it devices nowhere else.

A claim on the ComputeDomain channel class (`compute-domain-default-channel.nvidia.com`,
NVIDIA's multi-node NVLink) makes the pod set a ComputeDomain's: named by its
ResourceClaimTemplate ("namespace/name", one per ComputeDomain), its pods stay inside one
NVLink clique, and a clique another ComputeDomain holds (a live ResourceReservation with
`compute-domain`: `domain_cliques`; a bound pod naming another channel template:
`pod_domain_cliques`) is closed to it.

Device taints (ResourceSlice `devices[].taints`, and DeviceTaintRules selecting a device by
driver, pool and name; both GA in Kubernetes 1.37): a GPU device with a
NoSchedule or NoExecute taint that not every GPU request of the pod tolerates
(`exactly.tolerations`, matched as kube-scheduler's allocator matches them) is not the
pod's: a node is a candidate only when its free GPUs the pod may take number at least the
GPUs it asks (`claim_nodes`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.nodes import DraDevice, dra_device_indices
from nexus_admit.kube.errors import Obj, TranslationError, mapping, meta, object_ref, sequence
from nexus_admit.kube.quantity import parse_memory_mib
from nexus_admit.model import GPU_WHOLE, Node

__all__ = [
    "ClaimGpus",
    "DeviceTaint",
    "DeviceToleration",
    "DraIndex",
    "claim_gpus",
    "claim_nodes",
    "closed_cliques",
    "domain_cliques",
    "merge_held",
    "normalize_product",
    "pod_domain_cliques",
]

_ATTR = rf'device\.attributes\["{re.escape(L.DRA_GPU_DRIVER)}"\]'
_PRODUCT = re.compile(rf'{_ATTR}\.{L.DRA_ATTR_PRODUCT}\s*==\s*"(?P<value>[^"\\]*)"')
_MEMORY = re.compile(
    rf'device\.capacity\["{re.escape(L.DRA_GPU_DRIVER)}"\]\.{L.DRA_CAP_MEMORY}'
    r'\.compareTo\(\s*quantity\(\s*"(?P<value>[^"\\]+)"\s*\)\s*\)\s*(?P<op>>=|>)\s*0'
)
_DRIVER = re.compile(rf'device\.driver\s*==\s*"{re.escape(L.DRA_GPU_DRIVER)}"')
_READABLE = (
    f'device.attributes["{L.DRA_GPU_DRIVER}"].{L.DRA_ATTR_PRODUCT} == "<product>", '
    f'device.capacity["{L.DRA_GPU_DRIVER}"].{L.DRA_CAP_MEMORY}.compareTo(quantity("<size>")) '
    f'>= 0 and device.driver == "{L.DRA_GPU_DRIVER}", joined by &&'
)


def normalize_product(product: str) -> str:
    """A product name as node labels carry it (GFD writes spaces as dashes)."""
    return product.strip().replace(" ", "-")


# taint effects that keep an untolerating claim off a device; None and any effect added
# later are ignored, as the allocator ignores them
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class DeviceToleration:
    """A device request's toleration (resource.k8s.io/v1 DeviceToleration)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: DeviceTaint) -> bool:
        # the rules of k8s.io/dynamic-resource-allocation's resourceclaim.ToleratesTaint
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator == "Equal" and self.value == taint.value


@dataclass(frozen=True, slots=True)
class DraIndex:
    """What claim translation reads: ResourceClaimTemplates and ResourceClaims by
    (namespace, name), the nodes whose GPUs a DRA driver publishes (None: unknown), and
    the GPU devices tainted NoSchedule or NoExecute (node → GPU index → its taints)."""

    templates: Mapping[tuple[str, str], Obj]
    claims: Mapping[tuple[str, str], Obj]
    gpu_nodes: frozenset[str] | None = None
    device_taints: Mapping[str, Mapping[int, tuple[DeviceTaint, ...]]] = field(
        default_factory=dict)

    @classmethod
    def of(
        cls,
        templates: Iterable[Obj] = (),
        claims: Iterable[Obj] = (),
        slices: Iterable[Obj] | None = None,
        taint_rules: Iterable[Obj] = (),
    ) -> DraIndex:
        """`taint_rules`: DeviceTaintRules (GA in 1.37), whose taints join the devices'."""
        nodes: frozenset[str] | None = None
        if slices is not None:
            nodes = frozenset(
                str(spec["nodeName"])
                for sl in slices
                if isinstance(spec := sl.get("spec"), Mapping)
                and spec.get("driver") == L.DRA_GPU_DRIVER
                and spec.get("nodeName")
                and spec.get("devices")
            )
        return cls(_by_key(templates), _by_key(claims), nodes,
                   _device_taints(slices or (), _taint_rules(taint_rules)))


@dataclass(frozen=True, slots=True)
class _TaintRule:
    """A DeviceTaintRule's selector (None: any) and its blocking taint."""

    driver: str | None
    pool: str | None
    device: str | None
    taint: DeviceTaint

    def selects(self, driver: str, pool: str, device: str) -> bool:
        return (self.driver in (None, driver) and self.pool in (None, pool)
                and self.device in (None, device))


def _taint_rules(rules: Iterable[Obj]) -> list[_TaintRule]:
    """The DeviceTaintRules whose taint blocks (NoSchedule, NoExecute). A rule without a
    `deviceSelector` selects no device (the API's rule), an empty one every device; a rule
    nexus cannot read adds none (the apiserver validates them, so none should exist)."""
    out: list[_TaintRule] = []
    for rule in rules:
        spec = rule.get("spec")
        if not isinstance(spec, Mapping):
            continue
        selector, taint = spec.get("deviceSelector"), spec.get("taint")
        if not isinstance(selector, Mapping) or not isinstance(taint, Mapping) \
                or taint.get("effect") not in _BLOCKING_EFFECTS:
            continue
        fields = [selector.get(k) for k in ("driver", "pool", "device")]
        if any(f is not None and not isinstance(f, str) for f in fields):
            continue
        driver, pool, device = (f if isinstance(f, str) else None for f in fields)
        out.append(_TaintRule(driver, pool, device, DeviceTaint(
            str(taint.get("key") or ""), str(taint.get("value") or ""), str(taint["effect"]))))
    return out


def _device_taints(
    slices: Iterable[Obj], rules: Sequence[_TaintRule] = ()
) -> dict[str, dict[int, tuple[DeviceTaint, ...]]]:
    """node → GPU index (as the snapshot numbers the node's devices) → the blocking taints
    its slices and the DeviceTaintRules selecting it put on that device. A malformed slice
    adds none: the snapshot leaves its node out and says so."""
    by_node: dict[str, list[Obj]] = {}
    for sl in slices:
        spec = sl.get("spec")
        if isinstance(spec, Mapping) and spec.get("driver") == L.DRA_GPU_DRIVER \
                and spec.get("nodeName"):
            by_node.setdefault(str(spec["nodeName"]), []).append(sl)
    out: dict[str, dict[int, tuple[DeviceTaint, ...]]] = {}
    for node, node_slices in by_node.items():
        try:
            indices = dra_device_indices(node_slices)
            tainted = {
                indices[device]: taints
                for device, taints in _slice_taints(node_slices, rules)
                if device in indices
            }
        except TranslationError:
            continue
        if tainted:
            out[node] = tainted
    return out


def _slice_taints(
    slices: Sequence[Obj], rules: Sequence[_TaintRule]
) -> Iterable[tuple[DraDevice, tuple[DeviceTaint, ...]]]:
    for sl in slices:
        spec = mapping(sl, sl.get("spec"), "spec")
        pool = str(mapping(sl, spec.get("pool"), "spec.pool").get("name") or "")
        for i, dev in enumerate(sequence(sl, spec.get("devices"), "spec.devices")):
            dev = mapping(sl, dev, f"spec.devices[{i}]")
            body = dev.get("basic", dev)  # v1beta1 devices hold their taints in `basic`
            raw = body.get("taints") if isinstance(body, Mapping) else None
            name = str(dev.get("name") or "")
            taints = tuple(
                DeviceTaint(str(t.get("key") or ""), str(t.get("value") or ""), str(t["effect"]))
                for t in sequence(sl, raw, f"spec.devices[{i}].taints")
                if isinstance(t, Mapping) and t.get("effect") in _BLOCKING_EFFECTS
            ) + tuple(r.taint for r in rules if r.selects(L.DRA_GPU_DRIVER, pool, name))
            if taints:
                yield (L.DRA_GPU_DRIVER, pool, name), taints


def _by_key(objs: Iterable[Obj]) -> dict[tuple[str, str], Obj]:
    return {
        (str(meta(o).get("namespace") or "default"), str(meta(o).get("name") or "")): o
        for o in objs
    }


@dataclass(frozen=True, slots=True)
class ClaimGpus:
    """What one pod asks through its claims: whole GPUs, VRAM per GPU (MiB, 0 = any), and
    the GPU product as node labels spell it (None = any)."""

    gpus: int = 0
    vram_mib: int = 0
    product: str | None = None
    compute_domain: str | None = None  # its channel's ResourceClaimTemplate, "ns/name"
    # the tolerations of each of its GPU requests: a tainted device is the pod's only when
    # every request tolerates its taints (nexus cannot tell which request gets which device)
    tolerations: tuple[tuple[DeviceToleration, ...], ...] = ()

    def may_use(self, taints: Sequence[DeviceTaint]) -> bool:
        return all(
            any(t.tolerates(taint) for t in request)
            for request in self.tolerations
            for taint in taints
        ) if self.tolerations else not taints


@dataclass(slots=True)
class _Asked:
    gpus: int = 0
    vram_mib: int = 0
    product: str | None = None
    compute_domain: str | None = None
    tolerations: list[tuple[DeviceToleration, ...]] = field(default_factory=list)


def claim_gpus(
    workload: Obj,
    pod_spec: Mapping[str, Any],
    field: str,
    index: DraIndex,
    gpu_classes: Sequence[str],
) -> ClaimGpus:
    """The GPUs one pod of `pod_spec` (at `field` of `workload`) asks through its claims."""
    ns = str(meta(workload).get("namespace") or "default")
    asked = _Asked()
    fld = f"{field}.resourceClaims"
    for j, entry in enumerate(sequence(workload, pod_spec.get("resourceClaims"), fld)):
        entry = mapping(workload, entry, f"{fld}[{j}]")
        source, where = _claim_spec(workload, ns, entry, f"{fld}[{j}]", index)
        if source is None:
            continue
        _read_requests(source, where, gpu_classes, asked)
    return ClaimGpus(asked.gpus, asked.vram_mib, asked.product, asked.compute_domain,
                     tuple(asked.tolerations))


@dataclass(frozen=True, slots=True)
class _Where:
    """Where a claim spec sits: the object holding it, the path to its `devices`, and the
    Workload field that names it (errors say both)."""

    holder: Obj
    devices_field: str
    named_by: str
    workload_ref: str
    shared: bool  # a ResourceClaim by name: one allocation for every pod that names it


def _claim_spec(
    workload: Obj, ns: str, entry: Mapping[str, Any], fld: str, index: DraIndex
) -> tuple[Mapping[str, Any] | None, _Where]:
    ref = object_ref(workload)
    tpl_name, claim_name = entry.get("resourceClaimTemplateName"), entry.get("resourceClaimName")
    if tpl_name:
        tpl = index.templates.get((ns, str(tpl_name)))
        if tpl is None:
            raise TranslationError(
                ref,
                f"{fld}.resourceClaimTemplateName",
                f"ResourceClaimTemplate {ns}/{tpl_name} does not exist (nexus reads the GPUs "
                f"a pod asks from it); create it or fix the name",
            )
        outer = mapping(tpl, tpl.get("spec"), "spec")
        spec = mapping(tpl, outer.get("spec"), "spec.spec")
        return spec, _Where(tpl, "spec.spec.devices", f"{fld}.resourceClaimTemplateName", ref,
                            False)
    if claim_name:
        claim = index.claims.get((ns, str(claim_name)))
        if claim is None:
            raise TranslationError(
                ref,
                f"{fld}.resourceClaimName",
                f"ResourceClaim {ns}/{claim_name} does not exist (nexus reads the GPUs a pod "
                f"asks from it); create it or fix the name",
            )
        spec = mapping(claim, claim.get("spec"), "spec")
        return spec, _Where(claim, "spec.devices", f"{fld}.resourceClaimName", ref, True)
    return None, _Where(workload, "", fld, ref, False)


def _fail(where: _Where, field: str, message: str) -> TranslationError:
    return TranslationError(
        where.workload_ref,
        f"{where.named_by} → {object_ref(where.holder)} {field}",
        message,
    )


def _read_requests(
    spec: Mapping[str, Any], where: _Where, gpu_classes: Sequence[str], asked: _Asked
) -> None:
    holder = where.holder
    devices = mapping(holder, spec.get("devices"), where.devices_field)
    rfld = f"{where.devices_field}.requests"
    gpu_requests = 0
    for k, req in enumerate(sequence(holder, devices.get("requests"), rfld)):
        req = mapping(holder, req, f"{rfld}[{k}]")
        if _asks_gpu_first_available(holder, req, f"{rfld}[{k}]", gpu_classes):
            raise _fail(where, f"{rfld}[{k}].firstAvailable",
                        "nexus cannot tell which alternative the allocator will pick; ask "
                        "for GPUs with exactly.count")
        exactly = mapping(holder, req.get("exactly"), f"{rfld}[{k}].exactly")
        if exactly.get("deviceClassName") == L.DRA_CD_CHANNEL_CLASS:
            _read_channel(where, f"{rfld}[{k}]", asked)
            continue
        if exactly.get("deviceClassName") not in gpu_classes:
            continue  # not GPUs: left to kube-scheduler
        if where.shared:
            raise _fail(where, f"{rfld}[{k}]",
                        "a ResourceClaim named by pods is one allocation shared by all of them, "
                        "on one node: nexus places GPUs asked per pod; use a "
                        "resourceClaimTemplateName")
        _read_exactly(exactly, where, f"{rfld}[{k}].exactly", asked)
        gpu_requests += 1
    cfld = f"{where.devices_field}.constraints"
    if gpu_requests and sequence(holder, devices.get("constraints"), cfld):
        raise _fail(where, cfld, "device constraints (matchAttribute) are not read by nexus; "
                    "leave them out of GPU claims")


def _read_channel(where: _Where, fld: str, asked: _Asked) -> None:
    """A ComputeDomain channel request: the pods share that ComputeDomain."""
    if where.shared:
        raise _fail(where, fld,
                    "a ComputeDomain channel is asked through the ResourceClaimTemplate its "
                    "ComputeDomain names (one claim per pod); a ResourceClaim named by pods is "
                    "one allocation on one node")
    m = meta(where.holder)
    domain = f"{m.get('namespace') or 'default'}/{m.get('name')}"
    if asked.compute_domain is not None and asked.compute_domain != domain:
        raise _fail(where, fld,
                    f"the pod shares ComputeDomain channel {asked.compute_domain} already; a "
                    "pod is in one ComputeDomain")
    asked.compute_domain = domain


def _asks_gpu_first_available(
    holder: Obj, req: Mapping[str, Any], fld: str, gpu_classes: Sequence[str]
) -> bool:
    alternatives = sequence(holder, req.get("firstAvailable"), f"{fld}.firstAvailable")
    return any(
        isinstance(sub, Mapping) and sub.get("deviceClassName") in gpu_classes
        for sub in alternatives
    )


def _read_exactly(exactly: Mapping[str, Any], where: _Where, fld: str, asked: _Asked) -> None:
    mode = exactly.get("allocationMode") or "ExactCount"
    if mode != "ExactCount":
        raise _fail(where, f"{fld}.allocationMode",
                    f"{mode!r}: nexus places a count of GPUs per pod (and Kueue does not "
                    f"admit allocationMode All either); set allocationMode ExactCount and count")
    if exactly.get("adminAccess"):
        raise _fail(where, f"{fld}.adminAccess", "adminAccess claims are not placed by nexus")
    count = exactly.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise _fail(where, f"{fld}.count", f"{count!r}: a device count must be 1 or more")
    for s, sel in enumerate(sequence(where.holder, exactly.get("selectors"), f"{fld}.selectors")):
        sel = mapping(where.holder, sel, f"{fld}.selectors[{s}]")
        cel = mapping(where.holder, sel.get("cel"), f"{fld}.selectors[{s}].cel")
        expr = cel.get("expression")
        if set(sel) - {"cel"} or not isinstance(expr, str):
            raise _fail(where, f"{fld}.selectors[{s}]",
                        "only CEL selectors (cel.expression) are read by nexus")
        _read_selector(expr, where, f"{fld}.selectors[{s}].cel.expression", asked)
    asked.tolerations.append(_read_tolerations(exactly, where, f"{fld}.tolerations"))
    asked.gpus += count


_OPERATORS = ("Equal", "Exists")


def _read_tolerations(
    exactly: Mapping[str, Any], where: _Where, fld: str
) -> tuple[DeviceToleration, ...]:
    out = []
    for t, raw in enumerate(sequence(where.holder, exactly.get("tolerations"), fld)):
        tol = mapping(where.holder, raw, f"{fld}[{t}]")
        operator = tol.get("operator") or "Equal"
        if operator not in _OPERATORS:
            raise _fail(where, f"{fld}[{t}].operator",
                        f"{operator!r}: a device toleration's operator is Equal or Exists")
        if not tol.get("key") and operator != "Exists":
            raise _fail(where, f"{fld}[{t}].key",
                        "a toleration without a key must have operator Exists")
        out.append(DeviceToleration(str(tol.get("key") or ""), str(operator),
                                    str(tol.get("value") or ""), str(tol.get("effect") or "")))
    return tuple(out)


def _conjuncts(expr: str) -> list[str] | None:
    """`a && b && c` split at the top level; None when it has `||`, `!` or parentheses
    around a conjunction (not read)."""
    parts, depth, quoted, start = [], 0, False, 0
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch == '"' and (i == 0 or expr[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            elif expr.startswith("&&", i) and depth == 0:
                parts.append(expr[start:i])
                start = i + 2
                i += 1
            elif expr.startswith("||", i):
                return None
        i += 1
    parts.append(expr[start:])
    return [p.strip() for p in parts]


def _read_selector(expr: str, where: _Where, fld: str, asked: _Asked) -> None:
    parts = _conjuncts(expr)
    for part in parts or [expr]:
        if parts is not None and (m := _PRODUCT.fullmatch(part)):
            product = normalize_product(m["value"])
            if asked.product is not None and asked.product != product:
                raise _fail(where, fld, f"asks {m['value']!r} where another selector of the "
                            f"pod asks {asked.product!r}: no GPU is both")
            asked.product = product
        elif parts is not None and (m := _MEMORY.fullmatch(part)):
            try:
                mib = parse_memory_mib(m["value"])
            except ValueError as e:
                raise _fail(where, fld, f"{m['value']!r}: {e}") from None
            asked.vram_mib = max(asked.vram_mib, mib + (1 if m["op"] == ">" else 0))
        elif parts is not None and _DRIVER.fullmatch(part):
            continue
        else:
            raise _fail(where, fld,
                        f"nexus cannot read the selector {part.strip()!r}, so it cannot tell "
                        f"which nodes' GPUs match; it reads {_READABLE}")


def claim_nodes(
    claim: ClaimGpus,
    nodes: Iterable[Node] | None,
    index: DraIndex,
    allowed: frozenset[str] | None,
) -> frozenset[str] | None:
    """The nodes (within `allowed`, None = any) a pod asking GPUs through claims may go to:
    those whose GPUs the DRA driver publishes and, with a product selector, of that product;
    on a node with tainted devices, only when enough of its free GPUs are ones the pod
    tolerates. Without the snapshot's `nodes`, `allowed` as it is (the product goes to the
    selector)."""
    if not claim.gpus or nodes is None:
        return allowed
    fits = frozenset(
        n.name
        for n in nodes
        if (index.gpu_nodes is None or n.name in index.gpu_nodes)
        and (claim.product is None or normalize_product(n.gpu_product) == claim.product)
        and _untainted_enough(claim, n, index.device_taints.get(n.name))
    )
    return fits if allowed is None else allowed & fits


def _untainted_enough(
    claim: ClaimGpus, node: Node, taints: Mapping[int, tuple[DeviceTaint, ...]] | None
) -> bool:
    """Whether the node's free whole GPUs the pod may take cover what it asks. Only nodes
    with a tainted device are counted here (the engine counts free GPUs itself); counted
    on what is free now because the engine does not know which GPUs are the tainted ones,
    so a node whose untainted GPUs are busy is no place for the pod even after preemption."""
    if not taints:
        return True
    usable = sum(
        1
        for i, free in enumerate(node.gpu_free)
        if free == GPU_WHOLE and claim.may_use(taints.get(i, ()))
    )
    return usable >= claim.gpus


def domain_cliques(
    reservations: Iterable[Obj], nodes: Mapping[str, Node]
) -> dict[str, frozenset[str]]:
    """NVLink clique → the ComputeDomains whose gangs hold a slot there: each live
    ResourceReservation annotated with its gang's ComputeDomain, at its slots' nodes."""
    held: dict[str, set[str]] = {}
    for rr in reservations:
        domain = (meta(rr).get("annotations") or {}).get(L.ANN_COMPUTE_DOMAIN)
        if not domain or meta(rr).get("deletionTimestamp"):
            continue
        spec = rr.get("spec")
        for ps in (spec.get("podSets") if isinstance(spec, Mapping) else None) or []:
            for slot in (ps.get("slots") if isinstance(ps, Mapping) else None) or []:
                node = nodes.get(str(slot.get("node"))) if isinstance(slot, Mapping) else None
                if node is not None and node.clique is not None:
                    held.setdefault(node.clique, set()).add(str(domain))
    return {clique: frozenset(domains) for clique, domains in held.items()}


def pod_domain_cliques(
    pods: Iterable[Obj], index: DraIndex, nodes: Mapping[str, Node]
) -> dict[str, frozenset[str]]:
    """NVLink clique → the ComputeDomains whose pods run there, whoever placed them: a bound,
    unfinished pod naming a channel template (one of a ComputeDomain's pods that nexus did
    not place holds its clique as much as a reservation does)."""
    held: dict[str, set[str]] = {}
    for pod in pods:
        spec, status = pod.get("spec"), pod.get("status")
        if not isinstance(spec, Mapping) or not spec.get("nodeName"):
            continue
        if isinstance(status, Mapping) and status.get("phase") in ("Succeeded", "Failed"):
            continue
        node = nodes.get(str(spec["nodeName"]))
        if node is None or node.clique is None:
            continue
        ns = str(meta(pod).get("namespace") or "default")
        for entry in spec.get("resourceClaims") or []:
            name = entry.get("resourceClaimTemplateName") if isinstance(entry, Mapping) else None
            if name and _asks_channel(index.templates.get((ns, str(name)))):
                held.setdefault(node.clique, set()).add(f"{ns}/{name}")
    return {clique: frozenset(domains) for clique, domains in held.items()}


def _asks_channel(template: Obj | None) -> bool:
    outer = template.get("spec") if template is not None else None
    spec = outer.get("spec") if isinstance(outer, Mapping) else None
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    return any(
        isinstance(r, Mapping) and isinstance(r.get("exactly"), Mapping)
        and r["exactly"].get("deviceClassName") == L.DRA_CD_CHANNEL_CLASS
        for r in requests or []
    )


def merge_held(*helds: Mapping[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for held in helds:
        for clique, domains in held.items():
            out[clique] = out.get(clique, frozenset()) | domains
    return out


def closed_cliques(domain: str | None, held: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """The cliques another ComputeDomain than `domain` holds (none without a domain)."""
    if domain is None:
        return frozenset()
    return frozenset(clique for clique, domains in held.items() if domains - {domain})
