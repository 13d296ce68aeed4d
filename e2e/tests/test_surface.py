"""nexus-admit's attack surface on the real control plane.

The CRD schemas: the apiserver (its OpenAPI validation, list types and CEL) refuses the
malformed ResourceReservations and PlacementConfigs that once passed the schema and then
stopped placement for everyone (`cpu: banana`, `reservationTtlSeconds: 1e12`), and a
reservation larger than the object limit allows; the well-formed ones, and everything the
controller writes, are accepted (the control). Each object is sent as a server-side dry run,
so nothing is stored.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nexus_admit.kube import labels as L  # noqa: E402
from nexus_admit.kube.crds import MAX_RESERVATION_SLOTS  # noqa: E402
from nexus_admit.model import PlacementConfig  # noqa: E402
from tests.model.test_config import OUT_OF_BOUNDS  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

GROUP_VERSION = L.GROUP_VERSION


@pytest.fixture(scope="module")
def crds(e2e_cluster: Any) -> Any:
    docs = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))]
    e2e_cluster.apply(docs)
    for d in docs:
        e2e_cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{d['metadata']['name']}"
        )
    return e2e_cluster


def dry_create(cluster: Any, obj: dict[str, Any]) -> tuple[bool, str]:
    """(accepted, the apiserver's words) for a server-side dry-run create of `obj`."""
    r = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False)
    return r.returncode == 0, r.stderr


# ---- ResourceReservation -----------------------------------------------------------------


def slot(index: int, node: str = "h100-r0-0", gpus: list[int] | None = None) -> dict[str, Any]:
    return {"index": index, "node": node, "gpus": [0, 1] if gpus is None else gpus}


def reservation(pod_sets: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A reservation as the controller writes one (kube/reservations.py's shape)."""
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "ResourceReservation",
        "metadata": {"name": "surface-rr", "namespace": "default"},
        "spec": {
            "workloadRef": {"name": "w", "namespace": "default", "uid": "u-1"},
            "podSets": pod_sets
            or [
                {
                    "name": "workers",
                    "requests": {"cpu": "500m", "memory": "65536Mi"},
                    "gpuShare": "1",
                    "slots": [slot(0), slot(1, gpus=[2, 3])],
                }
            ],
            "expiresAt": "2030-01-01T00:00:00Z",
            "decision": {
                "policy": "nexus",
                "status": "optimal",
                "objective": 12.5,
                "nodes": 1,
                "gpus": 4,
                "terms": {"nodeCount": 50.0},
                "explanation": ["one node"],
                "mode": "placed",
            },
        },
    }


def with_pod_set(**changes: Any) -> dict[str, Any]:
    rr = reservation()
    rr["spec"]["podSets"][0].update(changes)
    return rr


def many_slots(n: int, first: int = 0) -> list[dict[str, Any]]:
    return [slot(first + i, node=f"n-{(first + i) // 8}", gpus=[i % 8]) for i in range(n)]


BAD_RESERVATIONS: dict[str, tuple[dict[str, Any], str]] = {
    # item 1 of issue 28: this passed the schema, then every snapshot failed on it
    "cpu-banana": (with_pod_set(requests={"cpu": "banana"}), "requests.cpu"),
    "negative-memory": (with_pod_set(requests={"memory": "-64Gi"}), "requests.memory"),
    "negative-int-cpu": (with_pod_set(requests={"cpu": -4}), "must not be negative"),
    "gpu-share-junk": (with_pod_set(gpuShare="half"), "gpuShare"),
    "duplicate-slot-index": (with_pod_set(slots=[slot(0), slot(0)]), "Duplicate value"),
    "duplicate-gpu": (with_pod_set(slots=[slot(0, gpus=[1, 1])]), "Duplicate value"),
    "negative-index": (with_pod_set(slots=[slot(-1)]), "index"),
    "long-node-name": (with_pod_set(slots=[slot(0, node="n" * 254)]), "node"),
    "too-many-slots-in-one-pod-set": (
        with_pod_set(slots=many_slots(MAX_RESERVATION_SLOTS + 1)),
        f"must have at most {MAX_RESERVATION_SLOTS} items",
    ),
    "too-many-slots-over-pod-sets": (
        reservation(
            [
                {"name": "a", "slots": many_slots(MAX_RESERVATION_SLOTS // 2 + 1)},
                {"name": "b", "slots": many_slots(MAX_RESERVATION_SLOTS // 2)},
            ]
        ),
        f"at most {MAX_RESERVATION_SLOTS} slots",
    ),
    "duplicate-pod-set": (
        reservation([{"name": "a", "slots": [slot(0)]}, {"name": "a", "slots": [slot(1)]}]),
        "Duplicate value",
    ),
}


def test_a_reservation_as_the_controller_writes_it_is_accepted(crds: Any) -> None:
    ok, err = dry_create(crds, reservation())
    assert ok, err
    # ... and one at the slot limit, spread over pod sets
    half = MAX_RESERVATION_SLOTS // 2
    big = reservation(
        [{"name": "a", "slots": many_slots(half)}, {"name": "b", "slots": many_slots(half)}]
    )
    ok, err = dry_create(crds, big)
    assert ok, err


@pytest.mark.parametrize("name", list(BAD_RESERVATIONS))
def test_the_apiserver_refuses_a_malformed_reservation(name: str, crds: Any) -> None:
    obj, words = BAD_RESERVATIONS[name]
    ok, err = dry_create(crds, obj)
    assert not ok, f"{name} was accepted"
    assert words in err, err


# ---- PlacementConfig ---------------------------------------------------------------------


def placement_config(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "PlacementConfig",
        "metadata": {"name": "surface-config"},
        "spec": spec,
    }


def good_specs() -> dict[str, dict[str, Any]]:
    manifest = yaml.safe_load_all((ROOT / "e2e" / "manifests" / "nexus.yaml").read_text())
    (e2e_spec,) = [d["spec"] for d in manifest if d and d["kind"] == "PlacementConfig"]
    chart = yaml.safe_load((ROOT / "charts" / "nexus-admit" / "values.yaml").read_text())
    return {
        "empty": {},
        "built-in-default": PlacementConfig().to_spec(),
        "e2e-manifest": e2e_spec,
        "chart-default": chart["placementConfig"]["spec"],
        "custom-tiers": {
            "hardwareClasses": [{"name": "fast", "gpuProducts": ["*"]}],
            "tiers": [{"name": "prod", "classCosts": {"fast": 0}}, {"name": "dev"}],
            "defaultTier": "dev",
            "vramThresholds": [{"tier": "prod", "minUtilization": 0.5}],
            "reservationTtlSeconds": 86_400,
        },
    }


@pytest.mark.parametrize("name", list(good_specs()))
def test_valid_placement_configs_are_accepted(name: str, crds: Any) -> None:
    spec = good_specs()[name]
    PlacementConfig.from_spec(spec)  # the model agrees
    ok, err = dry_create(crds, placement_config(spec))
    assert ok, err


BAD_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "duplicate-tier": (
        {"tiers": [{"name": "bronze"}, {"name": "bronze"}]},
        "Duplicate value",
    ),
    "default-tier-unknown": ({"defaultTier": "platinum"}, "defaultTier must be one of the tiers"),
    "default-tier-of-custom-tiers": (
        {"tiers": [{"name": "prod"}]},  # the default, bronze, is not among them
        "defaultTier must be one of the tiers",
    ),
    "topology-both": (
        {"topology": {"topologyName": "gpu-fabric", "levels": ["rack"]}},
        "either topologyName or levels",
    ),
    "class-cost-unknown-class": (
        {"tiers": [{"name": "bronze", "classCosts": {"gold-plated": 1}}]},
        "classCosts may name only hardwareClasses",
    ),
    "vram-unknown-tier": (
        {"vramThresholds": [{"tier": "platinum", "minUtilization": 0.5}]},
        "vramThresholds may name only tiers",
    ),
    "numa-policy": ({"numaPolicy": "sometimes"}, "numaPolicy"),
}
# every value the model refuses for being past its bounds (JSON has no inf or NaN)
BAD_CONFIGS.update(
    {
        f"bounds-{k}": (spec, field)
        for k, (spec, field) in OUT_OF_BOUNDS.items()
        if k not in ("infinite-wait", "nan-drain")
    }
)


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_the_apiserver_refuses_a_placement_config_the_model_refuses(name: str, crds: Any) -> None:
    spec, words = BAD_CONFIGS[name]
    with pytest.raises(ValueError):
        PlacementConfig.from_spec(copy.deepcopy(spec))  # the model refuses it as well
    ok, err = dry_create(crds, placement_config(spec))
    assert not ok, f"{name} was accepted"
    assert words in err, err
