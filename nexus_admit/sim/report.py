"""Report writer: Markdown + PNG plots (matplotlib, headless) + JSON, one directory.

matplotlib is the optional extra `report` (`make simulate` installs it through `dev`); the
controller image leaves it out. Without it the tables and JSON are written, the plots are
skipped, and the report and the log say so.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nexus_admit.sim.replay import WAIT_REASONS, standing

log = logging.getLogger(__name__)

__all__ = [
    "PLOTS_SKIPPED",
    "closest_rival",
    "markdown_table",
    "paired_summary",
    "plot_links",
    "plot_paired",
    "plot_replay",
    "pyplot",
    "replay_table",
    "replay_table_title",
    "write_json",
    "write_replay_report",
]


PLOTS_SKIPPED = (
    "Plots skipped: matplotlib is not installed (it is the optional extra `report`: "
    "`pip install 'nexus-admit[report]'`)."
)


def pyplot() -> Any:
    """matplotlib's pyplot on the headless backend, or None (with a notice, once) when the
    optional extra `report` is not installed: the tables and JSON are written anyway."""
    try:
        import matplotlib
    except ImportError:
        global _NOTICE_GIVEN
        if not _NOTICE_GIVEN:
            _NOTICE_GIVEN = True
            log.warning(PLOTS_SKIPPED)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_NOTICE_GIVEN = False


def plot_links(plots: Sequence[Path]) -> list[str]:
    """Markdown image links of the plots, or the notice that they were skipped."""
    if not plots and pyplot() is None:
        return [f"_{PLOTS_SKIPPED}_"]
    return [f"![{p.stem}]({p.name})" for p in plots]


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    head = "| " + " | ".join(title for _, title in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_fmt(r.get(key)) for key, _ in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=1, default=str))


# ---------------------------------------------------------------- the gang replay

REPLAY_ROWS = (
    ("effective_throughput", "effective throughput %"),
    ("gpu_allocation", "GPU allocated %"),
    ("offered_load", "work offered in window %"),
    ("work_not_done", "  − work not done in window %"),
    ("slowdown_overhead", "  + GPU time held beyond the work %"),
    ("cost_per_effective_gpu_hour", "cost / effective GPU-h"),
    ("tier_mismatch_gpu_hours", "Bronze-on-premium GPU-h, Gold waiting"),
    ("stranded_vram_gib_hours", "stranded VRAM GiB-h"),
    ("pristine_islands_mean", "free 8-GPU nodes (mean)"),
    ("pristine_cliques_mean", "free NVLink cliques (mean)"),
    ("one_tor_share", "multi-node gangs in 1 ToR"),
    ("one_agg_share", "multi-node gangs in 1 agg."),
    ("mean_factor_multinode", "speed factor, multi-node"),
    ("pending_at_end", "queued at end"),
    ("evictions", "runs evicted (preemption)"),
    ("lost_gpu_hours", "work lost to evictions GPU-h"),
    ("admitted", "admitted"),
    ("seconds", "sim seconds"),
)


# the groups whose waits the table splits by reason (sim/replay.py WAIT_REASONS), summed
# over the group's jobs: Gold, and the biggest gangs
WAIT_ROWS = ("tier:gold", "size:64-256 GPUs")


def replay_table(results: Sequence[Any]) -> tuple[list[str], list[list[str]]]:
    """Rows: metrics (incl. delays by tier and size), columns: policies, for the first
    scenario: the mean over its seeds (what the across-seeds ranking compares; one seed
    alone is noisy), or that seed's values when it has one. The JSON holds every run."""
    if not results:
        return [], []
    scenario = results[0].scenario
    by_policy: dict[str, list[Any]] = defaultdict(list)
    for r in results:
        if r.scenario == scenario:
            by_policy[r.policy].append(r)
    policies = list(by_policy)

    def mean(values: Sequence[float]) -> float:
        return float(np.mean(values)) if values else 0.0

    def cell(values: Sequence[float]) -> str:
        m = mean(values)
        return str(int(m)) if m.is_integer() and all(isinstance(v, int) for v in values) \
            else _fmt(m)

    header = ["metric", *policies]
    body = []
    for key, title in REPLAY_ROWS:
        body.append([title, *[cell([getattr(r, key) for r in by_policy[p]]) for p in policies]])
    groups = sorted({g for rs in by_policy.values() for r in rs for g in r.delay if g != "all"})
    for g in groups:
        cells = []
        for p in policies:
            stats = [r.delay.get(g, {}) for r in by_policy[p]]
            cells.append(f"{mean([s.get('mean', 0.0) for s in stats]):.2f}/"
                         f"{mean([s.get('p95', 0.0) for s in stats]):.2f}")
        body.append([f"delay h mean/p95 {g.split(':', 1)[-1]}", *cells])
    for g in WAIT_ROWS:
        if not any(g in r.wait_hours for rs in by_policy.values() for r in rs):
            continue
        cells = []
        for p in policies:
            hours = [r.wait_hours.get(g, {}) for r in by_policy[p]]
            cells.append("/".join(f"{mean([h.get(why, 0.0) for h in hours]):.1f}"
                                  for why in WAIT_REASONS))
        body.append([f"waited h {g.split(':', 1)[-1]}: {'/'.join(WAIT_REASONS)}", *cells])
    return header, body


def replay_table_title(results: Sequence[Any]) -> str:
    """What `replay_table` shows: the scenario and the seeds it averages."""
    if not results:
        return "gang replay"
    scenario = results[0].scenario
    seeds = sorted({r.seed for r in results if r.scenario == scenario})
    which = (f"mean over seeds {', '.join(map(str, seeds))}" if len(seeds) > 1
             else f"seed {seeds[0]}")
    runs = f"{len(results)} run" + ("s" if len(results) != 1 else "")
    return f"gang replay {scenario}, {which} ({runs})"


def closest_rival(row: dict[str, Any]) -> str | None:
    """The other policy a metric's across-seeds verdict turns on: the best by mean of those
    nexus is not clearly ahead of (any it is behind of, else within noise of), else the
    best of the others."""
    paired = row.get("paired", {})
    if not paired:
        return None
    pick = max if row["higher_is_better"] else min
    for verdicts in (("behind",), ("within noise",), ("ahead", "tie")):
        close = [p for p, v in paired.items() if v["verdict"] in verdicts]
        if close:
            return pick(close, key=lambda p: row["values"][p])
    return None


def plot_paired(means: Sequence[dict[str, Any]], out: Path, scenario: str) -> Path | None:
    """A forest plot: per metric, nexus's paired per-seed difference to its closest rival
    with the 95 % interval, relative to the rival's mean (positive: nexus better). Metrics
    whose rival mean is 0 have no relative scale and are left out."""
    rows = []
    for row in means:
        rival = closest_rival(row)
        if rival is None or not row["values"][rival]:
            continue
        d = row["paired"][rival]
        scale = 100.0 / abs(row["values"][rival])
        mean, half = d["mean"] * scale, d["ci95"] * scale
        rows.append((f"{row['metric']} (vs {rival}) {mean:+.0f} ± {half:.0f} %", mean, half,
                     d["verdict"]))
    if not rows:
        return None
    plt = pyplot()
    if plt is None:
        return None

    colours = {"ahead": "tab:green", "behind": "tab:red"}
    limit = 100.0  # near-zero delays give huge relative intervals: clip, the label has them
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.4))
    for y, (_label, mean, half, verdict) in enumerate(rows):
        colour = colours.get(verdict, "tab:grey")
        finite = half if np.isfinite(half) else 2 * limit
        low, high = max(mean - finite, -limit), min(mean + finite, limit)
        ax.plot([low, high], [y, y], color=colour, lw=1.5)
        ax.plot([min(max(mean, -limit), limit)], [y], "o", color=colour)
    ax.set_xlim(-limit * 1.05, limit * 1.05)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("nexus − closest rival, % of the rival's mean (right: nexus better)\n"
                  "bars: 95 % interval over seeds, drawn clipped at ±100 %")
    ax.set_title(f"replay {scenario}: paired per-seed differences "
                 "(green: ahead, red: behind, grey: within noise)", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    path = out / f"replay_{scenario}_paired.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def paired_summary(means: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """The across-seeds rows (`compare(..., across_seeds=True)`) grouped by where `ours`
    stands once seed-to-seed noise is counted: 'ahead of all', 'behind', 'within noise'
    (and 'tie'); each entry names the metric and, when behind, who is ahead and by how
    much, otherwise the difference to the best of the others it is not clearly ahead of
    (paired difference ± 95 % half-width, in the metric's unit, positive when `ours` is
    better)."""
    out: dict[str, list[str]] = defaultdict(list)
    for row in means:
        where = standing(row)
        text = row["metric"]
        paired = row.get("paired", {})
        if where == "behind":
            ahead = [(p, v) for p, v in paired.items() if v["verdict"] == "behind"]
            text += " (" + ", ".join(f"{p} ahead by {-v['mean']:g} ± {v['ci95']:g}"
                                     for p, v in ahead) + ")"
        elif where in ("within noise", "ahead of all") and paired:
            rival = closest_rival(row)
            assert rival is not None
            v = paired[rival]
            text += f" (vs {rival}: {v['mean']:+g} ± {v['ci95']:g})"
        out[where].append(text)
    return dict(out)


# what a platform team's manager asks first, in that order: (metric, plain words, unit)
HEADLINE_METRICS = (
    ("effective_throughput", "useful GPU work (effective throughput)", "% of capacity"),
    ("cost_per_effective_gpu_hour", "cost per useful GPU-hour", "price units"),
    ("delay_mean[tier:gold]", "Gold mean queueing delay", "h"),
    ("delay_p95[size:64-256 GPUs]", "p95 queueing delay of 64-256-GPU gangs", "h"),
    ("tier_mismatch_gpu_hours", "Bronze on premium GPUs while Gold waits", "GPU-h"),
    ("one_tor_share", "multi-node gangs kept inside one ToR", "share"),
    ("gpu_allocation", "GPU allocation", "% of capacity"),
)


def replay_summary(results: Sequence[Any], comparison: Sequence[dict[str, Any]],
                   ours: str = "nexus") -> list[str]:
    """Markdown bullets for the top of the report, per scenario ranked across seeds: each
    headline metric as `ours` against the best other policy by mean, with the paired
    verdict, then GPU allocation split into work offered, work not done and GPU time held
    beyond the work for `ours` and the policy that allocates most, so a lead in allocation
    that comes from slowed-down gangs reads as such. Everything is read off the data."""
    lines: list[str] = []
    by_scenario: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for row in comparison:
        if row["seed"] == -1:
            by_scenario[row["scenario"]][row["metric"]] = row
    for scenario, rows in by_scenario.items():
        seeds = sorted({r.seed for r in results if r.scenario == scenario})
        over = f"mean over {len(seeds)} seeds" if len(seeds) != 1 else f"seed {seeds[0]}"
        lines.append(f"**{scenario}**, {over}, {ours} against the "
                     "best other policy on each metric (verdict from seed-paired 95 % "
                     "intervals):")
        lines.append("")
        for metric, words, unit in HEADLINE_METRICS:
            row = rows.get(metric)
            if row is None or ours not in row["values"]:
                continue
            values = row["values"]
            others = {p: v for p, v in values.items() if p != ours}
            if not others:
                continue
            pick = max if row["higher_is_better"] else min
            rival = pick(others, key=lambda p: others[p])
            verdict = {"ahead of all": "ahead of every other policy", "behind": "behind",
                       "within noise": "within noise", "tie": "tied"}.get(standing(row), "")
            lines.append(f"- {words}: {ours} {_fmt(values[ours])} vs {rival} "
                         f"{_fmt(values[rival])} {unit}" + (f" — {verdict}" if verdict else ""))
        split = _allocation_split(results, scenario, ours)
        if split:
            lines.append(split)
        lines.append("")
    return lines


def _allocation_split(results: Sequence[Any], scenario: str, ours: str) -> str:
    """One bullet: allocation = offered − not done + held beyond the work, for `ours` and the
    policy with the highest mean allocation (when that is another policy); it says the lead
    is slowdown only when that policy both holds more beyond its work and does no more work."""
    parts: dict[str, list[Any]] = defaultdict(list)
    for r in results:
        if r.scenario == scenario:
            parts[r.policy].append(r)

    def mean(policy: str, key: str) -> float:
        return float(np.mean([getattr(r, key) for r in parts[policy]]))

    if ours not in parts:
        return ""
    top = max(parts, key=lambda p: mean(p, "gpu_allocation"))
    if top == ours:
        return ""
    offered = mean(ours, "offered_load")

    def said(policy: str) -> str:
        return (f"{policy} {mean(policy, 'gpu_allocation'):.1f} = "
                f"{mean(policy, 'offered_load'):.1f} − {mean(policy, 'work_not_done'):.1f} + "
                f"{mean(policy, 'slowdown_overhead'):.1f}")

    return ("- GPU allocation (% of capacity) = work offered − work not done in the window + "
            f"GPU time held beyond the work: {said(top)}; {said(ours)}. With "
            f"{offered:.1f} % offered, {top}'s lead comes from "
            f"{mean(top, 'slowdown_overhead') - mean(ours, 'slowdown_overhead'):.1f} points "
            "more GPU time held beyond the work (slowed-down gangs), not from more work done."
            if mean(top, "slowdown_overhead") > mean(ours, "slowdown_overhead")
            and mean(top, "effective_throughput") <= mean(ours, "effective_throughput")
            else f"- GPU allocation split (offered − not done + held beyond the work): "
                 f"{said(top)}; {said(ours)}.")


def plot_replay(results: Sequence[Any], out: Path) -> list[Path]:
    plt = pyplot()
    if plt is None:
        return []

    files = []
    by_group: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for r in results:
        by_group[(r.scenario, r.seed)].append(r)
    for (scenario, seed), rs in by_group.items():
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
        for r in rs:
            lw = 1.8 if r.policy == "nexus" else 1.0
            axes[0].step(r.series_t, r.series_alloc, where="post", label=r.policy, lw=lw)
            axes[1].step(r.series_t, r.series_islands, where="post", label=r.policy, lw=lw)
        axes[0].set(title=f"replay {scenario}/seed {seed}: GPU allocated",
                    xlabel="hours", ylabel="% of GPUs")
        axes[1].set(title="fully free 8-GPU nodes", xlabel="hours", ylabel="nodes")
        names = [r.policy for r in rs]
        x = np.arange(len(names))
        eff = [r.effective_throughput for r in rs]
        cost = [r.cost_per_effective_gpu_hour for r in rs]
        tor = [100 * r.one_tor_share for r in rs]
        width = 0.27
        axes[2].bar(x - width, eff, width, label="effective throughput %")
        axes[2].bar(x, tor, width, label="multi-node gangs in one ToR %")
        ax2 = axes[2].twinx()
        ax2.bar(x + width, cost, width, color="tab:red", alpha=0.6, label="cost / effective GPU-h")
        ax2.set_ylabel("cost per effective GPU-hour")
        axes[2].set_xticks(x, names, rotation=30, ha="right")
        axes[2].set_title("throughput, locality, cost")
        axes[2].set_ylim(0, 105)  # both bars are percentages
        axes[2].legend(fontsize=7, loc="upper left")
        ax2.legend(fontsize=7, loc="upper right")
        for ax in axes[:2]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"replay_{scenario}_{seed}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


def write_replay_report(
    results: Sequence[Any],
    comparison: Sequence[dict[str, Any]],
    out: Path,
    meta: dict[str, Any],
    assumptions: str = "",
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    plots = plot_replay(results, out)
    for scenario in dict.fromkeys(r["scenario"] for r in comparison if r["seed"] == -1):
        forest = plot_paired([r for r in comparison
                              if r["seed"] == -1 and r["scenario"] == scenario], out, scenario)
        if forest is not None:
            plots.insert(0, forest)
    write_json(out / "replay.json", {"meta": meta, "results": [r.to_json() for r in results],
                                      "comparison": list(comparison)})
    header, body = replay_table(results)
    lines = ["# Multi-tenant gang replay", "", "## Summary", "",
             *replay_summary(results, comparison)]
    if assumptions:
        lines += ["## The model and how to read it", "", assumptions.strip(), ""]
    if header:
        lines += [f"{replay_table_title(results)}:", ""]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        lines.append("")
    lines += _against_default(results)
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for row in comparison:
        groups[(row["scenario"], row["seed"])].append(row)
    lines += _where_best(groups)
    lines += _noise_sections(groups)
    lines += _mean_tables(groups)
    lines += ["", *plot_links(plots), ""]
    path = out / "REPLAY.md"
    path.write_text("\n".join(lines))
    return path


def _against_default(results: Sequence[Any]) -> list[str]:
    """Cost, throughput and multi-node speed of each policy relative to `default`."""
    lines = ["## Against the kube default scheduler", "",
             "Per scenario/seed: GPU cost per effective GPU-hour (lower is better), effective "
             "throughput and the mean speed factor of multi-node gangs, each relative to "
             "`default`. These check claims such as \"30-50 % lower GPU cost from tier "
             "matching\" and \"3-10x faster training from fabric co-location\" under this "
             "model; the slowdown model caps any co-location speed-up at 1/0.30 = 3.3x "
             "(Gavel's median 8-GPU penalty) and only for gangs the default spreads across "
             "aggregation domains.", "",
             "| scenario/seed | policy | cost per effective GPU-h | effective throughput | "
             "multi-node gang speed |", "|---|---|---|---|---|"]
    by_seed: dict[tuple[str, int], dict[str, Any]] = defaultdict(dict)
    for r in results:
        by_seed[(r.scenario, r.seed)][r.policy] = r
    for (scenario, seed), rs in by_seed.items():
        ref = rs.get("default")
        if ref is None:
            continue
        for policy, r in rs.items():
            if policy == "default":
                continue
            cost = (r.cost_per_effective_gpu_hour / ref.cost_per_effective_gpu_hour - 1) * 100 \
                if ref.cost_per_effective_gpu_hour else 0.0
            eff = r.effective_throughput / ref.effective_throughput \
                if ref.effective_throughput else 0.0
            speed = r.mean_factor_multinode / ref.mean_factor_multinode \
                if ref.mean_factor_multinode else 0.0
            lines.append(f"| {scenario}/{seed} | {policy} | {cost:+.0f} % | {eff:.2f}x | "
                         f"{speed:.2f}x |")
    lines.append("")
    return lines


def _where_best(groups: dict[tuple[str, int], list[dict[str, Any]]]) -> list[str]:
    """Per scenario/seed, the metrics nexus is best on (ties count) and the others."""
    lines = ["## Where nexus is best (ties count)", ""]
    for (scenario, seed), rows in groups.items():
        won = [r["metric"] for r in rows if r["ours_best"]]
        lost = [f"{r['metric']} (best: {', '.join(r['best'])})" for r in rows
                if not r["ours_best"]]
        where = f"{scenario}/mean over seeds" if seed == -1 else f"{scenario}/seed {seed}"
        lines.append(f"- {where}: best on {len(won)} of {len(rows)} metrics"
                     + (f"; not best on: {'; '.join(lost)}" if lost else ""))
    return lines


def _noise_sections(groups: dict[tuple[str, int], list[dict[str, Any]]]) -> list[str]:
    """Per scenario, the paired per-seed differences: ahead, behind or within noise."""
    lines: list[str] = []
    for (scenario, seed), rows in groups.items():
        if seed != -1 or not any("paired" in r for r in rows):
            continue
        summary = paired_summary(rows)
        n_seeds = max(v["seeds"] for r in rows for v in r.get("paired", {}).values())
        lines += ["", f"## {scenario}: seed-to-seed noise ({n_seeds} seeds)", "",
                  "Every policy sees the same arrivals on a seed, so each metric is compared "
                  "as the per-seed difference between nexus and each other policy; its mean "
                  "and 95 % interval (Student's t) say whether nexus is ahead, behind, or "
                  "within noise.", ""]
        for key, title in (("ahead of all", "ahead of every other policy"),
                           ("behind", "behind some policy"),
                           ("within noise", "within noise of the best other policy"),
                           ("tie", "tied on every seed")):
            if summary.get(key):
                lines.append(f"- {title} on {len(summary[key])} of {len(rows)}: "
                             + "; ".join(summary[key]))
    return lines


def _mean_tables(groups: dict[tuple[str, int], list[dict[str, Any]]]) -> list[str]:
    """Per scenario, every metric's mean over seeds per policy, the best in bold."""
    lines: list[str] = []
    for (scenario, seed), rows in groups.items():
        if seed != -1:
            continue
        policies = list(rows[0]["values"])
        lines += ["", f"## {scenario}: mean over seeds (best in bold)", "",
                  "| metric | " + " | ".join(policies) + " |",
                  "|---|" + "---|" * len(policies)]
        for r in rows:
            cells = [f"**{_fmt(r['values'][p])}**" if p in r["best"] else _fmt(r["values"][p])
                     for p in policies]
            lines.append(f"| {r['metric']} | " + " | ".join(cells) + " |")
    return lines
