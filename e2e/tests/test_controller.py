"""nexus-admit end to end on the real control plane: Kueue reserves quota, nexus-admit places
the gang, writes the ResourceReservation and its check, the webhook gates the pods, the
ungater pins them, kube-scheduler binds them to the reserved KWOK nodes.

Everything is checked against the cluster's own objects (bound pods, node labels, the
Workload's check entry), never against the controller's view. Latencies are printed, not
asserted (run with -s to see them).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from builders import (
    CHECK,
    GATE,
    NUMA_ZONE,
    RESERVATION,
    RR_GROUP,
    RR_PLURAL,
    RR_VERSION,
    SLOT,
    create_local_queue,
    job,
)
from e2e_util import GPU, KUEUE_GROUP, KUEUE_VERSION, QUEUE_LABEL, condition, wait_for
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

RACK = "cloud.google.com/gce-topology-subblock"
PRODUCT = "nvidia.com/gpu.product"
INDEX = "batch.kubernetes.io/job-completion-index"
H100, L40S = "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S"


def workload_of(custom: client.CustomObjectsApi, ns: str, job_name: str) -> dict[str, Any] | None:
    for wl in custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, ns, "workloads")[
        "items"
    ]:
        if any(r.get("name") == job_name for r in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


def check_entry(wl: dict[str, Any]) -> dict[str, Any]:
    for c in (wl.get("status") or {}).get("admissionChecks") or []:
        if c.get("name") == CHECK:
            return c
    return {}


def wait_check(custom, ns: str, job_name: str, states: tuple[str, ...], timeout: float = 90):
    def ready():
        wl = workload_of(custom, ns, job_name)
        return wl if wl and check_entry(wl).get("state") in states else None

    return wait_for(f"{job_name}: check {CHECK} in {states}", ready, timeout=timeout)


def event(core, ns: str, reason: str, contains: str = ""):
    for e in core.list_namespaced_event(ns).items:
        if e.reason == reason and contains in (e.message or ""):
            return e
    return None


def reservation_of(custom, ns: str, wl: dict[str, Any]) -> dict[str, Any]:
    """The ResourceReservation named by the Workload's Ready check (its podSetUpdates)."""
    name = check_entry(wl)["podSetUpdates"][0]["labels"][RESERVATION]
    return custom.get_namespaced_custom_object(RR_GROUP, RR_VERSION, ns, RR_PLURAL, name)


def reservations(custom, ns: str) -> list[dict[str, Any]]:
    return custom.list_namespaced_custom_object(RR_GROUP, RR_VERSION, ns, RR_PLURAL)["items"]


def job_pods(core, ns: str, job_name: str) -> list[client.V1Pod]:
    return core.list_namespaced_pod(ns, label_selector=f"job-name={job_name}").items


def running(core, ns: str, job_name: str, count: int) -> list[client.V1Pod] | None:
    pods = [p for p in job_pods(core, ns, job_name) if p.status.phase == "Running"]
    return pods if len(pods) == count and all(p.spec.node_name for p in pods) else None


def nodes_by_name(core) -> dict[str, client.V1Node]:
    return {n.metadata.name: n for n in core.list_node().items}


def qr_time(wl: dict[str, Any]) -> float:
    for c in wl["status"]["conditions"]:
        if c["type"] == "QuotaReserved":
            return time.mktime(time.strptime(c["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ"))
    raise AssertionError("no QuotaReserved condition")


def slots_of(rr: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{ps['name']}/{s['index']}": s for ps in rr["spec"]["podSets"] for s in ps["slots"]}


def test_gold_training_gang_lands_on_one_h100_rack_pinned_by_rank(
    nexus_namespace, core_v1, batch_v1, custom_objects, e2e_cluster
):
    ns = nexus_namespace
    t0 = time.time()
    batch_v1.create_namespaced_job(
        ns,
        job(
            "train",
            "nexus-gold",
            pods=8,
            gpus=8,
            cpu="32",
            memory="256Gi",
            annotations={"scheduling.kubenexus.io/gpu-memory": "70Gi"},
        ),
    )
    wl = wait_check(custom_objects, ns, "train", ("Ready",))
    entry = check_entry(wl)
    t_ready = time.time()
    assert "placed 8 pods on 8 nodes" in entry["message"], entry
    rr = reservation_of(custom_objects, ns, wl)
    assert rr["metadata"]["ownerReferences"][0]["uid"] == wl["metadata"]["uid"]
    slots = slots_of(rr)
    assert len(slots) == 8

    pods = wait_for("8 pods Running", lambda: running(core_v1, ns, "train", 8), timeout=120)
    t_running = time.time()
    nodes = nodes_by_name(core_v1)
    racks = {nodes[p.spec.node_name].metadata.labels[RACK] for p in pods}
    products = {nodes[p.spec.node_name].metadata.labels[PRODUCT] for p in pods}
    assert products == {H100}, products
    assert len(racks) == 1, f"one rack expected, got {racks}"
    for p in pods:
        slot = p.metadata.annotations[SLOT]
        index = p.metadata.labels.get(INDEX) or p.metadata.annotations[INDEX]
        assert slot == f"main/{index}", (p.metadata.name, slot, index)
        assert p.spec.node_name == slots[slot]["node"], "bound to the reserved node"
        assert p.spec.node_selector["kubernetes.io/hostname"] == p.spec.node_name
        # the node's name in the required affinity: the scheduler filtered that node alone
        terms = p.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert [(f.key, f.operator, f.values) for t in terms.node_selector_terms
                for f in t.match_fields] == [("metadata.name", "In", [p.spec.node_name])]
        assert not [g for g in p.spec.scheduling_gates or [] if g.name == GATE]
    by_rank = [
        p.spec.node_name for p in sorted(pods, key=lambda p: int(p.metadata.annotations[SLOT][5:]))
    ]
    assert by_rank == sorted(by_rank), f"ranks in node order: {by_rank}"

    wl = workload_of(custom_objects, ns, "train")
    assert condition(wl, "Admitted") == "True"
    describe = e2e_cluster.kubectl("describe", "workload", "-n", ns, wl["metadata"]["name"]).stdout
    assert "placed 8 pods on 8 nodes" in describe
    assert "Placed" in describe  # the Event
    print(
        f"\n[latency] gold 8x8: submit→Ready {t_ready - t0:.1f}s, QuotaReserved→Ready "
        f"≤{t_ready - qr_time(wl):.1f}s, Ready→8 Running {t_running - t_ready:.1f}s"
    )


def test_bronze_lands_on_l40s_and_vram_and_numa_are_respected(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    ns = nexus_namespace
    # a required node-affinity term of the pod's own: kept, and it takes the node's name
    products = client.V1NodeSelectorRequirement(key=PRODUCT, operator="In", values=[L40S, H100])
    own = client.V1Affinity(node_affinity=client.V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=client.V1NodeSelector(
            node_selector_terms=[client.V1NodeSelectorTerm(match_expressions=[products])])))
    batch_v1.create_namespaced_job(
        ns, job("bronze", "nexus-bronze", pods=1, gpus=1, affinity=own)
    )
    batch_v1.create_namespaced_job(
        ns,
        job(
            "bigvram",
            "nexus-silver",
            pods=2,
            gpus=1,
            annotations={"scheduling.kubenexus.io/gpu-memory": "60Gi"},
        ),
    )
    batch_v1.create_namespaced_job(
        ns,
        job(
            "numa",
            "nexus-silver",
            pods=1,
            gpus=2,
            cpu="16",
            annotations={"scheduling.kubenexus.io/numa-policy": "single-numa-node"},
        ),
    )
    nodes = nodes_by_name(core_v1)
    bronze = wait_for("bronze Running", lambda: running(core_v1, ns, "bronze", 1), timeout=120)
    assert nodes[bronze[0].spec.node_name].metadata.labels[PRODUCT] == L40S
    required = bronze[0].spec.affinity.node_affinity
    (term,) = required.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert [(e.key, e.values) for e in term.match_expressions] == [(PRODUCT, [L40S, H100])]
    assert [(f.key, f.values) for f in term.match_fields] == [
        ("metadata.name", [bronze[0].spec.node_name])]
    big = wait_for("bigvram Running", lambda: running(core_v1, ns, "bigvram", 2), timeout=120)
    for p in big:
        memory = int(nodes[p.spec.node_name].metadata.labels["nvidia.com/gpu.memory"])
        assert memory >= 60 * 1024, f"{p.metadata.name} on a {memory} MiB GPU"
    numa = wait_for("numa Running", lambda: running(core_v1, ns, "numa", 1), timeout=120)
    assert numa[0].metadata.annotations.get(NUMA_ZONE) in ("0", "1")
    wl = workload_of(custom_objects, ns, "numa")
    rr = reservation_of(custom_objects, ns, wl)
    (slot,) = slots_of(rr).values()
    assert len(slot["gpus"]) == 2 and "numaZone" in slot


def test_malformed_annotation_is_rejected_and_foreign_reservation_denied(
    nexus_namespace, core_v1, batch_v1, custom_objects, gate_mode
):
    ns = nexus_namespace
    batch_v1.create_namespaced_job(
        ns,
        job(
            "bad",
            "nexus-silver",
            pods=1,
            gpus=1,
            annotations={"scheduling.kubenexus.io/gpu-memory": "lots"},
        ),
    )
    batch_v1.create_namespaced_job(ns, job("good", "nexus-silver", pods=1, gpus=1))
    # Kueue deactivates a rejected Workload at once (and resets its checks), so the answer
    # is read from the Event the controller posts, which is what `describe` shows
    rejected = wait_for("PlacementRejected Event", lambda: event(core_v1, ns, "PlacementRejected"))
    assert "scheduling.kubenexus.io/gpu-memory" in rejected.message
    assert "'lots' is not a memory quantity" in rejected.message
    bad = wait_for(
        "bad deactivated by Kueue",
        lambda: (w := workload_of(custom_objects, ns, "bad")) and w["spec"].get("active") is False,
    )
    assert bad
    good = wait_check(custom_objects, ns, "good", ("Ready",))
    wait_for("good Running", lambda: running(core_v1, ns, "good", 1), timeout=120)

    # a pod that names the good job's reservation but is not part of its Workload
    rr_name = check_entry(good)["podSetUpdates"][0]["labels"][RESERVATION]
    intruder = client.V1Pod(
        metadata=client.V1ObjectMeta(name="intruder", labels={RESERVATION: rr_name}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="x")]),
    )
    with pytest.raises(client.ApiException) as denied:
        core_v1.create_namespaced_pod(ns, intruder)
    assert denied.value.status == 403 or "not part of Workload" in str(denied.value.body)
    assert "not part of Workload" in str(denied.value.body)

    # the same label copied into a Job template outside Kueue
    copycat = job("copycat", "nexus-silver", pods=1, gpus=1)
    copycat.metadata.labels = {}
    copycat.spec.template.metadata.labels = {RESERVATION: rr_name}
    batch_v1.create_namespaced_job(ns, copycat)
    if gate_mode == "webhook":
        # every labelled pod reaches the webhook, the Job controller's too: it is refused
        refused = wait_for(
            "FailedCreate Event on the copycat Job",
            lambda: event(core_v1, ns, "FailedCreate", "not part of Workload"),
        )
        assert refused.involved_object.name == "copycat"
        assert not job_pods(core_v1, ns, "copycat")
    else:
        # the Job controller's pod skips the webhook (the apiserver's policy gates it), and
        # the ungater never pins it
        refused = wait_for(
            "PlacementDenied Event on the copycat's pod",
            lambda: event(core_v1, ns, "PlacementDenied", "not part of Workload"),
        )
        (pod,) = job_pods(core_v1, ns, "copycat")
        assert refused.involved_object.name == pod.metadata.name
        assert [g.name for g in pod.spec.scheduling_gates or []] == [GATE]
        assert not pod.spec.node_name
        assert "kubernetes.io/hostname" not in (pod.spec.node_selector or {})
    assert running(core_v1, ns, "good", 1)  # the reservation's own pod keeps its slot


def test_deleting_a_job_releases_its_reservation_for_the_next_gang(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    ns = nexus_namespace
    # 32 H100 nodes: a gold gang of 32 x 8 GPUs takes every one of them
    batch_v1.create_namespaced_job(ns, job("first", "nexus-gold", pods=32, gpus=8, cpu="16"))
    wait_for("first Running", lambda: running(core_v1, ns, "first", 32), timeout=180)
    # 24 x 8 more fits Kueue's quota (448 GPUs) but no free GPUs: H100s are full, and the
    # 16 A100 nodes hold only 16 of its pods
    batch_v1.create_namespaced_job(ns, job("second", "nexus-gold", pods=24, gpus=8, cpu="16"))
    wl = wait_check(custom_objects, ns, "second", ("Retry", "Ready"), timeout=60)
    entry = check_entry(wl)
    assert entry["state"] == "Retry", f"placed while the GPUs are full: {entry['message']}"
    print(f"\n[retry message] {entry['message']}")
    first_wl = workload_of_name(custom_objects, ns, "first")
    batch_v1.delete_namespaced_job("first", ns, propagation_policy="Foreground")
    wait_for(
        "first's reservation released",
        lambda: all(
            r["spec"]["workloadRef"]["name"] != first_wl for r in reservations(custom_objects, ns)
        ),
        timeout=60,
    )
    pods = wait_for("second Running", lambda: running(core_v1, ns, "second", 24), timeout=180)
    nodes = nodes_by_name(core_v1)
    assert Counter(nodes[p.spec.node_name].metadata.labels[PRODUCT] for p in pods) == {H100: 24}


def workload_of_name(custom, ns: str, job_name: str) -> str:
    wl = workload_of(custom, ns, job_name)
    return wl["metadata"]["name"] if wl else ""


def test_plain_pod_group_is_gated_placed_pinned_and_running(
    nexus_namespace, core_v1, custom_objects
):
    ns = nexus_namespace
    group = "grp"
    for i in range(3):
        container = client.V1Container(
            name="c",
            image="registry.invalid/nexus/worker:e2e",
            resources=client.V1ResourceRequirements(
                requests={"cpu": "4", "memory": "16Gi", GPU: "4"}, limits={GPU: "4"}
            ),
        )
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=f"{group}-{i}",
                labels={QUEUE_LABEL: "nexus-silver", "kueue.x-k8s.io/pod-group-name": group},
                annotations={
                    "kueue.x-k8s.io/pod-group-total-count": "3",
                    # KWOK completes them after a while: the group finishes, which must
                    # release its reservation (and lets Kueue drop its pod finalizers)
                    "pod-complete.stage.kwok.x-k8s.io/delay": "40s",
                },
            ),
            spec=client.V1PodSpec(restart_policy="Never", containers=[container]),
        )
        created = core_v1.create_namespaced_pod(ns, pod)
        assert GATE in [g.name for g in created.spec.scheduling_gates or []]

    def group_running():
        pods = core_v1.list_namespaced_pod(
            ns, label_selector=f"kueue.x-k8s.io/pod-group-name={group}"
        ).items
        ok = len(pods) == 3 and all(p.status.phase == "Running" and p.spec.node_name for p in pods)
        return pods if ok else None

    pods = wait_for("3 group pods Running", group_running, timeout=120)
    wl = custom_objects.get_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, ns, "workloads", group
    )
    entry = check_entry(wl)
    assert entry["state"] == "Ready", entry
    rr = reservation_of(custom_objects, ns, wl)
    slots = slots_of(rr)
    for p in pods:
        assert p.metadata.labels[RESERVATION] == rr["metadata"]["name"]
        assert p.spec.node_name == slots[p.metadata.annotations[SLOT]]["node"]
    assert len({p.metadata.annotations[SLOT] for p in pods}) == 3
    wait_for(
        "the finished group's reservation released",
        lambda: not reservations(custom_objects, ns),
        timeout=120,
    )


def _gpus_by_node(core, ns: str) -> Counter:
    used: Counter = Counter()
    for p in core.list_pod_for_all_namespaces().items:
        if p.spec.node_name and p.status.phase not in ("Succeeded", "Failed"):
            for c in p.spec.containers:
                used[p.spec.node_name] += int((c.resources.requests or {}).get(GPU, 0))
    return used


def histogram(metrics: str, name: str) -> tuple[float, float, dict[float, float]]:
    """(count, sum, cumulative buckets) of a Prometheus histogram in exposition text."""
    count = total = 0.0
    buckets: dict[float, float] = {}
    for line in metrics.splitlines():
        if line.startswith(f"{name}_count"):
            count += float(line.split()[-1])
        elif line.startswith(f"{name}_sum"):
            total += float(line.split()[-1])
        elif line.startswith(f"{name}_bucket") and 'le="+Inf"' not in line:
            le = float(line.split('le="')[1].split('"')[0])
            buckets[le] = buckets.get(le, 0.0) + float(line.split()[-1])
    return count, total, buckets


def quantile(count: float, buckets: dict[float, float], q: float) -> float | None:
    for le in sorted(buckets):
        if buckets[le] >= q * count:
            return le
    return None


def test_thirty_workloads_of_three_tiers_never_double_book(
    nexus_namespace, core_v1, batch_v1, custom_objects, nexus_controller
):
    """30 gangs at once, more than the fleet holds: every placed gang is complete on
    reserved nodes, no node holds more GPUs than it has, the rest wait in Retry."""
    ns = nexus_namespace
    # per tier: pods x GPUs; 520 GPUs in all against 448 in the fleet, each tier within
    # its ClusterQueue's quota, so Kueue reserves quota for all and nexus must say no to some
    shapes = [("nexus-gold", 4, 8), ("nexus-silver", 4, 4), ("nexus-bronze", 2, 2)]
    names = []
    t0 = time.time()
    for i in range(30):
        queue, pods, gpus = shapes[i % 3]
        name = f"burst-{i}"
        batch_v1.create_namespaced_job(ns, job(name, queue, pods=pods, gpus=gpus, cpu="4"))
        names.append((name, pods))

    def all_answered():
        retried = {
            e.involved_object.name
            for e in core_v1.list_namespaced_event(ns).items
            if e.reason == "PlacementRetry"
        }
        answered = 0
        for name, _ in names:
            wl = workload_of(custom_objects, ns, name)
            if wl and (condition(wl, "Admitted") == "True" or wl["metadata"]["name"] in retried):
                answered += 1
        return answered == len(names)

    wait_for("every burst Workload answered", all_answered, timeout=180)
    t_answered = time.time()
    time.sleep(5)
    ready = []
    for name, count in names:
        wl = workload_of(custom_objects, ns, name)
        if condition(wl, "Admitted") == "True":
            ready.append((name, count))
    assert ready, "nothing placed"
    for name, count in ready:
        wait_for(f"{name} Running", lambda n=name, c=count: running(core_v1, ns, n, c), timeout=120)
    nodes = nodes_by_name(core_v1)
    used = _gpus_by_node(core_v1, ns)
    for node, n in used.items():
        have = int(nodes[node].status.allocatable[GPU])
        assert n <= have, f"{node}: {n} GPUs bound, {have} allocatable"
    for name, _ in ready:
        wl = workload_of(custom_objects, ns, name)
        rr = reservation_of(custom_objects, ns, wl)
        slots = slots_of(rr)
        for p in job_pods(core_v1, ns, name):
            assert p.spec.node_name == slots[p.metadata.annotations[SLOT]]["node"]
    print(
        f"\n[burst] 30 Workloads: all answered in {t_answered - t0:.1f}s, "
        f"{len(ready)} admitted and running, {30 - len(ready)} waiting (Retry)"
    )
    metrics = nexus_controller.metrics()
    n, total, buckets = histogram(metrics, "nexus_admit_solve_seconds")
    lag_n, _, lag = histogram(metrics, "nexus_admit_event_loop_lag_seconds")
    print(
        f"[burst] solves {n:.0f}, mean {total / max(n, 1) * 1000:.0f} ms, p99 ≤ "
        f"{quantile(n, buckets, 0.99)} s; event-loop lag p99 ≤ {quantile(lag_n, lag, 0.99)} s "
        f"over {lag_n:.0f} probes"
    )


def counter(metrics: str, name: str) -> float:
    """A counter's value in a /metrics text (0 when not exported yet)."""
    for line in metrics.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return 0.0


def test_a_workload_waiting_for_quota_is_warmed_then_placed_when_kueue_reserves(
    nexus_namespace, core_v1, batch_v1, custom_objects, nexus_controller
):
    """A Job in a held LocalQueue waits for quota: its shape is warmed ahead on the real
    ClusterQueue's flavor (controller/warm.py); once the queue is released, Kueue reserves,
    nexus places and the pods run on their planned nodes."""
    ns = nexus_namespace
    create_local_queue(custom_objects, ns, "held-gold", "nexus-gold", stop_policy="Hold")
    before = counter(nexus_controller.metrics(), "nexus_admit_warmed_shapes_total")
    # a one-pod shape no other test asks for, so its tracker is new to the controller
    batch_v1.create_namespaced_job(ns, job("waits", "held-gold", pods=1, gpus=3, cpu="5"))
    wait_for("waits' Workload", lambda: workload_of(custom_objects, ns, "waits"))
    wait_for(
        "the waiting shape warmed",
        lambda: counter(nexus_controller.metrics(), "nexus_admit_warmed_shapes_total") > before,
        timeout=30,
    )
    wl = workload_of(custom_objects, ns, "waits")
    assert condition(wl, "QuotaReserved") != "True", "held: no quota reserved while warmed"
    custom_objects.patch_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, ns, "localqueues", "held-gold",
        {"spec": {"stopPolicy": "None"}})
    wl = wait_check(custom_objects, ns, "waits", ("Ready",), timeout=60)
    (pod,) = wait_for("waits Running", lambda: running(core_v1, ns, "waits", 1), timeout=60)
    slots = slots_of(reservation_of(custom_objects, ns, wl))
    assert pod.spec.node_name == slots[pod.metadata.annotations[SLOT]]["node"]


def test_pod_bypassing_kueue_onto_a_running_gangs_node_moves_that_slot_alone(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """A pod outside Kueue bound straight to a node (spec.nodeName skips the scheduler) takes
    the GPUs a running gang's slot holds while that slot's pod is replaced: nexus-admit moves
    the slot to a node of the gang's rack with room (same reservation, Event SlotMoved, no
    Retry), the replacement pod runs there and the gang's other pods are not touched.
    Before issue 57 the replacement was pinned to the taken node and the whole gang,
    running pods included, went back through Retry."""
    ns = nexus_namespace
    batch_v1.create_namespaced_job(
        ns, job("victim", "nexus-silver", pods=4, gpus=8, cpu="8", backoff_limit=20)
    )
    pods = wait_for("victim Running", lambda: running(core_v1, ns, "victim", 4), timeout=120)
    reservation_uid = reservation_of(
        custom_objects, ns, workload_of(custom_objects, ns, "victim"))["metadata"]["uid"]
    target, *others = sorted(pods, key=lambda p: p.metadata.name)
    taken = target.spec.node_name
    kept = {p.metadata.uid: p.spec.node_name for p in others}
    bypass = client.V1Pod(
        metadata=client.V1ObjectMeta(name="bypass"),
        spec=client.V1PodSpec(
            node_name=taken,
            containers=[
                client.V1Container(
                    name="c",
                    image="registry.invalid/other:1",
                    resources=client.V1ResourceRequirements(requests={GPU: "8"}, limits={GPU: "8"}),
                )
            ],
        ),
    )
    core_v1.create_namespaced_pod(ns, bypass)
    core_v1.delete_namespaced_pod(target.metadata.name, ns, grace_period_seconds=0)

    moved = wait_for(
        "SlotMoved off the taken node",
        lambda: event(core_v1, ns, "SlotMoved", f"moved from node {taken}"),
        timeout=90,
    )
    again = wait_for(
        "victim Running on its slots, none on the taken node",
        lambda: (
            p
            if (p := running(core_v1, ns, "victim", 4))
            and all(x.spec.node_name != taken for x in p)
            else None
        ),
        timeout=120,
    )
    wl = workload_of(custom_objects, ns, "victim")
    rr = reservation_of(custom_objects, ns, wl)
    # a Retry would have released this reservation and placed the gang under a new one
    # (the gang may have been answered Retry before it was first placed: the test before
    # holds GPUs until its namespace is gone, so PlacementRetry Events tell nothing here)
    assert rr["metadata"]["uid"] == reservation_uid, "no Retry: only the slot moved"
    slots = slots_of(rr)
    for p in again:
        assert p.spec.node_name == slots[p.metadata.annotations[SLOT]]["node"]
    assert {p.metadata.uid: p.spec.node_name for p in again if p.metadata.uid in kept} == kept
    assert condition(wl, "Admitted") == "True", moved.message


def test_a_missing_placement_config_deactivates_the_check_and_its_queues(
    nexus_controller, custom_objects
):
    """Kueue must not admit Workloads through a check whose config is broken: the check
    goes Active=False with what is wrong, Kueue deactivates the ClusterQueues that use it,
    and both come back when the config is named correctly again."""

    def set_config(name: str) -> None:
        custom_objects.patch_cluster_custom_object(
            KUEUE_GROUP,
            KUEUE_VERSION,
            "admissionchecks",
            CHECK,
            {"spec": {"parameters": {"name": name}}},
        )

    def active(plural: str, name: str) -> dict[str, Any] | None:
        obj = custom_objects.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c["type"] == "Active":
                return c
        return None

    set_config("no-such-config")
    try:
        cond = wait_for(
            "check Active=False",
            lambda: (c := active("admissionchecks", CHECK)) and c["status"] == "False" and c,
        )
        assert "PlacementConfig 'no-such-config'" in cond["message"], cond
        wait_for(
            "nexus-gold deactivated by Kueue",
            lambda: (c := active("clusterqueues", "nexus-gold")) and c["status"] == "False",
        )
    finally:
        set_config("e2e")
    wait_for(
        "check and queue active again",
        lambda: (
            (a := active("admissionchecks", CHECK))
            and a["status"] == "True"
            and (q := active("clusterqueues", "nexus-gold"))
            and q["status"] == "True"
        ),
    )
