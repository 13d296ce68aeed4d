"""`plan` on malformed dumps: one value of the sample dump changed (another type, a negative
number, a missing key) is answered with the project's own error naming the object and
field, or by recording the Workload's error and going on; never by a Python traceback."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nexus_admit.commands.plan import PlanInputError, run_plan
from nexus_admit.kube.dump import ClusterDump, DumpError, load_objects
from nexus_admit.kube.errors import TranslationError

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "samples" / "cluster-dump.yaml"
ITEMS: list[dict[str, Any]] = yaml.safe_load(SAMPLE.read_text())["items"]
OWN_ERRORS = (DumpError, PlanInputError, TranslationError)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a value inside `value` (keys of mappings, indices of lists)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


PATHS = [p for p in _paths(ITEMS) if len(p) > 1]  # inside an object, not whole objects
REPLACEMENTS = st.sampled_from(
    [None, -3, 0, -1.5, "-3", "", "bogus", "12x", True, [], ["x"], {}, {"a": 1}, [{}], 10**20]
)


def _mutate(items: list[dict[str, Any]], path: tuple[Any, ...], new: Any, delete: bool) -> None:
    parent: Any = items
    for step in path[:-1]:
        parent = parent[step]
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = new


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), new=REPLACEMENTS, delete=st.booleans())
def test_plan_answers_a_malformed_dump_with_its_own_errors(
    path: tuple[Any, ...], new: Any, delete: bool
) -> None:
    items = copy.deepcopy(ITEMS)
    _mutate(items, path, new, delete)
    try:
        dump = ClusterDump.of(load_objects([{"kind": "List", "items": items}]))
        result = run_plan(dump)
    except OWN_ERRORS as e:
        event("refused")
        assert str(e)
        return
    event("recorded" if result.errors else "planned")
    assert all(isinstance(line, str) and line for line in result.errors)


def _by(kind: str, name: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in items if o["kind"] == kind and o["metadata"]["name"] == name)


def _plan_items(items: list[dict[str, Any]]) -> Any:
    return run_plan(ClusterDump.of(load_objects([{"kind": "List", "items": items}])))


def _refused(items: list[dict[str, Any]]) -> str:
    try:
        result = _plan_items(items)
    except TranslationError as e:
        return str(e)
    assert result.errors, "expected the input to be refused"
    return " ".join(result.errors)


def test_negative_node_memory_is_refused_not_read_as_zero() -> None:
    items = copy.deepcopy(ITEMS)
    _by("Node", "h100-a1", items)["status"]["allocatable"]["memory"] = "-3"
    message = _refused(items)
    assert "Node h100-a1" in message and "status.allocatable[memory]" in message
    assert "negative" in message


def test_negative_tier_cost_is_refused() -> None:
    items = copy.deepcopy(ITEMS)
    tier = _by("PlacementConfig", "default", items)["spec"]["tiers"][0]
    tier["classCosts"][next(iter(tier["classCosts"]))] = -100
    message = _refused(items)
    assert "PlacementConfig default" in message and "classCosts" in message


def test_bogus_toleration_effect_on_a_resource_flavor_is_refused() -> None:
    items = copy.deepcopy(ITEMS)
    flavor = _by("ResourceFlavor", "h100", items)
    flavor["spec"]["tolerations"][0]["effect"] = "NoScheduleEver"
    message = _refused(items)
    assert "ResourceFlavor h100" in message and "tolerations[0].effect" in message


def test_reservation_of_a_missing_workload_holds_its_gpus_and_says_so(
    caplog: Any,
) -> None:
    """Counted with a warning rather than refused: one stale reservation must not stop
    every plan; its slots keep their GPUs, its unknown CPU and memory are logged."""
    items = copy.deepcopy(ITEMS)
    rr = _by("ResourceReservation", "finetune-7b", items)
    for ps in rr["spec"]["podSets"]:
        ps.pop("requests", None)
    rr["spec"]["workloadRef"]["name"] = "gone"
    with caplog.at_level("WARNING", logger="nexus_admit.kube.cluster"):
        dump = ClusterDump.of(load_objects([{"kind": "List", "items": items}]))
        snap = dump.snapshot()
    assert any("team-llm/gone" in r.getMessage() and "no CPU or memory" in r.getMessage()
               for r in caplog.records)
    held = {s["node"] for ps in rr["spec"]["podSets"] for s in ps["slots"]}
    assert any(snap.nodes[n].free_whole_gpus < snap.nodes[n].gpu_count for n in held)
