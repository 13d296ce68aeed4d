"""PlacementConfig: the public CRD spec of ARCHITECTURE §4, its defaults, validation and the
lookups the engine makes through it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from nexus_admit.model import DEFAULT_LEVELS, HOSTNAME_LABEL, PlacementConfig
from tests.factories import BLOCK, RACK, snapshot

# The sample spec of ARCHITECTURE §4, verbatim (with the levels variant of `topology`).
ARCHITECTURE_SPEC = """
topology:
  levels: [cloud.google.com/gce-topology-block, kubernetes.io/hostname]
hardwareClasses:
- {name: premium,  gpuProducts: ["NVIDIA-H100*", "NVIDIA-H200*", "NVIDIA-B200*"]}
- {name: standard, gpuProducts: ["NVIDIA-A100*", "NVIDIA-L40S*"]}
- {name: economy,  gpuProducts: ["*"]}
tiers:
- {name: gold,   classCosts: {premium: 0,  standard: 40, economy: 80}}
- {name: silver, classCosts: {premium: 30, standard: 0,  economy: 30}}
- {name: bronze, classCosts: {premium: 80, standard: 30, economy: 0}}
defaultTier: bronze
"""


def _spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(ARCHITECTURE_SPEC)
    spec.update(overrides)
    return spec


# ---------------------------------------------------------------- built-in defaults


def test_builtin_defaults_are_the_architecture_values() -> None:
    default = PlacementConfig()
    spec = default.to_spec()
    documented = yaml.safe_load(ARCHITECTURE_SPEC)
    assert spec["hardwareClasses"] == documented["hardwareClasses"]
    assert spec["tiers"] == documented["tiers"]
    assert spec["defaultTier"] == "bronze"
    assert spec["topology"] == {
        "levels": ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    }


def test_empty_spec_is_the_builtin_default() -> None:
    assert PlacementConfig.from_spec({}) == PlacementConfig()
    assert PlacementConfig.from_spec(None) == PlacementConfig()


def test_default_levels_resolve_to_zone_then_hostname() -> None:
    assert PlacementConfig().resolve_levels({}) == DEFAULT_LEVELS
    assert DEFAULT_LEVELS == ("topology.kubernetes.io/zone", "kubernetes.io/hostname")


def test_default_class_costs() -> None:
    c = PlacementConfig()
    assert [c.class_cost("gold", k) for k in ("premium", "standard", "economy")] == [0, 40, 80]
    assert [c.class_cost("silver", k) for k in ("premium", "standard", "economy")] == [30, 0, 30]
    assert [c.class_cost("bronze", k) for k in ("premium", "standard", "economy")] == [80, 30, 0]
    # a CPU-only node (no class) never costs anything
    assert c.class_cost("gold", None) == 0


def test_default_vram_thresholds_per_tier() -> None:
    c = PlacementConfig()
    assert c.min_vram_utilization("gold") == 0.3
    assert c.min_vram_utilization("silver") == 0.5
    assert c.min_vram_utilization("bronze") == 0.7
    assert c.min_vram_utilization("no-such-tier") == 0.0


# ---------------------------------------------------------------- camelCase contract


def test_architecture_sample_spec_parses() -> None:
    c = PlacementConfig.from_spec(_spec())
    assert c.topology.levels == ("cloud.google.com/gce-topology-block", "kubernetes.io/hostname")
    assert c.class_names == ("premium", "standard", "economy")
    assert c.tier_names() == ("gold", "silver", "bronze")
    assert c.default_tier == "bronze"


def test_camel_case_round_trip() -> None:
    spec = _spec(
        topology={"topologyName": "gpu-fabric"},
        vramThresholds=[{"tier": "gold", "minUtilization": 0.25}],
        weights={"islandBroken": 5000, "domainSpread": 10},
        solver={"timeLimitSeconds": 2.5, "maxCandidateNodes": 64, "keptFraction": 0.2},
        numaPolicy="single-numa-node",
        islandMinGpus=4,
        reservationTtlSeconds=120,
        retryAfterSeconds=15,
    )
    c = PlacementConfig.from_spec(spec)
    assert c.topology.topology_name == "gpu-fabric"
    assert c.weights.island_broken == 5000
    assert c.solver.time_limit_seconds == 2.5
    assert c.numa_policy == "single-numa-node"
    assert c.island_min_gpus == 4
    out = c.to_spec()
    # camelCase keys only, and no None fields leaking out (topology has only topologyName)
    assert out["topology"] == {"topologyName": "gpu-fabric"}
    assert out["weights"]["islandBroken"] == 5000
    assert out["solver"]["maxCandidateNodes"] == 64
    assert out["solver"]["keptFraction"] == 0.2
    assert "reservation_ttl_seconds" not in out and out["reservationTtlSeconds"] == 120
    assert PlacementConfig.from_spec(out) == c
    # and the output is plain YAML-able data
    assert PlacementConfig.from_spec(yaml.safe_load(yaml.safe_dump(out))) == c


def test_custom_tiers_without_vram_thresholds_are_accepted() -> None:
    """An admin who renames the tiers and does not write `vramThresholds` must not be told
    about tiers they never wrote: the built-in thresholds name gold/silver/bronze only."""
    c = PlacementConfig.from_spec({
        "tiers": [{"name": "prod", "classCosts": {"premium": 0, "economy": 50}},
                  {"name": "dev", "classCosts": {"premium": 50, "economy": 0}}],
        "defaultTier": "dev",
    })
    assert c.tier_names() == ("prod", "dev")
    assert c.min_vram_utilization("prod") == 0.0


def test_unknown_field_is_rejected() -> None:
    with pytest.raises(ValidationError, match="topolgy"):
        PlacementConfig.from_spec({"topolgy": {"levels": ["a"]}})


def test_config_is_frozen() -> None:
    c = PlacementConfig()
    with pytest.raises(ValidationError):
        c.default_tier = "gold"  # type: ignore[misc]


# ---------------------------------------------------------------- validation errors


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"tiers": [{"name": "gold", "classCosts": {"premium": 0, "ultra": 5}}],
             "defaultTier": "gold"},
            "unknown hardware classes \\['ultra'\\]",
        ),
        (
            {"hardwareClasses": [{"name": "a", "gpuProducts": ["X*"]},
                                 {"name": "a", "gpuProducts": ["*"]}],
             "tiers": [{"name": "bronze"}]},
            "hardwareClasses: names must be unique",
        ),
        (
            {"tiers": [{"name": "gold"}, {"name": "gold"}], "defaultTier": "gold"},
            "tiers: names must be unique",
        ),
        ({"defaultTier": "platinum"}, "defaultTier 'platinum' is not one of tiers"),
        (
            {"topology": {"topologyName": "gpu-fabric", "levels": [RACK]}},
            "either topologyName or levels, not both",
        ),
        ({"topology": {"levels": []}}, "at least one node label"),
        ({"vramThresholds": [{"tier": "platinum", "minUtilization": 0.5}]}, "unknown tier"),
        ({"vramThresholds": [{"tier": "gold", "minUtilization": 1.5}]}, "less than or equal"),
        ({"hardwareClasses": [{"name": "empty", "gpuProducts": []}]}, "gpuProducts"),
        ({"solver": {"timeLimitSeconds": 0}}, "timeLimitSeconds"),
        ({"numaPolicy": "always"}, "numaPolicy"),
        (
            {"tiers": [{"name": "gold", "allowedClasses": ["premium", "ultra"]}],
             "defaultTier": "gold"},
            "tiers\\[gold\\].allowedClasses names unknown hardware classes \\['ultra'\\]",
        ),
        ({"tiers": [{"name": "gold", "allowedClasses": []}], "defaultTier": "gold"},
         "allowedClasses"),
        ({"spread": {"node": -1}}, "spread.node"),
    ],
    ids=[
        "unknown-class-in-classCosts",
        "duplicate-class",
        "duplicate-tier",
        "unknown-defaultTier",
        "topologyName-and-levels",
        "empty-levels",
        "vram-threshold-unknown-tier",
        "vram-threshold-above-1",
        "class-without-products",
        "zero-time-limit",
        "unknown-numa-policy",
        "unknown-class-in-allowedClasses",
        "empty-allowedClasses",
        "negative-spread-weight",
    ],
)
def test_invalid_specs_are_rejected_with_a_clear_message(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        PlacementConfig.from_spec(_spec(**overrides))


def test_allowed_classes_per_tier_and_spread_weights_per_level() -> None:
    config = PlacementConfig.from_spec({
        "tiers": [{"name": "bronze", "allowedClasses": ["economy", "standard"]},
                  {"name": "gold"}],
        "spread": {"node": 10, "domain": 2, "levels": {RACK: 5}},
    })
    assert config.allowed_classes("bronze") == frozenset({"economy", "standard"})
    assert config.allowed_classes("gold") is None
    assert config.allowed_classes("unknown") is None
    assert config.spread.level_weight("kubernetes.io/hostname", hostname=True) == 10
    assert config.spread.level_weight(RACK, hostname=False) == 5
    assert config.spread.level_weight("topology.kubernetes.io/zone", hostname=False) == 2


# ---------------------------------------------------------------- hardware classes


@pytest.mark.parametrize(
    ("product", "expected"),
    [
        ("NVIDIA-H100-80GB-HBM3", "premium"),
        ("NVIDIA-H200", "premium"),
        ("NVIDIA-B200", "premium"),
        ("NVIDIA-A100-SXM4-40GB", "standard"),
        ("NVIDIA-L40S", "standard"),
        ("NVIDIA-L40", "economy"),  # L40 (no S) is not matched by "NVIDIA-L40S*"
        ("Tesla-T4", "economy"),
        ("nvidia-h100-80gb-hbm3", "economy"),  # globs are case-sensitive
    ],
)
def test_default_hardware_class_globs(product: str, expected: str) -> None:
    assert PlacementConfig().hardware_class(product) == expected


def test_hardware_class_first_match_wins() -> None:
    c = PlacementConfig.from_spec({
        "hardwareClasses": [
            {"name": "hopper", "gpuProducts": ["NVIDIA-H100*"]},
            {"name": "nvidia", "gpuProducts": ["NVIDIA-*"]},
            {"name": "h100-late", "gpuProducts": ["NVIDIA-H100*"]},
        ],
        "tiers": [{"name": "bronze", "classCosts": {"hopper": 1}}],
        "vramThresholds": [],
    })
    assert c.hardware_class("NVIDIA-H100-80GB-HBM3") == "hopper"
    assert c.hardware_class("NVIDIA-A100-SXM4-40GB") == "nvidia"
    # no catch-all: an unmatched product has no class (and costs nothing)
    assert c.hardware_class("Tesla-T4") is None
    assert c.class_cost("bronze", c.hardware_class("Tesla-T4")) == 0
    # a class not named in a tier's classCosts costs 0 for that tier
    assert c.class_cost("bronze", "nvidia") == 0
    assert c.class_cost("bronze", "hopper") == 1


def test_reordering_classes_changes_the_match() -> None:
    c = PlacementConfig.from_spec({
        "hardwareClasses": [
            {"name": "economy", "gpuProducts": ["*"]},
            {"name": "premium", "gpuProducts": ["NVIDIA-H100*"]},
        ],
        "tiers": [{"name": "bronze"}],
        "vramThresholds": [],
    })
    assert c.hardware_class("NVIDIA-H100-80GB-HBM3") == "economy"


# ---------------------------------------------------------------- topology levels


def test_resolve_levels_appends_hostname() -> None:
    c = PlacementConfig.from_spec({"topology": {"levels": [BLOCK, RACK]}})
    assert c.resolve_levels({}) == (BLOCK, RACK, HOSTNAME_LABEL)


def test_resolve_levels_does_not_duplicate_hostname() -> None:
    c = PlacementConfig.from_spec({"topology": {"levels": [RACK, HOSTNAME_LABEL]}})
    assert c.resolve_levels({}) == (RACK, HOSTNAME_LABEL)


def test_resolve_levels_from_kueue_topology_in_snapshot() -> None:
    snap = snapshot(**{"gpu-fabric": (BLOCK, RACK)})
    c = PlacementConfig.from_spec({"topology": {"topologyName": "gpu-fabric"}})
    assert c.resolve_levels(snap.kueue_topologies) == (BLOCK, RACK, HOSTNAME_LABEL)
    # a Kueue Topology that already ends at the hostname is taken as is
    snap = snapshot(**{"gpu-fabric": (RACK, HOSTNAME_LABEL)})
    assert c.resolve_levels(snap.kueue_topologies) == (RACK, HOSTNAME_LABEL)


def test_resolve_levels_missing_kueue_topology_is_a_clear_error() -> None:
    snap = snapshot(**{"other": (RACK,)})
    c = PlacementConfig.from_spec({"topology": {"topologyName": "gpu-fabric"}})
    with pytest.raises(ValueError, match=r"topologyName 'gpu-fabric'.*known: \['other'\]"):
        c.resolve_levels(snap.kueue_topologies)


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_kept_fraction_outside_zero_to_one_is_rejected(fraction: float) -> None:
    with pytest.raises(ValueError, match="keptFraction"):
        PlacementConfig.from_spec({"solver": {"keptFraction": fraction}})


def test_solver_defaults_are_one_worker_and_eight_percent_kept() -> None:
    solver = PlacementConfig().solver
    assert (solver.workers, solver.max_candidate_nodes, solver.kept_fraction) == (1, 160, 0.08)


# ---------------------------------------------------------------- upper bounds

OUT_OF_BOUNDS = {
    # a TTL of 1e12 s overflowed the reservation's expiry datetime on every pass
    "ttl-1e12": ({"reservationTtlSeconds": 1e12}, "reservationTtlSeconds"),
    "ttl-over-a-day": ({"reservationTtlSeconds": 86_401}, "reservationTtlSeconds"),
    "retry-1e9": ({"retryAfterSeconds": 10**9}, "retryAfterSeconds"),
    "weight-overflows-int64": ({"weights": {"islandBroken": 10**20}}, "islandBroken"),
    "preemption-weight": ({"preemption": {"weights": {"victim": 10**7}}}, "victim"),
    "infinite-wait": ({"preemption": {"gracePeriodSeconds": float("inf")}}, "grace"),
    "nan-drain": ({"preemption": {"drainAfterSeconds": float("nan")}}, "drainAfter"),
    "lost-hours": ({"preemption": {"maxLostGpuHours": 1e30}}, "maxLostGpuHours"),
    "locality": ({"localityWait": {"level": "rack", "maxWaitSeconds": 1e9}}, "maxWait"),
    "island": ({"islandMinGpus": 4096}, "islandMinGpus"),
    "candidates": ({"solver": {"maxCandidateNodes": 10**7}}, "maxCandidateNodes"),
    "class-cost": ({"tiers": [{"name": "bronze", "classCosts": {"economy": 10**9}}]}, "classC"),
    "long-tier-name": ({"tiers": [{"name": "t" * 64}], "defaultTier": "t" * 64}, "name"),
    "empty-class-name": ({"hardwareClasses": [{"name": "", "gpuProducts": ["*"]}]}, "name"),
    "too-many-tiers": (
        {"tiers": [{"name": f"t{i}"} for i in range(33)], "defaultTier": "t0"},
        "tiers",
    ),
    "too-many-levels": ({"topology": {"levels": [f"l{i}" for i in range(17)]}}, "levels"),
    "long-label-key": ({"topology": {"levels": ["x" * 318]}}, "levels"),
}


@pytest.mark.parametrize("spec,field", OUT_OF_BOUNDS.values(), ids=list(OUT_OF_BOUNDS))
def test_values_past_the_upper_bounds_are_refused_naming_the_field(
    spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as e:
        PlacementConfig.from_spec(spec)
    assert field in str(e.value)


def test_the_upper_bounds_admit_the_largest_sensible_values() -> None:
    c = PlacementConfig.from_spec(
        {
            "reservationTtlSeconds": 86_400,
            "weights": {"islandBroken": 1_000_000},
            "preemption": {"drainAfterSeconds": 7 * 86_400, "maxLostGpuHours": 1e6},
            "solver": {"maxCandidateNodes": 100_000},
        }
    )
    assert c.reservation_ttl_seconds == 86_400 and c.weights.island_broken == 1_000_000
