"""What the controller's store costs in memory at fleet scale: real objects copied into a
fleet of any size, fed to a store page by page as a list brings them, RSS measured.

Who calls it: `nexus-admit bench --store-memory` (`commands/bench_store.py`), which passes
the store's insert path in (this package sits below the controller and never imports it).
Each variant runs in a fresh interpreter (`multiprocessing` spawn), so one variant's freed
memory, which the allocator keeps, never counts for the next.

The objects are the templates in `nexus_admit/data/live/objects.json` (read from the e2e
plane, managedFields and all), given new names, uids and resourceVersions, the pods spread
over the nodes, each object parsed from JSON on its own as a client would: no substructure
is shared between objects, as none is between objects a client decodes.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

__all__ = [
    "PAGE",
    "Fill",
    "MemoryRecord",
    "fleet_pages",
    "measure_in_child",
    "rss_bytes",
    "templates",
]

PAGE = 500  # objects per page, as the controller's lists read them
# (kind, page of objects) → None: what the store does with each page
Fill = Callable[[], Callable[[str, list[dict[str, Any]]], None]]


def templates() -> dict[str, dict[str, Any]]:
    """The real Node, Pod and Workload the fleet is copied from."""
    text = resources.files("nexus_admit.data").joinpath("live/objects.json").read_text()
    loaded: dict[str, dict[str, Any]] = json.loads(text)
    return loaded


def rss_bytes() -> int:
    """The process's resident set now (Linux), else its peak."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _renamed(template: str, old: str, new: str, uid: str, rv: int) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(template.replace(old, new))
    meta = obj["metadata"]
    meta["uid"] = uid
    meta["resourceVersion"] = str(rv)
    return obj


def fleet_pages(
    nodes: int, pods: int, workloads: int, page: int = PAGE
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(kind, page) of `nodes` Nodes, `pods` Pods spread over them and `workloads`
    Workloads, copies of `templates()`, one page at a time."""
    t = templates()
    node_name = str(t["Node"]["metadata"]["name"])
    node_text = json.dumps(t["Node"])
    # a pod names its node, its own name and its Workload's Job: each is replaced
    pod, wl = t["Pod"], t["Workload"]
    pod_name, wl_name = str(pod["metadata"]["name"]), str(wl["metadata"]["name"])
    pod_text, wl_text = json.dumps(pod), json.dumps(wl)
    rv = 1000
    kinds: list[tuple[str, int, Callable[[int], dict[str, Any]]]] = [
        ("Node", nodes, lambda i: _renamed(node_text, node_name, f"node-{i:05}", f"n-{i}", rv + i)),
        (
            "Pod",
            pods,
            lambda i: _renamed(
                pod_text.replace(node_name, f"node-{i % max(nodes, 1):05}"),
                pod_name,
                f"pod-{i:06}",
                f"p-{i}",
                rv + i,
            ),
        ),
        (
            "Workload",
            workloads,
            lambda i: _renamed(wl_text, wl_name, f"wl-{i:05}", f"w-{i}", rv + i),
        ),
    ]
    for kind, count, make in kinds:
        for start in range(0, count, page):
            yield kind, [make(i) for i in range(start, min(start + page, count))]


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    variant: str
    nodes: int
    pods: int
    workloads: int
    rss_start_mib: float
    rss_filled_mib: float
    store_mib: float  # what filling the store added
    fill_seconds: float  # building the objects (the client's parse) and inserting them

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _measure(variant: str, fill: Fill, nodes: int, pods: int, workloads: int) -> MemoryRecord:
    insert = fill()
    templates()  # loaded before the baseline
    gc.collect()
    start = rss_bytes()
    began = time.perf_counter()
    for kind, page in fleet_pages(nodes, pods, workloads):
        insert(kind, page)
        del page  # as a list does: a page's raw objects go before the next is read
    seconds = time.perf_counter() - began
    gc.collect()
    filled = rss_bytes()
    mib = 1024 * 1024
    return MemoryRecord(
        variant, nodes, pods, workloads, start / mib, filled / mib, (filled - start) / mib, seconds
    )


def measure_in_child(
    variant: str, fill: Fill, nodes: int, pods: int, workloads: int
) -> MemoryRecord:
    """`_measure` in a fresh interpreter; `fill` must be importable (a module-level
    function) to reach it."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        record: MemoryRecord = pool.apply(_measure, (variant, fill, nodes, pods, workloads))
    return record
