"""Report helpers: the replay's headline table averages the seeds that the ranking averages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nexus_admit.sim.replay import ReplayResult
from nexus_admit.sim.report import replay_table, replay_table_title


def _result(policy: str, seed: int, throughput: float, delay: float, admitted: int
            ) -> ReplayResult:
    zero: dict[str, Any] = {name: 0.0 for name in (
        "hours", "seconds", "place_seconds", "gpu_allocation", "gpu_cost",
        "cost_per_effective_gpu_hour", "tier_mismatch_gpu_hours", "stranded_vram_gib_hours",
        "pristine_islands_mean", "pristine_cliques_mean", "one_tor_share", "one_agg_share",
        "mean_factor_multinode")}
    return ReplayResult(
        scenario="s", seed=seed, policy=policy, jobs=10, admitted=admitted, rejected=0,
        pending_at_end=0, placements=admitted, multinode_gangs=0,
        delay={"tier:gold": {"n": 1, "mean": delay, "p95": 2 * delay}}, **zero,
        wait_hours={"tier:gold": {"quota": delay, "hold": 0.5, "no room": 0.0, "queue": 0.0}},
        effective_throughput=throughput,
    )


def test_replay_table_shows_the_mean_over_seeds() -> None:
    results = [_result("nexus", 7, 40.0, 1.0, 10), _result("nexus", 11, 50.0, 3.0, 10),
               _result("default", 7, 30.0, 2.0, 9), _result("default", 11, 20.0, 2.0, 10)]
    header, body = replay_table(results)
    assert header == ["metric", "nexus", "default"]
    rows = {row[0]: row[1:] for row in body}
    assert rows["effective throughput %"] == ["45.00", "25.00"]
    assert rows["admitted"] == ["10", "9.50"]  # whole numbers stay whole
    assert rows["delay h mean/p95 gold"] == ["2.00/4.00", "2.00/4.00"]
    assert rows["waited h gold: quota/hold/no room/queue"] == ["2.0/0.5/0.0/0.0"] * 2
    assert not [r for r in rows if r.startswith("waited h 64")]  # no such group here
    assert replay_table_title(results) == "gang replay s, mean over seeds 7, 11 (4 runs)"


def test_replay_table_with_one_seed_names_it() -> None:
    results = [_result("nexus", 7, 40.0, 1.0, 10)]
    assert replay_table(results)[1][0] == ["effective throughput %", "40.00"]
    assert replay_table_title(results) == "gang replay s, seed 7 (1 run)"


def test_paired_summary_names_who_is_ahead_and_the_closest_call() -> None:
    from nexus_admit.sim.report import paired_summary

    rows = [
        {"metric": "effective_throughput", "higher_is_better": True,
         "values": {"nexus": 50.0, "tas": 49.0, "fgd": 30.0},
         "paired": {"tas": {"mean": 1.0, "ci95": 2.0, "seeds": 3, "verdict": "within noise"},
                    "fgd": {"mean": 20.0, "ci95": 2.0, "seeds": 3, "verdict": "ahead"}}},
        {"metric": "gpu_allocation", "higher_is_better": True,
         "values": {"nexus": 60.0, "tas": 61.0, "fgd": 75.0},
         "paired": {"tas": {"mean": -1.0, "ci95": 3.0, "seeds": 3, "verdict": "within noise"},
                    "fgd": {"mean": -15.0, "ci95": 2.0, "seeds": 3, "verdict": "behind"}}},
    ]
    summary = paired_summary(rows)
    assert summary["within noise"] == ["effective_throughput (vs tas: +1 ± 2)"]
    assert summary["behind"] == ["gpu_allocation (fgd ahead by 15 ± 2)"]


def test_closest_rival_and_the_forest_plot(tmp_path: Path) -> None:
    from nexus_admit.sim.report import closest_rival, plot_paired

    def row(metric: str, values: dict[str, float], verdicts: dict[str, str]) -> dict[str, Any]:
        return {"metric": metric, "higher_is_better": True, "values": values,
                "paired": {p: {"mean": values["nexus"] - values[p], "ci95": 1.0, "seeds": 3,
                               "verdict": v} for p, v in verdicts.items()}}

    behind = row("a", {"nexus": 5.0, "x": 9.0, "y": 7.0}, {"x": "behind", "y": "behind"})
    assert closest_rival(behind) == "x"  # the best of those ahead of nexus
    noisy = row("b", {"nexus": 5.0, "x": 4.9, "y": 1.0}, {"x": "within noise", "y": "ahead"})
    assert closest_rival(noisy) == "x"
    clear = row("c", {"nexus": 5.0, "x": 1.0, "y": 2.0}, {"x": "ahead", "y": "ahead"})
    assert closest_rival(clear) == "y"
    zero = row("d", {"nexus": 0.0, "x": 0.0}, {"x": "tie"})
    path = plot_paired([behind, noisy, clear, zero], tmp_path, "s")
    assert path is not None and path.name == "replay_s_paired.png" and path.stat().st_size > 0
    assert plot_paired([zero], tmp_path, "z") is None  # no relative scale for a 0 mean


def _split(policy: str, seed: int, allocation: float, throughput: float, overhead: float
           ) -> ReplayResult:
    r = _result(policy, seed, throughput, 1.0, 10)
    r.gpu_allocation = allocation
    r.offered_load = 80.0
    r.slowdown_overhead = overhead
    r.work_not_done = 80.0 - allocation + overhead
    return r


def test_the_summary_reads_each_headline_metric_and_splits_allocation() -> None:
    from nexus_admit.sim.replay import compare
    from nexus_admit.sim.report import replay_summary

    results = [_split("nexus", s, 64.0 + s, 52.0 + s, 12.0) for s in (1, 2, 3)]
    results += [_split("fgd", s, 76.0 + s, 32.0 + s, 44.0) for s in (1, 2, 3)]
    lines = replay_summary(results, compare(results, reference="fgd", across_seeds=True))
    text = "\n".join(lines)
    assert lines[0].startswith("**s**, mean over 3 seeds, nexus against")
    assert ("- useful GPU work (effective throughput): nexus 54.00 vs fgd 34.00 % of "
            "capacity — ahead of every other policy") in lines
    assert "- GPU allocation: nexus 66.00 vs fgd 78.00 % of capacity — behind" in lines
    assert ("fgd 78.0 = 80.0 − 46.0 + 44.0; nexus 66.0 = 80.0 − 26.0 + 12.0" in text
            and "fgd's lead comes from 32.0 points more GPU time held beyond the work" in text)
    # a policy that allocates more *and* does more work is not said to be slowed down
    busier = [_split("nexus", s, 64.0, 52.0, 12.0) for s in (1, 2)]
    busier += [_split("fgd", s, 76.0, 60.0, 16.0) for s in (1, 2)]
    text = "\n".join(replay_summary(busier, compare(busier, reference="fgd",
                                                    across_seeds=True)))
    assert "lead comes from" not in text
    assert "fgd 76.0 = 80.0 − 20.0 + 16.0; nexus 64.0 = 80.0 − 28.0 + 12.0" in text


def test_without_matplotlib_the_report_is_written_and_says_the_plots_were_skipped(
    tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    """matplotlib is the optional extra `report`: a None entry in sys.modules makes its
    import fail here as it does where it is not installed."""
    import sys

    from nexus_admit.sim import report

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(report, "_NOTICE_GIVEN", False)
    results = [_result(p, s, 1.0, 1.0, 10) for p in ("nexus", "kube") for s in (1, 2)]
    path = report.write_replay_report(results, [], tmp_path, {})
    assert report.PLOTS_SKIPPED in path.read_text()
    assert not list(tmp_path.glob("*.png"))
    assert report.PLOTS_SKIPPED in caplog.text
