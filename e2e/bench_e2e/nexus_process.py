"""nexus-admit as the benchmark runs it: installed once with its webhook off for the
Kueue-alone phases, started (timed: its process, its webhook serving, its first decision
on a Workload already waiting), stopped; its log read per phase and its /metrics."""

from __future__ import annotations

import datetime
import re
import sys
import time
from typing import TYPE_CHECKING, Any

from nexus_controller import NexusController

from bench_e2e import stats
from bench_e2e import workloads as wl_mod
from bench_e2e.recorder import WorkloadWatcher

if TYPE_CHECKING:
    from bench_e2e.bench_plane import BenchPlane


def log(msg: str) -> None:
    print(f"[bench-e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class NexusProcess:
    """The controller under test on the benchmark's plane."""

    def __init__(self, plane: BenchPlane, pin_at_creation: bool):
        self.plane = plane
        self.nc = NexusController(plane.cluster, pin_at_creation=pin_at_creation)

    def install(self) -> None:
        """Its CRDs, RBAC and configuration; its webhook off (the Kueue-alone phases run
        without nexus in the path)."""
        self.nc.install()
        self.nc.uninstall_webhook()

    @property
    def pid(self) -> int | None:
        return self.nc.proc.pid if self.nc.proc else None

    def start(self) -> dict[str, Any]:
        """Start the controller and wait until it is ready; returns when its process started
        and its webhook first served (wall clock), and where this run's log begins."""
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
        batch = self.plane.batch
        waiting = wl_mod.BenchWorkload("first-decision", "silver", 1, 1, 0.0)
        times = {waiting.name: stats.WorkloadTimes(pods=1)}
        watcher = WorkloadWatcher(str(self.plane.cluster.kubeconfig), ns, times)
        watcher.start()
        watcher.listed.wait(30)
        batch.create_namespaced_job(ns, manifest(waiting), _preload_content=False)
        times[waiting.name].created = time.time()
        startup = self.start()
        deadline = time.time() + 300
        while times[waiting.name].check_ready is None and time.time() < deadline:
            time.sleep(0.2)
        watcher.stop()
        if times[waiting.name].check_ready is None:
            log("WARNING: the waiting Workload's check was not Ready after 300 s")
        batch.delete_namespaced_job(waiting.name, ns, propagation_policy="Background")
        startup["waiting"] = times[waiting.name]
        return startup

    def stop(self) -> None:
        self.nc.stop()
        self.nc.uninstall_webhook()

    def metrics(self) -> str:
        return self.nc.metrics() if self.nc.proc else ""

    # -- its log ------------------------------------------------------------------------
    def log_size(self) -> int:
        return self.nc.log_file.stat().st_size if self.nc.log_file.exists() else 0

    def log_since(self, log_offset: int) -> str:
        """What this run's controller logged after `log_offset` ("" without a log)."""
        if not self.nc.log_file.exists():
            return ""
        with open(self.nc.log_file, "rb") as f:
            f.seek(log_offset)
            return f.read().decode(errors="replace")

    def log_lines(self, log_offset: int, *patterns: str) -> list[str]:
        """The lines the controller logged after `log_offset` that contain one of
        `patterns`: the phase's slow solves and snapshot renewals, read per decision."""
        text = self.log_since(log_offset)
        return [line for line in text.splitlines() if any(p in line for p in patterns)]

    def store_synced_at(self, log_offset: int) -> float | None:
        """When this run's controller logged "store synced in" (its log's own timestamp)."""
        text = self.log_since(log_offset)
        m = re.search(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*store synced in", text, re.M)
        if not m:
            return None
        return datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
