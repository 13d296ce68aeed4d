"""Issue 30's targets and the per-Workload CPU figures, from a result dict alone."""

from __future__ import annotations

from typing import Any

import pytest
from bench_e2e import report, stats


def phase(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "throughput_wl_per_s": 6.0,
        "burst_throughput_wl_per_s": 10.0,
        "create_to_running_p50_s": 7.0,
        "create_to_running_p99_s": 16.0,
        "double_booked_gpus": 0,
        "admitted": 100,
        "cpu_by_process": {},
        "webhooks": {},
        "admission_policies": {},
    }
    return {**base, **over}


def nexus_phase(**over: Any) -> dict[str, Any]:
    return phase(
        **{
            "throughput_wl_per_s": 5.8,  # 0.967×
            "burst_throughput_wl_per_s": 8.0,  # 0.8×
            "create_to_running_p50_s": 9.0,  # 1.286×
            "create_to_running_p99_s": 20.0,  # 1.25×
            "pods_on_planned_node": 40,
            "pods_with_reservation": 40,
            "controller_process": {"rss_peak_mib": 600.0},
            "cluster_pods_at_start": 18_000,
            "cluster_pods_at_end": 20_100,
            "startup": {"first_check_ready_s": 12.0},
            "admission_policies": {"gate": {"calls": 193.0, "p99_s": 0.004}},
            **over,
        }
    )


def by_target(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["target"]: r for r in rows}


def verdicts(result: dict[str, Any]) -> dict[str, bool | None]:
    return {r["target"]: r["met"] for r in report.targets(result)}


def test_each_target_of_issue_30_judged_against_kueue_alone() -> None:
    result = {
        "phases": {"kueue": phase(), "nexus": nexus_phase()},
        "soak": {"rss": {"rss_growth_percent": 4.0}, "drain": {"reservations_left": 0}},
    }
    rows = by_target(report.targets(result))
    assert verdicts(result) == {
        "burst throughput: nexus ≥ 0.9× Kueue alone": False,
        "whole-run throughput: nexus ≥ 0.95× Kueue alone": True,
        "create → all pods Running p50: nexus ≤ 1.3× Kueue alone": True,
        "create → all pods Running p99: nexus ≤ 1.2× Kueue alone": False,
        "1-pod decision p99, larger fleet ≤ 1.5× smaller": None,
        "controller peak RSS ≤ 1 GiB with ≥ 20,000 pods, MiB": True,
        "first decision ≤ 30 s after the controller's process start": True,
        "controller RSS growth over the soak ≤ 10 %": True,
        "double-booked GPUs = 0 (kueue)": True,
        "double-booked GPUs = 0 (nexus)": True,
        "bound pods on their planned node = 100 %": True,
        "reservations left after the soak = 0": True,
        "nexus pod gating p99 (apiserver histograms: webhook, policy), s": None,
    }
    assert rows["burst throughput: nexus ≥ 0.9× Kueue alone"]["value"] == pytest.approx(0.8)
    assert rows["create → all pods Running p99: nexus ≤ 1.2× Kueue alone"][
        "value"
    ] == pytest.approx(1.25)
    gating = rows["nexus pod gating p99 (apiserver histograms: webhook, policy), s"]
    assert gating["value"] == 0.004 and gating["note"] == "information, not a target"


def test_missing_the_bounds_is_reported_as_missed() -> None:
    nexus = nexus_phase(
        controller_process={"rss_peak_mib": 1100.0},
        startup={"first_check_ready_s": 31.0},
        pods_on_planned_node=39,
        double_booked_gpus=2,
    )
    result = {
        "phases": {"kueue": phase(), "nexus": nexus},
        "soak": {"rss": {"rss_growth_percent": 12.0}, "drain": {"reservations_left": 1}},
    }
    missed = {t for t, met in verdicts(result).items() if met is False}
    assert missed >= {
        "controller peak RSS ≤ 1 GiB with ≥ 20,000 pods, MiB",
        "first decision ≤ 30 s after the controller's process start",
        "controller RSS growth over the soak ≤ 10 %",
        "double-booked GPUs = 0 (nexus)",
        "bound pods on their planned node = 100 %",
        "reservations left after the soak = 0",
    }


def _sized(
    nodes: int, one_pod_p99: float | None, count: int = 40, cpu_p99: float | None = None,
    kept: tuple[int, float] | None = None,
) -> dict[str, Any]:
    one = {"count": count, "p99_s": one_pod_p99} if one_pod_p99 is not None else {}
    metrics = {"solve_seconds_one_pod": one}
    if cpu_p99 is not None:
        metrics["solve_cpu_seconds_one_pod"] = {"count": count, "p99_s": cpu_p99}
    if kept is not None:  # (count, p99) of the decisions that reused kept facts
        metrics["solve_seconds_one_pod_kept"] = {"count": kept[0], "p99_s": kept[1]}
    return {"config": {"nodes": nodes},
            "phases": {"nexus": nexus_phase(controller_metrics=metrics)}}


def test_a_one_pod_decision_is_compared_across_two_fleet_sizes() -> None:
    """The larger fleet's p99 over the smaller's, whichever of the two runs this is."""
    small, large = _sized(1000, 0.010), _sized(5000, 0.014)
    for this, other in ((large, small), (small, large)):
        row = report.one_pod_scaling_target(this, other)
        assert row["value"] == pytest.approx(1.4) and row["met"] is True
        assert row["note"] == "5,000 vs 1,000 nodes: 14.0 ms / 10.0 ms"
    assert report.one_pod_scaling_target(_sized(5000, 0.016), small)["met"] is False
    assert report.one_pod_scaling_target(large, None)["met"] is None
    none = report.one_pod_scaling_target(large, _sized(1000, 0.01, count=0))
    assert none["met"] is None and none["note"].startswith("not measured: no one-pod")


def test_the_one_pod_target_is_judged_on_wall_time_and_shows_the_cpu_time() -> None:
    """The solving thread's CPU time says what the decision itself costs on each fleet; the
    target stays the wall time's (what a Workload waits)."""
    small, large = _sized(1000, 0.056, cpu_p99=0.002), _sized(5000, 0.246, cpu_p99=0.0025)
    row = report.one_pod_scaling_target(large, small)
    assert row["met"] is False and row["value"] == pytest.approx(0.246 / 0.056)
    assert row["note"].endswith("; CPU time 2.5 ms / 2.0 ms (1.25×)")


def test_the_one_pod_target_shows_the_decisions_that_reused_kept_facts() -> None:
    """The first decision of a pod shape derives its facts over the fleet (O(fleet) by
    construction); the note sets those apart, and the target still counts every decision."""
    small = _sized(1000, 0.008, count=162, kept=(158, 0.004))
    large = _sized(5000, 0.060, count=162, kept=(157, 0.005))
    row = report.one_pod_scaling_target(large, small)
    assert row["met"] is False and row["value"] == pytest.approx(7.5)
    assert row["note"].endswith(
        "; with facts kept 5.0 ms / 4.0 ms (1.25×), 5 and 4 derived over the fleet")
    assert report.fleet_scans(large) == 5
    assert report.fleet_scans(_sized(5000, 0.06)) is None, "a run from before the label"


def test_rss_not_judged_below_20000_pods_in_the_cluster() -> None:
    nexus = nexus_phase(cluster_pods_at_start=2_000, cluster_pods_at_end=4_000)
    row = report.controller_rss_target(nexus)
    assert row["met"] is None
    assert row["value"] == 600.0
    assert row["note"] == "not measured: 4,000 pods in the cluster"
    # 20,000 reached at the phase's end (the phase's own pods on top of the background)
    assert report.controller_rss_target(nexus_phase(cluster_pods_at_start=19_000))["met"]


def test_a_run_without_nexus_or_soak_measures_nothing_of_them() -> None:
    result = {"phases": {"kueue": phase()}}
    got = verdicts(result)
    assert got.pop("double-booked GPUs = 0 (kueue)") is True
    assert set(got.values()) == {None}


def test_cpu_per_workload_by_phase_and_what_nexus_adds() -> None:
    kueue = phase(
        admitted=100,
        cpu_by_process={
            "kube-apiserver": {"cpu_s": 50.0, "core_percent": 50.0},
            report.BENCH_PROCESS: {"cpu_s": 10.0, "core_percent": 10.0},
        },
    )
    nexus = nexus_phase(
        admitted=50,
        cpu_by_process={
            "kube-apiserver": {"cpu_s": 40.0, "core_percent": 50.0},
            report.CONTROLLER: {"cpu_s": 15.0, "core_percent": 20.0},
            report.BENCH_PROCESS: {"cpu_s": 5.0, "core_percent": 5.0},
        },
    )
    got = report.cpu_per_workload({"phases": {"kueue": kueue, "nexus": nexus}})
    assert got["per_phase"]["kueue"] == {
        "kube-apiserver": 0.5,
        report.BENCH_PROCESS: 0.1,
        stats.ALL_BUT_BENCH: 0.5,
    }
    assert got["per_phase"]["nexus"][stats.ALL_BUT_BENCH] == 1.1
    assert got["nexus_share"] == {
        "kube-apiserver": pytest.approx(0.3),
        report.CONTROLLER: 0.3,
        report.BENCH_PROCESS: 0.0,
        stats.ALL_BUT_BENCH: pytest.approx(0.6),
    }
    assert "nexus_share" not in report.cpu_per_workload({"phases": {"nexus": nexus}})
    assert "per_phase_beyond_idle" not in got  # no idle spell measured (--idle-seconds 0)


def test_cpu_per_workload_beyond_idle_where_both_phases_measured_it() -> None:
    def with_idle(ph: dict[str, Any], rate: float) -> dict[str, Any]:
        idle = {p: {"cpu_s": 0.0, "core_percent": rate} for p in ph["cpu_by_process"]}
        return {**ph, "cpu_wall_s": 100.0, "idle_cpu_by_process": idle}

    kueue = with_idle(
        phase(
            admitted=100, cpu_by_process={"kube-apiserver": {"cpu_s": 50.0, "core_percent": 50.0}}
        ),
        10.0,
    )
    nexus = with_idle(
        nexus_phase(
            admitted=100, cpu_by_process={"kube-apiserver": {"cpu_s": 80.0, "core_percent": 80.0}}
        ),
        20.0,
    )
    got = report.cpu_per_workload({"phases": {"kueue": kueue, "nexus": nexus}})
    assert got["per_phase"]["nexus"]["kube-apiserver"] == 0.8
    assert got["per_phase_beyond_idle"]["kueue"]["kube-apiserver"] == 0.4  # (50 - 10) / 100
    assert got["per_phase_beyond_idle"]["nexus"]["kube-apiserver"] == 0.6  # (80 - 20) / 100
    assert got["nexus_share_beyond_idle"]["kube-apiserver"] == pytest.approx(0.2)


def full_phase(**over: Any) -> dict[str, Any]:
    """A phase with every key the printed tables read."""
    return phase(
        **{
            "all_running": 30,
            "workloads": 30,
            "pods": 193,
            "controller_metrics": {},
            "pods_gated": 0,
            "controller_process": {},
            "load": {"load1_mean": 1.5},
            "stages": {"create→quota reserved": {"p50": 0.4, "p99": 1.0, "n": 30}},
            "cluster_pods_at_start": 300,
            "cluster_pods_at_end": 493,
            "node_heartbeats": {"lease_puts": 12.0, "node_status": 3.0},
            "lease_wait_s": 0.0,
            **over,
        }
    )


def test_report_prints_the_targets_cpu_per_workload_and_start_up(capsys) -> None:
    nexus = full_phase(
        **{
            **nexus_phase(),
            "controller_process": {"cpu_percent_mean": 20.0, "cpu_s": 6.0, "rss_peak_mib": 300.0},
            "cpu_by_process": {report.CONTROLLER: {"cpu_s": 6.0, "core_percent": 20.0}},
            "cpu_wall_s": 30.0,
            "idle_cpu_by_process": {report.CONTROLLER: {"cpu_s": 0.2, "core_percent": 1.0}},
            "startup": {
                "webhook_serving_s": 2.1,
                "store_synced_s": 3.0,
                "first_check_ready_s": 9.5,
            },
            "webhooks": {report.PIN_WEBHOOK: {"calls": 240.0, "p50_s": 0.012, "p99_s": 0.09}},
            "pods_gated": 0,
            "controller_log": [
                "... slow solve of ns/a (pods 1, feasible, 96 nodes): 120 ms, 90 ms CPU: ...",
                "... slow solve of ns/b (pods 8, feasible, 96 nodes): 300 ms, 250 ms CPU: ...",
                "... snapshot of 96 nodes renewed (static): the engine derives its facts again",
            ],
        }
    )
    result: dict[str, Any] = {
        "fleet": {"nodes": 96},
        "config": {"workloads": 30},
        "phases": {"kueue": full_phase(), "nexus": nexus},
    }
    result["cpu_per_workload"] = report.cpu_per_workload(result)
    result["targets"] = report.targets(result)
    report.print_report(result)
    out = capsys.readouterr().out
    assert "targets (issue 30)" in out
    assert "CPU seconds per admitted Workload" in out
    assert "nexus − kueue" in out
    assert "CPU seconds per Workload, beyond idle" in out and "idle rate (% of a core)" in out
    assert "its check Ready (the first decision) 9.5" in out
    assert "2 (1 one-pod)" in out  # the slow solves the controller logged in the phase
    # pinned at creation (--pin-at-creation): the hook's calls, and no gate the watch saw
    assert "240, 12 ms / 90 ms" in out
    assert "no gates seen" in out
    assert "not measured: 20,100" not in out  # 20,100 pods: judged


def test_the_gap_split_into_any_check_and_nexus_beyond_it() -> None:
    check = phase(
        burst_throughput_wl_per_s=5.0,  # 0.5× Kueue alone
        throughput_wl_per_s=6.0,
        create_to_running_p50_s=14.0,
        create_to_running_p99_s=16.0,
    )
    result = {"phases": {"kueue": phase(), "check": check, "nexus": nexus_phase()}}
    rows = {r["metric"]: r for r in report.gap_split(result)}
    burst = rows["burst throughput"]
    assert burst["check_vs_kueue"] == 0.5
    assert burst["nexus_vs_check"] == 1.6  # nexus 8 per s against the check's 5
    assert burst["nexus_vs_kueue"] == 0.8
    p50 = rows["create → all pods Running p50"]
    assert (p50["check_vs_kueue"], p50["nexus_vs_check"]) == (2.0, pytest.approx(9 / 14))
    # the targets stay judged against Kueue alone, whatever the check phase measured
    assert verdicts(result)["burst throughput: nexus ≥ 0.9× Kueue alone"] is False
    assert report.gap_split({"phases": {"kueue": phase(), "nexus": nexus_phase()}}) == []


def test_cpu_per_workload_splits_what_any_check_adds_from_what_nexus_adds() -> None:
    def cpu(**by: float) -> dict[str, Any]:
        return {p: {"cpu_s": s, "core_percent": 0.0} for p, s in by.items()}

    kueue = phase(admitted=100, cpu_by_process=cpu(**{"kube-apiserver": 40.0}))
    check = phase(admitted=100,
                  cpu_by_process=cpu(**{"kube-apiserver": 50.0, report.INSTANT: 2.0}))
    nexus = nexus_phase(admitted=100,
                        cpu_by_process=cpu(**{"kube-apiserver": 60.0, report.CONTROLLER: 8.0}))
    got = report.cpu_per_workload({"phases": {"kueue": kueue, "check": check, "nexus": nexus}})
    assert got["check_share"]["kube-apiserver"] == pytest.approx(0.1)
    assert got["check_share"][report.INSTANT] == 0.02
    assert got["nexus_beyond_check"]["kube-apiserver"] == pytest.approx(0.1)
    assert got["nexus_beyond_check"][report.CONTROLLER] == 0.08
    assert got["nexus_beyond_check"][report.INSTANT] is None  # not running with nexus
    assert got["nexus_share"][stats.ALL_BUT_BENCH] == pytest.approx(0.28)


def test_report_prints_the_check_phase_and_the_gap_split(capsys) -> None:
    check = full_phase(
        cpu_by_process={report.INSTANT: {"cpu_s": 1.0, "core_percent": 2.0}},
        create_to_running_p50_s=8.0,
    )
    result: dict[str, Any] = {
        "fleet": {"nodes": 96},
        "config": {"workloads": 30},
        "phases": {"kueue": full_phase(), "check": check, "nexus": full_phase(**nexus_phase(
            controller_process={"cpu_percent_mean": 20.0, "cpu_s": 6.0, "rss_peak_mib": 300.0}
        ))},
    }
    result["cpu_per_workload"] = report.cpu_per_workload(result)
    result["targets"] = report.targets(result)
    result["gap_split"] = report.gap_split(result)
    report.print_report(result)
    out = capsys.readouterr().out
    assert "Kueue + instant check" in out
    assert "check − kueue" in out and "nexus − check" in out
    assert "the gap split" in out
    assert "1.14×" in out  # p50: the check's 8 s against Kueue alone's 7
