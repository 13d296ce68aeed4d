"""Placement-level preemption on the real control plane: Bronze borrows the H100 racks while
the cheaper GPUs are taken; a Gold 4 x 8-GPU gang arrives; the fewest Bronze Workloads of
one rack are evicted through Kueue (our check turns Retry, Kueue evicts and requeues them),
the Gold gang binds to that rack, and the evicted Bronze work is admitted again elsewhere
once room appears. A Silver Workload and Workloads outside the check are never touched,
and no node ever has more GPUs bound than it has.

The module has its own PlacementConfig (`e2e-preempt`, preemption on), AdmissionCheck
(`nexus-preempt`) and ClusterQueues (`preempt-gold|silver|bronze`), so no other test's
Workloads can be evicted.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import create_local_queue
from builders import job as gpu_job
from e2e_util import (
    GPU,
    KUEUE_GROUP,
    KUEUE_VERSION,
    WaitTimeout,
    condition,
    wait_for,
)
from kubernetes import client

from nexus_admit.kube import labels as L

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900, func_only=True)]

MANIFEST = Path(__file__).resolve().parents[1] / "manifests" / "preemption.yaml"
CHECK = "nexus-preempt"
RR_GROUP, RR_VERSION, RR_PLURAL = "scheduling.kubenexus.io", "v1alpha1", "resourcereservations"
RESERVATION = L.LABEL_RESERVATION
BORROWED = L.LABEL_BORROWED
PREEMPTS = L.ANN_PREEMPTS
RACK = "cloud.google.com/gce-topology-subblock"
PRODUCT = "nvidia.com/gpu.product"
H100 = "NVIDIA-H100-80GB-HBM3"
COMPLETE = "pod-complete.stage.kwok.x-k8s.io/delay"


def job(name: str, queue: str, pods: int, gpus: int, finish_after: str | None = None
        ) -> client.V1Job:
    """An Indexed Job; eviction deletes its pods, which must not use up its retries. KWOK
    completes its pods `finish_after` (e.g. "30s") after they run, or never."""
    return gpu_job(name, queue, pods, gpus, backoff_limit=20,
                   annotations={COMPLETE: finish_after} if finish_after else {})

def workload(custom, ns: str, job_name: str) -> dict[str, Any] | None:
    items = custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, ns, "workloads")
    for wl in items["items"]:
        if any(r.get("name") == job_name for r in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


def entry(wl: dict[str, Any] | None) -> dict[str, Any]:
    for c in ((wl or {}).get("status") or {}).get("admissionChecks") or []:
        if c.get("name") == CHECK:
            return c
    return {}


def running(core, ns: str, job_name: str, count: int) -> list[client.V1Pod] | None:
    pods = core.list_namespaced_pod(ns, label_selector=f"job-name={job_name}").items
    up = [p for p in pods if p.status.phase == "Running" and p.spec.node_name]
    return up if len(up) == count else None


def gpus_bound_over_allocatable(core) -> list[str]:
    """Nodes with more GPUs bound (pods with a node, not finished) than allocatable."""
    alloc = {n.metadata.name: int(n.status.allocatable.get(GPU, 0)) for n in core.list_node().items}
    bound: Counter = Counter()
    for p in core.list_pod_for_all_namespaces().items:
        if p.spec.node_name and p.status.phase not in ("Succeeded", "Failed"):
            for c in p.spec.containers:
                bound[p.spec.node_name] += int(((c.resources.requests or {}).get(GPU)) or 0)
    return [f"{n}: {g} GPUs bound, {alloc.get(n, 0)} allocatable"
            for n, g in bound.items() if g > alloc.get(n, 0)]


def events(core, ns: str, reason: str) -> list[client.CoreV1Event]:
    return [e for e in core.list_namespaced_event(ns).items if e.reason == reason]


@pytest.fixture
def preempt_namespace(e2e_cluster: Any, nexus_controller: Any, e2e_namespace: str,
                      custom_objects) -> Any:
    """The module's PlacementConfig, AdmissionCheck and ClusterQueues, and LocalQueues
    preempt-<tier> in the test namespace; removed afterwards."""
    e2e_cluster.apply(MANIFEST.read_text(), retries=10)
    for tier in ("gold", "silver", "bronze"):
        create_local_queue(custom_objects, e2e_namespace, f"preempt-{tier}", f"preempt-{tier}")

    def active() -> bool:
        cq = custom_objects.get_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", "preempt-gold")
        return condition(cq, "Active") == "True"

    wait_for("ClusterQueue preempt-gold active", active, timeout=60)
    yield e2e_namespace
    # the fleet was full: leave it empty for the next module, not while the namespace goes
    batch = client.BatchV1Api(custom_objects.api_client)
    core = client.CoreV1Api(custom_objects.api_client)
    batch.delete_collection_namespaced_job(e2e_namespace, propagation_policy="Background")
    wait_for("the test's pods gone",
             lambda: not core.list_namespaced_pod(e2e_namespace).items, timeout=180)
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    for d in reversed(docs):
        kind = d["kind"].lower()
        e2e_cluster.kubectl("delete", f"{kind}s.{d['apiVersion'].split('/')[0]}",
                            d["metadata"]["name"], "--ignore-not-found", "--wait=false",
                            check=False)


class BoundWatch:
    """Nodes with more GPUs bound than allocatable, sampled every second while it runs
    ("at any moment"), after the fleet is idle (earlier modules' namespaces may still be
    going away)."""

    def __init__(self, core) -> None:
        self.core = core
        self.over = threading.Event()
        self.overbooked: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.over.is_set():
            self.overbooked.extend(gpus_bound_over_allocatable(self.core))
            time.sleep(1.0)

    def __enter__(self) -> BoundWatch:
        busy: list[str] = []

        def fleet_idle() -> bool:
            busy[:] = [f"{p.metadata.namespace}/{p.metadata.name} {p.status.phase}"
                       f"{' deleting' if p.metadata.deletion_timestamp else ''}"
                       for p in self.core.list_pod_for_all_namespaces().items
                       if p.metadata.namespace.startswith("e2e-") and p.spec.node_name
                       and p.status.phase not in ("Succeeded", "Failed")]
            return not busy

        try:
            wait_for("no pods of other tests on the fleet", fleet_idle, timeout=180)
        except WaitTimeout as e:
            raise WaitTimeout(f"{e}; still there: {busy[:10]}") from None
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.over.set()
        self.thread.join(timeout=5)
        if exc[0] is None:
            assert not self.overbooked, self.overbooked[:5]


def fill_outside_the_check(batch_v1, core_v1, ns: str) -> None:
    """Jobs outside our check, through Kueue's own flavors, fill the A100 and L40S pools."""
    batch_v1.create_namespaced_job(ns, job("outside-a100", "silver", pods=16, gpus=8))
    batch_v1.create_namespaced_job(ns, job("outside-l40s", "bronze", pods=16, gpus=4))
    wait_for("A100 and L40S full", lambda: running(core_v1, ns, "outside-a100", 16)
             and running(core_v1, ns, "outside-l40s", 16), timeout=120)


def test_gold_gang_evicts_the_fewest_borrowed_bronze_of_one_rack_through_kueue(
    preempt_namespace: str, batch_v1, core_v1, custom_objects
) -> None:
    ns = preempt_namespace
    with BoundWatch(core_v1):
        # 1. the A100 and L40S pools are full, outside the check
        fill_outside_the_check(batch_v1, core_v1, ns)
        # 2. Through the check: 15 Bronze and 1 Silver 2 x 8-GPU gangs, which can only borrow
        #    the H100s (32 nodes): every rack then has every node busy
        names = [f"bronze-{i:02d}" for i in range(15)]
        for name in names:
            batch_v1.create_namespaced_job(ns, job(name, "preempt-bronze", pods=2, gpus=8))
        batch_v1.create_namespaced_job(ns, job("silver", "preempt-silver", pods=2, gpus=8))
        wait_for("16 gangs on the H100s",
                 lambda: all(running(core_v1, ns, n, 2) for n in [*names, "silver"]),
                 timeout=300)
        rrs = custom_objects.list_namespaced_custom_object(RR_GROUP, RR_VERSION, ns, RR_PLURAL)
        borrowed = {r["spec"]["workloadRef"]["name"] for r in rrs["items"]
                    if (r["metadata"].get("labels") or {}).get(BORROWED) == "true"}
        assert len(borrowed) == 16, "Bronze and Silver on H100 are borrowed capacity"
        assert {r["spec"]["decision"]["mode"] for r in rrs["items"]} == {"borrowed"}
        bronze_rack = {
            n: {core_v1.read_node(p.spec.node_name).metadata.labels[RACK]
                for p in running(core_v1, ns, n, 2) or []}
            for n in names
        }
        # 3. Gold: 4 x 8 GPUs, one rack's worth
        batch_v1.create_namespaced_job(ns, job("gold", "preempt-gold", pods=4, gpus=8))
        gold_pods = wait_for("the Gold gang running",
                             lambda: running(core_v1, ns, "gold", 4), timeout=180)
        gold_nodes = {p.spec.node_name for p in gold_pods}
        racks = {core_v1.read_node(n).metadata.labels[RACK] for n in gold_nodes}
        products = {core_v1.read_node(n).metadata.labels[PRODUCT] for n in gold_nodes}
        assert len(racks) == 1 and products == {H100}, (racks, products)
        gold_wl = workload(custom_objects, ns, "gold")
        assert entry(gold_wl)["state"] == "Ready"
        assert "evict 2 in" in entry(gold_wl)["message"], entry(gold_wl)["message"]
        gold_rr = custom_objects.get_namespaced_custom_object(
            RR_GROUP, RR_VERSION, ns, RR_PLURAL,
            entry(gold_wl)["podSetUpdates"][0]["labels"][RESERVATION])
        assert gold_rr["spec"]["decision"]["mode"] == "preempting"
        # exactly the fewest Bronze victims, all in that rack; Silver untouched
        evicted = {e.involved_object.name for e in events(core_v1, ns, "PlacementPreempted")}
        victims = [n for n in names
                   if (workload(custom_objects, ns, n) or {})["metadata"]["name"] in evicted]
        assert len(victims) == 2, victims
        assert all(bronze_rack[v] == racks for v in victims), (victims, racks)
        silver = workload(custom_objects, ns, "silver")
        assert entry(silver)["state"] == "Ready" and running(core_v1, ns, "silver", 2)
        for outside in ("outside-a100", "outside-l40s"):
            assert running(core_v1, ns, outside, 16), f"{outside} was touched"
        # what `kubectl describe workload` shows on each side
        for v in victims:
            wl = workload(custom_objects, ns, v)
            text = " ".join(e.message or "" for e in events(core_v1, ns, "PlacementPreempted")
                            if e.involved_object.name == wl["metadata"]["name"])
            assert "preempted by" in text and "gold" in text, text
        preempting = [e for e in events(core_v1, ns, "Preempting")
                      if e.involved_object.name == gold_wl["metadata"]["name"]]
        assert preempting and "evict 2 in" in (preempting[0].message or "")
        # 4. room appears (the A100 job ends): the evicted Bronze gangs are admitted again
        batch_v1.delete_namespaced_job("outside-a100", ns, propagation_policy="Background")
        wait_for("the evicted Bronze gangs running again",
                 lambda: all(running(core_v1, ns, v, 2) for v in victims), timeout=300)
        for v in victims:
            nodes = {p.spec.node_name for p in running(core_v1, ns, v, 2) or []}
            assert not nodes & gold_nodes, f"{v} placed on the Gold gang's nodes"


def set_queue_stop(custom_objects, ns: str, queue: str, policy: str) -> None:
    """Hold a LocalQueue (Kueue reserves no quota for its Workloads, which stay queued) or
    let it through again (`None`)."""
    custom_objects.patch_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, ns, "localqueues", queue, {"spec": {"stopPolicy": policy}})


def test_a_waiting_gold_workload_keeps_bronze_off_the_h100s_until_it_runs(
    preempt_namespace: str, batch_v1, core_v1, custom_objects
) -> None:
    """Backfill: the A100 and L40S pools are full, and a Gold 4 x 8-GPU gang waits in its
    queue (held, so Kueue has reserved no quota for it) that the free H100s could hold. A
    Bronze gang that could only borrow the H100s is kept off them, and its Retry says so;
    once the Gold gang is let through and runs on the H100s, nothing of Gold waits and the
    Bronze gang is placed there as borrowed capacity."""
    ns = preempt_namespace
    with BoundWatch(core_v1):
        fill_outside_the_check(batch_v1, core_v1, ns)
        set_queue_stop(custom_objects, ns, "preempt-gold", "Hold")
        batch_v1.create_namespaced_job(ns, job("gold", "preempt-gold", pods=4, gpus=8))
        wait_for("the Gold Workload queued", lambda: workload(custom_objects, ns, "gold"),
                 timeout=60)
        batch_v1.create_namespaced_job(ns, job("bronze", "preempt-bronze", pods=1, gpus=8))

        def kept_off() -> client.CoreV1Event | None:
            wl = workload(custom_objects, ns, "bronze")
            for e in events(core_v1, ns, "PlacementRetry"):
                if wl and e.involved_object.name == wl["metadata"]["name"] and \
                        "preemption.backfill" in (e.message or ""):
                    return e
            return None

        note = wait_for("the Bronze gang kept off the H100s", kept_off, timeout=120)
        assert "waiting higher tier" in (note.message or ""), note.message
        assert not running(core_v1, ns, "bronze", 1)
        assert not (workload(custom_objects, ns, "gold") or {}).get("status", {}).get(
            "admission"), "the held Gold Workload was admitted"
        # Gold let through: it runs on the H100s, and then Bronze may borrow them
        set_queue_stop(custom_objects, ns, "preempt-gold", "None")
        gold_pods = wait_for("the Gold gang running",
                             lambda: running(core_v1, ns, "gold", 4), timeout=180)
        gold_nodes = {p.spec.node_name for p in gold_pods}
        assert {core_v1.read_node(n).metadata.labels[PRODUCT] for n in gold_nodes} == {H100}
        bronze_pods = wait_for("the Bronze gang running on an H100",
                               lambda: running(core_v1, ns, "bronze", 1), timeout=300)
        node = bronze_pods[0].spec.node_name
        assert core_v1.read_node(node).metadata.labels[PRODUCT] == H100
        assert node not in gold_nodes
        bronze = entry(workload(custom_objects, ns, "bronze"))
        rr = custom_objects.get_namespaced_custom_object(
            RR_GROUP, RR_VERSION, ns, RR_PLURAL, bronze["podSetUpdates"][0]["labels"][RESERVATION])
        assert rr["spec"]["decision"]["mode"] == "borrowed"
        assert (rr["metadata"].get("labels") or {}).get(BORROWED) == "true"
        assert "borrowed" in bronze["message"], bronze["message"]


def set_preemption(custom_objects, **fields: Any) -> None:
    custom_objects.patch_cluster_custom_object(
        RR_GROUP, RR_VERSION, "placementconfigs", "e2e-preempt",
        {"spec": {"preemption": fields}})


def fill_for_a_drain(batch_v1, core_v1, ns: str, first: str, rest: str) -> list[str]:
    """A100 and L40S full; the first H100 rack has 2 free nodes and 3 Bronze 2 x 8 gangs
    that run for `first`, the other racks are full of Bronze gangs that run for `rest`.
    The H100 racks, sorted."""
    fill_outside_the_check(batch_v1, core_v1, ns)
    racks = sorted({n.metadata.labels[RACK] for n in core_v1.list_node().items
                    if n.metadata.labels.get(PRODUCT) == H100})
    shapes = [(racks[0], first)] * 3 + [(r, rest) for r in racks[1:] for _ in range(4)]
    names = []
    for i, (rack, finish) in enumerate(shapes):
        name = f"bronze-{i:02d}"
        spec = job(name, "preempt-bronze", pods=2, gpus=8, finish_after=finish)
        spec.spec.template.spec.node_selector = {RACK: rack}
        batch_v1.create_namespaced_job(ns, spec)
        names.append(name)
    wait_for("15 gangs on the H100s",
             lambda: all(running(core_v1, ns, n, 2) for n in names), timeout=300)
    return racks


def draining(custom_objects, ns: str) -> dict[str, Any] | None:
    for r in custom_objects.list_namespaced_custom_object(
            RR_GROUP, RR_VERSION, ns, RR_PLURAL)["items"]:
        if r["spec"]["decision"].get("mode") == "draining":
            return r
    return None


def test_a_gold_gang_that_waited_drains_a_rack_and_late_jobs_keep_off_it(
    preempt_namespace: str, batch_v1, core_v1, custom_objects
) -> None:
    """Drain-to-fit: Gold may evict nothing here. One rack has 2 free nodes and 3 Bronze
    gangs that run for 40 s; the other racks are full of Bronze gangs that run for 80 s.
    After 5 s of waiting the Gold gang gets a reservation of intent (mode draining) on 4
    nodes of the rack with the fewest GPUs busy: later Bronze jobs are refused the 2 free
    nodes, the Gold gang runs there once the rack's gangs finish, and the later jobs run on
    the other racks as they empty."""
    ns = preempt_namespace
    set_preemption(custom_objects, mayEvict={"gold": []}, drainAfterSeconds=5)
    try:
        with BoundWatch(core_v1):
            racks = fill_for_a_drain(batch_v1, core_v1, ns, first="40s", rest="80s")
            batch_v1.create_namespaced_job(ns, job("gold", "preempt-gold", pods=4, gpus=8))
            rr = wait_for("a draining reservation for the Gold gang",
                          lambda: draining(custom_objects, ns), timeout=120)
            held = {s["node"] for ps in rr["spec"]["podSets"] for s in ps["slots"]}
            assert {core_v1.read_node(n).metadata.labels[RACK] for n in held} == {racks[0]}
            gold = workload(custom_objects, ns, "gold")
            assert entry(gold)["state"] == "Pending" and "draining" in entry(gold)["message"]
            # later jobs, each wanting a whole H100 node: 2 are free in the drained rack now
            late = [f"late-{i}" for i in range(4)]
            for name in late:
                batch_v1.create_namespaced_job(ns, job(name, "preempt-bronze", pods=1, gpus=8))

            def late_running() -> list[client.V1Pod] | None:
                pods = [running(core_v1, ns, n, 1) for n in late]
                return [p for ps in pods for p in ps or []] if all(pods) else None

            late_pods = wait_for("the later jobs running", late_running, timeout=300)
            taken = {p.spec.node_name for p in late_pods}
            assert not taken & held, f"later jobs took drained nodes {taken & held}"
            # they asked while only the drained rack's 2 nodes were free, and were refused
            refused = {e.involved_object.name for e in events(core_v1, ns, "PlacementRetry")}
            for name in late:
                wl = workload(custom_objects, ns, name)
                assert wl and wl["metadata"]["name"] in refused, f"{name} was never refused"
            gold_pods = wait_for("the Gold gang running",
                                 lambda: running(core_v1, ns, "gold", 4), timeout=300)
            # on the drained rack: the held nodes, or (its gangs leaving one pass apart)
            # nodes there that freed first, the drain given up for them
            assert {core_v1.read_node(p.spec.node_name).metadata.labels[RACK]
                    for p in gold_pods} == {racks[0]}
            notes = " ".join(e.message or "" for e in events(core_v1, ns, "Preempting"))
            assert "draining" in notes, notes
            assert not events(core_v1, ns, "PlacementPreempted"), "a drain evicts nothing"
    finally:
        set_preemption(custom_objects, mayEvict={"gold": ["bronze"]}, drainAfterSeconds=None)


def test_a_silver_drain_gives_way_to_a_gold_job_with_no_other_place(
    preempt_namespace: str, batch_v1, core_v1, custom_objects
) -> None:
    """Silver and Gold may evict nothing. A Silver 4 x 8-GPU gang drains the first rack (its
    2 free nodes held for it). A Gold 1 x 8 job arrives while those are the only free GPUs:
    a lower tier's drain must not hold up a higher one, so the Gold job runs on a drained
    node, the draining reservation is released and the Silver Workload told why, and the
    Silver gang runs once another rack empties (the Gold job never ends); no GPU is
    over-booked at any moment."""
    ns = preempt_namespace
    set_preemption(custom_objects, mayEvict={"gold": [], "silver": []}, drainAfterSeconds=5)
    try:
        with BoundWatch(core_v1):
            fill_for_a_drain(batch_v1, core_v1, ns, first="120s", rest="40s")
            batch_v1.create_namespaced_job(ns, job("silver", "preempt-silver", pods=4, gpus=8))
            rr = wait_for("a draining reservation for the Silver gang",
                          lambda: draining(custom_objects, ns), timeout=120)
            held = {s["node"] for ps in rr["spec"]["podSets"] for s in ps["slots"]}
            batch_v1.create_namespaced_job(ns, job("gold", "preempt-gold", pods=1, gpus=8))
            (gold_pod,) = wait_for("the Gold job running",
                                   lambda: running(core_v1, ns, "gold", 1), timeout=180)
            assert gold_pod.spec.node_name in held, (gold_pod.spec.node_name, held)
            assert "the drain was withdrawn" in entry(workload(custom_objects, ns, "gold"))[
                "message"]
            silver = workload(custom_objects, ns, "silver")
            assert silver is not None
            notes = [e.message or "" for e in events(core_v1, ns, "PlacementReleased")
                     if e.involved_object.name == silver["metadata"]["name"]]
            assert any("drain withdrawn: Workload" in n and "(tier gold)" in n
                       for n in notes), notes
            # it drains again; the Gold job never ends, and the gang runs where it fits
            # first (a drain waits only while its gang fits nowhere else)
            silver_pods = wait_for("the Silver gang running",
                                   lambda: running(core_v1, ns, "silver", 4), timeout=300)
            assert gold_pod.spec.node_name not in {p.spec.node_name for p in silver_pods}
            # drained again on the first rack (the freest, the Gold job among what it waits
            # for), it ran as soon as it fitted elsewhere
            message = entry(workload(custom_objects, ns, "silver"))["message"]
            assert "placed before its drain ended" in message, message
    finally:
        set_preemption(custom_objects, mayEvict={"gold": ["bronze"]}, drainAfterSeconds=None)
