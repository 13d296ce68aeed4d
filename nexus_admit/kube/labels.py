"""Every label, annotation and API name nexus-admit reads or writes, defined once.

ARCHITECTURE §4 is the contract for the `scheduling.kubenexus.io/...` keys. Node facts come
from NVIDIA GPU Feature Discovery (GFD), NodeResourceTopology and DRA; Kueue names come from
the `kueue.x-k8s.io/v1beta2` API.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ADMISSION_CHECK_CONTROLLER",
    "ANN_ATTEMPT",
    "ANN_COMPUTE_DOMAIN",
    "ANN_DRAIN",
    "ANN_GPU_FRACTION",
    "ANN_GPU_MEMORY",
    "ANN_NUMA_POLICY",
    "ANN_NUMA_ZONE",
    "ANN_POD_LABEL",
    "ANN_PREEMPTS",
    "ANN_PREFERRED_TOPOLOGY",
    "ANN_REQUIRED_TOPOLOGY",
    "ANN_SLOT",
    "ANN_WORKLOAD_TYPE",
    "API_GROUP",
    "API_VERSION",
    "DRA_API_GROUP",
    "DRA_ATTR_INDEX",
    "DRA_ATTR_NUMA_NODE",
    "DRA_ATTR_PCIE_ROOT",
    "DRA_ATTR_PRODUCT",
    "DRA_ATTR_TYPE",
    "DRA_CAP_MEMORY",
    "DRA_CD_CHANNEL_CLASS",
    "DRA_GPU_DRIVER",
    "GATE_PLACEMENT",
    "GFD_GPU_CLIQUE",
    "GFD_GPU_COUNT",
    "GFD_GPU_MEMORY",
    "GFD_GPU_PRODUCT",
    "GFD_GPU_REPLICAS",
    "GPU_RESOURCE",
    "GROUP_VERSION",
    "HOSTNAME_LABEL",
    "KIND_PLACEMENT_CONFIG",
    "KIND_RESOURCE_RESERVATION",
    "KUEUE_API_GROUP",
    "KUEUE_API_VERSION",
    "KUEUE_ELASTIC_JOB",
    "KUEUE_GROUP_VERSION",
    "KUEUE_PODSET_GROUP_NAME",
    "KUEUE_PODSET_LABEL",
    "KUEUE_PODSET_PREFERRED_TOPOLOGY",
    "KUEUE_PODSET_REQUIRED_TOPOLOGY",
    "KUEUE_POD_GROUP_SERVING",
    "KUEUE_QUEUE_NAME_LABEL",
    "KUEUE_WORKLOAD_ANNOTATION",
    "KUEUE_WORKLOAD_SLICE_REPLACES",
    "LABEL_BORROWED",
    "LABEL_NUMA_ZONES",
    "LABEL_RESERVATION",
    "LABEL_TIER",
    "NRT_API_GROUP",
    "NRT_API_VERSION",
    "NRT_ZONE_TYPE_NODE",
    "ZONE_LABEL",
]

# ---- our API ----
API_GROUP: Final = "scheduling.kubenexus.io"
API_VERSION: Final = "v1alpha1"
GROUP_VERSION: Final = f"{API_GROUP}/{API_VERSION}"
KIND_RESOURCE_RESERVATION: Final = "ResourceReservation"
KIND_PLACEMENT_CONFIG: Final = "PlacementConfig"
# AdmissionCheck.spec.controllerName of the nexus placement check
ADMISSION_CHECK_CONTROLLER: Final = "kubenexus.io/placement"

_P: Final = f"{API_GROUP}/"

# ---- labels and annotations of ARCHITECTURE §4 ----
LABEL_TIER: Final = _P + "tier"  # ClusterQueue label, admin-owned
ANN_GPU_MEMORY: Final = _P + "gpu-memory"  # pod template: VRAM per GPU, a quantity
ANN_WORKLOAD_TYPE: Final = _P + "workload-type"  # pod template: training|inference|batch|service
ANN_REQUIRED_TOPOLOGY: Final = _P + "required-topology"  # pod template: a level label key
ANN_PREFERRED_TOPOLOGY: Final = _P + "preferred-topology"  # pod template: a level label key
ANN_NUMA_POLICY: Final = _P + "numa-policy"  # pod template: single-numa-node|preferred|none
LABEL_RESERVATION: Final = _P + "reservation"  # pod label (podSetUpdates): the RR name
ANN_PREEMPTS: Final = _P + "preempts"  # preemptor's RR: victims (JSON, workload + RR)
ANN_DRAIN: Final = _P + "drain"  # preemptor's RR: "true" when it waits, evicting nothing
LABEL_BORROWED: Final = _P + "borrowed"  # RR on a higher tier's hardware: "true"
ANN_SLOT: Final = _P + "slot"  # pod (webhook): "<podSet>/<index>" of the RR slot it holds
ANN_NUMA_ZONE: Final = _P + "numa-zone"  # pod (webhook): NUMA zone id given to the pod

# ---- additions (not in §4's table; documented in kube/translate.py) ----
# ResourceReservation: the Workload's quota reservation this placement was made for
ANN_ATTEMPT: Final = _P + "attempt"
# pod scheduling gate: the webhook adds it, the ungater removes it once the pod has a slot
GATE_PLACEMENT: Final = _P + "placement"
# pod template / pod: the share of ONE GPU the pod uses, "0.25" or "250m" (pod requests
# nvidia.com/gpu: 1). Without it every nvidia.com/gpu unit is a whole device.
ANN_GPU_FRACTION: Final = _P + "gpu-fraction"
# Node label fallback for NUMA when no NodeResourceTopology exists: number of NUMA zones;
# GPUs and CPUs are split evenly by index order.
LABEL_NUMA_ZONES: Final = _P + "numa-zones"

# ResourceReservation of a Workload slice: the reservation label its pods carry when that
# is not its own name (a Job's template is stamped once: every slice's pods keep the label
# of the first slice's reservation)
ANN_POD_LABEL: Final = _P + "pod-label"

# ---- node facts ----
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
GPU_RESOURCE: Final = "nvidia.com/gpu"
GFD_GPU_PRODUCT: Final = "nvidia.com/gpu.product"
GFD_GPU_MEMORY: Final = "nvidia.com/gpu.memory"  # MiB per GPU
GFD_GPU_COUNT: Final = "nvidia.com/gpu.count"  # physical devices
GFD_GPU_CLIQUE: Final = "nvidia.com/gpu.clique"  # NVLink domain across nodes
GFD_GPU_REPLICAS: Final = "nvidia.com/gpu.replicas"  # time-slicing/MPS replicas per device

# NodeResourceTopology
NRT_API_GROUP: Final = "topology.node.k8s.io"
NRT_API_VERSION: Final = "v1alpha2"
NRT_ZONE_TYPE_NODE: Final = "Node"

# DRA ResourceSlices of the NVIDIA driver
DRA_API_GROUP: Final = "resource.k8s.io"
DRA_GPU_DRIVER: Final = "gpu.nvidia.com"
DRA_ATTR_TYPE: Final = "type"  # "gpu" | "mig" | ...
DRA_ATTR_PRODUCT: Final = "productName"
DRA_ATTR_INDEX: Final = "index"
DRA_ATTR_PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
DRA_ATTR_NUMA_NODE: Final = "numaNode"  # honoured when a driver publishes it
DRA_CAP_MEMORY: Final = "memory"
# ComputeDomains (multi-node NVLink): the DeviceClass of a ComputeDomain's channel, which the
# ResourceClaimTemplate NVIDIA's ComputeDomain controller creates for its pods asks for
DRA_CD_CHANNEL_CLASS: Final = "compute-domain-default-channel.nvidia.com"
# ResourceReservation: the ComputeDomain (its channel template, "namespace/name") the gang
# shares: at most one ComputeDomain per NVLink clique
ANN_COMPUTE_DOMAIN: Final = _P + "compute-domain"

# ---- Kueue ----
KUEUE_API_GROUP: Final = "kueue.x-k8s.io"
KUEUE_API_VERSION: Final = "v1beta2"
KUEUE_GROUP_VERSION: Final = f"{KUEUE_API_GROUP}/{KUEUE_API_VERSION}"
KUEUE_QUEUE_NAME_LABEL: Final = "kueue.x-k8s.io/queue-name"
KUEUE_WORKLOAD_ANNOTATION: Final = "kueue.x-k8s.io/workload"
# on an elastic Job and each of its Workload slices: "true"
KUEUE_ELASTIC_JOB: Final = "kueue.x-k8s.io/elastic-job"
# on a Workload slice of an elastic Job: "namespace/name" of the slice it replaces
KUEUE_WORKLOAD_SLICE_REPLACES: Final = "kueue.x-k8s.io/workload-slice-replacement-for"
# on the pods Kueue starts: the pod set of its Workload they belong to
KUEUE_PODSET_LABEL: Final = "kueue.x-k8s.io/podset"
KUEUE_PODSET_REQUIRED_TOPOLOGY: Final = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PODSET_PREFERRED_TOPOLOGY: Final = "kueue.x-k8s.io/podset-preferred-topology"
# pod template annotation (Kueue copies it to topologyRequest.podSetGroupName): co-location
KUEUE_PODSET_GROUP_NAME: Final = "kueue.x-k8s.io/podset-group-name"
# on the pods (and Workload pod templates) of a serving pod group: StatefulSet, LWS
KUEUE_POD_GROUP_SERVING: Final = "kueue.x-k8s.io/pod-group-serving"
