"""The DRA part of the e2e fleet, shared by e2e/tests/test_dra_claims.py and
test_dra_cliques.py: KWOK nodes without `nvidia.com/gpu` whose GPUs are published as
ResourceSlices the way NVIDIA's DRA driver publishes them (driver `gpu.nvidia.com`, one device
per GPU with `productName`, `architecture`, `index`, `uuid` and capacity `memory`), the
ComputeDomain channel devices of nodes in an NVLink clique (driver
`compute-domain.nvidia.com`, device `channel-0` with `type: channel`, `id: 0`), the
DeviceClasses and the module's Kueue and nexus objects (e2e/manifests/dra.yaml), and the
claim templates and Jobs the tests submit.

What the real driver does that this harness does not: its kubelet plugins prepare the devices
(CDI) and its ComputeDomain controller runs IMEX daemons and creates the channel
ResourceClaimTemplate; here the tests create that template themselves, and KWOK runs the pods
without preparing anything.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from e2e_util import KUEUE_GROUP, KUEUE_VERSION, QUEUE_LABEL, condition, wait_for
from kubernetes import client

MANIFEST = Path(__file__).resolve().parent / "manifests" / "dra.yaml"
RESOURCE = ("resource.k8s.io", "v1")
DRIVER = "gpu.nvidia.com"
CD_DRIVER = "compute-domain.nvidia.com"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
CLIQUE = "nvidia.com/gpu.clique"
QUEUE = "dra-gold"
RACK = "cloud.google.com/gce-topology-subblock"
REQUIRED_TOPOLOGY = "scheduling.kubenexus.io/required-topology"
POOL_LABEL = "scheduling.kubenexus.io/e2e-pool"
RR = ("scheduling.kubenexus.io", "v1alpha1", "resourcereservations")
GPUS_PER_NODE = 8
# what an operator or a health monitor puts on a failing GPU's device (a ResourceSlice
# device taint, GA in Kubernetes 1.37): no claim is allocated it unless it tolerates it
UNHEALTHY = {"key": "e2e.kubenexus.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}


@dataclass(frozen=True)
class DraNode:
    """One KWOK node of the DRA fleet: its rack, GPUs as published, and its NVLink clique
    (None: in none, and no channel devices)."""

    name: str
    rack: str
    product: str
    memory: str
    architecture: str
    clique: str | None = None
    tainted: tuple[int, ...] = ()  # indices of the GPUs whose device carries UNHEALTHY


def node_object(n: DraNode) -> dict[str, Any]:
    alloc = {"cpu": "128", "memory": "1000Gi", "pods": "110"}
    labels = {
        "type": "kwok",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": n.name,
        "topology.kubernetes.io/zone": "zone-dra",
        "cloud.google.com/gce-topology-block": "dra-block",
        RACK: n.rack,
        POOL_LABEL: "dra",
    }
    if n.clique is not None:
        labels[CLIQUE] = n.clique
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": n.name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": labels},
        "spec": {},
        "status": {"capacity": dict(alloc), "allocatable": dict(alloc)},
    }


def slice_name(node: str, driver: str = DRIVER) -> str:
    return f"{node}-{driver}"


def gpu_slice(n: DraNode, generation: int = 1) -> dict[str, Any]:
    """One node's GPUs as NVIDIA's DRA driver publishes them."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "index": {"int": i},
                "productName": {"string": n.product},
                "architecture": {"string": n.architecture},
                "uuid": {"string": f"GPU-{n.name}-{i}"},
            },
            "capacity": {"memory": {"value": n.memory}},
            **({"taints": [dict(UNHEALTHY)]} if i in n.tainted else {}),
        }
        for i in range(GPUS_PER_NODE)
    ]
    return _slice(n.name, DRIVER, devices, generation)


def channel_slice(n: DraNode) -> dict[str, Any]:
    """A clique node's ComputeDomain channel as NVIDIA's ComputeDomain kubelet plugin
    publishes it (the default channel class selects channel 0)."""
    devices = [{"name": "channel-0",
                "attributes": {"type": {"string": "channel"}, "id": {"int": 0}}}]
    return _slice(n.name, CD_DRIVER, devices, 1)


def _slice(node: str, driver: str, devices: list[dict[str, Any]], generation: int
           ) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, driver)},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def slices_of(n: DraNode) -> list[dict[str, Any]]:
    return [gpu_slice(n)] + ([channel_slice(n)] if n.clique is not None else [])


def bring_up(e2e_cluster: Any, kube_api: Any, nodes: Iterable[DraNode]) -> None:
    """Apply the manifest, create the nodes and publish their slices; wait until Ready."""
    core = client.CoreV1Api(kube_api)
    custom = client.CustomObjectsApi(kube_api)
    e2e_cluster.apply(MANIFEST.read_text(), retries=10)
    nodes = list(nodes)
    for n in nodes:
        core.create_node(node_object(n))
        for sl in slices_of(n):
            custom.create_cluster_custom_object(*RESOURCE, "resourceslices", sl)

    def ready() -> bool:
        return all(
            any(c.type == "Ready" and c.status == "True"
                for c in (core.read_node(n.name).status.conditions or []))
            for n in nodes
        )

    wait_for("the DRA nodes Ready", ready, timeout=120)


def tear_down(e2e_cluster: Any, kube_api: Any, nodes: Iterable[DraNode]) -> None:
    core = client.CoreV1Api(kube_api)
    custom = client.CustomObjectsApi(kube_api)
    for n in nodes:
        for driver in (DRIVER, CD_DRIVER):
            with contextlib.suppress(client.ApiException):
                custom.delete_cluster_custom_object(*RESOURCE, "resourceslices",
                                                    slice_name(n.name, driver))
        with contextlib.suppress(client.ApiException):
            core.delete_node(n.name)
    for d in reversed([d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]):
        group = d["apiVersion"].split("/")[0]
        kind = d["kind"].lower()
        plural = f"{kind}es" if kind.endswith("s") else f"{kind}s"
        e2e_cluster.kubectl("delete", f"{plural}.{group}", d["metadata"]["name"],
                            "--ignore-not-found", "--wait=false", check=False)


def local_queue(custom: client.CustomObjectsApi, ns: str, known: Iterable[str]) -> None:
    """The module's LocalQueue in `ns`; waits until its ClusterQueue is active and no claim
    of an earlier test holds a device of `known` nodes."""
    custom.create_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, ns, "localqueues",
        {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "LocalQueue",
         "metadata": {"name": QUEUE, "namespace": ns}, "spec": {"clusterQueue": QUEUE}},
    )

    def active() -> bool:
        cq = custom.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", QUEUE)
        return condition(cq, "Active") == "True"

    wait_for(f"ClusterQueue {QUEUE} active", active, timeout=60)
    names = set(known)
    wait_for("no claim of an earlier test holds a DRA device",
             lambda: not allocated_devices(custom, names, driver=None), timeout=180)


def claim_template(custom: client.CustomObjectsApi, ns: str, name: str, count: int,
                   *selectors: str, labels: Mapping[str, str] | None = None,
                   tolerations: Iterable[Mapping[str, Any]] = ()) -> None:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "allocationMode": "ExactCount",
                               "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if tolerations:
        exactly["tolerations"] = [dict(t) for t in tolerations]
    _template(custom, ns, name, {"name": "gpus", "exactly": exactly}, labels)


def channel_template(custom: client.CustomObjectsApi, ns: str, name: str, domain_uid: str
                     ) -> None:
    """The channel ResourceClaimTemplate NVIDIA's ComputeDomain controller creates for a
    ComputeDomain (named by its `spec.channel.resourceClaimTemplate.name`, labelled with the
    ComputeDomain's UID); the real one also carries the driver's opaque channel config."""
    _template(custom, ns, name,
              {"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}},
              {"resource.nvidia.com/computeDomain": domain_uid})


def _template(custom: client.CustomObjectsApi, ns: str, name: str, request: dict[str, Any],
              labels: Mapping[str, str] | None) -> None:
    custom.create_namespaced_custom_object(*RESOURCE, ns, "resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns, "labels": dict(labels or {})},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    })


def claim_job(batch: client.BatchV1Api, ns: str, name: str, pods: int, template: str,
              rack_required: bool = False, channel: str | None = None,
              node_selector: Mapping[str, str] | None = None,
              gates: Iterable[str] = ()) -> None:
    """An Indexed Job of `pods` pods asking GPUs through `template` (and a ComputeDomain
    channel through `channel`); `gates`: scheduling gates of the test's own on its pods."""
    annotations = {REQUIRED_TOPOLOGY: RACK} if rack_required else {}
    resource_claims = [{"name": "gpu", "resourceClaimTemplateName": template}]
    if channel is not None:
        resource_claims.append({"name": "channel", "resourceClaimTemplateName": channel})
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "resourceClaims": resource_claims,
        "containers": [{
            "name": "worker", "image": "registry.invalid/nexus/worker:e2e",
            "resources": {"requests": {"cpu": "8", "memory": "32Gi"},
                          "claims": [{"name": c["name"]} for c in resource_claims]},
        }],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    batch.create_namespaced_job(ns, {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: QUEUE}},
        "spec": {
            "parallelism": pods, "completions": pods, "completionMode": "Indexed",
            "template": {"metadata": {"annotations": annotations}, "spec": spec},
        },
    })


def claims(custom: client.CustomObjectsApi, ns: str | None = None) -> list[dict[str, Any]]:
    if ns is None:
        return custom.list_cluster_custom_object(*RESOURCE, "resourceclaims")["items"]
    return custom.list_namespaced_custom_object(*RESOURCE, ns, "resourceclaims")["items"]


def claim_devices(claim: Mapping[str, Any], driver: str | None = DRIVER
                  ) -> list[tuple[str, str]]:
    """(node, device) of every device of `driver` (None: any) the claim's allocation holds
    (the pool is the node)."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return [(r["pool"], r["device"]) for r in (alloc.get("devices") or {}).get("results") or []
            if driver is None or r.get("driver") == driver]


def allocated_devices(custom: client.CustomObjectsApi, nodes: Iterable[str],
                      driver: str | None = DRIVER) -> list[tuple[str, str]]:
    names = set(nodes)
    return [d for c in claims(custom) for d in claim_devices(c, driver) if d[0] in names]


def running_pods(core: client.CoreV1Api, ns: str, job: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(ns, label_selector=f"job-name={job}").items
    return [p for p in pods if p.status.phase == "Running" and p.spec.node_name]


def events(core: client.CoreV1Api, ns: str, reason: str) -> list[client.CoreV1Event]:
    return [e for e in core.list_namespaced_event(ns).items if e.reason == reason]


def retried(core: client.CoreV1Api, ns: str) -> set[str]:
    """Workloads nexus answered Retry (its Event on the Workload)."""
    return {e.involved_object.name for e in events(core, ns, "PlacementRetry")}
