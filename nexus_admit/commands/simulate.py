"""`nexus-admit simulate`: replay workloads through every placement policy side by side.

With no options it runs the bundled default scenario (under a minute on two cores): the gang
replay (64 Lingjun hosts, 220 jobs, seeds 1-10; six policies), then the openb `default`
trace under the FGD paper's protocol on a fixed half of the openb nodes, seed 42, the
paper's six baselines and the nexus CP-SAT engine, and prints both tables. `--report DIR`
also writes Markdown, PNG plots and JSON there and says where. The full study of the paper
is `--trace all --seeds 42-51 --nodes 1`. The traces come from the copy shipped in the
package unless `--data` / `$NEXUS_ADMIT_DATA` names another directory; `--pods` and
`--nodes-file` run a user's own pod and node lists (openb's columns) through the protocol.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from nexus_admit.model import ObjectiveWeights
from nexus_admit.sim import replay as rp
from nexus_admit.sim.data import DATA_ENV, csv_path, packaged_data
from nexus_admit.sim.openb import (
    NODE_COLUMNS,
    NODE_LIST,
    POD_COLUMNS,
    TRACES,
    OpenbRun,
    TraceError,
    pod_list,
    read_nodes,
    read_pods,
)
from nexus_admit.sim.openb_report import write_openb_report
from nexus_admit.sim.report import (
    paired_summary,
    replay_table,
    replay_table_title,
    write_replay_report,
)
from nexus_admit.sim.study import (
    OPENB_NOTES,
    PAPER_POLICIES,
    StudySpec,
    paired_against,
    run_study,
)

__all__ = ["parse_seeds", "register", "simulate"]

DEFAULT_POLICIES = (*PAPER_POLICIES, "nexus")
REPLAY_POLICIES = ("default", "binpack", "tas-bestfit", "gpu-packing", "fgd", "nexus")


def parse_seeds(text: str) -> list[int]:
    """"42-51", "42,43" or "42"."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            seeds.extend(range(int(lo), int(hi) + 1))
        else:
            seeds.append(int(part))
    if not seeds:
        raise typer.BadParameter(f"no seeds in {text!r}")
    return seeds


def _mix(text: str) -> tuple[float, float, float]:
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or min(parts) < 0 or sum(parts) <= 0:
        raise typer.BadParameter(
            f"--replay-mix wants three shares (training, inference, fractional), got {text!r}")
    total = sum(parts) if abs(sum(parts) - 1.0) > 1e-9 else 1.0
    return (parts[0] / total, parts[1] / total, parts[2] / total)


def _weights(text: str) -> tuple[tuple[str, int], ...]:
    """"tierMismatch=0,domainFragmentation=20" -> validated (name, value) pairs."""
    pairs: list[tuple[str, int]] = []
    for part in _split(text):
        name, _, value = part.partition("=")
        try:
            pairs.append((name.strip(), int(value)))
        except ValueError:
            raise typer.BadParameter(
                f"--replay-weights wants name=integer pairs, got {part!r}") from None
    try:
        rp.replay_config(rp.ReplayScenario(weights=tuple(pairs)))
    except ValidationError as e:
        known = ", ".join(f.alias or n for n, f in ObjectiveWeights.model_fields.items())
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc']))}: "
            + ("unknown weight" if err["type"] == "extra_forbidden" else err["msg"])
            for err in e.errors())
        raise typer.BadParameter(
            f"--replay-weights: {problems} (weights: {known})") from None
    return tuple(pairs)


def _split(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


_DATA_HINT = (
    f"point --data or {DATA_ENV} at a directory holding openb/ and lingjun/ "
    "(.csv or .csv.gz), or leave both unset for the data shipped with nexus-admit"
)


def _data_dir(data: Path | None) -> Path:
    """The directory to read traces from: the option (or its environment variable) when
    given, else the packaged data."""
    if data is None:
        return packaged_data()
    if not data.is_dir():
        raise typer.BadParameter(f"{data} is not a directory; {_DATA_HINT}", param_hint="--data")
    return data


def _require(data: Path, relative: str, what: str) -> None:
    if csv_path(data, relative) is None:
        raise typer.BadParameter(
            f"{data}/{relative} not found ({what}); {_DATA_HINT}", param_hint="--data"
        )


def _print_report(console: Console, report: Path) -> None:
    """Where the report went, on one unwrapped line a user can copy."""
    where = report.resolve()
    pages = [p.name for p in (where / "README.md", where / "REPLAY.md") if p.is_file()]
    plots = len(list(where.glob("*.png")))
    console.print(
        f"report written to {where}: {', '.join(pages)}, {plots} PNG plots, JSON",
        markup=False,
        soft_wrap=True,
    )


def simulate(
    trace: Annotated[str, typer.Option(help="openb trace(s): default, multigpu50, gpuspec33, "
                                             "comma-separated, or 'all'")] = "default",
    seeds: Annotated[str, typer.Option(help="seeds, e.g. 42-51 or 42,43")] = "42",
    policies: Annotated[str, typer.Option(help="comma-separated registered policies")] =
        ",".join(DEFAULT_POLICIES),
    nexus_seeds: Annotated[str | None, typer.Option(
        help="run the CP-SAT engine ('nexus') only on these seeds (it is the slow one)")] = None,
    workers: Annotated[int, typer.Option(help="worker processes")] = 2,
    nodes: Annotated[float, typer.Option(
        help="fraction of the openb nodes to simulate (a fixed sample); 1 = all 1213")] = 0.5,
    data: Annotated[Path | None, typer.Option(
        envvar=DATA_ENV, show_default=False,
        help="directory holding other traces as openb/ and lingjun/ (.csv or .csv.gz); "
             "default: the data shipped with nexus-admit")] = None,
    pods: Annotated[Path | None, typer.Option(
        exists=True, dir_okay=False, show_default=False,
        help=f"your own pod list for the openb study, instead of --trace (.csv or .csv.gz; "
             f"openb's columns: {', '.join(POD_COLUMNS)}, optional gpu_spec)")] = None,
    nodes_file: Annotated[Path | None, typer.Option(
        exists=True, dir_okay=False, show_default=False,
        help=f"your own node list for the openb study, instead of openb's (openb's "
             f"columns: {', '.join(NODE_COLUMNS)}); --nodes samples it")] = None,
    report: Annotated[Path | None, typer.Option(
        help="write README.md, PNG plots and JSON into this directory")] = None,
    openb: Annotated[bool, typer.Option(help="run the openb study")] = True,
    replay: Annotated[bool, typer.Option(help="run the multi-tenant gang replay")] = True,
    replay_seeds: Annotated[str, typer.Option(help="replay scenario seeds")] = "1-10",
    replay_policies: Annotated[str, typer.Option(help="policies in the replay")] =
        ",".join(REPLAY_POLICIES),
    replay_hosts: Annotated[int, typer.Option(help="replay cluster size (hosts, ×8)")] = 64,
    replay_jobs: Annotated[int, typer.Option(help="jobs per replay")] = 220,
    replay_load: Annotated[float, typer.Option(help="offered load / capacity")] = 1.15,
    replay_mix: Annotated[str, typer.Option(
        help="job mix: shares of training, inference, fractional")] = "0.25,0.35,0.40",
    replay_weights: Annotated[str, typer.Option(
        help="nexus objective weights for the replay, as PlacementConfig names, e.g. "
             "tierMismatch=0,gangSplit=800 (what-if runs)")] = "",
    replay_locality_wait: Annotated[float, typer.Option(
        min=0.0, help="nexus's localityWait in the replay: seconds a gang one aggregation "
                      "domain could hold may wait for room there before it is split (0: off)")
    ] = rp.REPLAY_LOCALITY_WAIT_SECONDS,
) -> None:
    """Replay the openb trace under the FGD paper's protocol through each policy, then a
    multi-tenant gang replay; print tables, optionally write a report."""
    console = Console(width=None if Console().is_terminal else 150)
    notes: list[str] = []
    data_dir = _data_dir(data)
    if replay:
        mix = _mix(replay_mix)
        weights = _weights(replay_weights)
        _require(data_dir, rp.FABRIC, "the replay's fabric")
        scenarios = _replay_scenarios(
            parse_seeds(replay_seeds), replay_hosts, replay_jobs, replay_load, mix, weights,
            replay_locality_wait,
        )
        notes += _gang_replay(
            console, scenarios, _split(replay_policies), data_dir, workers, report
        )
    if not openb:
        if report is not None:
            _print_report(console, report)
        return
    traces = _openb_traces(trace, data_dir, pods, nodes_file)
    seed_list = parse_seeds(seeds)
    seeds_for = {"nexus": parse_seeds(nexus_seeds)} if nexus_seeds else {}
    spec = StudySpec(traces, _split(policies), seed_list, data_dir, workers, nodes, seeds_for,
                     pods, nodes_file)
    _openb_study(console, spec, report, notes)


def _openb_traces(trace: str, data_dir: Path, pods: Path | None, nodes_file: Path | None
                  ) -> list[str]:
    """The openb study's trace names, once every list they read is there (and a user's own
    lists read without a fault)."""
    if pods is not None:
        traces = [_trace_name(pods)]
    else:
        traces = list(TRACES) if trace == "all" else _split(trace)
        for t in traces:
            if t not in TRACES:
                raise typer.BadParameter(f"unknown trace {t!r}; known: {', '.join(TRACES)}")
    bundled = ([] if nodes_file else [NODE_LIST]) + ([] if pods else [pod_list(t) for t in traces])
    if bundled and not (data_dir / "openb").is_dir():
        raise typer.BadParameter(f"{data_dir}/openb not found; {_DATA_HINT}", param_hint="--data")
    for relative in bundled:
        _require(data_dir, relative, "openb")
    _check_own_lists(pods, nodes_file)
    return traces


def _trace_name(pods: Path) -> str:
    """What a user's pod list's runs are called: its file name without .csv / .gz."""
    name = pods.name.removesuffix(".gz").removesuffix(".csv")
    return name or pods.name


def _check_own_lists(pods: Path | None, nodes_file: Path | None) -> None:
    """Read a user's own lists before any run starts (the runs read them again in their
    worker processes), so a malformed row stops here with its file, line and column."""
    try:
        if pods is not None:
            read_pods(pods)
        if nodes_file is not None:
            read_nodes(nodes_file)
    except TraceError as err:
        typer.echo(f"error: {err}", err=True)  # as written: no markup, no emoji codes (":100:")
        raise typer.Exit(2) from None


def _replay_scenarios(
    seeds: list[int],
    hosts: int,
    jobs: int,
    load: float,
    mix: tuple[float, float, float],
    weights: tuple[tuple[str, int], ...],
    locality_wait: float,
) -> list[rp.ReplayScenario]:
    """One scenario per seed, named after what differs from the default scenario."""
    name = f"h{hosts}-j{jobs}"
    if mix != rp.ReplayScenario().mix:
        name += "-mix" + "-".join(f"{m:g}" for m in mix)
    if load != rp.ReplayScenario().load:
        name += f"-load{load:g}"
    if weights:
        name += "-" + "-".join(f"{k}{v}" for k, v in weights)
    if locality_wait != rp.REPLAY_LOCALITY_WAIT_SECONDS:
        name += f"-wait{locality_wait:g}s"
    return [rp.ReplayScenario(name=name, seed=s, hosts=hosts, jobs=jobs, load=load, mix=mix,
                              weights=weights, locality_wait_seconds=locality_wait)
            for s in seeds]


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=console)


def _gang_replay(
    console: Console,
    scenarios: list[rp.ReplayScenario],
    rpolicies: list[str],
    data_dir: Path,
    workers: int,
    report: Path | None,
) -> list[str]:
    """Run and print the gang replay (and write its report): the notes for the openb
    report."""
    with _progress(console) as progress:
        bar = progress.add_task("gang replays", total=len(scenarios) * len(rpolicies), last="")

        def rtick(done: int, _total: int, r: rp.ReplayResult) -> None:
            progress.update(bar, completed=done, last=f"{r.policy}/{r.seed}")

        results = rp.run_replays(rpolicies, scenarios, data_dir, workers, rtick)
    comparison = rp.compare(results)
    header, body = replay_table(results)
    rtable = Table(title=replay_table_title(results))
    for col in header:
        rtable.add_column(col, justify="left" if col == "metric" else "right")
    for row in body:
        rtable.add_row(*row)
    console.print(rtable)
    per_seed = []
    for scn in scenarios:
        rows = [c for c in comparison if c["seed"] == scn.seed]
        per_seed.append(f"{sum(1 for c in rows if c['ours_best'])} (seed {scn.seed})")
    n_metrics = sum(1 for c in comparison if c["seed"] == scenarios[0].seed)
    console.print(f"nexus best on, of {n_metrics} replay metrics: " + ", ".join(per_seed))
    if len(scenarios) > 1:
        comparison += _print_means(console, results, len(scenarios))
    if report is None:
        return []
    meta = {"scenarios": [vars(s) for s in scenarios], "policies": rpolicies}
    path = write_replay_report(results, comparison, report, meta, rp.MODEL_NOTES)
    return [f"Gang replay: [{path.name}]({path.name})"]


def _print_means(
    console: Console, results: list[rp.ReplayResult], n_seeds: int
) -> list[dict[str, Any]]:
    """Print where nexus is best on the means over seeds, and the paired verdicts; the
    rows of the means."""
    means = rp.compare(results, across_seeds=True)
    lost = [escape(f"{c['metric']} ({', '.join(c['best'])})") for c in means
            if not c["ours_best"]]
    console.print(f"mean over {n_seeds} seeds: nexus best on "
                  f"{len(means) - len(lost)} of {len(means)}; not best on: "
                  + ("; ".join(lost) or "none"))
    summary = paired_summary(means)
    console.print(
        "paired per seed, 95 % interval: nexus "
        + "; ".join(f"{key} on {len(summary[key])}" for key in
                    ("ahead of all", "within noise", "behind", "tie") if key in summary)
        + (": behind on " + escape("; ".join(summary["behind"]))
           if "behind" in summary else ""))
    return means


def _openb_study(
    console: Console, spec: StudySpec, report: Path | None, notes: list[str]
) -> None:
    """Run and print the openb study, and write its report."""
    total = len(spec.tasks())
    with _progress(console) as progress:
        bar = progress.add_task("openb runs", total=total, last="")

        def tick(done: int, _total: int, run: OpenbRun) -> None:
            progress.update(bar, completed=done,
                            last=f"{run.trace}/{run.policy}/{run.seed}: {run.alloc_130:.2f} %")

        result = run_study(spec, on_progress=tick)
    rows = result.table()
    _print_openb_table(console, rows, total, result.seconds, spec.node_fraction)
    paired = paired_against(result.runs)
    _print_paired(console, paired)
    if report is not None:
        meta = {"traces": spec.traces, "seeds": spec.seeds, "policies": spec.policies,
                "runs": total, "seconds": result.seconds, "workers": spec.workers,
                "node_fraction": spec.node_fraction,
                "nexus_seeds": spec.seeds_for.get("nexus"),
                "pods_file": spec.pods_file and str(spec.pods_file),
                "nodes_file": spec.nodes_file and str(spec.nodes_file)}
        write_openb_report(rows, result.runs, report, meta, [*notes, *OPENB_NOTES], paired)
        _print_report(console, report)


def _print_openb_table(
    console: Console, rows: list[dict[str, Any]], total: int, seconds: float, nodes: float
) -> None:
    table = Table(title=f"openb GPU allocation ({total} runs, {seconds:.0f} s, "
                        f"{nodes:.0%} of nodes)")
    for col in ("trace", "policy", "seeds", "@100 %", "paper", "@130 %", "paper", "failed",
                "8-GPU nodes used", "of them partly idle", "s/run"):
        table.add_column(col, justify="left" if col in ("trace", "policy") else "right")
    for r in rows:
        table.add_row(
            r["trace"], r["label"], str(len(r["seeds"])), f"{r['alloc_100']:.2f}",
            "–" if r["published_100"] is None else f"{r['published_100']:.2f}",
            f"{r['alloc_130']:.2f}",
            "–" if r["published_130"] is None else f"{r['published_130']:.2f}",
            f"{r['failed_pods']:.0f}",
            r["broken8_levels"],
            r["partial8_levels"],
            f"{r['seconds_per_run']:.1f}",
        )
    console.print(table)
    console.print(f"[dim]8-GPU nodes (of {rows[0]['nodes8']}) no longer fully free, and those of "
                  f"them left partly idle (islands broken), at 10/30/50/70/90/100 % of capacity "
                  f"requested[/dim]")
    if nodes < 1:
        console.print("[dim]paper figures are for the full cluster (--nodes 1); "
                      "a node sample is not comparable to them[/dim]")


def _print_paired(console: Console, paired: list[dict[str, Any]]) -> None:
    """nexus − FGD per trace, seed by seed."""
    for t in dict.fromkeys(row["trace"] for row in paired):
        rows_t = [row for row in paired if row["trace"] == t]
        n = rows_t[0]["seeds"]
        if n < 2:
            console.print(f"{t}, nexus − FGD on one seed (+ = nexus better; run more seeds for "
                          "an interval): " + "; ".join(f"{row['metric']} {row['mean']:+g}"
                                                      for row in rows_t), markup=False)
            continue
        console.print(
            f"{t}, nexus − FGD per seed ({n} seeds, 95 % interval, + = nexus better): "
            + "; ".join(f"{row['metric']} {row['mean']:+g} ± {row['ci95']:g} "
                        f"({row['verdict']})" for row in rows_t),
            markup=False)


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
