"""GPUs through Dynamic Resource Allocation on the real control plane.

The test adds eight KWOK nodes without `nvidia.com/gpu` and publishes their GPUs as
ResourceSlices the way NVIDIA's DRA driver does (driver `gpu.nvidia.com`, one device per
GPU with `productName`, `architecture`, `index` and capacity `memory`): rack `dra-ra` holds
4 nodes of 8 H200 (141 GB), rack `dra-rb` 4 nodes of 8 L40S (48 GB). The DeviceClass
`gpu.nvidia.com` selects that driver (e2e/manifests/dra.yaml), Kueue counts the claims'
devices as `nvidia.com/gpu` (deviceClassMappings), nexus places the gangs, the ungater pins
the nodes, kube-scheduler's DRA allocator allocates the claims there and KWOK runs the pods
(it does not prepare devices; the pods reach Running all the same). The claims' statuses
are the evidence: which device of which node each pod holds.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_util import KUEUE_GROUP, KUEUE_VERSION, QUEUE_LABEL, WaitTimeout, condition, wait_for
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900, func_only=True)]

MANIFEST = Path(__file__).resolve().parents[1] / "manifests" / "dra.yaml"
RESOURCE = ("resource.k8s.io", "v1")
DRIVER = "gpu.nvidia.com"
CHECK = "nexus-dra"
QUEUE = "dra-gold"
RACK = "cloud.google.com/gce-topology-subblock"
REQUIRED_TOPOLOGY = "scheduling.kubenexus.io/required-topology"
POOL_LABEL = "scheduling.kubenexus.io/e2e-pool"
RR = ("scheduling.kubenexus.io", "v1alpha1", "resourcereservations")
MEM80 = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("80Gi")) >= 0'
UNREADABLE = f'device.attributes["{DRIVER}"].architecture == "Hopper"'
# rack → (product, memory, architecture); 4 nodes of 8 GPUs each
RACKS = {
    "dra-ra": ("NVIDIA H200", "143771Mi", "Hopper"),
    "dra-rb": ("NVIDIA L40S", "46068Mi", "Ada"),
}
NODES = {f"{rack}-{i}": rack for rack in RACKS for i in range(4)}
GPUS_PER_NODE = 8


def node_object(name: str, rack: str) -> dict[str, Any]:
    alloc = {"cpu": "128", "memory": "1000Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "topology.kubernetes.io/zone": "zone-dra",
                "cloud.google.com/gce-topology-block": "dra-block",
                RACK: rack,
                POOL_LABEL: "dra",
            },
        },
        "spec": {},
        "status": {"capacity": dict(alloc), "allocatable": dict(alloc)},
    }


def slice_object(name: str, rack: str) -> dict[str, Any]:
    """One node's GPUs as NVIDIA's DRA driver publishes them."""
    product, memory, arch = RACKS[rack]
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "index": {"int": i},
                "productName": {"string": product},
                "architecture": {"string": arch},
                "uuid": {"string": f"GPU-{name}-{i}"},
            },
            "capacity": {"memory": {"value": memory}},
        }
        for i in range(GPUS_PER_NODE)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{name}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


@pytest.fixture(scope="module")
def dra_fleet(e2e_cluster: Any, kube_api) -> Any:
    """The DRA nodes, their ResourceSlices and the module's Kueue and nexus objects."""
    core = client.CoreV1Api(kube_api)
    custom = client.CustomObjectsApi(kube_api)
    e2e_cluster.apply(MANIFEST.read_text(), retries=10)
    for name, rack in NODES.items():
        core.create_node(node_object(name, rack))
        custom.create_cluster_custom_object(*RESOURCE, "resourceslices", slice_object(name, rack))

    def ready() -> bool:
        nodes = [core.read_node(n) for n in NODES]
        return all(
            any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
            for n in nodes
        )

    wait_for("the DRA nodes Ready", ready, timeout=120)
    yield
    for name in NODES:
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(*RESOURCE, "resourceslices", f"{name}-{DRIVER}")
        with contextlib.suppress(client.ApiException):
            core.delete_node(name)
    for d in reversed([d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]):
        group = d["apiVersion"].split("/")[0]
        e2e_cluster.kubectl("delete", f"{d['kind'].lower()}es.{group}" if d["kind"].endswith(
            "s") else f"{d['kind'].lower()}s.{group}", d["metadata"]["name"],
            "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
def dra_ns(dra_fleet: Any, nexus_controller: Any, e2e_namespace: str, custom_objects) -> Any:
    custom_objects.create_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, e2e_namespace, "localqueues",
        {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "LocalQueue",
         "metadata": {"name": QUEUE, "namespace": e2e_namespace},
         "spec": {"clusterQueue": QUEUE}},
    )

    def active() -> bool:
        cq = custom_objects.get_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", QUEUE)
        return condition(cq, "Active") == "True"

    wait_for(f"ClusterQueue {QUEUE} active", active, timeout=60)
    wait_for("no claim of an earlier test holds a DRA GPU",
             lambda: not allocated_devices(custom_objects), timeout=180)
    yield e2e_namespace
    batch = client.BatchV1Api(custom_objects.api_client)
    batch.delete_collection_namespaced_job(e2e_namespace, propagation_policy="Background")


def claim_template(custom, ns: str, name: str, count: int, *selectors: str) -> None:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "allocationMode": "ExactCount",
                               "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    custom.create_namespaced_custom_object(*RESOURCE, ns, "resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}},
    })


def claim_job(batch, ns: str, name: str, pods: int, template: str,
              rack_required: bool = False) -> None:
    annotations = {REQUIRED_TOPOLOGY: RACK} if rack_required else {}
    batch.create_namespaced_job(ns, {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: QUEUE}},
        "spec": {
            "parallelism": pods, "completions": pods, "completionMode": "Indexed",
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                    "containers": [{
                        "name": "worker", "image": "registry.invalid/nexus/worker:e2e",
                        "resources": {"requests": {"cpu": "8", "memory": "32Gi"},
                                      "claims": [{"name": "gpu"}]},
                    }],
                },
            },
        },
    })


def claims(custom, ns: str | None = None) -> list[dict[str, Any]]:
    if ns is None:
        return custom.list_cluster_custom_object(*RESOURCE, "resourceclaims")["items"]
    return custom.list_namespaced_custom_object(*RESOURCE, ns, "resourceclaims")["items"]


def claim_devices(claim: dict[str, Any]) -> list[tuple[str, str]]:
    """(node, device) of every GPU the claim's allocation holds (the pool is the node)."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return [(r["pool"], r["device"]) for r in (alloc.get("devices") or {}).get("results") or []
            if r.get("driver") == DRIVER]


def allocated_devices(custom) -> list[tuple[str, str]]:
    return [d for c in claims(custom) for d in claim_devices(c) if d[0] in NODES]


def running_pods(core, ns: str, job: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(ns, label_selector=f"job-name={job}").items
    return [p for p in pods if p.status.phase == "Running" and p.spec.node_name]


def retried(core, ns: str) -> set[str]:
    """Workloads nexus answered Retry (its Event on the Workload)."""
    return {e.involved_object.name for e in core.list_namespaced_event(ns).items
            if e.reason == "PlacementRetry"}


def test_gang_through_claim_template_lands_in_one_rack_on_its_reserved_nodes(
    dra_ns: str, batch_v1, core_v1, custom_objects
) -> None:
    ns = dra_ns
    claim_template(custom_objects, ns, "four-gpus", 4)
    claim_job(batch_v1, ns, "gang", pods=2, template="four-gpus", rack_required=True)
    pods = wait_for("the 2 gang pods Running", lambda: (
        p if len(p := running_pods(core_v1, ns, "gang")) == 2 else None), timeout=180)
    nodes = {p.metadata.name: p.spec.node_name for p in pods}
    assert set(nodes.values()) <= set(NODES)
    assert len({NODES[n] for n in nodes.values()}) == 1, nodes  # one rack
    rrs = custom_objects.list_namespaced_custom_object(*RR[:2], ns, RR[2])["items"]
    reserved = {s["node"] for rr in rrs for ps in rr["spec"]["podSets"] for s in ps["slots"]}
    assert set(nodes.values()) == reserved
    held = {}
    for c in claims(custom_objects, ns):
        owner = [r["name"] for r in c["status"].get("reservedFor") or []]
        devices = claim_devices(c)
        assert len(devices) == 4 and len({d[0] for d in devices}) == 1, c["status"]
        held[owner[0]] = devices[0][0]
    assert held == nodes  # each pod's claim is allocated on the node nexus reserved for it


def test_devices_held_by_claims_are_never_promised_again(
    dra_ns: str, batch_v1, core_v1, custom_objects
) -> None:
    ns = dra_ns
    claim_template(custom_objects, ns, "eight-gpus", GPUS_PER_NODE)
    jobs = [f"burst-{i}" for i in range(len(NODES) + 2)]  # 80 GPUs asked, 64 exist
    for name in jobs:
        claim_job(batch_v1, ns, name, pods=1, template="eight-gpus")

    def settled() -> bool:
        up = sum(len(running_pods(core_v1, ns, j)) for j in jobs)
        return up == len(NODES) and len(retried(core_v1, ns)) >= 1

    try:
        wait_for("every DRA node running one burst pod, the rest answered Retry", settled,
                 timeout=300)
    except WaitTimeout as e:
        raise WaitTimeout(f"{e}; allocated {len(allocated_devices(custom_objects))}") from None
    devices = allocated_devices(custom_objects)
    doubled = [d for d, n in Counter(devices).items() if n > 1]
    assert not doubled, doubled
    assert len(devices) == len(NODES) * GPUS_PER_NODE
    assert all(n == GPUS_PER_NODE for n in Counter(d[0] for d in devices).values())
    waiting = [j for j in jobs if not running_pods(core_v1, ns, j)]
    assert len(waiting) == 2
    for j in waiting:  # never bound: their pods hold no node
        pods = core_v1.list_namespaced_pod(ns, label_selector=f"job-name={j}").items
        assert not [p.metadata.name for p in pods if p.spec.node_name]


def test_an_80gib_selector_never_lands_on_48gib_devices(
    dra_ns: str, batch_v1, core_v1, custom_objects
) -> None:
    ns = dra_ns
    claim_template(custom_objects, ns, "big-eight", GPUS_PER_NODE, MEM80)
    claim_job(batch_v1, ns, "big", pods=4, template="big-eight")
    pods = wait_for("the 4 pods asking 80 GiB devices Running", lambda: (
        p if len(p := running_pods(core_v1, ns, "big")) == 4 else None), timeout=180)
    assert {NODES[p.spec.node_name] for p in pods} == {"dra-ra"}
    # the 141 GB rack is full now: one more such pod waits (Retry), 48 GB GPUs stay free
    claim_template(custom_objects, ns, "big-one", 1, MEM80)
    claim_job(batch_v1, ns, "one-more", pods=1, template="big-one")
    wait_for("one-more answered Retry", lambda: any(
        "one-more" in w for w in retried(core_v1, ns)), timeout=120)
    assert not running_pods(core_v1, ns, "one-more")
    assert {n for n, _ in allocated_devices(custom_objects)} == {
        n for n, r in NODES.items() if r == "dra-ra"}


def test_a_selector_nexus_cannot_read_is_rejected_naming_the_field(
    dra_ns: str, batch_v1, core_v1, custom_objects
) -> None:
    ns = dra_ns
    claim_template(custom_objects, ns, "hopper", 2, UNREADABLE)
    claim_job(batch_v1, ns, "unreadable", pods=1, template="hopper")
    # Kueue deactivates a Rejected Workload at once; nexus's Event on it keeps the message
    message = wait_for("the check Rejected", lambda: next(
        (e.message for e in core_v1.list_namespaced_event(ns).items
         if e.reason == "PlacementRejected" and "unreadable" in e.involved_object.name), None),
        timeout=120)
    assert "selectors[0].cel.expression" in message, message
    assert "cannot read the selector" in message, message
    assert "ResourceClaimTemplate" in message and "/hopper" in message, message
    assert not allocated_devices(custom_objects)
