"""GPUs asked through DRA claims → the gang model: counts, VRAM, product, the nodes a claim
can be allocated on, and a Rejection naming the field for what nexus cannot read."""

import re
from typing import Any

import pytest
from kube_factories import cluster_queue, node, pod_set, workload

from nexus_admit.kube.cluster import node_from_object
from nexus_admit.kube.dra import (
    DraIndex,
    claim_gpus,
    closed_cliques,
    domain_cliques,
    merge_held,
    pod_domain_cliques,
)
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.errors import TranslationError
from nexus_admit.kube.kueue import KueueIndex
from nexus_admit.kube.workload import workload_to_gang
from nexus_admit.model import NVLINK_CLIQUE_LEVEL, PlacementConfig

CONFIG = PlacementConfig()
H100 = "NVIDIA H100 80GB HBM3"
MEM80 = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0'
PRODUCT = f'device.attributes["gpu.nvidia.com"].productName == "{H100}"'


def template(name: str, *requests: dict[str, Any], ns: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": list(requests)}}},
    }


def gpu_request(count: int = 4, *selectors: str, cls: str = "gpu.nvidia.com",
                **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count, **extra}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": "gpus", "exactly": exactly}


def claim_pod_set(count: int = 2, tpl: str = "gpus", **kw: Any) -> dict[str, Any]:
    claims = [{"name": "gpu", "resourceClaimTemplateName": tpl}]
    return pod_set("workers", count, gpus=0, spec_extra={"resourceClaims": claims}, **kw)


def gang(wl: dict[str, Any], index: DraIndex, nodes: Any = None):
    kueue = KueueIndex.of(cluster_queues=[cluster_queue("cq", "gold")])
    return workload_to_gang(wl, config=CONFIG, kueue=kueue, nodes=nodes,
                            levels=CONFIG.resolve_levels({}), dra=index)


def test_template_count_selectors_become_gpus_vram_and_product() -> None:
    index = DraIndex.of([template("gpus", gpu_request(4, MEM80, PRODUCT))])
    ps = gang(workload("w", [claim_pod_set(2)]), index).pod_sets[0]
    assert (ps.count, ps.gpus, ps.vram_mib) == (2, 4, 80 * 1024)
    assert ps.node_selector["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


def test_conjunction_in_one_expression_and_strictly_greater() -> None:
    expr = (f'device.driver == "gpu.nvidia.com" && '
            f'{MEM80.replace(">= 0", "> 0")} && {PRODUCT}')
    index = DraIndex.of([template("gpus", gpu_request(2, expr))])
    got = claim_gpus(workload("w", [claim_pod_set()]),
                     claim_pod_set()["template"]["spec"], "spec", index, ("gpu.nvidia.com",))
    assert (got.gpus, got.vram_mib, got.product) == (2, 80 * 1024 + 1, "NVIDIA-H100-80GB-HBM3")


def test_other_device_classes_are_not_gpus() -> None:
    index = DraIndex.of([template("gpus", gpu_request(4), gpu_request(2, cls="nic.example.com"))])
    assert gang(workload("w", [claim_pod_set()]), index).pod_sets[0].gpus == 4


def test_configured_gpu_class_is_read() -> None:
    index = DraIndex.of([template("gpus", gpu_request(3, cls="h100.example.com"))])
    config = PlacementConfig.from_spec({"gpuDeviceClasses": ["h100.example.com"]})
    kueue = KueueIndex.of(cluster_queues=[cluster_queue("cq", "gold")])
    g = workload_to_gang(workload("w", [claim_pod_set()]), config=config, kueue=kueue, dra=index)
    assert g.pod_sets[0].gpus == 3


def test_claims_restrict_nodes_to_dra_gpus_of_the_product() -> None:
    def dra_node(name: str, product: str) -> Any:
        devices = [{"name": f"gpu-{i}", "attributes": {"productName": {"string": product}}}
                   for i in range(8)]
        sl = {"kind": "ResourceSlice", "metadata": {"name": f"{name}-s"},
              "spec": {"driver": "gpu.nvidia.com", "nodeName": name,
                       "pool": {"name": name}, "devices": devices}}
        return node_from_object(node(name, gpus=0), resource_slices=[sl])[0], sl

    (a, sa), (b, sb) = dra_node("dra-a", H100), dra_node("dra-b", "NVIDIA L40S")
    plugin = node_from_object(node("plugin", product="NVIDIA-H100-80GB-HBM3"))[0]
    index = DraIndex.of([template("gpus", gpu_request(4, PRODUCT))], slices=[sa, sb])
    ps = gang(workload("w", [claim_pod_set()]), index, nodes=[a, b, plugin]).pod_sets[0]
    assert ps.allowed_nodes == frozenset({"dra-a"})


@pytest.mark.parametrize(
    ("request_", "field", "says"),
    [
        (gpu_request(4, 'device.attributes["gpu.nvidia.com"].architecture == "Hopper"'),
         "requests[0].exactly.selectors[0].cel.expression", "cannot read the selector"),
        (gpu_request(4, f"{PRODUCT} || {MEM80}"),
         "requests[0].exactly.selectors[0].cel.expression", "cannot read the selector"),
        (gpu_request(4, allocationMode="All"), "requests[0].exactly.allocationMode",
         "ExactCount"),
        ({"name": "g", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.nvidia.com"}]},
         "requests[0].firstAvailable", "alternative"),
        (gpu_request(0), "requests[0].exactly.count", "1 or more"),
    ],
)
def test_what_nexus_cannot_read_is_an_error_naming_the_field(
    request_: dict[str, Any], field: str, says: str
) -> None:
    index = DraIndex.of([template("gpus", request_)])
    with pytest.raises(TranslationError) as e:
        gang(workload("w", [claim_pod_set()]), index)
    assert "spec.podSets[0].template.spec.resourceClaims[0].resourceClaimTemplateName" in (
        e.value.field)
    assert f"ResourceClaimTemplate default/gpus spec.spec.devices.{field}" in e.value.field
    assert says in e.value.message


def test_missing_template_and_shared_claim_and_mixing_are_errors() -> None:
    with pytest.raises(TranslationError, match="does not exist"):
        gang(workload("w", [claim_pod_set()]), DraIndex.of())
    claim = {"kind": "ResourceClaim", "metadata": {"name": "shared", "namespace": "default"},
             "spec": {"devices": {"requests": [gpu_request(1)]}}}
    ps = pod_set("p", 2, gpus=0,
                 spec_extra={"resourceClaims": [{"name": "g", "resourceClaimName": "shared"}]})
    with pytest.raises(TranslationError, match="shared by all of them"):
        gang(workload("w", [ps]), DraIndex.of(claims=[claim]))
    mixed = claim_pod_set()
    mixed["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    with pytest.raises(TranslationError, match="ask them one way"):
        gang(workload("w", [mixed]), DraIndex.of([template("gpus", gpu_request(1))]))


def test_template_is_namespace_local_and_dump_resolves_it() -> None:
    other_ns = template("gpus", gpu_request(4), ns="elsewhere")
    with pytest.raises(TranslationError, match="default/gpus does not exist"):
        gang(workload("w", [claim_pod_set()]), DraIndex.of([other_ns]))
    dump = ClusterDump.of([template("gpus", gpu_request(4))])
    assert dump.dra_index().templates[("default", "gpus")]["kind"] == "ResourceClaimTemplate"


# ---------------------------------------------------------------- capacity


def _slice(name: str, count: int, product: str = H100, memory: str = "81559Mi",
           pool: str | None = None) -> dict[str, Any]:
    devices = [{"name": f"gpu-{i}",
                "attributes": {"index": {"int": i}, "productName": {"string": product}},
                "capacity": {"memory": {"value": memory}}} for i in range(count)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{name}-gpu"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": name,
                     "pool": {"name": pool or name, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}}


def _claim(name: str, node_name: str, *devices: str, driver: str = "gpu.nvidia.com"
           ) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"devices": {"requests": [gpu_request(len(devices))]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpus", "driver": driver, "pool": node_name, "device": d}
                for d in devices]}}}}


def test_devices_allocated_to_claims_are_not_free() -> None:
    from nexus_admit.kube.cluster import build_snapshot

    snap = build_snapshot(
        [node("d1", gpus=0), node("d2", gpus=0)], [], [],
        resource_slices=[_slice("d1", 8), _slice("d2", 8)],
        resource_claims=[_claim("a", "d1", "gpu-1", "gpu-2"), _claim("b", "d2", "gpu-7"),
                         _claim("other", "d2", "gpu-0", driver="nic.example.com"),
                         _claim("pending", "d2")],
    )
    assert snap.nodes["d1"].gpu_free == [1000, 0, 0] + [1000] * 5
    assert snap.nodes["d2"].gpu_free == [1000] * 7 + [0]


def test_node_with_extended_resource_and_slices_counts_each_gpu_once() -> None:
    from nexus_admit.kube.cluster import build_snapshot

    # 8 GPUs as nvidia.com/gpu, the same 8 published as devices: the extended resource
    # gives the count, a claim's device is the GPU of the same index
    snap = build_snapshot([node("both", gpus=8)], [], [], resource_slices=[_slice("both", 8)],
                          resource_claims=[_claim("a", "both", "gpu-3")])
    assert snap.nodes["both"].gpu_count == 8
    assert snap.nodes["both"].gpu_free.count(0) == 1 and snap.nodes["both"].gpu_free[3] == 0


def test_bound_claim_pod_takes_its_claims_devices_not_its_slots() -> None:
    from kube_factories import pod, reservation

    from nexus_admit.kube.cluster import build_snapshot

    rr = reservation("rr", "w", [{"index": 0, "node": "d1", "gpus": [0, 1]}],
                     namespace="team", pod_set="workers")
    bound = pod("p", "d1", namespace="team", gpus=0,
                labels={"scheduling.kubenexus.io/reservation": "rr"},
                annotations={"scheduling.kubenexus.io/slot": "workers/0"})
    snap = build_snapshot([node("d1", gpus=0)], [bound], [rr],
                          resource_slices=[_slice("d1", 8)],
                          resource_claims=[_claim("p-gpu", "d1", "gpu-6", "gpu-7")])
    assert snap.nodes["d1"].gpu_free == [1000] * 6 + [0, 0]


def _extended_pod(status: dict[str, Any] | None) -> dict[str, Any]:
    from kube_factories import pod

    p = pod("p", "d1", namespace="team", gpus=4)
    if status is not None:
        p["status"]["extendedResourceClaimStatus"] = status
    return p


SERVED = {"resourceClaimName": "p-extended-resources-x7k2q", "requestMappings": [
    {"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0"}]}


@pytest.mark.parametrize(("status", "free"), [
    (SERVED, 4),  # the claim the scheduler made holds the 4 GPUs: counted once
    (None, 0),  # served by a device plugin: the request counts too (and over-commits)
    ({"resourceClaimName": "p-x", "requestMappings": [
        {"containerName": "main", "resourceName": "example.com/nic", "requestName": "r"}]}, 0),
    ({"resourceClaimName": "p-x", "requestMappings": "nope"}, 0),  # unreadable: never freer
])
def test_a_pod_whose_extended_resource_dra_serves_is_counted_once(
    status: dict[str, Any] | None, free: int
) -> None:
    from nexus_admit.kube.cluster import build_snapshot

    # Kubernetes 1.37 serves `nvidia.com/gpu` on a node whose GPUs only a DRA driver
    # publishes through a claim it makes for the pod (DeviceClass extendedResourceName)
    snap = build_snapshot([node("d1", gpus=0)], [_extended_pod(status)], [],
                          resource_slices=[_slice("d1", 8)],
                          resource_claims=[_claim("p-extended-resources-x7k2q", "d1",
                                                  "gpu-0", "gpu-1", "gpu-2", "gpu-3")])
    assert snap.nodes["d1"].gpu_free.count(1000) == free


def test_malformed_claim_is_listed_not_fatal() -> None:
    from nexus_admit.kube.cluster import build_snapshot
    from nexus_admit.kube.errors import Skipped

    bad = _claim("bad", "d1", "gpu-0")
    bad["status"]["allocation"]["devices"]["results"] = "nope"
    skipped: list[Skipped] = []
    snap = build_snapshot([node("d1", gpus=0)], resource_slices=[_slice("d1", 2)],
                          resource_claims=[bad, _claim("ok", "d1", "gpu-1")], skipped=skipped)
    assert snap.nodes["d1"].gpu_free == [1000, 0]
    assert [(s.kind, s.name) for s in skipped] == [("ResourceClaim", "bad")]


# ---------------------------------------------------------------- ComputeDomains

CHANNEL = {"name": "channel",
           "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"}}
ZONE = "topology.kubernetes.io/zone"


def cd_pod_set(count: int = 2, **kw: Any) -> dict[str, Any]:
    claims = [{"name": "gpu", "resourceClaimTemplateName": "gpus"},
              {"name": "channel", "resourceClaimTemplateName": "cd-channel"}]
    return pod_set("workers", count, gpus=0, spec_extra={"resourceClaims": claims}, **kw)


def cd_index() -> DraIndex:
    return DraIndex.of([template("gpus", gpu_request(8)), template("cd-channel", CHANNEL)])


def test_a_compute_domain_channel_binds_the_pod_set_to_one_nvlink_clique() -> None:
    g = gang(workload("w", [cd_pod_set()]), cd_index())
    ps = g.pod_sets[0]
    assert (ps.gpus, ps.compute_domain) == (8, "default/cd-channel")
    assert ps.required_level == NVLINK_CLIQUE_LEVEL == g.required_level
    assert g.compute_domain == "default/cd-channel"
    # a level under the clique (every configured one is: the clique heads them) is kept
    in_rack = gang(workload("w", [cd_pod_set(annotations={
        "scheduling.kubenexus.io/required-topology": ZONE})]), cd_index())
    assert in_rack.pod_sets[0].required_level == ZONE == in_rack.required_level
    # without the channel, no clique
    plain = gang(workload("w", [claim_pod_set()]), cd_index())
    assert (plain.pod_sets[0].compute_domain, plain.required_level) == (None, None)


def test_a_channel_in_a_shared_claim_or_two_channels_are_errors() -> None:
    claim = {"kind": "ResourceClaim", "metadata": {"name": "shared", "namespace": "default"},
             "spec": {"devices": {"requests": [CHANNEL]}}}
    ps = pod_set("p", 2, gpus=0,
                 spec_extra={"resourceClaims": [{"name": "c", "resourceClaimName": "shared"}]})
    with pytest.raises(TranslationError, match="ResourceClaimTemplate its ComputeDomain"):
        gang(workload("w", [ps]), DraIndex.of(claims=[claim]))
    two = cd_pod_set()
    two["template"]["spec"]["resourceClaims"].append(
        {"name": "other", "resourceClaimTemplateName": "other-channel"})
    index = DraIndex.of([template("gpus", gpu_request(8)), template("cd-channel", CHANNEL),
                         template("other-channel", CHANNEL)])
    with pytest.raises(TranslationError, match="one ComputeDomain"):
        gang(workload("w", [two]), index)


def _clique_node(name: str, clique: str | None) -> Any:
    labels = {NVLINK_CLIQUE_LEVEL: clique} if clique else {}
    return node_from_object(node(name, labels=labels))[0]


def _rr(name: str, domain: str | None, *nodes: str, deleting: bool = False) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "namespace": "default", "annotations": {}}
    if domain:
        m["annotations"]["scheduling.kubenexus.io/compute-domain"] = domain
    if deleting:
        m["deletionTimestamp"] = "2026-11-25T10:00:00Z"
    slots = [{"index": i, "node": n, "gpus": list(range(8))} for i, n in enumerate(nodes)]
    return {"kind": "ResourceReservation", "metadata": m,
            "spec": {"podSets": [{"name": "workers", "slots": slots}]}}


def test_cliques_held_by_other_compute_domains_are_closed() -> None:
    nodes = {n.name: n for n in (_clique_node("a0", "A"), _clique_node("a1", "A"),
                                 _clique_node("b0", "B"), _clique_node("x0", None))}
    held = domain_cliques([_rr("one", "ns/cd1", "a0", "a1"), _rr("plain", None, "b0"),
                           _rr("gone", "ns/cd3", "b0", deleting=True),
                           _rr("nowhere", "ns/cd2", "x0", "missing")], nodes)
    assert held == {"A": frozenset({"ns/cd1"})}
    assert closed_cliques("ns/cd2", held) == {"A"}
    assert closed_cliques("ns/cd1", held) == frozenset()  # its own clique stays open
    assert closed_cliques(None, held) == frozenset()


def test_the_dump_closes_cliques_its_reservations_give_other_compute_domains() -> None:
    objs = [node(f"{c}{i}", labels={NVLINK_CLIQUE_LEVEL: c.upper()}) for c in "ab"
            for i in range(2)]
    objs += [template("gpus", gpu_request(8)), template("cd-channel", CHANNEL),
             cluster_queue("cq", "gold"), _rr("other", "default/other-channel", "a0")]
    wl = workload("w", [cd_pod_set()])
    dump = ClusterDump.of([*objs, wl])
    g = dump.gang(wl, CONFIG, dump.snapshot())
    assert g.closed_cliques == {"A"}


def test_running_pods_of_a_compute_domain_nexus_did_not_place_hold_their_clique() -> None:
    nodes = {n.name: n for n in (_clique_node("a0", "A"), _clique_node("b0", "B"))}

    def pod(name: str, node: str | None, tpl: str, phase: str = "Running") -> dict[str, Any]:
        spec: dict[str, Any] = {"resourceClaims": [{"name": "c",
                                                    "resourceClaimTemplateName": tpl}]}
        if node:
            spec["nodeName"] = node
        return {"kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                "spec": spec, "status": {"phase": phase}}

    index = DraIndex.of([template("gpus", gpu_request(8)), template("cd-channel", CHANNEL)])
    held = pod_domain_cliques([pod("p", "a0", "cd-channel"), pod("g", "b0", "gpus"),
                               pod("pending", None, "cd-channel"),
                               pod("done", "b0", "cd-channel", phase="Succeeded")],
                              index, nodes)
    assert held == {"A": frozenset({"default/cd-channel"})}
    both = merge_held(held, {"A": frozenset({"ns/x"}), "B": frozenset({"ns/y"})})
    assert both == {"A": frozenset({"default/cd-channel", "ns/x"}), "B": frozenset({"ns/y"})}


# ---------------------------------------------------------------- device taints


def _tainted_slice(name: str, count: int, tainted: dict[int, list[dict[str, str]]]
                   ) -> dict[str, Any]:
    sl = _slice(name, count)
    for i, taints in tainted.items():
        sl["spec"]["devices"][i]["taints"] = taints
    return sl


BROKEN = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}


def _taint_gang(slices: list[dict[str, Any]], *requests: dict[str, Any],
                claims: list[dict[str, Any]] = (), rules: list[dict[str, Any]] = ()
                ) -> frozenset[str] | None:
    from nexus_admit.kube.cluster import build_snapshot

    names = [sl["spec"]["nodeName"] for sl in slices]
    snap = build_snapshot([node(n, gpus=0) for n in names], [], [],
                          resource_slices=slices, resource_claims=list(claims))
    index = DraIndex.of([template("gpus", *requests)], slices=slices, taint_rules=rules)
    ps = gang(workload("w", [claim_pod_set(1)]), index, nodes=list(snap.nodes.values()))
    return ps.pod_sets[0].allowed_nodes


def test_a_node_whose_untainted_gpus_are_too_few_is_not_a_candidate() -> None:
    slices = [_tainted_slice("t", 8, {i: [BROKEN] for i in range(5)}), _slice("clean", 8)]
    assert _taint_gang(slices, gpu_request(4)) == frozenset({"clean"})
    # three untainted GPUs are enough for a pod that asks three
    assert _taint_gang(slices, gpu_request(3)) == frozenset({"t", "clean"})


def test_untainted_gpus_taken_by_claims_do_not_count() -> None:
    slices = [_tainted_slice("t", 4, {0: [BROKEN], 1: [BROKEN]}), _slice("clean", 4)]
    taken = _claim("busy", "t", "gpu-2")
    assert _taint_gang(slices, gpu_request(2), claims=[taken]) == frozenset({"clean"})


def _rule(selector: dict[str, str] | None, taint: dict[str, str] = BROKEN) -> dict[str, Any]:
    spec: dict[str, Any] = {"taint": taint}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": "r"}, "spec": spec}


@pytest.mark.parametrize(
    ("rule", "candidates"),
    [
        # a whole node's pool tainted (DeviceTaintRule, GA in 1.37): its GPUs are not free
        (_rule({"driver": "gpu.nvidia.com", "pool": "t"}), {"clean"}),
        (_rule({"pool": "t"}), {"clean"}),
        (_rule({}), set()),  # an empty selector selects every device
        (_rule({"pool": "t", "device": "gpu-0"}), {"t", "clean"}),  # one device: 7 left
        (_rule(None), {"t", "clean"}),  # no selector selects no device
        (_rule({"driver": "nic.example.com"}), {"t", "clean"}),  # another driver's devices
        (_rule({"pool": "t"}, {**BROKEN, "effect": "None"}), {"t", "clean"}),  # not blocking
        (_rule({"pool": 7}), {"t", "clean"}),  # unreadable: adds none
    ],
)
def test_a_device_taint_rule_taints_the_devices_it_selects(
    rule: dict[str, Any], candidates: set[str]
) -> None:
    slices = [_slice("t", 8), _slice("clean", 8)]
    assert _taint_gang(slices, gpu_request(4), rules=[rule]) == frozenset(candidates)


def test_device_taint_rules_and_slice_taints_add_up() -> None:
    slices = [_tainted_slice("t", 8, {i: [BROKEN] for i in range(3)}), _slice("clean", 8)]
    rules = [_rule({"pool": "t", "device": f"gpu-{i}"}) for i in range(3, 5)]
    assert _taint_gang(slices, gpu_request(4), rules=rules) == frozenset({"clean"})
    assert _taint_gang(slices, gpu_request(3), rules=rules) == frozenset({"t", "clean"})


@pytest.mark.parametrize(
    ("taint", "toleration", "placed_on_tainted"),
    [
        (BROKEN, {"key": "gpu.nvidia.com/xid", "operator": "Exists"}, True),
        (BROKEN, {"key": "gpu.nvidia.com/xid", "value": "79"}, True),
        (BROKEN, {"key": "gpu.nvidia.com/xid", "value": "48"}, False),
        (BROKEN, {"operator": "Exists"}, True),
        (BROKEN, {"operator": "Exists", "effect": "NoExecute"}, False),
        ({**BROKEN, "effect": "NoExecute"}, {"operator": "Exists", "effect": "NoExecute"}, True),
        ({**BROKEN, "effect": "NoExecute"}, None, False),
        # None (and any effect the allocator does not know) keeps nobody off
        ({**BROKEN, "effect": "None"}, None, True),
    ],
)
def test_a_tainted_device_is_the_pods_only_when_tolerated(
    taint: dict[str, str], toleration: dict[str, str] | None, placed_on_tainted: bool
) -> None:
    slices = [_tainted_slice("t", 2, {0: [taint], 1: [taint]})]
    extra = {"tolerations": [toleration]} if toleration else {}
    allowed = _taint_gang(slices, gpu_request(1, **extra))
    assert allowed == (frozenset({"t"}) if placed_on_tainted else frozenset())


def test_every_gpu_request_of_the_pod_must_tolerate_the_taint() -> None:
    slices = [_tainted_slice("t", 2, {0: [BROKEN], 1: [BROKEN]})]
    tolerant = gpu_request(1, tolerations=[{"operator": "Exists"}])
    other = {**gpu_request(1), "name": "more"}
    assert _taint_gang(slices, tolerant, other) == frozenset()
    assert _taint_gang(slices, tolerant, {**tolerant, "name": "more"}) == frozenset({"t"})


def test_a_toleration_nexus_cannot_match_is_an_error_naming_the_field() -> None:
    index = DraIndex.of([template("gpus", gpu_request(1, tolerations=[
        {"key": "a", "operator": "Lt", "value": "3"}]))])
    field = "requests[0].exactly.tolerations[0].operator"
    with pytest.raises(TranslationError, match=re.escape(field)):
        gang(workload("w", [claim_pod_set()]), index)


def test_malformed_taints_add_none_and_break_nothing() -> None:
    sl = _slice("t", 2)
    sl["spec"]["devices"][0]["taints"] = "not a list"
    assert DraIndex.of(slices=[sl]).device_taints == {}
    assert DraIndex.of(slices=[sl]).gpu_nodes == frozenset({"t"})
