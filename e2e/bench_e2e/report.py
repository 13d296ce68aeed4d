"""The benchmark's printed report and its targets (issue 30), from the result dict alone:
no cluster access here, so that the figures and the verdicts are unit-tested."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from bench_e2e import stats

NEXUS_WEBHOOK = "pod-gate.scheduling.kubenexus.io"
PIN_WEBHOOK = "pod-pin.scheduling.kubenexus.io"  # --pin-at-creation
CONTROLLER = "nexus-admit"
INSTANT = "instant check"  # the check phase's controller (instant_check.py)
BENCH_PROCESS = "bench-e2e (this script)"
PHASE_TITLES = {"kueue": "Kueue alone", "check": "Kueue + instant check", "nexus": "Kueue + nexus"}
# the controller's memory target holds for a cluster of at least this many pods
RSS_TARGET_PODS = 20_000
RSS_TARGET_MIB = 1024


def gate_p99(phase: Mapping[str, Any]) -> float | None:
    """The slowest p99 of what adds our gate at pod creation: the webhook and the policy."""
    p99s = [
        h.get("p99_s")
        for h in [
            (phase.get("webhooks") or {}).get(NEXUS_WEBHOOK),
            *(phase.get("admission_policies") or {}).values(),
        ]
        if h and h.get("p99_s") is not None
    ]
    return max(p99s, default=None)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _target(label: str, value: Any, met: bool | None, note: str = "") -> dict[str, Any]:
    return {"target": label, "value": value, "met": met, **({"note": note} if note else {})}


def _at_most(label: str, value: float | None, bound: float) -> dict[str, Any]:
    return _target(label, value, None if value is None else value <= bound)


ONE_POD_SCALING_BOUND = 1.5


def one_pod_p99(result: Mapping[str, Any], series: str = "solve_seconds_one_pod") -> float | None:
    """The nexus phase's p99 of a one-pod decision (the engine's wall time, from the
    controller's solve histogram's `pods="1"` series; `solve_cpu_seconds_one_pod`: the
    solving thread's CPU time)."""
    nexus = result.get("phases", {}).get("nexus") or {}
    one = (nexus.get("controller_metrics") or {}).get(series) or {}
    return one.get("p99_s") if one.get("count") else None


def fleet_scans(result: Mapping[str, Any]) -> int | None:
    """The nexus phase's one-pod decisions that derived their facts over every candidate
    node (the first of a pod shape, or the first after a snapshot renewal), O(fleet)."""
    metrics = ((result.get("phases", {}).get("nexus") or {}).get("controller_metrics") or {})
    every, kept = (metrics.get(k) or {} for k in
                   ("solve_seconds_one_pod", "solve_seconds_one_pod_kept"))
    if "count" not in every or "count" not in kept:
        return None
    return int(every["count"] - kept["count"])


def one_pod_scaling_target(
    result: Mapping[str, Any], other: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A one-pod decision's p99 on the larger fleet ≤ 1.5× its p99 on the smaller: this run
    against another run's JSON (`--compare-with`), on another fleet size."""
    label = f"1-pod decision p99, larger fleet ≤ {ONE_POD_SCALING_BOUND}× smaller"
    if other is None:
        return _target(label, None, None, "not measured: needs --compare-with another size")
    runs = sorted((result, other), key=lambda r: int(r.get("config", {}).get("nodes") or 0))
    small, large = (one_pod_p99(r) for r in runs)
    sizes = " vs ".join(f"{int(r['config']['nodes']):,}" for r in reversed(runs))
    if small is None or large is None:
        return _target(label, None, None, f"not measured: no one-pod decisions ({sizes} nodes)")
    ratio = large / small
    note = f"{sizes} nodes: {large * 1000:.1f} ms / {small * 1000:.1f} ms"
    small_cpu, large_cpu = (one_pod_p99(r, "solve_cpu_seconds_one_pod") for r in runs)
    if small_cpu and large_cpu:
        note += (f"; CPU time {large_cpu * 1000:.1f} ms / {small_cpu * 1000:.1f} ms "
                 f"({large_cpu / small_cpu:.2f}×)")
    small_kept, large_kept = (one_pod_p99(r, "solve_seconds_one_pod_kept") for r in runs)
    if small_kept and large_kept:
        over = " and ".join(str(fleet_scans(r)) for r in reversed(runs))
        note += (f"; with facts kept {large_kept * 1000:.1f} ms / {small_kept * 1000:.1f} ms "
                 f"({large_kept / small_kept:.2f}×), {over} derived over the fleet")
    return _target(label, ratio, ratio <= ONE_POD_SCALING_BOUND, note)


def targets(
    result: Mapping[str, Any], other: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Each target of issue 30 with the measured value and whether it is met (None: not
    measured in this run, `note` says why when it is not plain). `other`: a run on another
    fleet size, for the one-pod decision's scaling."""
    k, n = result["phases"].get("kueue", {}), result["phases"].get("nexus", {})
    soak = result.get("soak") or {}
    out = []
    for key, label, bound in (
        ("burst_throughput_wl_per_s", "burst throughput: nexus ≥ 0.9× Kueue alone", 0.9),
        ("throughput_wl_per_s", "whole-run throughput: nexus ≥ 0.95× Kueue alone", 0.95),
    ):
        r = _ratio(n.get(key), k.get(key))
        out.append(_target(label, r, None if r is None else r >= bound))
    for q, bound in (("p50", 1.3), ("p99", 1.2)):
        key = f"create_to_running_{q}_s"
        out.append(
            _at_most(
                f"create → all pods Running {q}: nexus ≤ {bound}× Kueue alone",
                _ratio(n.get(key), k.get(key)),
                bound,
            )
        )
    out.append(one_pod_scaling_target(result, other))
    out.append(controller_rss_target(n))
    out.append(
        _at_most(
            "first decision ≤ 30 s after the controller's process start",
            (n.get("startup") or {}).get("first_check_ready_s"),
            30,
        )
    )
    out.append(
        _at_most(
            "controller RSS growth over the soak ≤ 10 %",
            (soak.get("rss") or {}).get("rss_growth_percent"),
            10,
        )
    )
    for name, ph in result["phases"].items():
        booked = ph.get("double_booked_gpus")
        out.append(
            _target(
                f"double-booked GPUs = 0 ({name})", booked, None if booked is None else booked == 0
            )
        )
    placed, total = n.get("pods_on_planned_node"), n.get("pods_with_reservation")
    out.append(
        _target(
            # of the pods bound when the phase ended (pods_bound says how many that was)
            "bound pods on their planned node = 100 %",
            placed / total if placed is not None and total else None,
            None if placed is None or not total else placed == total,
        )
    )
    left = (soak.get("drain") or {}).get("reservations_left")
    out.append(
        _target("reservations left after the soak = 0", left, None if left is None else left == 0)
    )
    out.append(
        _target(
            "nexus pod gating p99 (apiserver histograms: webhook, policy), s",
            gate_p99(n) if n else None,
            None,
            "information, not a target",
        )
    )
    return out


GAP_METRICS = (
    ("burst_throughput_wl_per_s", "burst throughput"),
    ("throughput_wl_per_s", "whole-run throughput"),
    ("create_to_running_p50_s", "create → all pods Running p50"),
    ("create_to_running_p99_s", "create → all pods Running p99"),
)


def gap_split(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each target's ratio (nexus against Kueue alone) split in two: what any check costs
    here (the instant check against Kueue alone) and what nexus adds beyond it (nexus
    against the instant check). Empty unless all three phases ran."""
    ph = result["phases"]
    k, c, n = ph.get("kueue"), ph.get("check"), ph.get("nexus")
    if not (k and c and n):
        return []
    return [
        {
            "metric": label,
            "check_vs_kueue": _ratio(c.get(key), k.get(key)),
            "nexus_vs_check": _ratio(n.get(key), c.get(key)),
            "nexus_vs_kueue": _ratio(n.get(key), k.get(key)),
        }
        for key, label in GAP_METRICS
    ]


def controller_rss_target(nexus: Mapping[str, Any]) -> dict[str, Any]:
    """The controller's peak RSS over the nexus phase (its start-up included) ≤ 1 GiB, judged
    only when the cluster held at least 20,000 pods then (at the phase's start or end)."""
    label = f"controller peak RSS ≤ 1 GiB with ≥ {RSS_TARGET_PODS:,} pods, MiB"
    peak = (nexus.get("controller_process") or {}).get("rss_peak_mib")
    pods = max(
        (nexus.get(k) or 0 for k in ("cluster_pods_at_start", "cluster_pods_at_end")), default=0
    )
    if peak is None:
        return _target(label, None, None)
    if pods < RSS_TARGET_PODS:
        return _target(label, peak, None, f"not measured: {pods:,} pods in the cluster")
    return _target(label, peak, peak <= RSS_TARGET_MIB)


def cpu_per_workload(result: Mapping[str, Any]) -> dict[str, Any]:
    """CPU seconds per admitted Workload of every process, per phase, and what nexus adds
    (Kueue + nexus minus Kueue alone, per process and in total)."""
    per = {
        name: stats.cpu_per_workload(
            ph.get("cpu_by_process") or {}, ph.get("admitted") or 0, BENCH_PROCESS
        )
        for name, ph in result["phases"].items()
    }
    out: dict[str, Any] = {"per_phase": per}
    if per.get("kueue") and per.get("nexus"):
        out["nexus_share"] = stats.cpu_share(per["kueue"], per["nexus"])
    if per.get("kueue") and per.get("check"):
        # what any check makes the stack do, and nexus beyond that
        out["check_share"] = stats.cpu_share(per["kueue"], per["check"])
        if per.get("nexus"):
            out["nexus_beyond_check"] = stats.cpu_share(per["check"], per["nexus"])
    # the same beyond each process's idle rate, where the phase measured it (--idle-seconds)
    beyond = {
        name: stats.cpu_per_workload_beyond_idle(
            ph.get("cpu_by_process") or {},
            ph["idle_cpu_by_process"],
            ph.get("cpu_wall_s") or 0.0,
            ph.get("admitted") or 0,
            BENCH_PROCESS,
        )
        for name, ph in result["phases"].items()
        if ph.get("idle_cpu_by_process")
    }
    if beyond:
        out["per_phase_beyond_idle"] = beyond
        if beyond.get("kueue") and beyond.get("nexus"):
            out["nexus_share_beyond_idle"] = stats.cpu_share(beyond["kueue"], beyond["nexus"])
    return out

    return out


def _fmt(v: Any, unit: str = "", digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}{unit}"
    return f"{v}{unit}"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1000:.0f} ms"


Cell = Callable[[Mapping[str, Any]], str]


def _p50_p99(metric: str) -> Cell:
    def cell(p: Mapping[str, Any]) -> str:
        if not p["controller_metrics"]:
            return "–"
        h = p["controller_metrics"].get(metric) or {}
        return " / ".join(_ms(h.get(q)) for q in ("p50_s", "p99_s"))

    return cell


def _full_collections(p: Mapping[str, Any]) -> str:
    h = (p["controller_metrics"] or {}).get("gc_pause_seconds_full") or {}
    if not h.get("count"):
        return "–"
    return f"{int(h['count'])}, p99 {_ms(h.get('p99_s'))}, {_fmt(h.get('sum_s'), ' s', 1)}"


def _renewals(p: Mapping[str, Any]) -> str:
    by_reason = (p["controller_metrics"] or {}).get("snapshot_renewals")
    if by_reason is None:
        return "–"
    return ", ".join(f"{r} {int(n)}" for r, n in sorted(by_reason.items())) or "0"


def _slow_solves(p: Mapping[str, Any]) -> str:
    lines = p.get("controller_log")
    if lines is None:
        return "–"
    slow = [line for line in lines if "slow solve of" in line]
    one_pod = sum("(pods 1," in line for line in slow)
    return f"{len(slow)} ({one_pod} one-pod)"


def _solving_and_waiting(p: Mapping[str, Any]) -> str:
    if not p["controller_metrics"]:
        return "–"
    return " / ".join(
        _fmt((p["controller_metrics"].get(m) or {}).get("sum_s"), " s", 1)
        for m in ("solve_seconds", "reservation_wait_seconds")
    )


def _gate_calls(p: Mapping[str, Any]) -> str:
    return " / ".join(
        str(int(h["calls"])) if h else "0"
        for h in (
            p["webhooks"].get(NEXUS_WEBHOOK),
            next(iter((p.get("admission_policies") or {}).values()), None),
        )
    )


def _pin_calls(p: Mapping[str, Any]) -> str:
    h = p["webhooks"].get(PIN_WEBHOOK)
    return f"{int(h['calls'])}, {_ms(h.get('p50_s'))} / {_ms(h.get('p99_s'))}" if h else "–"


def _gating_p99(p: Mapping[str, Any]) -> str:
    kueue = max(
        (h["p99_s"] or 0 for n, h in p["webhooks"].items() if n.endswith(".kb.io")),
        default=None,
    )
    return " / ".join([_ms(gate_p99(p)), _ms(kueue)])


def _ungate(p: Mapping[str, Any]) -> str:
    if not p["pods_gated"]:
        return "no gates seen"  # pinned at creation: gated and ungated inside the create request
    return " / ".join(_ms(p.get(q)) for q in ("ungate_client_p50_s", "ungate_client_p99_s"))


def _controller_cpu(p: Mapping[str, Any]) -> str:
    proc = p["controller_process"]
    return f"{proc['cpu_percent_mean']} %, {proc['cpu_s']} s" if proc else "–"


def _controller_rss(p: Mapping[str, Any]) -> str:
    proc = p["controller_process"]
    return _fmt(proc.get("rss_peak_mib"), " MiB", 0) if proc else "–"


def _on_planned_node(p: Mapping[str, Any]) -> str:
    if not p.get("pods_with_reservation"):
        return "n/a"
    return f"{p['pods_on_planned_node']}/{p['pods_with_reservation']}"


def _heartbeats(p: Mapping[str, Any]) -> str:
    return " / ".join(
        _fmt(int(v) if (v := (p.get("node_heartbeats") or {}).get(k)) is not None else None)
        for k in ("node_leases_renewed", "lease_puts", "node_status")
    )


# the phase table's rows, one column per phase: what the Workloads saw
_WORKLOAD_ROWS: list[tuple[str, Cell]] = [
    ("Workloads all Running", lambda p: f"{p['all_running']}/{p['workloads']}"),
    ("pods", lambda p: str(p["pods"])),
    ("admission throughput (Workloads/s)", lambda p: _fmt(p["throughput_wl_per_s"])),
    ("  burst only", lambda p: _fmt(p["burst_throughput_wl_per_s"])),
    ("create → all Running p50", lambda p: _fmt(p["create_to_running_p50_s"], " s", 1)),
    ("create → all Running p99", lambda p: _fmt(p["create_to_running_p99_s"], " s", 1)),
    ("create → all bound p50 / p99", lambda p: " / ".join(
        _fmt(p.get(f"create_to_bound_{q}_s"), " s", 1) for q in ("p50", "p99"))),
    ("KWOK pod stage plays failed; replays refused", lambda p: "; ".join(
        _fmt(p.get(k)) for k in ("kwok_failed_pod_stages", "kwok_refused_replays"))),
]
# what the controller did
_CONTROLLER_ROWS: list[tuple[str, Cell]] = [
    ("solve p50 / p99", _p50_p99("solve_seconds")),
    ("one-pod solve p50 / p99", _p50_p99("solve_seconds_one_pod")),
    ("  its CPU time p50 / p99", _p50_p99("solve_cpu_seconds_one_pod")),
    ("  with facts kept: p50 / p99", _p50_p99("solve_seconds_one_pod_kept")),
    ("  with facts kept: CPU p50 / p99", _p50_p99("solve_cpu_seconds_one_pod_kept")),
    ("  derived over the fleet", lambda p: _fmt(fleet_scans({"phases": {"nexus": p}}))),
    ("full collections: count, p99, total", _full_collections),
    ("snapshot renewals (the engine's fleet facts again)", _renewals),
    ("shapes warmed while waiting for quota",
     lambda p: _fmt((p["controller_metrics"] or {}).get("warmed_shapes"), "", 0)),
    ("solves ≥ 100 ms logged (one-pod among them)", _slow_solves),
    ("solving / waiting for reservation creates (total)", _solving_and_waiting),
]
# admission in the apiserver, the controller's process, the cluster around the phase
_ADMISSION_ROWS: list[tuple[str, Cell]] = [
    ("nexus webhook calls / gate policy calls", _gate_calls),
    ("pin-at-creation hook calls, p50 / p99", _pin_calls),
    ("pod gating p99 (nexus webhook, policy / Kueue's webhooks)", _gating_p99),
    ("ungate p50 / p99 (gate seen → gone)", _ungate),
    ("ungate p99 (controller metric)",
     lambda p: _ms((p["controller_metrics"].get("ungate_seconds") or {}).get("p99_s"))),
    ("controller CPU (mean %, s)", _controller_cpu),
    ("controller peak RSS", _controller_rss),
]
_CLUSTER_ROWS: list[tuple[str, Cell]] = [
    ("pods on planned node", _on_planned_node),
    ("double-booked GPUs", lambda p: _fmt(p.get("double_booked_gpus"))),
    ("pods in the cluster at the phase's start / end",
     lambda p: f"{_fmt(p.get('cluster_pods_at_start'))} / {_fmt(p.get('cluster_pods_at_end'))}"),
    ("node leases renewed / lease PUTs / node status writes", _heartbeats),
    ("waited for a lease renewal round first", lambda p: _fmt(p.get("lease_wait_s"), " s", 0)),
    ("load average (1 min, mean)", lambda p: _fmt(p["load"]["load1_mean"], "", 1)),
]


def _phase_table(result: Mapping[str, Any]) -> Table:
    phases = result["phases"]
    t = Table(
        title=f"bench-e2e: {result['fleet']['nodes']} KWOK GPU nodes, "
        f"{result['config']['workloads']} Workloads",
        show_lines=False,
    )
    t.add_column("metric")
    for name in phases:
        t.add_column(PHASE_TITLES.get(name, name), justify="right")
    for label, cell in _WORKLOAD_ROWS + _CONTROLLER_ROWS + _ADMISSION_ROWS + _CLUSTER_ROWS:
        t.add_row(label, *[cell(ph) for ph in phases.values()])
    return t


def _by_phase_table(
    title: str,
    first: str,
    phases: Mapping[str, Any],
    rows_of: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    cell: Callable[[Any], str],
) -> Table:
    """A row per key any phase has (`rows_of`), a column per phase."""
    t = Table(title=title)
    t.add_column(first)
    for name in phases:
        t.add_column(name, justify="right")
    keys: list[str] = []
    for ph in phases.values():
        keys += [k for k in rows_of(ph) if k not in keys]
    for key in keys:
        t.add_row(key, *[cell(rows_of(ph).get(key)) for ph in phases.values()])
    return t


def _stage_table(phases: Mapping[str, Any]) -> Table:
    return _by_phase_table(
        "where the time goes: p50 per stage (s)",
        "stage",
        phases,
        lambda ph: ph["stages"],
        lambda v: _fmt((v or {}).get("p50"), "", 2),
    )


def _cpu_table(phases: Mapping[str, Any]) -> Table:
    return _by_phase_table(
        "CPU by process over the phase (s, % of one core)",
        "process",
        phases,
        lambda ph: ph.get("cpu_by_process", {}),
        lambda u: f"{u['cpu_s']:.0f} s, {u['core_percent']:.0f} %" if u else "–",
    )


def _idle_table(phases: Mapping[str, Any]) -> Table:
    return _by_phase_table(
        "idle rate (% of a core)",
        "process",
        phases,
        lambda ph: ph.get("idle_cpu_by_process", {}),
        lambda u: f"{u['core_percent']:.1f} %" if u else "–",
    )


def _cpu_per_workload_table(
    cpu: Mapping[str, Any],
    per_key: str = "per_phase",
    share_key: str = "nexus_share",
    title: str = "CPU seconds per admitted Workload, by process",
) -> Table:
    per, share = cpu.get(per_key) or {}, cpu.get(share_key) or {}
    split = [] if per_key != "per_phase" else [
        (cpu[k], head) for k, head in (("check_share", "check − kueue"),
                                       ("nexus_beyond_check", "nexus − check"))
        if cpu.get(k)
    ]
    c = Table(title=title)
    c.add_column("process")
    for name in per:
        c.add_column(name, justify="right")
    if share:
        c.add_column("nexus − kueue", justify="right")
    for _, head in split:
        c.add_column(head, justify="right")
    procs: list[str] = []
    for values in per.values():
        procs += [p for p in values if p not in procs]
    # the total last
    procs.sort(key=lambda p: p == stats.ALL_BUT_BENCH)
    for proc in procs:
        cells = [_fmt((values or {}).get(proc), "", 3) for values in per.values()]
        if share:
            cells.append(_fmt(share.get(proc), "", 3))
        cells += [_fmt(values.get(proc), "", 3) for values, _ in split]
        c.add_row(proc, *cells)
    return c


def _startup_line(nexus: Mapping[str, Any]) -> str:
    s = nexus.get("startup") or {}
    return (
        "nexus start-up, s after its process start: webhook serving "
        f"{_fmt(s.get('webhook_serving_s'), '', 1)}, store synced "
        f"{_fmt(s.get('store_synced_s'), '', 1)}, the Workload waiting for it created "
        f"{_fmt(s.get('first_workload_created_s'), '', 1)}, its check Ready (the first "
        f"decision) {_fmt(s.get('first_check_ready_s'), '', 1)} ("
        f"{_fmt(s.get('first_decision_after_its_create_s'), ' s', 1)} after its "
        f"create); cluster pods at the phase's start {nexus.get('cluster_pods_at_start')}"
    )


def _gap_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="the gap split: any check (the instant check) and nexus beyond it")
    t.add_column("metric")
    for head in ("check / Kueue alone", "nexus / check", "nexus / Kueue alone"):
        t.add_column(head, justify="right")
    for r in rows:
        t.add_row(r["metric"], *(_fmt(r[k], "×") for k in
                                 ("check_vs_kueue", "nexus_vs_check", "nexus_vs_kueue")))
    return t


def _targets_table(rows: list[dict[str, Any]]) -> Table:
    tt = Table(title="targets (issue 30)")
    tt.add_column("target")
    tt.add_column("measured", justify="right")
    tt.add_column("met")
    for row_ in rows:
        v = row_["value"]
        verdict = {True: "yes", False: "NO", None: "not measured"}[row_["met"]]
        tt.add_row(
            row_["target"],
            _fmt(v, "", 3) if isinstance(v, float) else _fmt(v),
            row_.get("note") or verdict,
        )
    return tt


def print_report(result: Mapping[str, Any]) -> None:
    # piped into a log, rich would wrap every table at 80 columns
    console = Console(width=None if sys.stdout.isatty() else 120)
    phases = result["phases"]
    console.print(_phase_table(result))
    if phases:
        console.print(_stage_table(phases))
        console.print(_cpu_table(phases))
        cpu = result.get("cpu_per_workload") or {}
        console.print(_cpu_per_workload_table(cpu))
        if cpu.get("per_phase_beyond_idle"):
            console.print(
                _cpu_per_workload_table(
                    cpu,
                    "per_phase_beyond_idle",
                    "nexus_share_beyond_idle",
                    "CPU seconds per Workload, beyond idle",
                )
            )
            console.print(_idle_table(result["phases"]))
    if "nexus" in phases:
        console.print(_startup_line(phases["nexus"]), soft_wrap=True)
    soak = result.get("soak")
    if soak:
        console.print(
            f"soak: {soak['workloads']} Workloads over {soak['wall_s']:.0f} s, "
            f"{soak['all_running']} all Running; controller RSS "
            f"{_fmt(soak['rss'].get('rss_after_warmup_mib'), ' MiB', 0)} after warm-up → "
            f"{_fmt(soak['rss'].get('rss_end_mib'), ' MiB', 0)} at the end "
            f"({_fmt(soak['rss'].get('rss_growth_percent'), ' %', 1)}); reservations left "
            f"{soak.get('drain', {}).get('reservations_left')}"
        )
    if result.get("gap_split"):
        console.print(_gap_table(result["gap_split"]))
    console.print(_targets_table(result["targets"]))
