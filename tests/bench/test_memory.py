"""The store-memory benchmark's fleet (`bench/memory.py`) and `nexus-admit bench
--store-memory`: shapes only, no figure is asserted."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from typer.testing import CliRunner

from nexus_admit.bench.memory import fleet_pages, templates
from nexus_admit.cli import app


def test_the_templates_are_objects_as_the_apiserver_sends_them() -> None:
    t = templates()
    assert set(t) == {"Node", "Pod", "Workload"}
    assert all(obj["metadata"]["managedFields"] for obj in t.values())


def test_the_fleet_has_the_asked_counts_unique_names_and_pods_spread_over_the_nodes() -> None:
    pages = list(fleet_pages(7, 30, 3, page=4))
    assert max(len(p) for _, p in pages) == 4
    objs = [(kind, o) for kind, page in pages for o in page]
    assert Counter(kind for kind, _ in objs) == {"Node": 7, "Pod": 30, "Workload": 3}
    assert len({(k, o["metadata"]["name"]) for k, o in objs}) == 40
    assert len({o["metadata"]["uid"] for _, o in objs}) == 40
    nodes = {o["metadata"]["name"] for k, o in objs if k == "Node"}
    on = Counter(o["spec"]["nodeName"] for k, o in objs if k == "Pod")
    assert set(on) == nodes and max(on.values()) - min(on.values()) <= 1
    pods = [o for k, o in objs if k == "Pod"]
    assert pods[0]["metadata"] is not pods[1]["metadata"]  # nothing shared, as decoded


def test_the_command_measures_both_variants_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "store.json"
    result = CliRunner().invoke(
        app,
        ["bench", "--store-memory", "--store-nodes", "20", "--store-pods", "40",
         "--store-workloads", "4", "--json", str(out)],
    )
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())["storeMemory"]
    assert [r["variant"] for r in records] == ["whole", "stripped"]
    assert all((r["nodes"], r["pods"], r["workloads"]) == (20, 40, 4) for r in records)
    assert all(r["rss_filled_mib"] > 0 for r in records)
