"""What the benchmark watches while a phase runs: pods and Workloads of its namespace
(client-side timestamps of each milestone) and the controller process (/proc samples).

Each watcher runs in a thread with its own API client: list, then watch from the list's
resourceVersion; on any error or expiry it lists again. Milestones keep the first time
they were seen, so seeing an object twice changes nothing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from bench_e2e.queues import INSTANT_CHECK, NEXUS_CHECK
from bench_e2e.stats import WorkloadTimes
from bench_e2e.workloads import WORKLOAD_LABEL

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
# the phases' checks: nexus's, and the instant check's
CHECK_NAMES = (NEXUS_CHECK, INSTANT_CHECK)


def api_client(kubeconfig: str) -> client.ApiClient:
    return config.new_client_from_config(config_file=kubeconfig)


def condition_true(obj: dict[str, Any], ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


class _Watcher(threading.Thread):
    """List + watch one kind in one namespace, calling `self.seen(obj)` for every object."""

    def __init__(self, kubeconfig: str, namespace: str):
        super().__init__(daemon=True)
        self.api = api_client(kubeconfig)
        self.namespace = namespace
        self.stopping = threading.Event()
        self.listed = threading.Event()  # the first list went through
        self.errors = 0

    def list_raw(self) -> dict[str, Any]:
        raise NotImplementedError

    def watch_func(self) -> Any:
        raise NotImplementedError

    def watch_args(self) -> tuple[Any, ...]:
        return (self.namespace,)

    def seen(self, obj: dict[str, Any], now: float) -> None:
        raise NotImplementedError

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                listed = self.list_raw()
                now = time.time()
                for item in listed.get("items") or []:
                    self.seen(item, now)
                self.listed.set()
                w = watch.Watch()
                for ev in w.stream(
                    self.watch_func(),
                    *self.watch_args(),
                    resource_version=listed["metadata"]["resourceVersion"],
                    timeout_seconds=120,
                    deserialize=False,
                ):
                    if self.stopping.is_set():
                        w.stop()
                        break
                    if ev.get("type") in ("ADDED", "MODIFIED"):
                        self.seen(ev["object"], time.time())
            except Exception:  # expired watch, apiserver hiccup: list again
                self.errors += 1
                time.sleep(0.5)

    def stop(self) -> None:
        self.stopping.set()


class PodWatcher(_Watcher):
    """Each pod's milestones. With `NEXUS_BENCH_POD_TRACE` set to a file, every pod event
    seen is also appended there, one JSON line: when, name, resourceVersion, phase, node,
    conditions and who wrote what (managedFields): which writer brought an extra event. The
    components' logs are then kept when the benchmark takes its cluster down."""

    def __init__(self, kubeconfig: str, namespace: str, times: dict[str, WorkloadTimes]):
        super().__init__(kubeconfig, namespace)
        self.core = client.CoreV1Api(self.api)
        self.times = times
        self.lock = threading.Lock()
        trace = os.environ.get("NEXUS_BENCH_POD_TRACE")
        self.trace = open(trace, "a") if trace else None  # noqa: SIM115 (open for the run)

    def list_raw(self) -> dict[str, Any]:
        r = self.core.list_namespaced_pod(self.namespace, _preload_content=False)
        return json.loads(r.data)

    def watch_func(self) -> Any:
        return self.core.list_namespaced_pod

    def seen(self, pod: dict[str, Any], now: float) -> None:
        meta = pod["metadata"]
        t = self.times.get((meta.get("labels") or {}).get(WORKLOAD_LABEL, ""))
        if t is None:
            return
        name = meta["name"]
        with self.lock:
            if self.trace is not None:
                self.trace.write(json.dumps(_trace_line(pod, now)) + "\n")
            t.pod_created.setdefault(name, now)
            gates = (pod.get("spec") or {}).get("schedulingGates") or []
            if gates:
                t.pod_gated.add(name)
            else:
                t.pod_ungated.setdefault(name, now)
            if (pod.get("spec") or {}).get("nodeName"):
                t.pod_bound.setdefault(name, now)
            if (pod.get("status") or {}).get("phase") in ("Running", "Succeeded"):
                t.pod_running.setdefault(name, now)


def _trace_line(pod: dict[str, Any], now: float) -> dict[str, Any]:
    meta, status = pod["metadata"], pod.get("status") or {}
    return {
        "t": round(now, 3), "name": meta.get("name"), "rv": meta.get("resourceVersion"),
        "phase": status.get("phase"), "node": (pod.get("spec") or {}).get("nodeName"),
        "ips": [i.get("ip") for i in status.get("podIPs") or []] or status.get("podIP"),
        "conditions": [(c.get("type"), c.get("status"), c.get("reason"))
                       for c in status.get("conditions") or []],
        "writers": [(f.get("manager"), f.get("operation"), f.get("subresource"), f.get("time"))
                    for f in meta.get("managedFields") or []],
    }


class JobWatcher(_Watcher):
    """The Jobs (named after our Workloads): when Kueue unsuspended each, which splits the
    wait for its first pod between Kueue's job reconciler and the Job controller."""

    def __init__(self, kubeconfig: str, namespace: str, times: dict[str, WorkloadTimes]):
        super().__init__(kubeconfig, namespace)
        self.batch = client.BatchV1Api(self.api)
        self.times = times

    def list_raw(self) -> dict[str, Any]:
        r = self.batch.list_namespaced_job(self.namespace, _preload_content=False)
        return json.loads(r.data)

    def watch_func(self) -> Any:
        return self.batch.list_namespaced_job

    def seen(self, job: dict[str, Any], now: float) -> None:
        t = self.times.get(job["metadata"]["name"])
        if t is not None and t.unsuspended is None and not (job.get("spec") or {}).get("suspend"):
            t.unsuspended = now


class WorkloadWatcher(_Watcher):
    """Kueue Workloads, matched to ours by the Job that owns them (same name)."""

    def __init__(self, kubeconfig: str, namespace: str, times: dict[str, WorkloadTimes]):
        super().__init__(kubeconfig, namespace)
        self.custom = client.CustomObjectsApi(self.api)
        self.times = times

    def list_raw(self) -> dict[str, Any]:
        r = self.custom.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, self.namespace, "workloads", _preload_content=False
        )
        return json.loads(r.data)

    def watch_func(self) -> Any:
        return self.custom.list_namespaced_custom_object

    def watch_args(self) -> tuple[Any, ...]:
        return (KUEUE_GROUP, KUEUE_VERSION, self.namespace, "workloads")

    def seen(self, wl: dict[str, Any], now: float) -> None:
        owners = wl["metadata"].get("ownerReferences") or []
        t = next((self.times[o["name"]] for o in owners if o.get("name") in self.times), None)
        if t is None:
            return
        if t.workload_seen is None:
            t.workload_seen = now
        if t.quota_reserved is None and condition_true(wl, "QuotaReserved"):
            t.quota_reserved = now
        if t.admitted is None and condition_true(wl, "Admitted"):
            t.admitted = now
        if t.check_ready is None:
            for c in (wl.get("status") or {}).get("admissionChecks") or []:
                if c.get("name") in CHECK_NAMES and c.get("state") == "Ready":
                    t.check_ready = now


# ------------------------------------------------------------------ the controller process

_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of the process (and its reaped children: none expected)."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / _TICK


def proc_rss_mib(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) in MiB, from /proc/<pid>/status (VmRSS, VmHWM)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


@dataclass
class ProcSample:
    t: float
    cpu_s: float
    rss_mib: float
    hwm_mib: float
    load1: float


class ProcSampler(threading.Thread):
    """Every `interval` s: the controller's CPU seconds and RSS (pid None: load only)."""

    def __init__(self, pid: int | None, interval: float = 1.0):
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.samples: list[ProcSample] = []
        self.stopping = threading.Event()

    def sample(self) -> None:
        cpu, rss, hwm = 0.0, 0.0, 0.0
        if self.pid is not None:
            try:
                cpu = proc_cpu_seconds(self.pid)
                rss, hwm = proc_rss_mib(self.pid)
            except (FileNotFoundError, ProcessLookupError):
                pass
        self.samples.append(ProcSample(time.time(), cpu, rss, hwm, os.getloadavg()[0]))

    def run(self) -> None:
        while not self.stopping.is_set():
            self.sample()
            self.stopping.wait(self.interval)

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        self.sample()
