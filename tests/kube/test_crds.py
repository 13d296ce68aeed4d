"""The CRD schemas bound what they hold: every list, map and string has a limit, quantities
have Kubernetes' syntax, and a reservation at the slot limit stays well under the object
size the apiserver stores. What the apiserver itself refuses is e2e/tests/test_surface.py's
job (it evaluates the CEL rules and list types for real)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from kube_factories import pod_set, workload

from nexus_admit.kube.crds import (
    MAX_RESERVATION_SLOTS,
    QUANTITY_PATTERN,
    crd_files,
    placement_config_crd,
    resource_reservation_crd,
)
from nexus_admit.kube.quantity import format_quantity, parse_quantity
from nexus_admit.kube.translate import reservation_object, workload_to_gang
from nexus_admit.model import Placement, PlacementConfig, Slot, SolveStatus

# the apiserver's limit on a request body is 3 MiB, etcd's on a value ~1.5 MiB
ETCD_OBJECT_LIMIT = int(1.5 * 2**20)


def _unbounded(schema: Any, path: str = "") -> list[str]:
    """Paths of lists without maxItems, maps without maxProperties and free strings."""
    out: list[str] = []
    if not isinstance(schema, dict):
        return out
    kind = schema.get("type")
    if kind == "array" and "maxItems" not in schema:
        out.append(f"{path}: list without maxItems")
    if kind == "object" and "additionalProperties" in schema and "maxProperties" not in schema:
        out.append(f"{path}: map without maxProperties")
    free = not {"maxLength", "enum", "format", "pattern"} & set(schema)
    if kind == "string" and free:
        out.append(f"{path}: string without maxLength")
    for name, sub in (schema.get("properties") or {}).items():
        if path == "" and name in ("apiVersion", "kind", "metadata"):
            continue  # the apiserver's own
        out += _unbounded(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            out += _unbounded(schema[key], f"{path}[]")
    return out


@pytest.mark.parametrize("crd", [placement_config_crd, resource_reservation_crd])
def test_every_list_map_and_string_of_the_crds_is_bounded(crd: Any) -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _unbounded(schema) == []


def test_placement_config_bounds_come_from_the_model() -> None:
    schema = placement_config_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    props = spec["properties"]
    assert props["reservationTtlSeconds"]["maximum"] == 86_400
    assert props["tiers"]["maxItems"] == 32
    assert props["tiers"]["x-kubernetes-list-map-keys"] == ["name"]  # unique tier names
    assert props["weights"]["properties"]["islandBroken"]["maximum"] == 1_000_000
    drain = props["preemption"]["properties"]["drainAfterSeconds"]
    assert drain["maximum"] == 7 * 86_400 and drain["nullable"] is True
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("defaultTier" in r for r in rules)
    assert "'gold', 'silver', 'bronze'" in rules[0], "the built-in tiers when tiers is omitted"
    # a map's keys are bounded by a rule (propertyNames is not part of a structural schema)
    costs = props["tiers"]["items"]["properties"]["classCosts"]
    assert "propertyNames" not in costs and costs["x-kubernetes-validations"]
    assert "propertyNames" not in crd_files()["placementconfigs.yaml"]


def test_reservation_lists_are_keyed_so_duplicates_are_refused() -> None:
    spec = resource_reservation_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    pod_sets = spec["properties"]["spec"]["properties"]["podSets"]
    assert pod_sets["x-kubernetes-list-map-keys"] == ["name"]
    slots = pod_sets["items"]["properties"]["slots"]
    assert slots["x-kubernetes-list-map-keys"] == ["index"]
    assert slots["maxItems"] == MAX_RESERVATION_SLOTS
    assert slots["items"]["properties"]["gpus"]["x-kubernetes-list-type"] == "set"
    (total,) = spec["properties"]["spec"]["x-kubernetes-validations"]
    assert f"<= {MAX_RESERVATION_SLOTS}" in total["rule"]


VALID = ["0", "8", "500m", "1.5", ".5", "1.", "40Gi", "65536Mi", "1G", "1e3", "2E-3", "1k"]
INVALID = ["banana", "", "-1", "+2", "1 Gi", "1gi", "Gi", "1.5.5", "0x10", "1e", " 8", "8 "]


@pytest.mark.parametrize("text", VALID)
def test_the_quantity_pattern_accepts_what_the_controller_parses(text: str) -> None:
    assert re.fullmatch(QUANTITY_PATTERN, text)
    assert parse_quantity(text) >= 0


@pytest.mark.parametrize("text", INVALID)
def test_the_quantity_pattern_refuses_junk_and_negatives(text: str) -> None:
    assert not re.fullmatch(QUANTITY_PATTERN, text)


@pytest.mark.parametrize("milli", [0, 1, 250, 500, 1000, 8000, 123_456_789])
def test_every_quantity_the_controller_writes_matches_the_pattern(milli: int) -> None:
    assert re.fullmatch(QUANTITY_PATTERN, format_quantity(milli))
    assert re.fullmatch(QUANTITY_PATTERN, f"{milli}Mi")


def _worst_case_reservation(slots: int) -> dict[str, Any]:
    """A reservation of `slots` slots with every string at its schema maximum."""
    long_node = "n" * 253
    wl = workload("w" * 63, [pod_set("p" * 63, slots, cpu="8", memory="64Gi", gpus=16)])
    gang = workload_to_gang(wl, config=PlacementConfig())
    placement = Placement(
        gang="default/w",
        policy="nexus",
        feasible=True,
        status=SolveStatus.OPTIMAL,
        slots=[
            Slot("p" * 63, i, f"{long_node[:-6]}{i:06d}", tuple(range(16)), 1) for i in range(slots)
        ],
        explanation=["x" * 200] * 16,
    )
    rr = reservation_object(
        name="w" * 52 + "-0123456789",
        workload=wl,
        gang=gang,
        placement=placement,
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
    )
    rr["status"] = {
        "phase": "Reserved",
        "slots": [
            {"slot": f"{'p' * 63}/{i}", "pod": "q" * 253, "uid": "u" * 36, "state": "Claimed"}
            for i in range(slots)
        ],
    }
    return rr


def test_a_reservation_at_the_slot_limit_stays_well_under_the_object_limit() -> None:
    rr = _worst_case_reservation(MAX_RESERVATION_SLOTS)
    size = len(json.dumps(rr, separators=(",", ":")).encode())
    assert size < ETCD_OBJECT_LIMIT * 0.6, f"{size} bytes"
    # the control: twice the limit would not fit
    twice = len(json.dumps(_worst_case_reservation(2 * MAX_RESERVATION_SLOTS)).encode())
    assert twice > ETCD_OBJECT_LIMIT


def test_the_crd_files_parse_as_one_document_each() -> None:
    for text in crd_files().values():
        assert len(list(yaml.safe_load_all(text))) == 1
