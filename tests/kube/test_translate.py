"""PlacementConfig objects, ResourceReservation objects and the CRDs."""

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_factories import node, pod_set, workload

from nexus_admit.kube.crds import crd_files, placement_config_schema
from nexus_admit.kube.errors import TranslationError
from nexus_admit.kube.translate import (
    build_snapshot,
    placement_config_from_object,
    reservation_object,
    workload_to_gang,
)
from nexus_admit.model import Placement, PlacementConfig, Slot, SolveStatus

ROOT = Path(__file__).resolve().parents[2]


def test_placement_config_object_and_bare_spec() -> None:
    obj = {
        "apiVersion": "scheduling.kubenexus.io/v1alpha1",
        "kind": "PlacementConfig",
        "metadata": {"name": "default"},
        "spec": {"defaultTier": "gold", "topology": {"levels": ["rack"]}},
    }
    cfg = placement_config_from_object(obj)
    assert cfg.default_tier == "gold"
    assert cfg.topology.levels == ("rack",)
    assert placement_config_from_object({"defaultTier": "silver"}).default_tier == "silver"
    assert placement_config_from_object({"kind": "PlacementConfig"}) == PlacementConfig()


def test_placement_config_errors_name_the_field() -> None:
    obj = {
        "kind": "PlacementConfig",
        "metadata": {"name": "p"},
        "spec": {"solver": {"timeLimitSeconds": -1}, "bogus": 1},
    }
    with pytest.raises(TranslationError) as e:
        placement_config_from_object(obj)
    assert e.value.obj_ref == "PlacementConfig p"
    assert e.value.field.startswith("spec.")
    assert "more" in e.value.message


def test_reservation_object_round_trips_through_the_snapshot() -> None:
    wl = workload("w", [pod_set("workers", 2, cpu="8", memory="64Gi", gpus=4)], namespace="ns")
    gang = workload_to_gang(wl, config=PlacementConfig())
    placement = Placement(
        gang="ns/w",
        policy="test",
        feasible=True,
        status=SolveStatus.OPTIMAL,
        slots=[
            Slot("workers", 1, "n1", (4, 5, 6, 7), 1),
            Slot("workers", 0, "n1", (0, 1, 2, 3), 0),
        ],
    )
    rr = reservation_object(
        name="w-rr",
        workload=wl,
        gang=gang,
        placement=placement,
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
    )
    assert rr["kind"] == "ResourceReservation"
    assert rr["metadata"]["namespace"] == "ns"
    assert rr["metadata"]["ownerReferences"][0]["uid"] == "uid-w"
    ps = rr["spec"]["podSets"][0]
    assert ps["requests"] == {"cpu": "8", "memory": "65536Mi"}
    assert [s["index"] for s in ps["slots"]] == [0, 1]
    assert rr["spec"]["expiresAt"] == "2030-01-01T00:00:00Z"
    assert "scheduling.kubenexus.io/compute-domain" not in rr["metadata"]["annotations"]
    shared = replace(gang, pod_sets=tuple(
        replace(p, required_level="nvidia.com/gpu.clique", compute_domain="ns/cd-channel")
        for p in gang.pod_sets))
    cd_rr = reservation_object(name="w-rr", workload=wl, gang=shared, placement=placement,
                               expires_at=datetime(2030, 1, 1, tzinfo=UTC))
    assert cd_rr["metadata"]["annotations"]["scheduling.kubenexus.io/compute-domain"] == (
        "ns/cd-channel")
    snap = build_snapshot(
        [node("n1", cpu="64", memory="512Gi")], [], [rr], now=datetime(2029, 1, 1, tzinfo=UTC)
    )
    n = snap.nodes["n1"]
    assert n.free_whole_gpus == 0
    assert n.free_cpu_milli == 48_000
    assert n.free_memory_mib == 512 * 1024 - 128 * 1024
    with pytest.raises(ValueError):
        reservation_object(
            name="x",
            workload=wl,
            gang=gang,
            placement=Placement("ns/w", "t", False, SolveStatus.INFEASIBLE),
            expires_at=datetime(2030, 1, 1, tzinfo=UTC),
        )


@pytest.mark.parametrize("name", ["placementconfigs.yaml", "resourcereservations.yaml"])
def test_crd_files_are_current(name: str) -> None:
    on_disk = (ROOT / "crds" / name).read_text()
    assert on_disk == crd_files()[name], (
        f"crds/{name} is stale: run `python -m nexus_admit.kube.crds crds`"
    )


def _walk(schema: Any, path: str = "") -> list[str]:
    """Paths that break Kubernetes structural-schema rules."""
    bad: list[str] = []
    if isinstance(schema, dict):
        if "$ref" in schema or "$defs" in schema:
            bad.append(f"{path}: $ref/$defs")
        if "anyOf" in schema and not schema.get("x-kubernetes-int-or-string"):
            bad.append(f"{path}: anyOf")
        if schema.get("additionalProperties") is False:
            bad.append(f"{path}: additionalProperties false")
        container = "properties" in schema or "items" in schema
        if (container or "additionalProperties" in schema) and schema.get("type") not in (
            "object",
            "array",
        ):
            bad.append(f"{path}: missing type")
        for k, v in schema.items():
            if k in ("properties",):
                for pk, pv in v.items():
                    if "type" not in pv and not pv.get("x-kubernetes-int-or-string"):
                        bad.append(f"{path}.{pk}: no type")
                    bad += _walk(pv, f"{path}.{pk}")
            elif isinstance(v, dict | list):
                bad += _walk(v, f"{path}/{k}")
    elif isinstance(schema, list):
        for i, v in enumerate(schema):
            bad += _walk(v, f"{path}[{i}]")
    return bad


@pytest.mark.parametrize("name", ["placementconfigs.yaml", "resourcereservations.yaml"])
def test_crds_are_structural(name: str) -> None:
    crd = yaml.safe_load(crd_files()[name])
    version = crd["spec"]["versions"][0]
    assert _walk(version["schema"]["openAPIV3Schema"]) == []
    assert version["additionalPrinterColumns"]


def test_placement_config_schema_matches_model_fields() -> None:
    schema = placement_config_schema()
    aliases = {f.alias or n for n, f in PlacementConfig.model_fields.items()}
    assert set(schema["properties"]) == aliases
    rr = yaml.safe_load(crd_files()["resourcereservations.yaml"])
    assert rr["spec"]["names"]["shortNames"] == ["rr"]
    pc = yaml.safe_load(crd_files()["placementconfigs.yaml"])
    assert pc["spec"]["scope"] == "Cluster"


def test_sample_placement_config_is_valid() -> None:
    docs = yaml.safe_load((ROOT / "config" / "samples" / "cluster-dump.yaml").read_text())
    (pc,) = [o for o in docs["items"] if o["kind"] == "PlacementConfig"]
    assert placement_config_from_object(pc).topology.topology_name == "gpu-fabric"
