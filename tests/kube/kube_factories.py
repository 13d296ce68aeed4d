"""Small builders for Kubernetes objects (plain dicts) used by the kube/ and cli/ tests."""

from __future__ import annotations

from typing import Any

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def node(
    name: str,
    *,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: str = "110",
    gpus: int = 8,
    product: str = "NVIDIA-H100-80GB-HBM3",
    gpu_memory: int | str | None = 81559,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, Any]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    lab = {"kubernetes.io/hostname": name}
    if gpus:
        lab["nvidia.com/gpu.product"] = product
        lab["nvidia.com/gpu.count"] = str(gpus)
        if gpu_memory is not None:
            lab["nvidia.com/gpu.memory"] = str(gpu_memory)
    lab.update(labels or {})
    alloc: dict[str, Any] = {"cpu": cpu, "memory": memory, "pods": pods}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": lab},
        "spec": spec,
        "status": {"allocatable": alloc, "capacity": dict(alloc)},
    }


def container(
    cpu: str | None = "1",
    memory: str | None = "1Gi",
    gpus: int = 0,
    limits_only: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    req: dict[str, Any] = {}
    if cpu is not None:
        req["cpu"] = cpu
    if memory is not None:
        req["memory"] = memory
    res: dict[str, Any] = {"limits": dict(req)} if limits_only else {"requests": req}
    if gpus:
        res.setdefault("limits", {})["nvidia.com/gpu"] = str(gpus)
    return {"name": "c", "image": "busybox", "resources": res, **extra}


def pod(
    name: str,
    node_name: str | None,
    *,
    namespace: str = "default",
    cpu: str = "1",
    memory: str = "1Gi",
    gpus: int = 0,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    spec_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container(cpu, memory, gpus)]}
    if node_name:
        spec["nodeName"] = node_name
    spec.update(spec_extra or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def nrt(
    name: str, zones: list[tuple[str, int]], available: list[str] | None = None
) -> dict[str, Any]:
    """zones: (cpu allocatable, gpus) per zone."""
    out = []
    for i, (cpu, gpus) in enumerate(zones):
        res = [
            {
                "name": "cpu",
                "capacity": cpu,
                "allocatable": cpu,
                "available": (available or [cpu] * len(zones))[i],
            }
        ]
        if gpus:
            res.append(
                {
                    "name": "nvidia.com/gpu",
                    "capacity": str(gpus),
                    "allocatable": str(gpus),
                    "available": str(gpus),
                }
            )
        out.append({"name": f"node-{i}", "type": "Node", "resources": res})
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "zones": out,
    }


def reservation(
    name: str,
    workload: str,
    slots: list[dict[str, Any]],
    *,
    namespace: str = "default",
    pod_set: str = "main",
    cpu: str = "4",
    memory: str = "16Gi",
    gpu_share: str = "1",
    phase: str = "Reserved",
    expires_at: str | None = "2099-01-01T00:00:00Z",
    requests: bool = True,
) -> dict[str, Any]:
    ps: dict[str, Any] = {"name": pod_set, "slots": slots, "gpuShare": gpu_share}
    if requests:
        ps["requests"] = {"cpu": cpu, "memory": memory}
    spec: dict[str, Any] = {
        "workloadRef": {"name": workload, "namespace": namespace},
        "podSets": [ps],
    }
    if expires_at:
        spec["expiresAt"] = expires_at
    return {
        "apiVersion": "scheduling.kubenexus.io/v1alpha1",
        "kind": "ResourceReservation",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
        "status": {"phase": phase},
    }


def pod_set(
    name: str = "main",
    count: int = 1,
    *,
    cpu: str = "4",
    memory: str = "16Gi",
    gpus: int = 1,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    spec_extra: dict[str, Any] | None = None,
    topology_request: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container(cpu, memory, gpus)]}
    spec.update(spec_extra or {})
    ps: dict[str, Any] = {
        "name": name,
        "count": count,
        "template": {
            "metadata": {"annotations": annotations or {}, "labels": labels or {}},
            "spec": spec,
        },
    }
    if topology_request:
        ps["topologyRequest"] = topology_request
    return ps


def workload(
    name: str,
    pod_sets: list[dict[str, Any]],
    *,
    namespace: str = "default",
    queue: str = "q",
    cluster_queue: str | None = "cq",
    owner_kind: str | None = "Job",
    flavors: dict[str, str] | None = None,
    check: str = "nexus",
    check_state: str = "Pending",
    conditions: dict[str, str] | None = None,
    created: str = "2025-05-01T10:00:00Z",
    active: bool | None = True,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    conds = {"QuotaReserved": "True"} if conditions is None else conditions
    status: dict[str, Any] = {
        "conditions": [{"type": t, "status": s} for t, s in conds.items()],
        "admissionChecks": [{"name": check, "state": check_state, "message": ""}],
    }
    if cluster_queue:
        status["admission"] = {
            "clusterQueue": cluster_queue,
            "podSetAssignments": [
                {"name": ps["name"], "flavors": dict(flavors or {}), "count": ps["count"]}
                for ps in pod_sets
            ],
        }
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "creationTimestamp": created,
        "uid": f"uid-{name}",
        "labels": labels or {},
    }
    if owner_kind:
        meta["ownerReferences"] = [
            {"apiVersion": "x/v1", "kind": owner_kind, "name": name, "uid": "u", "controller": True}
        ]
    spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets}
    if active is not None:
        spec["active"] = active
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": meta,
        "spec": spec,
        "status": status,
    }


def cluster_queue(name: str, tier: str | None = None) -> dict[str, Any]:
    labels = {"scheduling.kubenexus.io/tier": tier} if tier else {}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
    }


def local_queue(namespace: str, name: str, cq: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cq},
    }


def flavor(
    name: str,
    node_labels: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if node_labels:
        spec["nodeLabels"] = node_labels
    if tolerations:
        spec["tolerations"] = tolerations
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": spec,
    }


def admission_check(
    name: str = "nexus", controller: str = "kubenexus.io/placement"
) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": name},
        "spec": {"controllerName": controller},
    }


def topology_assignment(
    pods_per_node: dict[str, int], levels: tuple[str, ...] = ("kubernetes.io/hostname",)
) -> dict[str, Any]:
    """A v1beta2 `topologyAssignment`: one slice, individual values and pod counts (higher
    levels, if any, a universal "x")."""
    names = list(pods_per_node)
    values: list[dict[str, Any]] = [{"universal": "x"} for _ in levels[:-1]]
    values.append({"individual": {"roots": names}})
    return {"levels": list(levels), "slices": [{
        "domainCount": len(names), "valuesPerLevel": values,
        "podCounts": {"individual": [pods_per_node[n] for n in names]}}]}


def tas_workload(
    name: str,
    pods_per_node: dict[str, int],
    *,
    gpus: int = 2,
    cpu: str = "4",
    conditions: dict[str, str] | None = None,
    pod_set_name: str = "main",
    others: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Workload Kueue TAS admitted: pod set `pod_set_name` on the nodes given (pods per
    node); `others`: more pod sets without a topology assignment."""
    count = sum(pods_per_node.values())
    wl = workload(name, [pod_set(pod_set_name, count, cpu=cpu, gpus=gpus), *(others or [])],
                  check="tas-gate", conditions=conditions)
    psa = wl["status"]["admission"]["podSetAssignments"][0]
    psa["topologyAssignment"] = topology_assignment(pods_per_node)
    return wl


def tas_pod(
    name: str, node_name: str | None, workload_name: str, *, pod_set_name: str = "main",
    gpus: int = 2, cpu: str = "4", phase: str = "Running",
) -> dict[str, Any]:
    """A pod Kueue started for a TAS Workload (its annotation and pod set label)."""
    return pod(name, node_name, gpus=gpus, cpu=cpu, memory="16Gi", phase=phase,
               labels={"kueue.x-k8s.io/podset": pod_set_name},
               annotations={"kueue.x-k8s.io/workload": workload_name})
