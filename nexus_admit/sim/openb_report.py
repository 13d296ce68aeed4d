"""The openb study's report: the allocation table against the FGD paper, the paired
nexus-against-FGD differences and the allocation/fragmentation curves."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nexus_admit.sim.openb import OpenbRun
from nexus_admit.sim.report import markdown_table, plot_links, pyplot, write_json
from nexus_admit.sim.study import LABELS

__all__ = ["OPENB_COLUMNS", "plot_openb", "write_openb_report"]


OPENB_COLUMNS = (
    ("trace", "trace"),
    ("label", "policy"),
    ("alloc_100", "alloc @100 %"),
    ("published_100", "paper @100 %"),
    ("diff_100", "Δ"),
    ("alloc_130", "alloc @130 %"),
    ("published_130", "paper @130 %"),
    ("diff_130", "Δ"),
    ("alloc_130_sd", "sd @130"),
    ("failed_pods", "failed pods"),
    ("broken8_levels", "8-GPU nodes used @10/30/50/70/90/100 %"),
    ("partial8_levels", "of them left partly idle (islands broken)"),
    ("seconds_per_run", "s/run"),
    ("place_ms_per_pod", "ms/pod"),
)


def _mean_curve(runs: Sequence[OpenbRun], attr: str) -> tuple[np.ndarray, np.ndarray]:
    length = min(len(r.curve_arrived) for r in runs)
    x = np.array(runs[0].curve_arrived[:length])
    y = np.mean([getattr(r, attr)[:length] for r in runs], axis=0)
    return x, y


def plot_openb(runs: Sequence[OpenbRun], out: Path) -> list[Path]:
    plt = pyplot()
    if plt is None:
        return []

    by_trace: dict[str, dict[str, list[OpenbRun]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        by_trace[r.trace][r.policy].append(r)
    files = []
    for trace, policies in by_trace.items():
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
        for policy, rs in policies.items():
            label = f"{LABELS.get(policy, policy)} ({len(rs)} seeds)"
            x, y = _mean_curve(rs, "curve_alloc")
            axes[0].plot(x, y, label=label, lw=1.6 if policy == "nexus" else 1.1)
            x, y = _mean_curve(rs, "curve_frag")
            axes[1].plot(x, y, label=label)
            x, y = _mean_curve(rs, "curve_broken8")
            line, = axes[2].plot(x, 100.0 * y / max(rs[0].nodes8, 1), label=label)
            x, y = _mean_curve(rs, "curve_partial8")
            axes[2].plot(x, 100.0 * y / max(rs[0].nodes8, 1), color=line.get_color(), ls="--",
                         lw=0.9)
        axes[0].plot([0, 130], [0, 130], color="grey", lw=0.6, ls=":")
        axes[0].set(title=f"openb {trace}: GPU allocated", xlabel="GPU requested (% of capacity)",
                    ylabel="GPU allocated (% of capacity)", xlim=(0, 131), ylim=(0, 101))
        axes[1].set(title="fragmentation (paper's measure)", xlabel="GPU requested (%)",
                    ylabel="fragmented idle GPU (% of capacity)", xlim=(0, 131))
        axes[2].set(title="8-GPU nodes no longer fully free (dashed: left partly idle)",
                    xlabel="GPU requested (%)",
                    ylabel="% of 8-GPU nodes", xlim=(0, 131))
        inset = axes[0].inset_axes((0.5, 0.08, 0.46, 0.42))
        for rs in policies.values():
            x, y = _mean_curve(rs, "curve_alloc")
            inset.plot(x, y, lw=1.0)
        inset.set(xlim=(90, 131), ylim=(84, 99))
        inset.tick_params(labelsize=7)
        inset.grid(alpha=0.3)
        for ax in axes:
            ax.grid(alpha=0.3)
        axes[2].legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        path = out / f"openb_{trace}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


def write_openb_report(
    rows: Sequence[dict[str, Any]],
    runs: Sequence[OpenbRun],
    out: Path,
    meta: dict[str, Any],
    notes: Sequence[str] = (),
    paired: Sequence[dict[str, Any]] = (),
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    plots = plot_openb(runs, out)
    write_json(out / "openb.json", {"meta": meta, "table": list(rows),
                                     "runs": [r.to_json() for r in runs],
                                     "nexus_vs_fgd": list(paired)})
    lines = [
        "# openb: GPU allocation under the FGD paper's protocol",
        "",
        f"Ran {meta.get('runs')} runs ({', '.join(meta.get('traces', []))}; seeds "
        f"{meta.get('seeds')}) in {meta.get('seconds', 0):.0f} s with "
        f"{meta.get('workers')} worker processes"
        + (f", on a {meta['node_fraction']:.0%} node sample" if meta.get("node_fraction", 1) < 1
           else "") + ".",
        "Protocol: inflate the pod list to 1.3 × GPU capacity (sampling with replacement), "
        "shuffle with the seed, create pods one by one, never delete; failed pods are skipped. "
        "Allocation is read at arrived = 100 % and 130 % (mean over pods whose arrived % "
        "rounds there), mean of seeds. Paper figures from Weng et al., USENIX ATC 2023.",
        "",
        markdown_table(rows, OPENB_COLUMNS),
        "",
    ]
    if paired:
        lines += ["## nexus against FGD, seed by seed", "",
                  "Both run the same shuffled pod list on a seed; each row is the mean of the "
                  "per-seed differences with its 95 % interval (Student's t), signed so that "
                  "positive means nexus is better (more allocated, fewer nodes partly idle).",
                  "", markdown_table(
                      [{**r, "difference": f"{r['mean']:+g} ± {r['ci95']:g}"} for r in paired],
                      (("trace", "trace"), ("metric", "metric"), ("seeds", "seeds"),
                       ("difference", "nexus − FGD"), ("verdict", "verdict"))), ""]
    lines += [*plot_links(plots), ""]
    if notes:
        lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    path = out / "README.md"
    path.write_text("\n".join(lines))
    return path
