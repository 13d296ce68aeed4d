"""What a phase measures on the plane: every process's CPU, the apiserver's and the
controller's metrics (scraped before and after a phase, summarized as their difference),
a kube-apiserver CPU profile, the cluster's bookings at a phase's end, why Workloads did
not run, and the controller's RSS over a phase."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench_e2e import booking, stats
from bench_e2e import workloads as wl_mod
from bench_e2e.recorder import KUEUE_GROUP, KUEUE_VERSION, proc_cpu_seconds
from bench_e2e.report import BENCH_PROCESS, CONTROLLER

if TYPE_CHECKING:
    import cluster as cluster_mod
    from kubernetes import client

    from bench_e2e.bench_plane import BenchPlane

WEBHOOK_METRIC = "apiserver_admission_webhook_admission_duration_seconds"
# the Job controller's pods are gated in the apiserver by our MutatingAdmissionPolicy
POLICY_METRIC = "apiserver_mutating_admission_policy_check_duration_seconds"


def log(msg: str) -> None:
    print(f"[bench-e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- CPU ----------------------------------------------------------------------------------
def process_cpu(
    cluster: cluster_mod.Cluster, controller_pid: int | None, label: str = CONTROLLER
) -> dict[str, float | None]:
    """CPU seconds so far of every control-plane process, the check's controller (nexus
    or the instant check, named `label`) and this benchmark (None: not running)."""
    pids = {k: v.get("pid") for k, v in cluster.info().get("components", {}).items()}
    pids[label] = controller_pid
    pids[BENCH_PROCESS] = os.getpid()
    out: dict[str, float | None] = {}
    for name, p in pids.items():
        try:
            out[name] = proc_cpu_seconds(int(p)) if p else None
        except (FileNotFoundError, ProcessLookupError, ValueError):
            out[name] = None
    return out


def idle_cpu(
    cluster: cluster_mod.Cluster,
    controller_pid: int | None,
    seconds: float,
    label: str = CONTROLLER,
) -> dict[str, dict[str, float]]:
    """Every process's CPU over `seconds` of quiet just before a phase (nothing
    submitted; no node lease round: the wait before the phase covers this spell too):
    its idle rate, which the report takes off the phase's CPU per Workload."""
    log(f"measuring every process's idle CPU for {seconds:g}s")
    before, t0 = process_cpu(cluster, controller_pid, label), time.monotonic()
    time.sleep(seconds)
    after = process_cpu(cluster, controller_pid, label)
    return stats.cpu_by_process(before, after, time.monotonic() - t0)


# -- kube-apiserver ------------------------------------------------------------------------
def apiserver_metrics(api: client.ApiClient) -> str:
    """kube-apiserver's /metrics, read with the admin client certificate."""
    method, url, headers, _, _ = api.param_serialize(
        "GET", "/metrics", auth_settings=["BearerToken"]
    )
    resp = api.call_api(method, url, headers)
    resp.read()
    return resp.data.decode()


def apiserver_profile(api: client.ApiClient, seconds: int, into: Path) -> None:
    """A CPU profile of kube-apiserver over the next `seconds` (its /debug/pprof,
    on by default, read with the admin client certificate) into `into`, and, where `go`
    is installed, its top functions by cumulative time next to it (`.txt`)."""
    method, url, headers, _, _ = api.param_serialize(
        "GET", "/debug/pprof/profile", query_params=[("seconds", str(seconds))],
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(method, url, headers, _request_timeout=seconds + 60)
    resp.read()
    into.write_bytes(resp.data)
    go = shutil.which("go")
    if go is None:
        return
    top = subprocess.run(
        [go, "tool", "pprof", "-top", "-cum", "-nodecount=60", str(into)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "GOTOOLCHAIN": "local"},
    )
    into.with_suffix(".txt").write_text(top.stdout + top.stderr)


# -- the cluster at a phase's end ------------------------------------------------------------
def cluster_checks(plane: BenchPlane, ns: str) -> dict[str, Any]:
    """Double-booked GPUs (cluster-wide, from bound pods and node allocatable, plus
    devices held by two reservations) and pods on their planned node (this phase's)."""
    alloc = {
        n.metadata.name: int((n.status.allocatable or {}).get(wl_mod.GPU, 0))
        for n in plane.core.list_node().items
    }
    raw = json.loads(plane.core.list_pod_for_all_namespaces(_preload_content=False).data)
    bound = [b for p in raw["items"] if (b := booking.bound_pod(p))]
    rrs = plane.reservations()
    good, total, bad = booking.on_planned_node([b for b in bound if b.namespace == ns], rrs)
    return {
        "cluster_pods_at_end": len(raw["items"]),
        "double_booked_gpus": booking.double_booked_gpus(alloc, bound, rrs),
        "over_allocated_nodes": booking.over_allocated(alloc, bound),
        "pods_bound": sum(b.namespace == ns for b in bound),
        "pods_with_reservation": total,
        "pods_on_planned_node": good,
        "pods_off_plan": bad[:20],
        "reservations_live": len([r for r in rrs if r["metadata"]["namespace"] == ns]),
    }


def why_not_running(
    plane: BenchPlane, ns: str, times: dict[str, stats.WorkloadTimes], limit: int = 20
) -> list[dict[str, Any]]:
    """For the Workloads whose pods did not all run: their conditions and checks."""
    waiting = {n for n, t in times.items() if t.all_running() is None}
    out = []
    for wl in plane.custom.list_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, ns, "workloads"
    )["items"]:
        owner = next((o["name"] for o in wl["metadata"].get("ownerReferences") or []), "")
        if owner not in waiting:
            continue
        status = wl.get("status") or {}
        out.append(
            {
                "workload": owner,
                "conditions": [
                    f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
                    for c in status.get("conditions") or []
                ],
                "checks": [
                    f"{c['name']}={c.get('state')}: {c.get('message', '')}"
                    for c in status.get("admissionChecks") or []
                ],
                "pods_running": len(times[owner].pod_running),
            }
        )
        if len(out) >= limit:
            break
    return out


# ------------------------------------------------------------------ summaries


def _admission_histograms(api: tuple[str, str], metric: str, label: str) -> dict[str, Any]:
    """Per webhook (or policy) of the apiserver's admission histogram: calls, p50, p99 over
    the phase (the difference of the scrapes before and after it)."""
    out = {}
    for value in sorted(stats.histogram_label_values(api[1], metric, label)):
        d = stats.bucket_delta(
            stats.histogram_buckets(api[1], metric, {label: value}),
            stats.histogram_buckets(api[0], metric, {label: value}),
        )
        if stats.histogram_count(d) > 0:
            out[value] = {
                "calls": stats.histogram_count(d),
                "p50_s": stats.histogram_quantile(0.5, d),
                "p99_s": stats.histogram_quantile(0.99, d),
                "buckets": {str(k): v for k, v in sorted(d.items())},
            }
    return out


# the controller's histograms read per phase: (key in the result, metric, label match)
CONTROLLER_HISTOGRAMS: tuple[tuple[str, str, dict[str, str] | None], ...] = (
    ("solve_seconds", "solve_seconds", None),
    # one-pod decisions alone: what should cost the same on any fleet size; wall
    # time, and the solving thread's CPU time (without its waits for a core)
    ("solve_seconds_one_pod", "solve_seconds", {"pods": "1"}),
    ("solve_cpu_seconds_one_pod", "solve_cpu_seconds", {"pods": "1"}),
    # those that reused the engine's kept facts (not the first of their pod shape,
    # nor the first after a snapshot renewal: those derive them over the fleet)
    ("solve_seconds_one_pod_kept", "solve_seconds", {"pods": "1", "facts": "kept"}),
    ("solve_cpu_seconds_one_pod_kept", "solve_cpu_seconds", {"pods": "1", "facts": "kept"}),
    # the part of each reservation create's round trip that the next solve did not
    # hide: with `solve_seconds`' sum, how a burst's placing time splits
    ("reservation_wait_seconds", "reservation_wait_seconds", None),
    ("reconcile_seconds", "reconcile_seconds", None),
    ("ungate_seconds", "ungate_seconds", None),
    ("event_loop_lag_seconds", "event_loop_lag_seconds", None),  # blocks the webhook
    # full collections: every thread of the controller waits while one runs
    ("gc_pause_seconds_full", "gc_pause_seconds", {"generation": "2"}),
)


def controller_summary(ctl: tuple[str, str]) -> dict[str, Any]:
    """The controller's histograms, renewals and warmed shapes over the phase, from its
    /metrics before and after it ({} when it did not run)."""
    controller: dict[str, Any] = {}
    if not ctl[1]:
        return controller
    for key, metric, match in CONTROLLER_HISTOGRAMS:
        full = "nexus_admit_" + metric
        d = stats.bucket_delta(
            stats.histogram_buckets(ctl[1], full, match),
            stats.histogram_buckets(ctl[0], full, match),
        )
        controller[key] = {
            "count": stats.histogram_count(d),
            "p50_s": stats.histogram_quantile(0.5, d),
            "p99_s": stats.histogram_quantile(0.99, d),
            "sum_s": round(
                stats.histogram_sum(ctl[1], full, match)
                - stats.histogram_sum(ctl[0], full, match), 3
            ),
        }
    # passes whose snapshot dropped the engine's facts about the fleet: each makes the
    # next solve derive them again, O(fleet) (a one-pod decision's tail)
    controller["snapshot_renewals"] = {
        reason: n for (reason,), n in stats.counter_delta(
            ctl[1], ctl[0], "nexus_admit_snapshot_renewals", ("reason",)).items()
    }
    # pod shapes of Workloads waiting for quota whose facts were derived ahead
    controller["warmed_shapes"] = sum(
        stats.counter_delta(ctl[1], ctl[0], "nexus_admit_warmed_shapes", ()).values())
    return controller


def _node_heartbeats(requests: dict[tuple[str, ...], float]) -> dict[str, float]:
    return {
        "lease_puts": sum(
            n for (v, r, _, _), n in requests.items() if (v, r) == ("PUT", "leases")
        ),
        "node_status": sum(
            n for (v, r, sub, _), n in requests.items() if r == "nodes" and sub == "status"
        ),
    }


def _api_requests(requests: dict[tuple[str, ...], float]) -> list[dict[str, Any]]:
    """What the apiserver served in the phase, most first: who loads it, and conflicts."""
    return [
        {"verb": v, "resource": r, "subresource": sub, "code": code, "count": n}
        for (v, r, sub, code), n in sorted(requests.items(), key=lambda kv: -kv[1])
        if v != "WATCH"
    ][:40]


def summarize(
    name: str,
    works: list[wl_mod.BenchWorkload],
    times: dict[str, stats.WorkloadTimes],
    t_start: float,
    t_end: float,
    api: tuple[str, str],
    ctl: tuple[str, str],
) -> dict[str, Any]:
    ts = list(times.values())
    c2r = stats.create_to_running(ts)
    c2b = stats.create_to_bound(ts)
    burst = [times[w.name] for w in works if w.arrival_s == 0]
    requests = stats.counter_delta(
        api[1], api[0], "apiserver_request_total", ("verb", "resource", "subresource", "code")
    )
    ungate = stats.ungate_latencies(ts)
    return {
        "phase": name,
        "workloads": len(works),
        "pods": sum(w.pods for w in works),
        "wall_s": round(t_end - t_start, 1),
        "all_running": len(c2r),
        "admitted": sum(t.admitted is not None for t in ts),
        "throughput_wl_per_s": stats.throughput([t.created for t in ts], [t.admitted for t in ts]),
        "burst_throughput_wl_per_s": stats.throughput(
            [t.created for t in burst], [t.admitted for t in burst]
        ),
        "running_throughput_wl_per_s": stats.throughput(
            [t.created for t in ts], [t.all_running() for t in ts]
        ),
        "create_to_running_p50_s": stats.percentile(c2r, 50),
        "create_to_running_p99_s": stats.percentile(c2r, 99),
        "create_to_running_max_s": max(c2r, default=None),
        # without KWOK's play of the kubelet (bound → Running): see stats.create_to_bound
        "create_to_bound_p50_s": stats.percentile(c2b, 50),
        "create_to_bound_p99_s": stats.percentile(c2b, 99),
        "ungate_client_p50_s": stats.percentile(ungate, 50),
        "ungate_client_p99_s": stats.percentile(ungate, 99),
        "pods_gated": len(ungate),
        "stages": stats.stage_summary(ts),
        "node_heartbeats": _node_heartbeats(requests),
        "webhooks": _admission_histograms(api, WEBHOOK_METRIC, "name"),
        "admission_policies": _admission_histograms(api, POLICY_METRIC, "policy"),
        "api_requests": _api_requests(requests),
        "controller_metrics": controller_summary(ctl),
    }


def process_summary(samples: list[Any]) -> dict[str, Any]:
    live = [s for s in samples if s.rss_mib > 0]
    if len(live) < 2:
        return {}
    wall = live[-1].t - live[0].t
    cpu = live[-1].cpu_s - live[0].cpu_s
    return {
        "cpu_s": round(cpu, 1),
        "cpu_percent_mean": round(100 * cpu / wall, 1) if wall > 0 else None,
        "rss_start_mib": round(live[0].rss_mib, 1),
        "rss_end_mib": round(live[-1].rss_mib, 1),
        "rss_peak_mib": round(max(s.hwm_mib for s in live), 1),
        "rss_series_mib": [
            [round(s.t - live[0].t, 1), round(s.rss_mib, 1)]
            for s in live[:: max(1, len(live) // 120)]
        ],
    }


def soak_rss(process: dict[str, Any], warmup_fraction: float = 0.1) -> dict[str, Any]:
    """RSS growth over the soak, from the end of its warm-up (the first `warmup_fraction`
    of the samples: caches and the first watch lists fill) to its end."""
    series = process.get("rss_series_mib") or []
    if len(series) < 4:
        return {}
    start = series[max(1, int(len(series) * warmup_fraction))][1]
    end = process["rss_end_mib"]
    return {
        "rss_after_warmup_mib": start,
        "rss_end_mib": end,
        "rss_growth_percent": round(100 * (end - start) / start, 1) if start else None,
    }


