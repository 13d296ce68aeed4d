"""The benchmark's plane: the control plane with its scaled KWOK fleet and API clients,
the ClusterQueues for that fleet, each phase's namespace and LocalQueues, the background
pods, the node leases' renewal rounds, and what is left after a phase (reservations)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import cluster as cluster_mod
import fleet as fleet_mod
from builders import create_local_queue
from kubernetes import client

from bench_e2e import lists, queues, stats
from bench_e2e import workloads as wl_mod
from bench_e2e.measure import process_cpu
from bench_e2e.recorder import KUEUE_GROUP, KUEUE_VERSION, api_client, condition_true
from bench_e2e.report import BENCH_PROCESS

RR = ("scheduling.kubenexus.io", "v1alpha1", "resourcereservations")
BACKGROUND_NAMESPACE = "bench-background"
NODE_LEASE_NAMESPACE = "kube-node-lease"
TIERS = wl_mod.TIERS


def log(msg: str) -> None:
    print(f"[bench-e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class BenchPlane:
    """The control plane the phases run on, and its objects between the phases."""

    def __init__(self, args: argparse.Namespace):
        os.environ["NEXUS_E2E_FLEET_NODES"] = str(args.nodes)  # read by Cluster.up()
        # 1,000 fake nodes renewing 40-s leases starve KWOK on a busy 2-core machine: nodes
        # went NotReady and tainted mid-phase. Heartbeats are not what is measured here.
        os.environ.setdefault("NEXUS_E2E_NODE_GRACE_SECONDS", str(args.node_grace_seconds))
        self.cluster = cluster_mod.Cluster()
        self.spec = fleet_mod.scaled(fleet_mod.load(), args.nodes)
        self.fleet = fleet_mod.expand(self.spec)
        self.pools = queues.pool_quotas(self.fleet)

    def up(self) -> int:
        """Bring the plane up (or reuse it) and open the API clients; returns its nodes."""
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
        return have

    def apply_cluster_queues(self) -> None:
        self.cluster.apply(queues.cluster_queues(self.pools), retries=10)

    # -- KWOK ---------------------------------------------------------------------------
    def kwok_log(self) -> Path:
        return Path(self.cluster.logs_dir) / "kwok.log"

    def kwok_log_size(self) -> int:
        return self.kwok_log().stat().st_size if self.kwok_log().exists() else 0

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
            before, t0 = process_cpu(self.cluster, None), time.monotonic()
            time.sleep(window_s)
            used = stats.cpu_by_process(
                before, process_cpu(self.cluster, None), time.monotonic() - t0
            )
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

