#!/usr/bin/env python3
"""Kueue alone against Kueue + nexus-admit on the real control plane with a large KWOK GPU
fleet, in one run (what `make bench-e2e` runs).

    NEXUS_E2E_STATE=/tmp/e2e-bench python e2e/bench_e2e/run.py --nodes 1000 --workloads 300

1. The control plane comes up with fleet.yaml scaled to --nodes (or is reused when it
   already runs with that many nodes), ClusterQueues get quotas for that fleet;
   --background-pods bound non-GPU pods (no Kueue) fill the cluster for both phases.
   Before each phase, and before the controller starts, the benchmark waits until KWOK's
   next round of node lease renewals is --lease-quiet-seconds away.
2. Phase `kueue`: the generated Workloads (Indexed Jobs) go to the Kueue-alone
   ClusterQueues gold/silver/bronze, a burst and then a steady stream; nexus-admit is not
   running and its webhook is not registered. Wait for every pod Running, check, clean up.
3. Phase `check`: the same Workloads, same arrival pattern, go to instant-gold/silver/bronze
   (Kueue alone's queues with the benchmark's instant check, instant_check.py: Ready at
   once, nothing placed), nexus not running: what any check costs on this plane.
4. Phase `nexus`: nexus-admit starts with one one-pod Workload already waiting (as after a
   restart with work queued) and its start-up is timed (webhook serving, store synced, its
   first decision, on that Workload); then the same Workloads, same arrival pattern, go to
   nexus-gold/silver/bronze.
5. Soak (nexus): Workloads arrive and finish (KWOK completes their pods) for --soak-minutes;
   the controller's RSS is sampled throughout; afterwards no reservation may be left.

Prints tables and issue 30's targets (report.py) and writes <out>/bench-e2e.json. Figures
are measured, never asserted.

The plane and its objects are in bench_plane.py, the controller under test in nexus_process.py,
what a phase measures in measure.py; this file drives the phases (Bench) and the CLI.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

E2E_DIR = Path(__file__).resolve().parent.parent
if str(E2E_DIR) not in sys.path:
    sys.path.insert(0, str(E2E_DIR))

from kubernetes import client  # noqa: E402

from bench_e2e import instant_check, queues, stats  # noqa: E402
from bench_e2e import workloads as wl_mod  # noqa: E402
from bench_e2e.bench_plane import BACKGROUND_NAMESPACE, BenchPlane  # noqa: E402
from bench_e2e.measure import (  # noqa: E402
    apiserver_metrics,
    apiserver_profile,
    cluster_checks,
    idle_cpu,
    process_cpu,
    process_summary,
    soak_rss,
    summarize,
    why_not_running,
)
from bench_e2e.nexus_process import NexusProcess  # noqa: E402
from bench_e2e.recorder import JobWatcher, PodWatcher, ProcSampler, WorkloadWatcher  # noqa: E402
from bench_e2e.report import (  # noqa: E402
    CONTROLLER,
    INSTANT,
    cpu_per_workload,
    gap_split,
    print_report,
    targets,
)


def log(msg: str) -> None:
    print(f"[bench-e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Scrape:
    """Every process's CPU (at `at`, monotonic) and the two /metrics, on one side of a
    phase."""

    cpu: dict[str, float | None]
    at: float
    api: str
    ctl: str


def job_manifests(
    rack_preference: bool, complete_after: str | None
) -> Callable[[wl_mod.BenchWorkload], dict[str, Any]]:
    """A phase's Job for each of its Workloads."""

    def manifest(w: wl_mod.BenchWorkload) -> dict[str, Any]:
        ttl = 0 if complete_after else None  # the soak: finished Jobs go at once
        return wl_mod.job_manifest(
            w,
            w.tier,
            rack_preference=rack_preference and w.tier in queues.TAS_TIERS,
            complete_after=complete_after,
            ttl_after_finished_s=ttl,
        )

    return manifest


class Bench:
    """Drives the phases: the plane (bench_plane.py) and the controller under test
    (nexus_process.py) set up, each phase's Workloads sent in a burst and a stream, its
    figures collected (measure.py) around it."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.plane = BenchPlane(args)
        self.cluster = self.plane.cluster
        self.fleet = self.plane.fleet
        self.pools = self.plane.pools
        self.nexus: NexusProcess | None = None
        self.checker: subprocess.Popen[bytes] | None = None  # the instant check's process

    # -- set-up -------------------------------------------------------------------------
    def up(self) -> None:
        t = time.monotonic()
        have = self.plane.up()
        self.nexus = NexusProcess(self.plane, pin_at_creation=self.args.pin_at_creation)
        self.nexus.install()
        self.plane.apply_cluster_queues()
        log(f"cluster ready with {have} nodes in {time.monotonic() - t:.0f}s")

    def start_controller(self) -> dict[str, Any]:
        assert self.nexus is not None
        return self.nexus.start()

    def stop_controller(self) -> None:
        if self.checker is not None:  # a phase that failed half-way
            instant_check.stop(self.checker)
            self.checker = None
        if self.nexus is not None:
            self.nexus.stop()

    # -- submission -----------------------------------------------------------------------
    def submit(
        self,
        ns: str,
        works: list[wl_mod.BenchWorkload],
        times: dict[str, stats.WorkloadTimes],
        manifest: Any,
    ) -> None:
        """Create each Job at its arrival offset, open loop: the burst through a few threads
        at once, then each Job of the stream sent at its own time from a pool, so a slow
        create (a loaded apiserver and its webhooks) never holds back the arrivals after it,
        as independent users would not wait for each other."""
        t0 = time.time()

        def create(w: wl_mod.BenchWorkload) -> None:
            for attempt in range(5):
                try:
                    self.plane.batch.create_namespaced_job(ns, manifest(w), _preload_content=False)
                    times[w.name].created = time.time()
                    return
                except client.ApiException as e:
                    if e.status == 409 or attempt == 4:  # exists: an earlier try went through
                        times[w.name].created = times[w.name].created or time.time()
                        if e.status != 409:
                            log(f"create {w.name} failed: {e.status} {e.reason}")
                        return
                    time.sleep(0.5)

        burst = [w for w in works if w.arrival_s == 0]
        with cf.ThreadPoolExecutor(8) as pool:
            list(pool.map(create, burst))
        with cf.ThreadPoolExecutor(16) as pool:
            sent = []
            for w in works[len(burst) :]:
                delay = t0 + w.arrival_s - time.time()
                if delay > 0:
                    time.sleep(delay)
                sent.append(pool.submit(create, w))
            for f in sent:
                f.result()  # an unexpected error fails the phase, as before


    def drive(
        self,
        name: str,
        ns: str,
        works: list[wl_mod.BenchWorkload],
        times: dict[str, stats.WorkloadTimes],
        manifest: Any,
        timeout: float,
    ) -> tuple[float, float]:
        """Submit the phase's Workloads and wait until every pod of each runs (at most
        `timeout`); returns the phase's start and end (wall clock)."""
        log(f"{name}: submitting {len(works)} Workloads ({sum(w.pods for w in works)} pods)")
        t_start = time.time()
        submitter = cf.ThreadPoolExecutor(1)
        submitted = submitter.submit(self.submit, ns, works, times, manifest)
        deadline = time.monotonic() + timeout
        last_log = 0.0
        while time.monotonic() < deadline:
            done = sum(t.all_running() is not None for t in times.values())
            if submitted.done() and done == len(works):
                break
            if time.monotonic() - last_log > 15:
                admitted = sum(t.admitted is not None for t in times.values())
                log(f"{name}: {done}/{len(works)} all Running, {admitted} admitted")
                last_log = time.monotonic()
            time.sleep(0.5)
        submitted.result()
        return t_start, time.time()

    def drain(self, ns: str, timeout: float = 300) -> dict[str, Any]:
        """The soak's end: wait until every Job finished and went (TTL 0), then count the
        reservations left anywhere (the controller releases them when Workloads finish)."""
        t = time.monotonic()
        deadline = t + timeout
        while time.monotonic() < deadline:
            if not self.plane.batch.list_namespaced_job(ns, limit=1).items:
                break
            time.sleep(2)
        jobs_left = len(self.plane.batch.list_namespaced_job(ns).items)
        while time.monotonic() < deadline and self.plane.reservations():
            time.sleep(2)
        return {
            "jobs_left": jobs_left,
            "reservations_left": len(self.plane.reservations()),
            "drain_s": round(time.monotonic() - t, 1),
        }



    # -- one phase ------------------------------------------------------------------------
    def run_phase(
        self,
        name: str,
        queue_prefix: str,
        works: list[wl_mod.BenchWorkload],
        *,
        rack_preference: bool,
        complete_after: str | None = None,
        controller: bool,
        timeout: float,
        launch: bool = False,
        instant: bool = False,
    ) -> dict[str, Any]:
        """One phase. `launch`: start the controller here with one Workload waiting for it
        (`start_with_waiting_workload`), which times its first decision after its start;
        the phase's Workloads then go to a controller that is ready. `instant`: the
        instant check answers the phase's Workloads (instant_check.py), in its own
        process, counted as the phase's controller."""
        ns = f"bench-{name}"
        self.plane.make_namespace(ns, queue_prefix)
        checker = self.checker = self._start_instant_check(ns, queue_prefix) if instant else None
        manifest = job_manifests(rack_preference, complete_after)
        startup = None
        if launch:
            assert self.nexus is not None
            startup = self.nexus.start_with_waiting_workload(ns, manifest)
        times = {w.name: stats.WorkloadTimes(pods=w.pods) for w in works}
        watchers = self._watch(ns, times)
        pods_at_start = self.plane.cluster_pods()
        pid, label = self._measured_process(controller, checker)
        idle = (
            idle_cpu(self.cluster, pid, self.args.idle_seconds, label)
            if self.args.idle_seconds > 0 else None
        )
        sampler = ProcSampler(pid)
        sampler.start()
        before = self._scrape_before(pid, label)
        log_offset = self.nexus.log_size() if controller and self.nexus else 0
        kwok_offset = self.plane.kwok_log_size()
        load_start = os.getloadavg()
        profile = self._start_profile(name)
        t_start, t_end = self.drive(name, ns, works, times, manifest, timeout)
        _await_profile(profile, name)
        after = self._scrape_after(pid, label)
        load_end = os.getloadavg()
        checks = cluster_checks(self.plane, ns) if not complete_after else {}
        checks["not_running"] = why_not_running(self.plane, ns, times)
        self._stop_watching(sampler, watchers)
        result = summarize(
            name, works, times, t_start, t_end, (before.api, after.api), (before.ctl, after.ctl)
        )
        result.update(checks)
        self._add_plane_facts(result, ns, kwok_offset, pods_at_start, (t_start, t_end))
        if startup is not None:
            result["startup"] = self._startup(startup)
        result["controller_process"] = process_summary(sampler.samples)
        if controller:
            # each solve over record.SLOW_SOLVE_SECONDS and each renewal, as logged: the
            # solve histograms' tail, one decision at a time
            result["controller_log"] = (
                self.nexus.log_lines(log_offset, "slow solve of", "renewed (")
                if self.nexus else []
            )
        _add_cpu_and_load(result, before, after, idle, (load_start, load_end), sampler.samples)
        result["watch_errors"] = sum(w.errors for w in watchers)
        # each Workload's milestones, in arrival order: where a stage's time went, and when
        result["timeline"] = [
            {"name": w.name, "tier": w.tier, "pods": w.pods, **times[w.name].timeline(t_start)}
            for w in works
        ]
        if complete_after:
            result["drain"] = self.drain(ns)
        result["cleanup_s"] = round(self.plane.remove_namespace(ns), 1)
        return result

    # -- a phase's parts ----------------------------------------------------------------
    def _start_instant_check(self, ns: str, queue_prefix: str) -> subprocess.Popen[bytes]:
        """The instant check for the phase's namespace, its ClusterQueues Active."""
        checker = instant_check.start(
            str(self.cluster.kubeconfig), ns, Path(self.args.out) / "instant-check.log"
        )
        self.checker = checker  # stopped by stop_controller if the wait fails
        self.plane.wait_queues_active(queue_prefix)
        return checker

    def _stop_watching(self, sampler: ProcSampler, watchers: list[Any]) -> None:
        """The sampler, the watchers and the phase's instant check stopped."""
        sampler.stop()
        for w in watchers:
            w.stop()
        if self.checker is not None:
            instant_check.stop(self.checker)
            self.checker = None

    def _watch(self, ns: str, times: dict[str, stats.WorkloadTimes]) -> list[Any]:
        """The phase's pod, Workload and Job watchers, started and listed."""
        kc = str(self.cluster.kubeconfig)
        watchers = [
            PodWatcher(kc, ns, times),
            WorkloadWatcher(kc, ns, times),
            JobWatcher(kc, ns, times),
        ]
        for w in watchers:
            w.start()
        for w in watchers:
            w.listed.wait(30)
        return watchers

    def _measured_process(
        self, controller: bool, checker: subprocess.Popen[bytes] | None
    ) -> tuple[int | None, str]:
        """The phase's check controller: nexus-admit, the instant check, or none."""
        if checker is not None:
            return checker.pid, INSTANT
        return (self.nexus.pid if controller and self.nexus else None), CONTROLLER

    def _scrape_before(self, pid: int | None, label: str) -> Scrape:
        cpu, at = process_cpu(self.cluster, pid, label), time.monotonic()
        api, ctl = apiserver_metrics(self.plane.api), self._controller_metrics()
        return Scrape(cpu, at, api, ctl)

    def _scrape_after(self, pid: int | None, label: str) -> Scrape:
        api, ctl = apiserver_metrics(self.plane.api), self._controller_metrics()
        cpu, at = process_cpu(self.cluster, pid, label), time.monotonic()
        return Scrape(cpu, at, api, ctl)

    def _controller_metrics(self) -> str:
        return self.nexus.metrics() if self.nexus else ""

    def _start_profile(self, name: str) -> cf.Future[None] | None:
        if self.args.profile_apiserver <= 0:
            return None
        into = Path(self.args.out) / f"apiserver-{name}.pprof"
        return cf.ThreadPoolExecutor(1).submit(
            apiserver_profile, self.plane.api, self.args.profile_apiserver, into
        )

    def _add_plane_facts(
        self,
        result: dict[str, Any],
        ns: str,
        kwok_offset: int,
        pods_at_start: int,
        window: tuple[float, float],
    ) -> None:
        failed = self.plane.kwok_failed_pod_stages(ns, kwok_offset)
        result["kwok_failed_pod_stages"] = failed["failed"]
        result["kwok_refused_replays"] = failed["refused_replays"]
        result["cluster_pods_at_start"] = pods_at_start
        # the KWOK node leases renewed in the phase (each at most once: a quarter of
        # --node-grace-seconds apart); with the apiserver's PUT leases, leader elections too
        result["node_heartbeats"]["node_leases_renewed"] = self.plane.leases_renewed_between(
            *window
        )

    def _startup(self, startup: dict[str, Any]) -> dict[str, Any]:
        assert self.nexus is not None
        return stats.first_decision(
            startup["started"],
            startup["serving"],
            self.nexus.store_synced_at(startup["log_offset"]),
            [startup["waiting"]],
        )


def _await_profile(profile: cf.Future[None] | None, name: str) -> None:
    if profile is None:
        return
    try:
        profile.result()
    except Exception as e:  # a profile is a study aid: the phase's figures stand
        log(f"{name}: no kube-apiserver profile: {e}")


def _add_cpu_and_load(
    result: dict[str, Any],
    before: Scrape,
    after: Scrape,
    idle: dict[str, dict[str, float]] | None,
    loadavg: tuple[Any, Any],
    samples: list[Any],
) -> None:
    """Where the machine's CPU went: every component, the controller, this benchmark."""
    cpu_wall = after.at - before.at
    result["cpu_by_process"] = stats.cpu_by_process(before.cpu, after.cpu, cpu_wall)
    if idle is not None:
        result["idle_cpu_by_process"] = idle
    result["cpu_wall_s"] = round(cpu_wall, 1)
    result["load"] = {
        "loadavg_start": loadavg[0],
        "loadavg_end": loadavg[1],
        "load1_mean": stats.percentile([s.load1 for s in samples], 50),
        "cpus": os.cpu_count(),
    }


# ------------------------------------------------------------------ CLI


def _add_load_args(ap: argparse.ArgumentParser) -> None:
    """The fleet and the Workloads each phase sends."""
    ap.add_argument("--nodes", type=int, default=1000, help="fleet size (fleet.yaml scaled)")
    ap.add_argument("--workloads", type=int, default=300)
    ap.add_argument("--burst", type=int, help="Workloads arriving at once (default 1/3)")
    ap.add_argument(
        "--stream-per-s", type=float, default=4.0, help="arrival rate of the rest (Workloads/s)"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--phases", default="kueue,check,nexus", help="comma-separated: kueue, check, nexus"
    )
    ap.add_argument("--phase-timeout", type=float, default=900)
    ap.add_argument("--soak-minutes", type=float, default=20, help="0: no soak")
    ap.add_argument("--soak-workloads", type=int, default=2000)
    ap.add_argument(
        "--soak-pod-seconds",
        type=int,
        default=30,
        help="how long a soak pod runs before KWOK completes it",
    )


def _add_plane_args(ap: argparse.ArgumentParser) -> None:
    """The plane around the phases: its heartbeats, background pods, quiet spells."""
    ap.add_argument(
        "--node-grace-seconds",
        type=int,
        default=900,
        help="node lease duration and node-monitor grace period of the benchmark's cluster",
    )
    ap.add_argument(
        "--lease-quiet-seconds",
        type=float,
        default=150,
        help="before each measured phase (and the controller's start), wait until KWOK's "
        "next round of node lease renewals is this far away (0: do not wait)",
    )
    ap.add_argument(
        "--idle-seconds",
        type=float,
        default=20,
        help="before each phase, read every process's CPU over this many seconds of quiet: "
        "the report also gives the CPU per Workload beyond each process's idle rate (0: do "
        "not)",
    )
    ap.add_argument(
        "--background-pods",
        type=int,
        default=0,
        help="bound non-GPU pods (no Kueue, no scheduler) kept in the cluster through both "
        "phases, so that the controller's store holds a large cluster",
    )
    ap.add_argument(
        "--settle-seconds",
        type=float,
        default=600,
        help="after adding the background pods, wait (at most this long) until the plane's "
        "processes together use less than 50 %% of a core, KWOK's work on them done (0: do "
        "not wait)",
    )


def _add_output_args(ap: argparse.ArgumentParser) -> None:
    """Profiles, the controller's pin hook, where the JSON goes, what is kept."""
    ap.add_argument(
        "--profile-apiserver",
        type=int,
        default=0,
        metavar="SECONDS",
        help="profile kube-apiserver's CPU for this long from each phase's start, into "
        "OUT/apiserver-<phase>.pprof (and .txt: its top functions) (0: do not); the plane "
        "it starts serves /debug/pprof",
    )
    ap.add_argument(
        "--pin-at-creation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="register the pod-pin hook (the chart's webhook.pinAtCreation, on by default): "
        "the Job controller's pods pinned in their create request; --no-pin-at-creation: "
        "pinned by a patch each, as before 2026-11-29",
    )
    ap.add_argument("--out", default="reports/bench-e2e")
    ap.add_argument(
        "--compare-with",
        metavar="JSON",
        help="another run's bench-e2e.json on another fleet size: the one-pod decision's "
        "p99 is compared across the two sizes (a target)",
    )
    ap.add_argument(
        "--keep", action="store_true", help="leave the control plane (and background pods) up"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="e2e/bench_e2e/run.py", description=__doc__.split("\n\n")[0])
    _add_load_args(ap)
    _add_plane_args(ap)
    _add_output_args(ap)
    return ap.parse_args(argv)


def _plane_environment(args: argparse.Namespace) -> None:
    """What the plane this benchmark starts is asked for (plane/components.py reads it)."""
    if args.profile_apiserver > 0:
        os.environ["NEXUS_E2E_PROFILING"] = "1"  # the plane serves /debug/pprof (components.py)
    # KWOK's pod-ready stage with one pod IP: its refused replays stalled every pod's status
    # in a phase (plane/components.one_pod_ip); the plane it starts only
    os.environ.setdefault("NEXUS_E2E_KWOK_ONE_POD_IP", "1")
    # and played once: a play on an old copy of a pod is refused (plane/components.played_once)
    os.environ.setdefault("NEXUS_E2E_KWOK_PLAY_ONCE", "1")


def _measured_phase(
    bench: Bench,
    args: argparse.Namespace,
    result: dict[str, Any],
    save: Callable[[], None],
    phase: str,
    lease_wait: float,
    **kwargs: Any,
) -> None:
    result["phases"][phase] = bench.run_phase(phase, timeout=args.phase_timeout, **kwargs)
    result["phases"][phase]["lease_wait_s"] = lease_wait
    save()


def _run_phases(
    bench: Bench,
    args: argparse.Namespace,
    works: list[wl_mod.BenchWorkload],
    result: dict[str, Any],
    save: Callable[[], None],
) -> None:
    """The background pods, then the measured phases in order."""
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    quiet = args.lease_quiet_seconds + args.idle_seconds
    if args.background_pods > 0:
        result["background"] = bench.plane.add_background_pods(args.background_pods)
        if args.settle_seconds > 0:
            result["background"]["settled_s"] = bench.plane.wait_until_settled(
                args.settle_seconds
            )
    if "kueue" in phases:
        _measured_phase(
            bench, args, result, save, "kueue", bench.plane.wait_for_lease_quiet(quiet),
            queue_prefix="", works=works, rack_preference=True, controller=False,
        )
    if "check" in phases:
        _measured_phase(
            bench, args, result, save, "check", bench.plane.wait_for_lease_quiet(quiet),
            queue_prefix=queues.INSTANT_PREFIX,
            works=works,
            rack_preference=True,  # Kueue alone's queues, TAS on gold, with the check
            controller=False,
            instant=True,
        )
    if "nexus" in phases or args.soak_minutes > 0:
        # the wait comes first: the controller's start counts towards its first decision
        lease_wait = bench.plane.wait_for_lease_quiet(quiet)
    if "nexus" in phases:
        # started with one Workload waiting (a restart with work queued): its first
        # decision times its own start-up, not Kueue's admission of a Workload created
        # only once it was ready
        _measured_phase(
            bench, args, result, save, "nexus", lease_wait,
            queue_prefix="nexus-", works=works, rack_preference=False, controller=True,
            launch=True,
        )
    if args.soak_minutes > 0 and args.soak_workloads > 0:
        if "nexus" not in phases:
            bench.start_controller()
        result["soak"] = _soak(bench, args)
        save()


def _soak(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """Workloads arrive and finish for --soak-minutes; the controller's RSS over it."""
    soak_works = wl_mod.generate(
        args.soak_workloads,
        args.seed + 1,
        queues.tier_pool_gpus(bench.pools),
        burst=0,
        stream_per_s=args.soak_workloads / (args.soak_minutes * 60),
        prefix="soak",
        pool_budget=None,
    )
    soak = bench.run_phase(
        "soak",
        "nexus-",
        soak_works,
        rack_preference=False,
        controller=True,
        complete_after=f"{args.soak_pod_seconds}s",
        timeout=args.soak_minutes * 60 + args.phase_timeout,
    )
    soak["rss"] = soak_rss(soak["controller_process"])
    return soak


def _take_down(bench: Bench, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The plane down when this run started it, or else the background pods removed,
    unless --keep."""
    if not args.keep and bench.cluster.started_here:
        # the background pods go with it; with a pod trace, the components' logs stay
        bench.cluster.down(keep_logs=bool(os.environ.get("NEXUS_BENCH_POD_TRACE")))
    elif not args.keep and "background" in result:
        bench.plane.remove_namespace(BACKGROUND_NAMESPACE)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    burst = args.workloads // 3 if args.burst is None else args.burst
    _plane_environment(args)
    bench = Bench(args)
    works = wl_mod.generate(
        args.workloads,
        args.seed,
        queues.tier_pool_gpus(bench.pools),
        burst=burst,
        stream_per_s=args.stream_per_s,
    )
    result: dict[str, Any] = {
        "config": {**vars(args), "burst": burst},
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()},
        "fleet": {"nodes": len(bench.fleet), "pools": bench.pools},
        "demand_gpus": wl_mod.demand_by_tier(works),
        "phases": {},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "bench-e2e.json"
    other = json.loads(Path(args.compare_with).read_text()) if args.compare_with else None

    def save() -> None:
        result["cpu_per_workload"] = cpu_per_workload(result)
        result["targets"] = targets(result, other)
        result["gap_split"] = gap_split(result)
        json_path.write_text(json.dumps(result, indent=2, default=str))

    try:
        bench.up()
        _run_phases(bench, args, works, result, save)
    finally:
        bench.stop_controller()
        result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        save()
        _take_down(bench, args, result)
    print_report(result)
    print(f"JSON: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
