"""`nexus-admit plan`: place the pending Workloads of a cluster dump, offline.

    nexus-admit plan --snapshot FILE [--workload NS/NAME]... [--policy NAME]
                     [--config FILE] [--output text|json]

Without --workload every Workload whose nexus check is Pending with quota reserved is placed,
in Kueue's admission order (priority, then creation); each sees the capacity taken by the
ones placed before it. The JSON output is a public interface:

    {"placements": [{"workload": "ns/name", "feasible": true, "reason": "",
                     "assignments": [{"podSet": "workers", "node": "n1", "pods": 2,
                                      "gpus": 16, "numaZones": [0, 1]}],
                     "terms": {"<term>": <value>}, "solveSeconds": 0.01,
                     "explanation": ["..."], "retryAfterSeconds": null}]}

Malformed objects are reported on stderr naming the object and field; the exit code is then 2
(the other workloads are still placed and printed).
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from nexus_admit.kube import labels as L
from nexus_admit.kube.dump import ClusterDump, DumpError, load_dump, load_objects
from nexus_admit.kube.errors import TranslationError, object_key
from nexus_admit.kube.kueue import admission_order_key
from nexus_admit.kube.serving import with_siblings
from nexus_admit.kube.translate import placement_config_from_object
from nexus_admit.model import Placement, PlacementConfig
from nexus_admit.placement.policies import make_policy
from nexus_admit.placement.sequence import OrderedPlacer

__all__ = ["OutputFormat", "PlanInputError", "PlanResult", "placement_json", "register", "run_plan"]

EXIT_INPUT = 2


class OutputFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


class PlanInputError(Exception):
    """Input that stops the whole plan (unreadable dump, unknown policy, ...)."""


@dataclass(slots=True)
class PlanResult:
    placements: list[Placement] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line per malformed object
    warnings: list[str] = field(default_factory=list)


def _load_config(path: Path) -> PlacementConfig:
    try:
        objs = load_objects(path)
    except DumpError as e:
        raise PlanInputError(str(e)) from None
    configs = [o for o in objs if o.get("kind") == L.KIND_PLACEMENT_CONFIG]
    if configs:
        return placement_config_from_object(configs[0])
    raise PlanInputError(f"{path}: no PlacementConfig object in the file")


def _load_config_or_spec(path: Path) -> PlacementConfig:
    """A PlacementConfig object, or a bare spec (a mapping without `kind`)."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PlanInputError(f"{path}: cannot read: {e}") from None
    if isinstance(doc, dict) and "kind" not in doc:
        return placement_config_from_object(doc)
    return _load_config(path)


def run_plan(
    dump: ClusterDump,
    *,
    workloads: Sequence[str] = (),
    policy: str = "nexus",
    config: PlacementConfig | None = None,
    seed: int = 0,
) -> PlanResult:
    """Place the selected (or all pending) Workloads of `dump` one after another.

    Raises PlanInputError / TranslationError for problems that stop the whole plan
    (unknown workload or policy, malformed nodes); a malformed Workload is recorded in
    `errors` and skipped.
    """
    result = PlanResult()
    try:
        engine = make_policy(policy, seed)
    except ValueError as e:
        raise PlanInputError(str(e)) from None
    cfg = config if config is not None else dump.placement_config()
    if workloads:
        selected = []
        for key in workloads:
            wl = dump.find_workload(key)
            if wl is None:
                raise PlanInputError(f"Workload {key} is not in the snapshot")
            selected.append(wl)
        selected.sort(key=admission_order_key)
    else:
        selected = dump.pending_workloads()
        if dump.kueue_index().our_checks() is None and selected:
            result.warnings.append(
                "the snapshot has no AdmissionCheck objects: every Workload with a Pending "
                "check is treated as waiting on nexus-admit (add admissionchecks to the dump)"
            )
    keys = [object_key(w) for w in selected]
    placer = OrderedPlacer(engine, dump.snapshot(exclude_workloads=keys))
    kueue = dump.kueue_index()
    # a service's replicas placed earlier in this plan are siblings of the later ones
    planned: dict[str, dict[str, int]] = {}
    for wl in selected:
        try:
            gang = dump.gang(wl, cfg, placer.snapshot, kueue)
        except TranslationError as e:
            result.errors.append(str(e))
            continue
        if gang.service is not None:
            gang = with_siblings(gang, planned.get(gang.service, {}))
        placement = placer.place(gang, cfg)
        if gang.service is not None and placement.feasible:
            held = planned.setdefault(gang.service, {})
            for node, pods in placement.pods_per_node().items():
                held[node] = held.get(node, 0) + pods
        result.placements.append(placement)
    return result


def placement_json(p: Placement) -> dict[str, Any]:
    """One placement in the stable JSON shape of `plan --output json`."""
    return {
        "workload": p.gang,
        "feasible": p.feasible,
        "reason": p.reason,
        "assignments": [
            {
                "podSet": a.pod_set,
                "node": a.node,
                "pods": a.pods,
                "gpus": a.gpus,
                "numaZones": list(a.numa_zones),
            }
            for a in p.assignments()
        ],
        "terms": {k: _num(v) for k, v in p.terms.items()},
        "solveSeconds": round(p.solve_seconds, 6),
        "explanation": list(p.explanation),
        # set when the answer is a deliberate hold (PlacementConfig.localityWait)
        "retryAfterSeconds": p.retry_after_seconds,
    }


def _num(v: float) -> float | int:
    return int(v) if float(v).is_integer() else round(float(v), 6)


def _render_text(result: PlanResult, console: Console) -> None:
    if not result.placements:
        console.print("No workload to place.")
    for p in result.placements:
        if p.feasible:
            title = (
                f"[bold]{p.gang}[/bold]: placed ({p.status.value}, {p.solve_seconds:.3f} s, "
                f"policy {p.policy})"
            )
        else:
            title = f"[bold]{p.gang}[/bold]: [red]not placed[/red] ({p.status.value})"
        console.print(title)
        if p.feasible:
            table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
            for col, justify in (
                ("Pod set", "left"),
                ("Node", "left"),
                ("Pods", "right"),
                ("GPUs", "right"),
                ("NUMA zones", "left"),
            ):
                table.add_column(col, justify=justify)  # type: ignore[arg-type]
            for a in p.assignments():
                zones = ",".join(str(z) for z in a.numa_zones) or "-"
                table.add_row(a.pod_set, a.node, str(a.pods), str(a.gpus), zones)
            console.print(table)
        else:
            console.print(f"  reason: {p.reason}", markup=False)
        for line in p.explanation:
            console.print(f"  - {line}", markup=False)
        console.print()


def plan(
    snapshot: Annotated[
        Path,
        typer.Option(
            "--snapshot",
            "-s",
            help="Cluster dump: `kubectl get nodes,pods,workloads,... -A -o yaml` output "
            "(a List) or multi-document YAML.",
            dir_okay=False,
        ),
    ],
    workload: Annotated[
        list[str] | None,
        typer.Option(
            "--workload",
            "-w",
            help="NAMESPACE/NAME of a Workload to place (repeatable). Default: every "
            "Workload pending on the nexus check.",
        ),
    ] = None,
    policy: Annotated[
        str,
        typer.Option(
            "--policy",
            "-p",
            help="Placement policy: nexus, or a baseline (default, binpack, bestfit, random, "
            "tas-bestfit, fgd).",
        ),
    ] = "nexus",
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="PlacementConfig YAML (object or bare spec). Default: the one in the snapshot "
            "referenced by the nexus AdmissionCheck, else built-in defaults.",
            dir_okay=False,
        ),
    ] = None,
    output: Annotated[
        OutputFormat, typer.Option("--output", "-o", help="text or json.")
    ] = OutputFormat.TEXT,
    seed: Annotated[int, typer.Option(help="Seed for randomised policies.")] = 0,
) -> None:
    """Place pending Workloads of a cluster dump and show where every pod would go."""
    err = Console(stderr=True, highlight=False)
    try:
        dump = load_dump(snapshot)
        cfg = _load_config_or_spec(config) if config is not None else None
        result = run_plan(dump, workloads=workload or (), policy=policy, config=cfg, seed=seed)
    except (DumpError, PlanInputError, TranslationError) as e:
        err.print(f"error: {e}", markup=False)
        raise typer.Exit(EXIT_INPUT) from None
    for w in result.warnings:
        err.print(f"warning: {w}", markup=False)
    for line in result.errors:
        err.print(f"error: {line}", markup=False)
    if output is OutputFormat.JSON:
        doc = {"placements": [placement_json(p) for p in result.placements]}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        _render_text(result, Console(highlight=False, soft_wrap=True))
    if result.errors:
        raise typer.Exit(EXIT_INPUT)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
