"""The test objects every e2e test and the benchmark build: Jobs, LocalQueues,
ClusterQueues, AdmissionChecks, and the label and annotation keys, taken from
`nexus_admit.kube.labels` so that a key the controller reads and the key a test writes can
never differ.

Why one module: each test file used to spell these out again (the LocalQueue body twelve
times, a GPU Job six, a ClusterQueue nine), and a field added to one copy was missing from
the others.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from nexus_admit.kube import labels as L

__all__ = [
    "CHECK",
    "GATE",
    "GPU",
    "KUEUE_GROUP",
    "KUEUE_VERSION",
    "NUMA_ZONE",
    "QUEUE_LABEL",
    "RESERVATION",
    "RR_GROUP",
    "RR_PLURAL",
    "RR_VERSION",
    "SLOT",
    "TIER_LABEL",
    "active_status",
    "admission_check",
    "cluster_queue",
    "create_local_queue",
    "flavor_quota",
    "job",
    "local_queue",
]

KUEUE_GROUP, KUEUE_VERSION = L.KUEUE_API_GROUP, L.KUEUE_API_VERSION
QUEUE_LABEL = L.KUEUE_QUEUE_NAME_LABEL
GPU = L.GPU_RESOURCE
RR_GROUP, RR_VERSION, RR_PLURAL = L.API_GROUP, L.API_VERSION, "resourcereservations"
RESERVATION = L.LABEL_RESERVATION
SLOT = L.ANN_SLOT
NUMA_ZONE = L.ANN_NUMA_ZONE
GATE = L.GATE_PLACEMENT
TIER_LABEL = L.LABEL_TIER
# the AdmissionCheck the plane's manifests (e2e/manifests/nexus.yaml) create
CHECK = "nexus-placement"
# never pulled: KWOK plays the kubelets
WORKER_IMAGE = "registry.invalid/nexus/worker:e2e"


def local_queue(
    name: str, namespace: str | None, cluster_queue: str, stop_policy: str | None = None
) -> dict[str, Any]:
    """A LocalQueue `name` pointing at `cluster_queue` (`namespace` None: the namespace the
    create call names)."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    spec: dict[str, Any] = {"clusterQueue": cluster_queue}
    if stop_policy is not None:
        spec["stopPolicy"] = stop_policy
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "LocalQueue",
        "metadata": metadata,
        "spec": spec,
    }


def flavor_quota(
    flavor: str, gpus: int | str = 64, *, cpu: str = "1000", memory: str = "10000Gi"
) -> dict[str, Any]:
    """One flavor's nominal quota of CPU, memory and GPUs in a ClusterQueue."""
    return {"name": flavor, "resources": [
        {"name": "cpu", "nominalQuota": cpu},
        {"name": "memory", "nominalQuota": memory},
        {"name": GPU, "nominalQuota": str(gpus)}]}


def cluster_queue(
    name: str,
    checks: list[str],
    flavors: list[dict[str, Any]],
    *,
    tier: str | None = None,
) -> dict[str, Any]:
    """A ClusterQueue over every namespace with the AdmissionChecks `checks`, one resource
    group covering CPU, memory and GPUs with `flavors` (`flavor_quota`), labelled with
    nexus-admit's `tier` when given."""
    metadata: dict[str, Any] = {"name": name}
    if tier is not None:
        metadata["labels"] = {TIER_LABEL: tier}
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "ClusterQueue",
        "metadata": metadata,
        "spec": {
            "namespaceSelector": {},
            "admissionChecksStrategy": {"admissionChecks": [{"name": c} for c in checks]},
            "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU], "flavors": flavors}],
        },
    }


def admission_check(
    name: str, controller: str, parameters: dict[str, str] | None = None
) -> dict[str, Any]:
    """An AdmissionCheck of `controller` (with its `parameters` reference, when given)."""
    spec: dict[str, Any] = {"controllerName": controller}
    if parameters is not None:
        spec["parameters"] = parameters
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "AdmissionCheck",
        "metadata": {"name": name},
        "spec": spec,
    }


def active_status(reason: str, message: str, when: str) -> dict[str, Any]:
    """An AdmissionCheck's status with Active=True, as its controller writes it (a test
    writes it for a check no controller runs, or Kueue deactivates the queues using it)."""
    return {"status": {"conditions": [{
        "type": "Active", "status": "True", "reason": reason, "message": message,
        "lastTransitionTime": when}]}}


def create_local_queue(
    custom: client.CustomObjectsApi,
    namespace: str,
    name: str,
    cluster_queue: str,
    stop_policy: str | None = None,
) -> dict[str, Any]:
    """Create `local_queue(...)` in `namespace`; the created object."""
    body = local_queue(name, namespace, cluster_queue, stop_policy)
    created: dict[str, Any] = custom.create_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, namespace, "localqueues", body
    )
    return created


def job(
    name: str,
    queue: str,
    pods: int,
    gpus: int,
    *,
    cpu: str = "8",
    memory: str = "32Gi",
    annotations: dict[str, str] | None = None,
    template_labels: dict[str, str] | None = None,
    indexed: bool = True,
    backoff_limit: int | None = 0,
    affinity: client.V1Affinity | None = None,
    container_name: str = "worker",
) -> client.V1Job:
    """A Job of `pods` pods (parallelism = completions) in LocalQueue `queue`, each asking
    `gpus` whole GPUs, `cpu` and `memory` (`backoff_limit` None: Kubernetes' default)."""
    container = client.V1Container(
        name=container_name,
        image=WORKER_IMAGE,
        resources=client.V1ResourceRequirements(
            requests={"cpu": cpu, "memory": memory, GPU: str(gpus)}, limits={GPU: str(gpus)}
        ),
    )
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels={QUEUE_LABEL: queue}),
        spec=client.V1JobSpec(
            parallelism=pods,
            completions=pods,
            completion_mode="Indexed" if indexed else "NonIndexed",
            backoff_limit=backoff_limit,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(
                    labels=template_labels, annotations=annotations or {}
                ),
                spec=client.V1PodSpec(
                    restart_policy="Never", containers=[container], affinity=affinity
                ),
            ),
        ),
    )
