"""Pure domain types of nexus-admit: no I/O, no Kubernetes client."""

from nexus_admit.model.cluster import GPU_WHOLE, ClusterSnapshot, Node, NumaZone, Taint
from nexus_admit.model.config import (
    DEFAULT_LEVELS,
    HOSTNAME_LABEL,
    HardwareClass,
    ObjectiveWeights,
    PlacementConfig,
    SolverSettings,
    Tier,
    TopologySpec,
    VramThreshold,
)
from nexus_admit.model.decision import (
    Assignment,
    Fit,
    Placement,
    Slot,
    SolveStatus,
    apply_slots,
    fit_pod,
    pod_capacity,
    release_slots,
)
from nexus_admit.model.gang import (
    Gang,
    NodeSelectorRequirement,
    NumaPolicy,
    PodSet,
    Toleration,
    WorkloadType,
)
from nexus_admit.model.topology import Domain, domain_at, domain_path

__all__ = [
    "DEFAULT_LEVELS",
    "GPU_WHOLE",
    "HOSTNAME_LABEL",
    "Assignment",
    "ClusterSnapshot",
    "Domain",
    "Fit",
    "Gang",
    "HardwareClass",
    "Node",
    "NodeSelectorRequirement",
    "NumaPolicy",
    "NumaZone",
    "ObjectiveWeights",
    "Placement",
    "PlacementConfig",
    "PodSet",
    "Slot",
    "SolveStatus",
    "SolverSettings",
    "Taint",
    "Tier",
    "Toleration",
    "TopologySpec",
    "VramThreshold",
    "WorkloadType",
    "apply_slots",
    "domain_at",
    "domain_path",
    "fit_pod",
    "pod_capacity",
    "release_slots",
]
