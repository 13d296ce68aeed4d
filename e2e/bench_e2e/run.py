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
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

E2E_DIR = Path(__file__).resolve().parent.parent
if str(E2E_DIR) not in sys.path:
    sys.path.insert(0, str(E2E_DIR))

import cluster as cluster_mod  # noqa: E402
import fleet as fleet_mod  # noqa: E402
from builders import create_local_queue  # noqa: E402
from kubernetes import client  # noqa: E402
from nexus_controller import NexusController  # noqa: E402

from bench_e2e import booking, instant_check, lists, queues, stats  # noqa: E402
from bench_e2e import workloads as wl_mod  # noqa: E402
from bench_e2e.recorder import (  # noqa: E402
    KUEUE_GROUP,
    KUEUE_VERSION,
    JobWatcher,
    PodWatcher,
    ProcSampler,
    WorkloadWatcher,
    api_client,
    condition_true,
    proc_cpu_seconds,
)
from bench_e2e.report import (  # noqa: E402
    BENCH_PROCESS,
    CONTROLLER,
    INSTANT,
    cpu_per_workload,
    gap_split,
    print_report,
    targets,
)

RR = ("scheduling.kubenexus.io", "v1alpha1", "resourcereservations")
WEBHOOK_METRIC = "apiserver_admission_webhook_admission_duration_seconds"
BACKGROUND_NAMESPACE = "bench-background"
NODE_LEASE_NAMESPACE = "kube-node-lease"
# the Job controller's pods are gated in the apiserver by our MutatingAdmissionPolicy
POLICY_METRIC = "apiserver_mutating_admission_policy_check_duration_seconds"
TIERS = wl_mod.TIERS


def log(msg: str) -> None:
    print(f"[bench-e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        os.environ["NEXUS_E2E_FLEET_NODES"] = str(args.nodes)  # read by Cluster.up()
        # 1,000 fake nodes renewing 40-s leases starve KWOK on a busy 2-core machine: nodes
        # went NotReady and tainted mid-phase. Heartbeats are not what is measured here.
        os.environ.setdefault("NEXUS_E2E_NODE_GRACE_SECONDS", str(args.node_grace_seconds))
        self.cluster = cluster_mod.Cluster()
        self.spec = fleet_mod.scaled(fleet_mod.load(), args.nodes)
        self.fleet = fleet_mod.expand(self.spec)
        self.pools = queues.pool_quotas(self.fleet)
        self.nc: NexusController | None = None
        self.checker: subprocess.Popen[bytes] | None = None  # the instant check's process

    # -- set-up -------------------------------------------------------------------------
    def up(self) -> None:
        t = time.monotonic()
        self.cluster.up()
        self.api = api_client(str(self.cluster.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        have = len(self.core.list_node().items)
        if have != len(self.fleet):
            raise SystemExit(
                f"the cluster in {self.cluster.state} has {have} nodes, not {len(self.fleet)}: "
                "take it down first (e2e/cluster.py down) or pick another NEXUS_E2E_STATE"
            )
        self.nc = NexusController(self.cluster, pin_at_creation=self.args.pin_at_creation)
        self.nc.install()
        self.nc.uninstall_webhook()  # the Kueue-alone phase runs without nexus in the path
        self.cluster.apply(queues.cluster_queues(self.pools), retries=10)
        log(f"cluster ready with {have} nodes in {time.monotonic() - t:.0f}s")

    def start_controller(self) -> dict[str, Any]:
        """Start the controller and wait until it is ready; returns when its process started
        and its webhook first served (wall clock), and where this run's log begins."""
        assert self.nc is not None
        self.nc.register_admission()
        log_file = self.nc.log_file
        offset = log_file.stat().st_size if log_file.exists() else 0
        started = time.time()
        self.nc.start(wait=False)
        serving = None
        while serving is None and time.time() - started < 120:
            if self.nc.proc is not None and self.nc.proc.poll() is not None:
                break  # wait_ready reports the exit with the log's tail
            if self.nc.ready():
                serving = time.time()
            else:
                time.sleep(0.05)
        self.nc.wait_ready()
        log(f"nexus-admit running (pid {self.nc.proc.pid if self.nc.proc else '?'})")
        return {"started": started, "serving": serving, "log_offset": offset}

    def start_with_waiting_workload(self, ns: str, manifest: Any) -> dict[str, Any]:
        """Start the controller with a one-pod Workload already created in `ns` (as after a
        restart with work queued) and wait for its check to be Ready: its first decision
        after its start ("waiting": that Workload's times). The Workload is deleted before
        the phase, so the phase's own Workloads go to a ready controller, as before."""
        waiting = wl_mod.BenchWorkload("first-decision", "silver", 1, 1, 0.0)
        times = {waiting.name: stats.WorkloadTimes(pods=1)}
        watcher = WorkloadWatcher(str(self.cluster.kubeconfig), ns, times)
        watcher.start()
        watcher.listed.wait(30)
        self.batch.create_namespaced_job(ns, manifest(waiting), _preload_content=False)
        times[waiting.name].created = time.time()
        startup = self.start_controller()
        deadline = time.time() + 300
        while times[waiting.name].check_ready is None and time.time() < deadline:
            time.sleep(0.2)
        watcher.stop()
        if times[waiting.name].check_ready is None:
            log("WARNING: the waiting Workload's check was not Ready after 300 s")
        self.batch.delete_namespaced_job(waiting.name, ns, propagation_policy="Background")
        startup["waiting"] = times[waiting.name]
        return startup

    def store_synced_at(self, log_offset: int) -> float | None:
        """When this run's controller logged "store synced in" (its log's own timestamp)."""
        text = self.controller_log_since(log_offset)
        m = re.search(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*store synced in", text, re.M)
        if not m:
            return None
        return datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()

    def kwok_log(self) -> Path:
        return Path(self.cluster.logs_dir) / "kwok.log"

    def kwok_failed_pod_stages(self, namespace: str, offset: int) -> dict[str, int]:
        """KWOK's failed plays of a pod stage for pods of `namespace` after `offset` in its
        log (`kwok_plays_failed`)."""
        try:
            with open(self.kwok_log(), "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return stats.kwok_plays_failed("", namespace)
        return stats.kwok_plays_failed(text, namespace)

    def log_size(self) -> int:
        return self.nc.log_file.stat().st_size if self.nc and self.nc.log_file.exists() else 0

    def controller_log_since(self, log_offset: int) -> str:
        """What this run's controller logged after `log_offset` ("" without a log)."""
        if self.nc is None or not self.nc.log_file.exists():
            return ""
        with open(self.nc.log_file, "rb") as f:
            f.seek(log_offset)
            return f.read().decode(errors="replace")

    def controller_log_lines(self, log_offset: int, *patterns: str) -> list[str]:
        """The lines the controller logged after `log_offset` that contain one of
        `patterns`: the phase's slow solves and snapshot renewals, read per decision."""
        text = self.controller_log_since(log_offset)
        return [line for line in text.splitlines() if any(p in line for p in patterns)]

    # -- a large cluster and its heartbeats ------------------------------------------------
    def add_background_pods(self, count: int, timeout: float = 1800) -> dict[str, Any]:
        """`count` bound, non-GPU pods in their own namespace, no Kueue and no scheduler
        (lists.py's copies of a real pod, bound by name to the KWOK nodes), so that the
        controller's store holds a large cluster; waits until KWOK runs them all, so that
        its backlog does not fall into a phase."""
        t = time.monotonic()
        nodes = [n.metadata.name for n in self.core.list_node(label_selector="type=kwok").items]
        lists.ensure_pods(self.core, count, nodes, BACKGROUND_NAMESPACE)
        created = time.monotonic() - t
        while time.monotonic() - t < timeout:
            pending = self.core.list_namespaced_pod(
                BACKGROUND_NAMESPACE, field_selector="status.phase!=Running", limit=1
            )
            if not pending.items:
                break
            time.sleep(2)
        else:
            log(f"WARNING: background pods not all Running after {timeout:.0f}s")
        log(f"{count} background pods Running in {time.monotonic() - t:.0f}s")
        return {
            "pods": count,
            "create_s": round(created, 1),
            "running_s": round(time.monotonic() - t, 1),
        }

    def wait_until_settled(
        self, limit_s: float, below_percent: float = 50.0, window_s: float = 10.0
    ) -> float:
        """Wait until the plane's processes together use less than `below_percent` of one
        core over a `window_s` window, at most `limit_s`: KWOK may go on working on the
        background pods for a while after they are all Running (a run once had it at 68 %
        of a core, and the apiserver at 61 %, just before the first phase, and another
        had that stretch inside the Kueue phase). Returns the seconds waited."""
        t = time.monotonic()
        while True:
            before, t0 = self.process_cpu(None), time.monotonic()
            time.sleep(window_s)
            used = stats.cpu_by_process(before, self.process_cpu(None), time.monotonic() - t0)
            busy = stats.busy_percent(used, BENCH_PROCESS)
            if busy < below_percent:
                break
            if time.monotonic() - t >= limit_s:
                log(f"WARNING: the plane still uses {busy:.0f} % of a core after "
                    f"{limit_s:.0f}s; going on")
                break
        waited = time.monotonic() - t
        log(f"the plane settled (below {below_percent:.0f} % of a core) in {waited:.0f}s")
        return round(waited, 1)

    def cluster_pods(self) -> int:
        listed = self.core.list_pod_for_all_namespaces(limit=1)
        return len(listed.items) + (listed.metadata.remaining_item_count or 0)

    def node_leases(self) -> list[tuple[float, float]]:
        """(renewTime, leaseDurationSeconds) of every node lease."""
        raw = json.loads(
            client.CoordinationV1Api(self.api)
            .list_namespaced_lease(NODE_LEASE_NAMESPACE, _preload_content=False)
            .data
        )
        out = []
        for lease in raw["items"]:
            spec = lease.get("spec") or {}
            if spec.get("renewTime") and spec.get("leaseDurationSeconds"):
                renewed = datetime.datetime.fromisoformat(spec["renewTime"].replace("Z", "+00:00"))
                out.append((renewed.timestamp(), float(spec["leaseDurationSeconds"])))
        return out

    def wait_for_lease_quiet(self, needed_s: float) -> float:
        """KWOK renews every node lease once per quarter of its duration, in rounds (1,000
        or 5,000 PUTs each, the apiserver's and etcd's work): before a measured phase, wait
        until the next round is at least `needed_s` away (at most three quarters of the
        renewal interval), so that neither phase gets a round the other does not.
        Returns the seconds waited."""
        t = time.monotonic()
        leases = self.node_leases()
        if needed_s <= 0 or not leases:
            return 0.0
        quarter = max(d for _, d in leases) / 4
        needed = min(needed_s, 0.75 * quarter)
        deadline = t + quarter * 1.2 + 60
        while time.monotonic() < deadline:
            pause = stats.lease_wait(stats.lease_renewals_due(leases, time.time()), needed)
            if pause is None:
                break
            time.sleep(pause)
            leases = self.node_leases()
        else:
            log("WARNING: no quiet spell between node lease renewals; going on")
        waited = time.monotonic() - t
        if waited > 1:
            log(f"waited {waited:.0f}s for a node lease renewal round to pass")
        return round(waited, 1)

    def leases_renewed_between(self, t0: float, t1: float) -> int:
        return sum(t0 <= renewed <= t1 for renewed, _ in self.node_leases())

    def stop_controller(self) -> None:
        if self.checker is not None:  # a phase that failed half-way
            instant_check.stop(self.checker)
            self.checker = None
        if self.nc is not None:
            self.nc.stop()
            self.nc.uninstall_webhook()

    # -- scrapes ------------------------------------------------------------------------
    def process_cpu(
        self, controller_pid: int | None, label: str = CONTROLLER
    ) -> dict[str, float | None]:
        """CPU seconds so far of every control-plane process, the check's controller (nexus
        or the instant check, named `label`) and this benchmark (None: not running)."""
        pids = {k: v.get("pid") for k, v in self.cluster.info().get("components", {}).items()}
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
        self, controller_pid: int | None, seconds: float, label: str = CONTROLLER
    ) -> dict[str, dict[str, float]]:
        """Every process's CPU over `seconds` of quiet just before a phase (nothing
        submitted; no node lease round: the wait before the phase covers this spell too):
        its idle rate, which the report takes off the phase's CPU per Workload."""
        log(f"measuring every process's idle CPU for {seconds:g}s")
        before, t0 = self.process_cpu(controller_pid, label), time.monotonic()
        time.sleep(seconds)
        after = self.process_cpu(controller_pid, label)
        return stats.cpu_by_process(before, after, time.monotonic() - t0)

    def apiserver_metrics(self) -> str:
        """kube-apiserver's /metrics, read with the admin client certificate."""
        method, url, headers, _, _ = self.api.param_serialize(
            "GET", "/metrics", auth_settings=["BearerToken"]
        )
        resp = self.api.call_api(method, url, headers)
        resp.read()
        return resp.data.decode()

    def apiserver_profile(self, seconds: int, into: Path) -> None:
        """A CPU profile of kube-apiserver over the next `seconds` (its /debug/pprof,
        on by default, read with the admin client certificate) into `into`, and, where `go`
        is installed, its top functions by cumulative time next to it (`.txt`)."""
        method, url, headers, _, _ = self.api.param_serialize(
            "GET", "/debug/pprof/profile", query_params=[("seconds", str(seconds))],
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(method, url, headers, _request_timeout=seconds + 60)
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

    def controller_metrics(self) -> str:
        return self.nc.metrics() if self.nc and self.nc.proc else ""

    # -- namespaces -----------------------------------------------------------------------
    def make_namespace(self, ns: str, queue_prefix: str) -> None:
        try:
            self.core.create_namespace({"metadata": {"name": ns}})
        except client.ApiException as e:
            if e.status != 409:
                raise
            log(f"{ns} left over from an earlier run: removing it first")
            self.remove_namespace(ns)
            self.core.create_namespace({"metadata": {"name": ns}})
        for tier in TIERS:
            create_local_queue(self.custom, ns, tier, f"{queue_prefix}{tier}")

    def wait_queues_active(self, prefix: str, timeout: float = 60) -> None:
        """Until Kueue holds the tiers' ClusterQueues named `prefix`<tier> Active (a queue
        whose check is not Active yet admits nothing)."""
        deadline = time.monotonic() + timeout
        names = [f"{prefix}{tier}" for tier in TIERS]
        while True:
            inactive = [
                n for n in names
                if not condition_true(
                    self.custom.get_cluster_custom_object(
                        KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", n), "Active")
            ]
            if not inactive:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"ClusterQueues not Active after {timeout:g} s: {inactive}")
            time.sleep(0.2)

    def reservations(self, ns: str | None = None) -> list[dict[str, Any]]:
        if ns:
            items = self.custom.list_namespaced_custom_object(*RR[:2], ns, RR[2])["items"]
        else:
            items = self.custom.list_cluster_custom_object(*RR)["items"]
        return [r for r in items if not r["metadata"].get("deletionTimestamp")]

    def remove_namespace(self, ns: str, timeout: float = 600) -> float:
        """Delete the namespace (Jobs, Workloads, pods, reservations go with it); wait until
        it is gone and no pod or reservation of it is left."""
        t = time.monotonic()
        try:
            self.batch.delete_collection_namespaced_job(ns, propagation_policy="Background")
        except client.ApiException as e:
            # only a head start: the namespace's deletion takes the Jobs anyway. A loaded
            # apiserver answered 504 after a phase of 300 Jobs, and the run lost its results
            if e.status != 404 and (e.status or 0) < 500:
                raise
            if e.status != 404:
                log(f"deleting the Jobs of {ns} timed out ({e.status}); the namespace takes them")
        self.core.delete_namespace(ns, propagation_policy="Background")
        # KWOK finishes pod deletions a few per second on a busy machine (2,000 pods took
        # minutes); between phases nothing is measured, so they go at once
        self.cluster.kubectl(
            "delete",
            "pods",
            "--all",
            "-n",
            ns,
            "--force",
            "--grace-period=0",
            "--wait=false",
            check=False,
            timeout=300,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.core.read_namespace(ns)
            except client.ApiException as e:
                if e.status == 404:
                    break
            time.sleep(2)
        else:
            log(f"WARNING: namespace {ns} still there after {timeout:.0f}s")
        left = self.reservations(ns)
        if left:
            log(f"WARNING: {len(left)} reservations left in {ns}")
        return time.monotonic() - t

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
                    self.batch.create_namespaced_job(ns, manifest(w), _preload_content=False)
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
        self.make_namespace(ns, queue_prefix)
        checker = self.checker = None
        if instant:
            checker = self.checker = instant_check.start(
                str(self.cluster.kubeconfig), ns, Path(self.args.out) / "instant-check.log"
            )
            self.wait_queues_active(queue_prefix)

        def manifest(w: wl_mod.BenchWorkload) -> dict[str, Any]:
            ttl = 0 if complete_after else None  # the soak: finished Jobs go at once
            m = wl_mod.job_manifest(
                w,
                w.tier,
                rack_preference=rack_preference and w.tier in queues.TAS_TIERS,
                complete_after=complete_after,
                ttl_after_finished_s=ttl,
            )
            return m

        startup = self.start_with_waiting_workload(ns, manifest) if launch else None
        times = {w.name: stats.WorkloadTimes(pods=w.pods) for w in works}
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
        pods_at_start = self.cluster_pods()
        pid = self.nc.proc.pid if controller and self.nc and self.nc.proc else None
        label = CONTROLLER
        if checker is not None:
            pid, label = checker.pid, INSTANT
        idle = (
            self.idle_cpu(pid, self.args.idle_seconds, label)
            if self.args.idle_seconds > 0 else None
        )
        sampler = ProcSampler(pid)
        sampler.start()
        cpu_before, cpu_t0 = self.process_cpu(pid, label), time.monotonic()
        api_before, ctl_before = self.apiserver_metrics(), self.controller_metrics()
        log_offset = self.log_size() if controller else 0
        kwok_offset = self.kwok_log().stat().st_size if self.kwok_log().exists() else 0
        load_start = os.getloadavg()

        profile = None
        if self.args.profile_apiserver > 0:
            into = Path(self.args.out) / f"apiserver-{name}.pprof"
            profile = cf.ThreadPoolExecutor(1).submit(
                self.apiserver_profile, self.args.profile_apiserver, into)
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
        t_end = time.time()
        if profile is not None:
            try:
                profile.result()
            except Exception as e:  # a profile is a study aid: the phase's figures stand
                log(f"{name}: no kube-apiserver profile: {e}")
        api_after, ctl_after = self.apiserver_metrics(), self.controller_metrics()
        cpu_after, cpu_wall = self.process_cpu(pid, label), time.monotonic() - cpu_t0
        load_end = os.getloadavg()
        checks = self.cluster_checks(ns) if not complete_after else {}
        checks["not_running"] = self.why_not_running(ns, times)
        sampler.stop()
        for w in watchers:
            w.stop()
        if checker is not None:
            instant_check.stop(checker)
            self.checker = None
        result = summarize(
            name, works, times, t_start, t_end, (api_before, api_after), (ctl_before, ctl_after)
        )
        result.update(checks)
        failed = self.kwok_failed_pod_stages(ns, kwok_offset)
        result["kwok_failed_pod_stages"] = failed["failed"]
        result["kwok_refused_replays"] = failed["refused_replays"]
        result["cluster_pods_at_start"] = pods_at_start
        # the KWOK node leases renewed in the phase (each at most once: a quarter of
        # --node-grace-seconds apart); with the apiserver's PUT leases, leader elections too
        result["node_heartbeats"]["node_leases_renewed"] = self.leases_renewed_between(
            t_start, t_end
        )
        if startup is not None:
            result["startup"] = stats.first_decision(
                startup["started"],
                startup["serving"],
                self.store_synced_at(startup["log_offset"]),
                [startup["waiting"]],
            )
        result["controller_process"] = process_summary(sampler.samples)
        if controller:
            # each solve over record.SLOW_SOLVE_SECONDS and each renewal, as logged: the
            # solve histograms' tail, one decision at a time
            result["controller_log"] = self.controller_log_lines(
                log_offset, "slow solve of", "renewed ("
            )
        # where the machine's CPU went: every component, the controller, this benchmark
        result["cpu_by_process"] = stats.cpu_by_process(cpu_before, cpu_after, cpu_wall)
        if idle is not None:
            result["idle_cpu_by_process"] = idle
        result["cpu_wall_s"] = round(cpu_wall, 1)
        result["load"] = {
            "loadavg_start": load_start,
            "loadavg_end": load_end,
            "load1_mean": stats.percentile([s.load1 for s in sampler.samples], 50),
            "cpus": os.cpu_count(),
        }
        result["watch_errors"] = sum(w.errors for w in watchers)
        # each Workload's milestones, in arrival order: where a stage's time went, and when
        result["timeline"] = [
            {"name": w.name, "tier": w.tier, "pods": w.pods, **times[w.name].timeline(t_start)}
            for w in works
        ]
        if complete_after:
            result["drain"] = self.drain(ns)
        result["cleanup_s"] = round(self.remove_namespace(ns), 1)
        return result

    def cluster_checks(self, ns: str) -> dict[str, Any]:
        """Double-booked GPUs (cluster-wide, from bound pods and node allocatable, plus
        devices held by two reservations) and pods on their planned node (this phase's)."""
        alloc = {
            n.metadata.name: int((n.status.allocatable or {}).get(wl_mod.GPU, 0))
            for n in self.core.list_node().items
        }
        raw = json.loads(self.core.list_pod_for_all_namespaces(_preload_content=False).data)
        bound = [b for p in raw["items"] if (b := booking.bound_pod(p))]
        rrs = self.reservations()
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
        self, ns: str, times: dict[str, stats.WorkloadTimes], limit: int = 20
    ) -> list[dict[str, Any]]:
        """For the Workloads whose pods did not all run: their conditions and checks."""
        waiting = {n for n, t in times.items() if t.all_running() is None}
        out = []
        for wl in self.custom.list_namespaced_custom_object(
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

    def drain(self, ns: str, timeout: float = 300) -> dict[str, Any]:
        """The soak's end: wait until every Job finished and went (TTL 0), then count the
        reservations left anywhere (the controller releases them when Workloads finish)."""
        t = time.monotonic()
        deadline = t + timeout
        while time.monotonic() < deadline:
            if not self.batch.list_namespaced_job(ns, limit=1).items:
                break
            time.sleep(2)
        jobs_left = len(self.batch.list_namespaced_job(ns).items)
        while time.monotonic() < deadline and self.reservations():
            time.sleep(2)
        return {
            "jobs_left": jobs_left,
            "reservations_left": len(self.reservations()),
            "drain_s": round(time.monotonic() - t, 1),
        }


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
    webhooks = _admission_histograms(api, WEBHOOK_METRIC, "name")
    policies = _admission_histograms(api, POLICY_METRIC, "policy")
    controller: dict[str, Any] = {}
    if ctl[1]:
        for key, metric, match in (
            ("solve_seconds", "solve_seconds", None),
            # one-pod decisions alone: what should cost the same on any fleet size; wall
            # time, and the solving thread's CPU time (without its waits for a core)
            ("solve_seconds_one_pod", "solve_seconds", {"pods": "1"}),
            ("solve_cpu_seconds_one_pod", "solve_cpu_seconds", {"pods": "1"}),
            # those that reused the engine's kept facts (not the first of their pod shape,
            # nor the first after a snapshot renewal: those derive them over the fleet)
            ("solve_seconds_one_pod_kept", "solve_seconds", {"pods": "1", "facts": "kept"}),
            ("solve_cpu_seconds_one_pod_kept", "solve_cpu_seconds",
             {"pods": "1", "facts": "kept"}),
            # the part of each reservation create's round trip that the next solve did not
            # hide: with `solve_seconds`' sum, how a burst's placing time splits
            ("reservation_wait_seconds", "reservation_wait_seconds", None),
            ("reconcile_seconds", "reconcile_seconds", None),
            ("ungate_seconds", "ungate_seconds", None),
            ("event_loop_lag_seconds", "event_loop_lag_seconds", None),  # blocks the webhook
            # full collections: every thread of the controller waits while one runs
            ("gc_pause_seconds_full", "gc_pause_seconds", {"generation": "2"}),
        ):
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
        "node_heartbeats": {
            "lease_puts": sum(
                n for (v, r, _, _), n in requests.items() if (v, r) == ("PUT", "leases")
            ),
            "node_status": sum(
                n for (v, r, sub, _), n in requests.items() if r == "nodes" and sub == "status"
            ),
        },
        "webhooks": webhooks,
        "admission_policies": policies,
        # what the apiserver served in the phase, most first: who loads it, and conflicts
        "api_requests": [
            {"verb": v, "resource": r, "subresource": sub, "code": code, "count": n}
            for (v, r, sub, code), n in sorted(requests.items(), key=lambda kv: -kv[1])
            if v != "WATCH"
        ][:40],
        "controller_metrics": controller,
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="e2e/bench_e2e/run.py", description=__doc__.split("\n\n")[0])
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
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    burst = args.workloads // 3 if args.burst is None else args.burst

    if args.profile_apiserver > 0:
        os.environ["NEXUS_E2E_PROFILING"] = "1"  # the plane serves /debug/pprof (components.py)
    # KWOK's pod-ready stage with one pod IP: its refused replays stalled every pod's status
    # in a phase (plane/components.one_pod_ip); the plane it starts only
    os.environ.setdefault("NEXUS_E2E_KWOK_ONE_POD_IP", "1")
    # and played once: a play on an old copy of a pod is refused (plane/components.played_once)
    os.environ.setdefault("NEXUS_E2E_KWOK_PLAY_ONCE", "1")
    bench = Bench(args)
    tier_gpus = queues.tier_pool_gpus(bench.pools)
    works = wl_mod.generate(
        args.workloads, args.seed, tier_gpus, burst=burst, stream_per_s=args.stream_per_s
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

    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    try:
        bench.up()
        if args.background_pods > 0:
            result["background"] = bench.add_background_pods(args.background_pods)
            if args.settle_seconds > 0:
                result["background"]["settled_s"] = bench.wait_until_settled(args.settle_seconds)
        if "kueue" in phases:
            lease_wait = bench.wait_for_lease_quiet(args.lease_quiet_seconds + args.idle_seconds)
            result["phases"]["kueue"] = bench.run_phase(
                "kueue",
                "",
                works,
                rack_preference=True,
                controller=False,
                timeout=args.phase_timeout,
            )
            result["phases"]["kueue"]["lease_wait_s"] = lease_wait
            save()
        if "check" in phases:
            lease_wait = bench.wait_for_lease_quiet(args.lease_quiet_seconds + args.idle_seconds)
            result["phases"]["check"] = bench.run_phase(
                "check",
                queues.INSTANT_PREFIX,
                works,
                rack_preference=True,  # Kueue alone's queues, TAS on gold, with the check
                controller=False,
                timeout=args.phase_timeout,
                instant=True,
            )
            result["phases"]["check"]["lease_wait_s"] = lease_wait
            save()
        if "nexus" in phases or args.soak_minutes > 0:
            # the wait comes first: the controller's start counts towards its first decision
            lease_wait = bench.wait_for_lease_quiet(args.lease_quiet_seconds + args.idle_seconds)
        if "nexus" in phases:
            # started with one Workload waiting (a restart with work queued): its first
            # decision times its own start-up, not Kueue's admission of a Workload created
            # only once it was ready
            result["phases"]["nexus"] = bench.run_phase(
                "nexus",
                "nexus-",
                works,
                rack_preference=False,
                controller=True,
                timeout=args.phase_timeout,
                launch=True,
            )
            result["phases"]["nexus"]["lease_wait_s"] = lease_wait
            save()
        if args.soak_minutes > 0 and args.soak_workloads > 0:
            if "nexus" not in phases:
                bench.start_controller()
            soak_works = wl_mod.generate(
                args.soak_workloads,
                args.seed + 1,
                tier_gpus,
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
            result["soak"] = soak
            save()
    finally:
        bench.stop_controller()
        result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        save()
        if not args.keep and bench.cluster.started_here:
            # the background pods go with it; with a pod trace, the components' logs stay
            bench.cluster.down(keep_logs=bool(os.environ.get("NEXUS_BENCH_POD_TRACE")))
        elif not args.keep and "background" in result:
            bench.remove_namespace(BACKGROUND_NAMESPACE)
    print_report(result)
    print(f"JSON: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
