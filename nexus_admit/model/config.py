"""PlacementConfig: everything an admin may tune, as the spec of the PlacementConfig CRD.

The field names in camelCase are a public contract (ARCHITECTURE §4): users write them in
YAML. Python code uses the snake_case attribute names; pydantic maps between the two.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

__all__ = [
    "DEFAULT_LEVELS",
    "HOSTNAME_LABEL",
    "HardwareClass",
    "LocalityWait",
    "ObjectiveWeights",
    "PlacementConfig",
    "Preemption",
    "PreemptionWeights",
    "SolverSettings",
    "SpreadWeights",
    "Tier",
    "TopologySpec",
    "VramThreshold",
]

HOSTNAME_LABEL = "kubernetes.io/hostname"
DEFAULT_LEVELS: tuple[str, ...] = ("topology.kubernetes.io/zone", HOSTNAME_LABEL)

# Upper bounds on every field. A config is written by an admin, but one value past what the
# controller can compute with (a TTL of 1e12 s overflows a datetime on every pass; a weight
# of 1e20 overflows CP-SAT's 64-bit objective) would stop placement for everyone, so the
# model and the CRD (generated from it) refuse it up front. The bounds sit far above any
# sensible setting and leave the defaults and the engine's tuning untouched.
MAX_WEIGHT = 1_000_000
MAX_CLASS_COST = 100_000
DAY_SECONDS = 86_400
WEEK_SECONDS = 7 * DAY_SECONDS

# A tier or hardware class name: a Kubernetes label value (a ClusterQueue's tier label).
Name = Annotated[str, Field(min_length=1, max_length=63)]
# A node label key: an optional DNS-subdomain prefix (253), "/", a name (63).
LabelKey = Annotated[str, Field(min_length=1, max_length=317)]
Weight = Annotated[int, Field(ge=0, le=MAX_WEIGHT)]


class _Spec(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
    )


class TopologySpec(_Spec):
    """Fabric levels, highest first. Either explicit label keys or a Kueue Topology name."""

    topology_name: str | None = Field(default=None, min_length=1, max_length=253)
    levels: tuple[LabelKey, ...] | None = Field(default=None, max_length=16)

    @model_validator(mode="after")
    def _one_of(self) -> TopologySpec:
        if self.topology_name and self.levels:
            raise ValueError("topology: set either topologyName or levels, not both")
        if self.levels is not None and len(self.levels) == 0:
            raise ValueError("topology.levels must name at least one node label")
        return self


class HardwareClass(_Spec):
    name: Name
    gpu_products: tuple[Annotated[str, Field(min_length=1, max_length=253)], ...] = Field(
        min_length=1, max_length=64
    )


class Tier(_Spec):
    name: Name
    # cost per GPU of this tier's work on each hardware class; a negative cost would reward
    # a mismatch (and drive the objective below zero), so it is refused
    class_costs: dict[Name, Annotated[int, Field(ge=0, le=MAX_CLASS_COST)]] = Field(
        default_factory=dict, max_length=64
    )
    # hard: this tier's GPU pods run only on these hardware classes (unset: on every class).
    # A gang then waits for room on them rather than run on another class.
    allowed_classes: tuple[Name, ...] | None = Field(default=None, min_length=1, max_length=64)


class VramThreshold(_Spec):
    """A pod of this tier should use at least `minUtilization` of each GPU's VRAM;
    VRAM left below that line is counted as stranded."""

    tier: Name
    min_utilization: float = Field(ge=0.0, le=1.0)


class ObjectiveWeights(_Spec):
    """Weights of the objective terms; each term is also reported on its own."""

    tier_mismatch: Weight = 10  # × class cost per GPU
    vram_stranded: Weight = 1  # per GiB of stranded VRAM
    island_broken: Weight = 2000  # per pristine island first touched
    domain_spread: Weight = 400  # per extra domain, × level rank
    # per level the gang is split across domains of, × level rank, × the gang's GPUs:
    # leaving one domain slows every GPU of the gang (Gavel measured consolidated against
    # spread, not per extra domain). Off by default: on the benchmark's large fleets the
    # node pruning does not yet keep the fewest-rack covers this weight asks for.
    gang_split: Weight = 0
    node_count: Weight = 50  # per node used (packing, training/batch)
    fragmentation: Weight = 20  # per partly used node left partly free
    # per GPU left free in the racks/ToRs a gang touches: Kueue TAS's BestFit over domains,
    # so later gangs still find whole racks (packing types and one-pod gangs)
    domain_fragmentation: Weight = 1
    numa_unaligned: Weight = 100  # per pod without single-NUMA fit
    spread: Weight = 300  # inference/service: pods on the busiest node
    # Engine-only placement-order preferences, off by default (see placement/fragmentation.py):
    # per GPU of fragmentation (FGD measure for the target workload) a gang adds,
    frag_gradient: Weight = 0
    # and per node used × its rank in [0, 1) in the cluster's node order (packing gangs).
    fill_order: Weight = 0


class SpreadWeights(_Spec):
    """The spread term of inference and service gangs (never of training or batch): per
    pair of pods of one service (a Deployment's replicas, a StatefulSet, an LWS group, or
    the gang alone) that share a node, and per pair that share a domain of each level above
    the host, counting the service's pods already placed. A pair in one rack usually also
    shares its block and zone, so higher levels weigh more on their own."""

    node: Weight = 2500  # above weights.islandBroken: replicas take a node each first
    domain: Weight = 100  # every topology level above the host not in `levels`
    levels: dict[LabelKey, Weight] = Field(default_factory=dict, max_length=16)

    def level_weight(self, level: str, hostname: bool) -> int:
        if hostname:
            return self.node
        return self.levels.get(level, self.domain)


class LocalityWait(_Spec):
    """Hold a gang back (Kueue Retry) for up to `maxWaitSeconds` rather than split it across
    domains of `level` while one domain of that level could hold it on an idle cluster:
    placed inside one domain as soon as one has room, split only after the wait. Spreading
    workload types (inference, service) without a preferred level are never held.

    Delay scheduling for locality: a gang split across the fabric runs slower for its whole
    life (Gavel measured 0.30-0.50 of consolidated throughput), which a short wait avoids."""

    level: LabelKey
    max_wait_seconds: float = Field(default=3600.0, ge=0.0, le=WEEK_SECONDS)


class PreemptionWeights(_Spec):
    """What evicting one running gang costs; the victim set with the least total is chosen."""

    victim: Weight = 1000  # per victim gang: fewest victims first
    lost_gpu_hour: Weight = 100  # per GPU-hour the victim has run so far
    tier: Weight = 500  # × how many tiers the victim ranks above the lowest
    priority: Weight = 1  # × the victim's priority (negatives count as 0)


class Preemption(_Spec):
    """Placement-level preemption, backfill and drain-to-fit (off unless `enabled`).

    Tiers are ranked by their order in `tiers` (first = highest). A gang of a lower tier
    placed on a hardware class that a higher tier owns (class cost 0 for that tier, above
    0 for the gang's) is *borrowed* capacity: allowed only while no Workload of the owning
    tier waits (`backfill`), and the first to go when the owner needs it back."""

    enabled: bool = False
    # tier -> the tiers it may evict, each ranked below it; unset: every lower tier
    may_evict: dict[Name, Annotated[tuple[Name, ...], Field(max_length=32)]] | None = Field(
        default=None, max_length=32
    )
    # "borrowed": only placements on a higher tier's hardware may be evicted; "any": every
    # running gang of an evictable tier
    victims: Literal["borrowed", "any"] = "borrowed"
    max_victims_per_gang: int = Field(default=4, ge=1, le=64)
    # a victim must have run this long (no thrashing of gangs that just started)
    min_run_seconds: float = Field(default=300.0, ge=0.0, le=WEEK_SECONDS)
    # at most this much work (GPU-hours run so far, all victims together) is thrown away
    # for one preemptor; unset: no limit
    max_lost_gpu_hours: float | None = Field(default=None, ge=0.0, le=1e9)
    # how long the preemptor's reservation holds the freed capacity for the victims' pods
    # to leave before the preemption is given up and the gang retried
    grace_period_seconds: float = Field(default=120.0, ge=0.0, le=DAY_SECONDS)
    # lower tiers borrow a higher tier's hardware only while that tier has nothing waiting
    backfill: bool = True
    # drain-to-fit: a gang waiting longer than this gets the cheapest domain to drain
    # (new placements avoid it until the gang fits); unset: off
    drain_after_seconds: float | None = Field(default=None, ge=0.0, le=WEEK_SECONDS)
    weights: PreemptionWeights = Field(default_factory=PreemptionWeights)


class SolverSettings(_Spec):
    time_limit_seconds: float = Field(default=1.0, gt=0.0, le=600.0)
    # One CP-SAT worker with the full LP relaxation proves these placements ~3x faster
    # than an 8-worker portfolio on 2 cores (see placement/engine.py); more workers run
    # the portfolio (worth it for long solves, e.g. the benchmark's reference).
    workers: int = Field(default=1, ge=1, le=64)
    # Above this many candidate nodes the engine prunes to the best domains first, keeping
    # this many nodes or `keptFraction` of the candidates, whichever is more (a big fleet
    # has more good domain combinations to compare: 8 % of 7,000 candidates is 560).
    max_candidate_nodes: int = Field(default=160, ge=8, le=100_000)
    kept_fraction: float = Field(default=0.08, ge=0.0, le=1.0)
    # Stop when the objective is proven within this fraction of optimal (large models
    # only: models of at most `exactBelowNodes` nodes are always solved to proven optimum).
    relative_gap: float = Field(default=0.005, ge=0.0, le=1.0)
    exact_below_nodes: int = Field(default=100, ge=0, le=100_000)


def _default_classes() -> tuple[HardwareClass, ...]:
    return (
        HardwareClass(
            name="premium", gpu_products=("NVIDIA-H100*", "NVIDIA-H200*", "NVIDIA-B200*")
        ),
        HardwareClass(name="standard", gpu_products=("NVIDIA-A100*", "NVIDIA-L40S*")),
        HardwareClass(name="economy", gpu_products=("*",)),
    )


def _default_tiers() -> tuple[Tier, ...]:
    return (
        Tier(name="gold", class_costs={"premium": 0, "standard": 40, "economy": 80}),
        Tier(name="silver", class_costs={"premium": 30, "standard": 0, "economy": 30}),
        Tier(name="bronze", class_costs={"premium": 80, "standard": 30, "economy": 0}),
    )


def _default_vram() -> tuple[VramThreshold, ...]:
    return (
        VramThreshold(tier="gold", min_utilization=0.3),
        VramThreshold(tier="silver", min_utilization=0.5),
        VramThreshold(tier="bronze", min_utilization=0.7),
    )


class PlacementConfig(_Spec):
    """The spec of a `PlacementConfig` object. `PlacementConfig()` is the built-in default."""

    topology: TopologySpec = Field(default_factory=lambda: TopologySpec(levels=DEFAULT_LEVELS))
    hardware_classes: tuple[HardwareClass, ...] = Field(
        default_factory=_default_classes, max_length=64
    )
    tiers: tuple[Tier, ...] = Field(default_factory=_default_tiers, max_length=32)
    default_tier: Name = "bronze"
    vram_thresholds: tuple[VramThreshold, ...] = Field(default_factory=_default_vram, max_length=32)
    weights: ObjectiveWeights = Field(default_factory=ObjectiveWeights)
    solver: SolverSettings = Field(default_factory=SolverSettings)
    numa_policy: Literal["single-numa-node", "preferred", "none"] = "preferred"
    # a node with ≥ this many GPUs is an island
    island_min_gpus: int = Field(default=8, ge=1, le=1024)
    locality_wait: LocalityWait | None = None  # off by default
    preemption: Preemption = Field(default_factory=Preemption)  # off by default
    spread: SpreadWeights = Field(default_factory=SpreadWeights)  # inference/service only
    reservation_ttl_seconds: int = Field(default=600, ge=10, le=DAY_SECONDS)
    retry_after_seconds: int = Field(default=30, ge=1, le=DAY_SECONDS)
    # DRA DeviceClasses whose devices are whole GPUs: a pod's claims on them are its GPUs
    gpu_device_classes: tuple[
        Annotated[str, Field(min_length=1, max_length=253)], ...
    ] = Field(default=("gpu.nvidia.com",), max_length=16)

    @model_validator(mode="after")
    def _consistent(self) -> PlacementConfig:
        class_names = [c.name for c in self.hardware_classes]
        if len(set(class_names)) != len(class_names):
            raise ValueError("hardwareClasses: names must be unique")
        tier_names = [t.name for t in self.tiers]
        if len(set(tier_names)) != len(tier_names):
            raise ValueError("tiers: names must be unique")
        if self.default_tier not in tier_names:
            raise ValueError(f"defaultTier {self.default_tier!r} is not one of tiers {tier_names}")
        for tier in self.tiers:
            for what, named in (
                ("classCosts", tier.class_costs),
                ("allowedClasses", tier.allowed_classes or ()),
            ):
                unknown = set(named) - set(class_names)
                if unknown:
                    raise ValueError(
                        f"tiers[{tier.name}].{what} names unknown hardware classes "
                        f"{sorted(unknown)}; known: {class_names}"
                    )
        if "vram_thresholds" not in self.model_fields_set:
            # the built-in thresholds name the built-in tiers; keep those that exist
            kept = tuple(vt for vt in self.vram_thresholds if vt.tier in tier_names)
            object.__setattr__(self, "vram_thresholds", kept)
        for vt in self.vram_thresholds:
            if vt.tier not in tier_names:
                raise ValueError(f"vramThresholds: unknown tier {vt.tier!r}; tiers: {tier_names}")
        for preemptor, victims in (self.preemption.may_evict or {}).items():
            if preemptor not in tier_names:
                raise ValueError(
                    f"preemption.mayEvict: unknown tier {preemptor!r}; tiers: {tier_names}"
                )
            for victim in victims:
                if victim not in tier_names:
                    raise ValueError(
                        f"preemption.mayEvict[{preemptor}]: unknown tier {victim!r}; "
                        f"tiers: {tier_names}"
                    )
                if tier_names.index(victim) <= tier_names.index(preemptor):
                    raise ValueError(
                        f"preemption.mayEvict[{preemptor}]: {victim!r} does not rank below "
                        f"{preemptor!r} (tiers rank in the order listed: {tier_names})"
                    )
        wait, levels = self.locality_wait, self.topology.levels
        if wait is not None and levels is not None and wait.level not in levels[:-1]:
            raise ValueError(
                f"localityWait.level {wait.level!r} must be one of the topology levels above "
                f"the host: {list(levels[:-1])}"
            )
        return self

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> PlacementConfig:
        """Validate a CRD spec (camelCase) into a config; raises pydantic.ValidationError."""
        return cls.model_validate(dict(spec or {}))

    def to_spec(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    # ---- derived lookups (cached: the config is frozen) ----
    @cached_property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.hardware_classes)

    def hardware_class(self, gpu_product: str) -> str | None:
        """First class whose glob matches the product; None when nothing matches."""
        return _match_class(self.hardware_classes, gpu_product)

    def tier_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tiers)

    def class_cost(self, tier: str, hardware_class: str | None) -> int:
        if hardware_class is None:
            return 0
        for t in self.tiers:
            if t.name == tier:
                return t.class_costs.get(hardware_class, 0)
        return 0

    def allowed_classes(self, tier: str) -> frozenset[str] | None:
        """The hardware classes a GPU pod of `tier` may run on; None: every class."""
        for t in self.tiers:
            if t.name == tier and t.allowed_classes is not None:
                return frozenset(t.allowed_classes)
        return None

    def tier_rank(self, tier: str) -> int:
        """0 for the highest tier; unknown tiers rank below every listed one."""
        names = self.tier_names()
        return names.index(tier) if tier in names else len(names)

    def evictable_tiers(self, tier: str) -> frozenset[str]:
        """The tiers a gang of `tier` may evict (none while preemption is off)."""
        if not self.preemption.enabled:
            return frozenset()
        names = self.tier_names()
        if self.preemption.may_evict is not None:
            return frozenset(self.preemption.may_evict.get(tier, ()))
        return frozenset(names[self.tier_rank(tier) + 1 :])

    def borrowed_classes(self, tier: str) -> frozenset[str]:
        """Hardware classes a gang of `tier` can only borrow: owned (class cost 0) by a
        higher tier while costing `tier` something."""
        rank = self.tier_rank(tier)
        out = set()
        for owner in self.tiers[:rank]:
            for cls, cost in owner.class_costs.items():
                if cost == 0 and self.class_cost(tier, cls) > 0:
                    out.add(cls)
        return frozenset(out)

    def class_owner(self, hardware_class: str) -> str | None:
        """The highest tier that owns `hardware_class` (class cost 0), if any."""
        for t in self.tiers:
            if t.class_costs.get(hardware_class, 1) == 0:
                return t.name
        return None

    def min_vram_utilization(self, tier: str) -> float:
        for vt in self.vram_thresholds:
            if vt.tier == tier:
                return vt.min_utilization
        return 0.0

    def resolve_levels(self, kueue_topologies: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
        """The topology level label keys, highest first, always ending at the hostname."""
        if self.topology.topology_name:
            try:
                levels = kueue_topologies[self.topology.topology_name]
            except KeyError:
                raise ValueError(
                    f"topology.topologyName {self.topology.topology_name!r}: no Kueue Topology "
                    f"of that name (known: {sorted(kueue_topologies)})"
                ) from None
        else:
            levels = self.topology.levels or DEFAULT_LEVELS
        if levels[-1] != HOSTNAME_LABEL:
            levels = (*levels, HOSTNAME_LABEL)
        return tuple(levels)


def _match_class(classes: tuple[HardwareClass, ...], gpu_product: str) -> str | None:
    for cls in classes:
        if any(fnmatch.fnmatchcase(gpu_product, pattern) for pattern in cls.gpu_products):
            return cls.name
    return None
