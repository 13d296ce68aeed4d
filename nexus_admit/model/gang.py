"""What is asked for: a gang of pod sets that must be placed all at once."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from nexus_admit.model.cluster import GPU_WHOLE, Node, Taint

__all__ = [
    "Gang",
    "NodeSelectorRequirement",
    "NumaPolicy",
    "PodSet",
    "SpreadRule",
    "Toleration",
    "WorkloadType",
]


class WorkloadType(enum.StrEnum):
    TRAINING = "training"
    BATCH = "batch"
    INFERENCE = "inference"
    SERVICE = "service"

    @property
    def packs(self) -> bool:
        """Training and batch pack tightly; inference and services spread."""
        return self in (WorkloadType.TRAINING, WorkloadType.BATCH)


class NumaPolicy(enum.StrEnum):
    SINGLE_NUMA_NODE = "single-numa-node"
    PREFERRED = "preferred"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str | None = None  # None with operator Exists tolerates every taint
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str | None = None  # None matches every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect is not None and self.effect != taint.effect:
            return False
        if self.key is None:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True, slots=True)
class NodeSelectorRequirement:
    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op in ("Gt", "Lt"):
            if value is None or len(self.values) != 1:
                return False
            try:
                left, right = int(value), int(self.values[0])
            except ValueError:
                return False
            return left > right if op == "Gt" else left < right
        raise ValueError(f"unknown node selector operator {op!r}")


@dataclass(frozen=True, slots=True)
class PodSet:
    """`count` identical pods. Each pod takes `gpus` GPUs at `gpu_milli` share of each:
    `gpu_milli` < 1000 (shared GPU) only with `gpus == 1`."""

    name: str
    count: int
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    gpu_milli: int = GPU_WHOLE
    vram_mib: int = 0  # VRAM needed per GPU; 0 = not stated
    tolerations: tuple[Toleration, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # required node affinity: OR of terms, each an AND of requirements
    affinity_terms: tuple[tuple[NodeSelectorRequirement, ...], ...] = ()
    # None = any node; otherwise only these (the nodes of the flavors Kueue assigned)
    allowed_nodes: frozenset[str] | None = None
    # pods carry an index (completion index, rank): neighbours should be neighbours
    indexed: bool = False
    # What this pod set itself asks for; None = follow the gang (see `Gang.level_of`).
    # The engine's soft terms read the gang-wide values; a required level is enforced.
    required_level: str | None = None
    preferred_level: str | None = None
    workload_type: WorkloadType | None = None
    # Kueue's podset-group-name: a group's pod sets share their required level (and a
    # GPU-less member of a group with GPU pod sets is bound like them)
    group: str | None = None
    # the ComputeDomain (its channel's ResourceClaimTemplate, "namespace/name") whose
    # multi-node NVLink channel the pods share: they must all be inside one NVLink clique
    # (the translation makes `required_level` the clique or a level under it)
    compute_domain: str | None = None

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"pod set {self.name!r}: count must be at least 1")
        if min(self.cpu_milli, self.memory_mib, self.gpus, self.vram_mib) < 0:
            raise ValueError(f"pod set {self.name!r}: negative request")
        if not 0 < self.gpu_milli <= GPU_WHOLE:
            raise ValueError(f"pod set {self.name!r}: gpu share must be in (0, 1000] milli")
        if self.gpu_milli < GPU_WHOLE and self.gpus != 1:
            raise ValueError(f"pod set {self.name!r}: a shared GPU fraction needs exactly 1 GPU")

    @property
    def fractional(self) -> bool:
        return self.gpus == 1 and self.gpu_milli < GPU_WHOLE

    @property
    def whole_gpus(self) -> int:
        """Whole GPUs per pod (0 for a fractional pod)."""
        return 0 if self.fractional else self.gpus

    @property
    def gpu_milli_per_pod(self) -> int:
        return self.gpus * self.gpu_milli

    def tolerates(self, node: Node) -> bool:
        return all(
            any(t.tolerates(taint) for t in self.tolerations)
            for taint in node.taints
            if taint.effect in ("NoSchedule", "NoExecute")
        )

    def selects(self, node: Node) -> bool:
        labels = node.labels
        if any(labels.get(k) != v for k, v in self.node_selector.items()):
            return False
        if self.affinity_terms and not any(
            all(req.matches(labels) for req in term) for term in self.affinity_terms
        ):
            return False
        return True

    def static_fit(self, node: Node) -> str | None:
        """Why this pod set can never run on `node` regardless of load, or None if it can."""
        if not node.schedulable:
            return "unschedulable"
        if self.allowed_nodes is not None and node.name not in self.allowed_nodes:
            return "outside assigned flavor"
        if not self.tolerates(node):
            return "untolerated taint"
        if not self.selects(node):
            return "selector/affinity"
        return self.shape_fit(node)

    def shape_fit(self, node: Node) -> str | None:
        """Why `node`'s shape (GPUs, VRAM per GPU, CPU, memory) can never hold one pod of
        this set, whatever its state, labels or taints; None if it can."""
        if self.gpus:
            if node.gpu_count < self.gpus:
                return "too few GPUs"
            if self.vram_mib and node.gpu_memory_mib < self.vram_mib:
                return "GPU VRAM too small"
        if self.cpu_milli > node.cpu_milli or self.memory_mib > node.memory_mib:
            return "node too small"
        return None


@dataclass(frozen=True, slots=True)
class SpreadRule:
    """A hard limit on how the pods of the gang's service (its own pods and the siblings
    already placed) share the domains of one topology level (the hostname: nodes): in
    every domain the gang puts pods in, at most `max_per_domain` of the service, and/or at
    most `max_skew` more than in the least-loaded domain the gang may use (its pod sets'
    candidate nodes)."""

    level: str  # a topology level label key
    max_skew: int | None = None
    max_per_domain: int | None = None

    def __post_init__(self) -> None:
        if self.max_skew is None and self.max_per_domain is None:
            raise ValueError(f"spread rule on {self.level!r} limits nothing")
        if min(self.max_skew or 1, self.max_per_domain or 1) < 1:
            raise ValueError(f"spread rule on {self.level!r}: limits must be at least 1")


@dataclass(frozen=True, slots=True)
class Gang:
    """One Kueue Workload: all its pod sets are placed together or not at all."""

    name: str  # "namespace/name"
    pod_sets: tuple[PodSet, ...]
    tier: str = "bronze"
    workload_type: WorkloadType = WorkloadType.BATCH
    required_level: str | None = None  # all pods inside one domain of this level
    preferred_level: str | None = None  # as few domains of this level as possible
    numa_policy: NumaPolicy = NumaPolicy.PREFERRED
    # how long the workload has waited so far (creation to now; the simulator: since
    # arrival): PlacementConfig.localityWait holds a gang back only this long
    waited_seconds: float = 0.0
    # Serving: the set of replicas this gang belongs to (a Deployment, a StatefulSet...),
    # and where that set's other pods already run (node -> pods); spreading types count
    # them in their spread term, and `spread_rules` count them too.
    service: str | None = None
    siblings: Mapping[str, int] = field(default_factory=dict)
    spread_rules: tuple[SpreadRule, ...] = ()
    # NVLink cliques other ComputeDomains hold: at most one ComputeDomain per clique, so the
    # gang's ComputeDomain pod sets keep out of them
    closed_cliques: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.pod_sets:
            raise ValueError(f"gang {self.name!r} has no pod sets")
        names = [p.name for p in self.pod_sets]
        if len(set(names)) != len(names):
            raise ValueError(f"gang {self.name!r}: duplicate pod set names {names}")
        domains = {p.compute_domain for p in self.pod_sets} - {None}
        if len(domains) > 1:
            raise ValueError(
                f"gang {self.name!r}: pod sets share different ComputeDomains "
                f"{sorted(d for d in domains if d)}; one gang may use one"
            )
        if any(p.compute_domain and p.required_level is None for p in self.pod_sets):
            raise ValueError(
                f"gang {self.name!r}: a ComputeDomain pod set needs a required level "
                "(the NVLink clique or one under it)"
            )

    @property
    def compute_domain(self) -> str | None:
        """The ComputeDomain its pod sets share, if any (at most one per gang)."""
        return next((p.compute_domain for p in self.pod_sets if p.compute_domain), None)

    @property
    def pod_count(self) -> int:
        return sum(p.count for p in self.pod_sets)

    @property
    def uses_gpus(self) -> bool:
        return any(p.gpus for p in self.pod_sets)

    def _mates(self, pod_set: PodSet) -> list[PodSet]:
        """The pod sets of `pod_set`'s podset group (itself alone without a group)."""
        if pod_set.group is None:
            return [pod_set]
        return [p for p in self.pod_sets if p.group == pod_set.group]

    def follows_gang(self, pod_set: PodSet) -> bool:
        """Whether the gang-wide `required_level` binds this pod set: neither it nor its
        group states a level of its own, and it (or its group) has GPUs or the whole gang
        has none. A GPU-less pod set beside GPU pod sets (a JobSet driver, a Ray head) is
        free: it does not drag the gang's domain."""
        mates = self._mates(pod_set)
        if any(p.required_level is not None for p in mates):
            return False
        return any(p.gpus for p in mates) or not self.uses_gpus

    def level_of(self, pod_set: PodSet) -> str | None:
        """The level inside one domain of which this pod set's pods must all be: its own
        (or its group's) stated level, else the gang's when it follows the gang, else none."""
        for p in self._mates(pod_set):
            if p.required_level is not None:
                return p.required_level
        return self.required_level if self.follows_gang(pod_set) else None

    def required_domains(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(level, pod set names): the pod sets bound to each required level share one
        domain of it. A gang whose pod sets all follow it has one entry naming them all."""
        by_level: dict[str, list[str]] = {}
        for p in self.pod_sets:
            level = self.level_of(p)
            if level is not None:
                by_level.setdefault(level, []).append(p.name)
        return tuple((level, tuple(names)) for level, names in by_level.items())

    @property
    def gpu_milli(self) -> int:
        return sum(p.count * p.gpu_milli_per_pod for p in self.pod_sets)
