"""`nexus-admit bench --store-memory`: the controller's store filled with a fleet of real
objects, whole (as it kept them before) and stripped (`kube/stored.py`), RSS of each.

    nexus-admit bench --store-memory [--store-nodes 5000] [--store-pods 20000]
                      [--store-workloads 2500] [--json docs/data/store-memory.json]

Each variant runs in a fresh interpreter (`bench/memory.py`). Figures are measurements of
this machine, never test assertions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from nexus_admit.bench.memory import MemoryRecord, measure_in_child
from nexus_admit.controller import store as store_module
from nexus_admit.controller.store import Store
from nexus_admit.kube.stored import StoredObject, stripped

__all__ = ["fill_stripped", "fill_whole", "store_memory"]

_KEPT: list[Store] = []  # the filled store stays alive until its RSS is read


def _whole(kind: str, obj: Mapping[str, Any]) -> StoredObject:
    return StoredObject(obj)


def fill_whole() -> Any:
    """The store as it was before stripping: every object kept as the apiserver sent it."""
    store_module.stripped = _whole  # type: ignore[attr-defined]  # this child process only
    store = Store()
    _KEPT.append(store)

    def insert(kind: str, page: list[dict[str, Any]]) -> None:
        for obj in page:
            store.upsert(kind, obj)

    return insert


def fill_stripped() -> Any:
    """The store as a list fills it now: each object stripped as its page arrives
    (`KubeApi.list`'s `keep`), then stored (stripped again on the way in: idempotent)."""
    store = Store()
    _KEPT.append(store)

    def insert(kind: str, page: list[dict[str, Any]]) -> None:
        for obj in page:
            store.upsert(kind, stripped(kind, obj))

    return insert


def store_memory(nodes: int, pods: int, workloads: int, json_path: Path) -> list[MemoryRecord]:
    console = Console(stderr=True)
    records = []
    for variant, fill in (("whole", fill_whole), ("stripped", fill_stripped)):
        with console.status(f"store memory: {variant}"):
            records.append(measure_in_child(variant, fill, nodes, pods, workloads))
    table = Table(title=f"store memory: {nodes} Nodes, {pods} Pods, {workloads} Workloads")
    for col in ("variant", "RSS start MiB", "RSS filled MiB", "store MiB", "fill s"):
        table.add_column(col, justify="right")
    for r in records:
        table.add_row(
            r.variant,
            f"{r.rss_start_mib:.0f}",
            f"{r.rss_filled_mib:.0f}",
            f"{r.store_mib:.0f}",
            f"{r.fill_seconds:.1f}",
        )
    Console().print(table)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"storeMemory": [r.to_json() for r in records]}, indent=1))
    console.print(f"wrote {json_path}")
    return records
