"""`nexus-admit bench`: every policy on the same synthetic fleets and gangs, side by side.

    nexus-admit bench [--sizes 100,1000,5000,12500] [--gangs 1,8,64,256] [--repeats 5]
                      [--policies nexus,default,...] [--reference-seconds 60]
                      [--warm 20] [--json bench-results/bench.json]
    nexus-admit bench --store-memory [--store-nodes 5000] [--store-pods 20000] ...

Prints one table (latency percentiles and quality per policy) and writes all records as
JSON. The `nexus (warm)` rows are decisions on the controller's tracked snapshot, after
its first decision of the shape (bench/runner.py). Timings are measurements of this
machine, never test assertions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from nexus_admit.bench.fleet import GANG_SIZES
from nexus_admit.bench.runner import run_bench, summarise
from nexus_admit.commands import bench_store
from nexus_admit.placement.policies import policy_names

__all__ = ["register"]


def _ints(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from None


def bench(
    sizes: Annotated[str, typer.Option(help="fleet sizes in nodes")] = "100,1000,5000,12500",
    gangs: Annotated[str, typer.Option(help="gang sizes in pods")] = ",".join(map(str, GANG_SIZES)),
    policies: Annotated[str, typer.Option(help="policies to compare (default: all)")] = "",
    repeats: Annotated[int, typer.Option(help="differently loaded fleets per size")] = 5,
    reference_seconds: Annotated[
        float, typer.Option(help="long-run unreduced reference solve per instance (0 = skip)")
    ] = 60.0,
    reference_repeats: Annotated[
        int | None, typer.Option(help="repeats that get a reference solve (default: all)")
    ] = None,
    time_limit: Annotated[float, typer.Option(help="engine time limit per solve, s")] = 1.0,
    warm: Annotated[
        int,
        typer.Option(
            help="nexus decisions of the one-pod gang per instance on a tracked snapshot "
            "after its first, each placement applied (the controller's warm path; 0 = none)",
            min=0,
        ),
    ] = 20,
    json_path: Annotated[Path, typer.Option("--json", help="where to write the JSON")] = Path(
        "bench-results/bench.json"
    ),
    store_memory: Annotated[
        bool,
        typer.Option(
            "--store-memory",
            help="instead: the controller's store filled with real objects, whole and "
            "stripped, RSS of each (commands/bench_store.py)",
        ),
    ] = False,
    store_nodes: Annotated[int, typer.Option(help="--store-memory: Nodes")] = 5000,
    store_pods: Annotated[int, typer.Option(help="--store-memory: Pods")] = 20000,
    store_workloads: Annotated[int, typer.Option(help="--store-memory: Workloads")] = 2500,
) -> None:
    """Benchmark the engine and the baselines on synthetic heterogeneous fleets."""
    if store_memory:
        bench_store.store_memory(store_nodes, store_pods, store_workloads, json_path)
        return
    names = [p for p in policies.split(",") if p] or policy_names()
    unknown = set(names) - set(policy_names())
    if unknown:
        raise typer.BadParameter(f"unknown policies {sorted(unknown)}; known: {policy_names()}")
    console = Console(stderr=True)
    with console.status("benchmarking") as status:
        result = run_bench(
            _ints(sizes),
            _ints(gangs),
            names,
            repeats,
            reference_seconds,
            time_limit,
            progress=lambda msg: status.update(msg),
            reference_repeats=reference_repeats,
            warm=warm,
        )
    table = _table(summarise(result))
    # piped output keeps every column readable instead of folding to 80 characters
    Console(width=None if Console().is_terminal else 160).print(table)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result.to_json(), indent=1))
    console.print(f"wrote {json_path}")


def _table(rows: list[dict[str, object]]) -> Table:
    table = Table(title="nexus-admit bench (lower is better except placed)")
    for col in (
        "nodes",
        "gang",
        "policy",
        "placed",
        "p50 ms",
        "p99 ms",
        "p99 CPU ms",
        "domains",
        "islands",
        "nodes used",
        "tier-mismatch GPUs",
        "VRAM stranded GiB",
        "gap max %",
        "violations",
    ):
        table.add_column(col, justify="right")
    for r in rows:

        def f(key: str, fmt: str = "{:.1f}", row: dict[str, object] = r) -> str:
            v = row.get(key)
            return "-" if v is None else fmt.format(v)

        table.add_row(
            str(r["nodes"]),
            str(r["gang"]),
            str(r["policy"]),
            f"{r['placed']}/{r['runs']}",
            f("p50Ms"),
            f("p99Ms"),
            f("p99CpuMs"),
            f("domainsSpanned", "{:.2f}"),
            f("islandsBroken", "{:.2f}"),
            f("nodesUsed"),
            f("tierMismatchGpus"),
            f("vramStrandedGiB"),
            f("gapToReferencePct", "{:.2f}"),
            str(r["violations"]),
        )
    return table


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
