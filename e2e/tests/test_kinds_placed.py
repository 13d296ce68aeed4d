"""Every workload kind Kueue integrates, placed by nexus-admit on the real control plane.

Each kind's real controller (JobSet, Kubeflow Trainer, LeaderWorkerSet, KubeRay, the MPI
operator, and kube-controller-manager's Deployment and StatefulSet controllers) creates the
pods; Kueue reserves quota on a nexus-checked ClusterQueue; nexus-admit places the gang, the
queue gate policy or the reservation gate holds the pods, the ungater pins each to its slot
and kube-scheduler binds it there. Everything is checked against the cluster's own objects:
each pod runs on the node of the slot its annotation names, ranks follow the slots (which
`kube.reservations` numbers in topology order), and a queue without the check is never
touched. Per-kind timings (submit → check Ready → all pods Running) are printed and written
to `.e2e-state/kinds-timings.json`, never asserted.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_util import (
    GPU,
    KUEUE_GROUP,
    KUEUE_VERSION,
    MPI_JOB_NAME_LABEL,
    MPIJOBS,
    QUEUE_LABEL,
    mpijob,
    mpijob_deleted_after,
    require_controller,
    wait_fleet_clear,
    wait_for,
)
from kubernetes import client
from nexus_controller import GATED_QUEUES_CONFIGMAP, GATED_QUEUES_NAMESPACE
from test_controller import (
    CHECK,
    GATE,
    RACK,
    RESERVATION,
    SLOT,
    check_entry,
    reservation_of,
    reservations,
    slots_of,
)

FIELD_MANAGER = "nexus-admit"  # nexus_admit/controller/api.py
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(360, func_only=True)]

IMAGE = "registry.invalid/nexus/worker:e2e"  # never pulled: KWOK fakes the kubelet
TIMINGS: dict[str, dict[str, float]] = {}
JOBSET_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"


def _container(name: str, gpus: int = 0, cpu: str = "500m") -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "1Gi"}}
    if gpus:
        resources["requests"][GPU] = str(gpus)
        resources["limits"] = {GPU: str(gpus)}
    return {"name": name, "image": IMAGE, "resources": resources}


def _pod_spec(gpus: int = 0, restart: str = "Never") -> dict[str, Any]:
    return {"restartPolicy": restart, "containers": [_container("main", gpus)]}


def _workload_owned_by(custom: client.CustomObjectsApi, ns: str, uid: str) -> list[dict]:
    items = custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, ns, "workloads")
    return [
        w
        for w in items["items"]
        if any(r.get("uid") == uid for r in w["metadata"].get("ownerReferences") or [])
    ]


def _ready(custom, ns: str, owner_uid: str, count: int = 1) -> list[dict[str, Any]]:
    """The owner's `count` Workloads, each with our check Ready."""

    def ready() -> list[dict[str, Any]] | None:
        wls = _workload_owned_by(custom, ns, owner_uid)
        states = [check_entry(w).get("state") for w in wls]
        return wls if len(wls) == count and states == ["Ready"] * count else None

    return wait_for(f"{count} Workload(s) with check {CHECK} Ready", ready, timeout=120)


def _running(core, ns: str, selector: str, count: int) -> list[client.V1Pod]:
    def all_running() -> list[client.V1Pod] | None:
        pods = [
            p
            for p in core.list_namespaced_pod(ns, label_selector=selector).items
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp
        ]
        return pods if len(pods) == count and all(p.spec.node_name for p in pods) else None

    return wait_for(f"{count} pods Running ({selector})", all_running, timeout=150)


def _pinned(custom, ns: str, wl: dict[str, Any], pods: list[client.V1Pod]) -> dict[str, str]:
    """Every pod runs on the node of the slot it holds (one slot each): pod → slot key."""
    rr = reservation_of(custom, ns, wl)
    slots = slots_of(rr)
    held = {}
    for p in pods:
        assert p.metadata.labels.get(RESERVATION) == rr["metadata"]["name"], p.metadata.name
        slot = p.metadata.annotations.get(SLOT)
        assert slot in slots, f"{p.metadata.name} holds {slot!r}, not a slot of its reservation"
        assert p.spec.node_name == slots[slot]["node"], (p.metadata.name, slot)
        assert not [g for g in p.spec.scheduling_gates or [] if g.name == GATE]
        held[p.metadata.name] = slot
    assert len(set(held.values())) == len(held), f"two pods hold one slot: {held}"
    return held


def _racks(core, pods: list[client.V1Pod]) -> set[str]:
    return {core.read_node(p.spec.node_name).metadata.labels[RACK] for p in pods}


def _timed(kind: str, submitted: float, ready: float, running: float) -> None:
    TIMINGS[kind] = {
        "check_ready_s": round(ready - submitted, 2),
        "all_running_s": round(running - submitted, 2),
    }
    print(
        f"\n{kind}: submit → check Ready {ready - submitted:.1f} s, → all Running "
        f"{running - submitted:.1f} s"
    )


@pytest.fixture(scope="module", autouse=True)
def _write_timings(e2e_cluster) -> Any:
    yield
    if TIMINGS and hasattr(e2e_cluster, "kubeconfig"):
        out = Path(e2e_cluster.kubeconfig).parent / "kinds-timings.json"
        out.write_text(json.dumps(TIMINGS, indent=2, sort_keys=True))


def _create(custom, ns: str, group: str, version: str, plural: str, body: dict) -> dict:
    return custom.create_namespaced_custom_object(group, version, ns, plural, body)


def _rank_order(pods: list[client.V1Pod], rank: Callable[[client.V1Pod], int]) -> list[str]:
    return [p.metadata.name for p in sorted(pods, key=rank)]


# ---------------------------------------------------------------- training


def test_jobset_driver_off_gpu_nodes_workers_in_one_rack_by_rank(
    nexus_namespace, core_v1, custom_objects
):
    require_controller("JOBSET_VERSION", "jobset", "jobsets.jobset.x-k8s.io", custom_objects)
    ns, name = nexus_namespace, f"js-{uuid.uuid4().hex[:5]}"
    wait_fleet_clear(core_v1, custom_objects, ns)  # it asserts one rack

    def replicated(rname: str, replicas: int, pods: int, gpus: int) -> dict[str, Any]:
        job = {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {"spec": _pod_spec(gpus)},
        }
        return {"name": rname, "replicas": replicas, "template": {"spec": job}}

    submitted = time.time()
    js = _create(
        custom_objects,
        ns,
        "jobset.x-k8s.io",
        "v1alpha2",
        "jobsets",
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: "nexus-gold"}},
            "spec": {
                "replicatedJobs": [replicated("driver", 1, 1, 0), replicated("workers", 2, 2, 8)]
            },
        },
    )
    (wl,) = _ready(custom_objects, ns, js["metadata"]["uid"])
    ready = time.time()
    pods = _running(core_v1, ns, f"jobset.sigs.k8s.io/jobset-name={name}", 5)
    _timed("JobSet", submitted, ready, time.time())
    held = _pinned(custom_objects, ns, wl, pods)
    workers = [
        p for p in pods if p.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"] == "workers"
    ]
    (driver,) = [p for p in pods if p not in workers]

    # ranks 0-3 across the two Jobs take worker slots 0-3, numbered in topology order
    def rank(p: client.V1Pod) -> int:
        return int(p.metadata.labels[JOBSET_INDEX]) * 2 + int(p.metadata.labels[COMPLETION_INDEX])

    assert [held[n] for n in _rank_order(workers, rank)] == [f"workers/{i}" for i in range(4)]
    assert len(_racks(core_v1, workers)) == 1, "the workers share one rack"
    assert GPU not in core_v1.read_node(driver.spec.node_name).status.allocatable, (
        f"the GPU-less driver took GPU node {driver.spec.node_name}"
    )
    message = check_entry(wl)["message"]
    assert "driver" in message and "workers" in message, message


@pytest.fixture
def torch_runtime(e2e_cluster, custom_objects):
    """Trainer's sample ClusterTrainingRuntime `torch-distributed`, from the module build.sh
    built Trainer from."""
    require_controller(
        "TRAINER_VERSION", "trainer", "trainjobs.trainer.kubeflow.org", custom_objects
    )
    bin_dir = Path(e2e_cluster.info()["bin"])
    runtime = yaml.safe_load(
        (bin_dir / "manifests" / "trainer" / "runtimes" / "torch_distributed.yaml").read_text()
    )
    e2e_cluster.apply([runtime])
    return runtime["metadata"]["name"]


def test_trainjob_4_nodes_in_one_rack_by_rank(
    nexus_namespace, core_v1, custom_objects, torch_runtime
):
    ns, name = nexus_namespace, f"tj-{uuid.uuid4().hex[:5]}"
    wait_fleet_clear(core_v1, custom_objects, ns)  # it asserts one rack
    submitted = time.time()
    tj = _create(
        custom_objects,
        ns,
        "trainer.kubeflow.org",
        "v1alpha1",
        "trainjobs",
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: "nexus-gold"}},
            "spec": {
                "runtimeRef": {
                    "apiGroup": "trainer.kubeflow.org",
                    "kind": "ClusterTrainingRuntime",
                    "name": torch_runtime,
                },
                "trainer": {
                    "image": IMAGE,
                    "numNodes": 4,
                    "resourcesPerNode": {"requests": {"cpu": "1", GPU: "8"}, "limits": {GPU: "8"}},
                },
            },
        },
    )
    (wl,) = _ready(custom_objects, ns, tj["metadata"]["uid"])
    ready = time.time()
    pods = _running(core_v1, ns, f"jobset.sigs.k8s.io/jobset-name={name}", 4)
    _timed("TrainJob", submitted, ready, time.time())
    held = _pinned(custom_objects, ns, wl, pods)
    (pod_set,) = {s.split("/")[0] for s in held.values()}

    def rank(p: client.V1Pod) -> int:
        return int(p.metadata.labels[JOBSET_INDEX]) * 4 + int(p.metadata.labels[COMPLETION_INDEX])

    assert [held[n] for n in _rank_order(pods, rank)] == [f"{pod_set}/{i}" for i in range(4)]
    assert len(_racks(core_v1, pods)) == 1


def test_rayjob_head_workers_and_submitter_placed(nexus_namespace, core_v1, custom_objects):
    require_controller("KUBERAY_VERSION", "kuberay", "rayjobs.ray.io", custom_objects)
    ns, name = nexus_namespace, f"ray-{uuid.uuid4().hex[:5]}"

    def group(container: str, gpus: int) -> dict[str, Any]:
        return {
            "rayStartParams": {},
            "template": {"spec": {"containers": [_container(container, gpus)]}},
        }

    submitted = time.time()
    rj = _create(
        custom_objects,
        ns,
        "ray.io",
        "v1",
        "rayjobs",
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: "nexus-gold"}},
            "spec": {
                "entrypoint": "python -c 'print(1)'",
                "shutdownAfterJobFinishes": True,
                "rayClusterSpec": {
                    "headGroupSpec": group("ray-head", 0),
                    "workerGroupSpecs": [
                        {
                            **group("ray-worker", 8),
                            "groupName": "workers",
                            "replicas": 2,
                            "minReplicas": 2,
                            "maxReplicas": 2,
                        }
                    ],
                },
            },
        },
    )
    (wl,) = _ready(custom_objects, ns, rj["metadata"]["uid"])
    ready = time.time()
    cluster = wait_for(
        "RayJob's RayCluster",
        lambda: (
            custom_objects.get_namespaced_custom_object("ray.io", "v1", ns, "rayjobs", name).get(
                "status"
            )
            or {}
        ).get("rayClusterName"),
        timeout=60,
    )
    pods = _running(core_v1, ns, f"ray.io/cluster={cluster},ray.io/node-type in (head,worker)", 3)
    _timed("RayJob", submitted, ready, time.time())
    held = _pinned(custom_objects, ns, wl, pods)
    workers = [p for p in pods if p.metadata.labels["ray.io/node-type"] == "worker"]
    assert sorted(held[p.metadata.name].split("/")[0] for p in workers) == ["workers", "workers"]
    assert len(_racks(core_v1, workers)) == 1


MPI_ROLE = "training.kubeflow.org/job-role"
MPI_RANK = "training.kubeflow.org/replica-index"


def test_mpijob_launcher_off_gpu_nodes_workers_in_one_rack_by_rank(
    nexus_namespace, core_v1, custom_objects
):
    """The MPI operator makes the workers itself and the launcher through a batch Job of
    its own, so the launcher pod's owner chain is Pod → Job → MPIJob."""
    require_controller("MPI_OPERATOR_VERSION", "mpi-operator", "mpijobs.kubeflow.org",
                       custom_objects)
    ns, name = nexus_namespace, f"mpi-{uuid.uuid4().hex[:5]}"
    wait_fleet_clear(core_v1, custom_objects, ns)  # it asserts one rack

    submitted = time.time()
    with mpijob_deleted_after(custom_objects, core_v1, ns, name):
        mj = _create(custom_objects, ns, *MPIJOBS, mpijob(
            name, _pod_spec(), _pod_spec(gpus=8), 3, {QUEUE_LABEL: "nexus-gold"},
            slotsPerWorker=8, runPolicy={"cleanPodPolicy": "Running"}))
        (wl,) = _ready(custom_objects, ns, mj["metadata"]["uid"])
        ready = time.time()
        pods = _running(core_v1, ns, f"{MPI_JOB_NAME_LABEL}={name}", 4)
        _timed("MPIJob", submitted, ready, time.time())
        held = _pinned(custom_objects, ns, wl, pods)
    workers = [p for p in pods if p.metadata.labels[MPI_ROLE] == "worker"]
    (launcher,) = [p for p in pods if p not in workers]
    (job_ref,) = launcher.metadata.owner_references
    assert job_ref.kind == "Job", "the launcher pod is its Job's, not the MPIJob's"
    assert held[launcher.metadata.name] == "launcher/0"
    # rank i takes worker slot i, numbered in topology order
    order = _rank_order(workers, lambda p: int(p.metadata.labels[MPI_RANK]))
    assert [held[n] for n in order] == [f"worker/{i}" for i in range(3)]
    assert len(_racks(core_v1, workers)) == 1, "the workers share one rack"
    assert GPU not in core_v1.read_node(launcher.spec.node_name).status.allocatable, (
        f"the GPU-less launcher took GPU node {launcher.spec.node_name}"
    )


# ---------------------------------------------------------------- serving


def test_leaderworkerset_groups_each_in_one_rack_leader_rank_0(
    nexus_namespace, core_v1, custom_objects
):
    require_controller(
        "LWS_VERSION", "lws", "leaderworkersets.leaderworkerset.x-k8s.io", custom_objects
    )
    ns, name = nexus_namespace, f"lws-{uuid.uuid4().hex[:5]}"
    wait_fleet_clear(core_v1, custom_objects, ns)  # it asserts one rack
    template = {"spec": _pod_spec(8, restart="Always")}
    submitted = time.time()
    lws = _create(
        custom_objects,
        ns,
        "leaderworkerset.x-k8s.io",
        "v1",
        "leaderworkersets",
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: "nexus-gold"}},
            "spec": {
                "replicas": 2,
                "leaderWorkerTemplate": {
                    "size": 4,
                    "leaderTemplate": template,
                    "workerTemplate": template,
                },
            },
        },
    )
    wls = _ready(custom_objects, ns, lws["metadata"]["uid"], count=2)
    ready = time.time()
    pods = _running(core_v1, ns, f"leaderworkerset.sigs.k8s.io/name={name}", 8)
    _timed("LeaderWorkerSet", submitted, ready, time.time())
    for group in ("0", "1"):
        members = [p for p in pods if p.metadata.labels[LWS_GROUP] == group]
        (wl,) = [
            w
            for w in wls
            if reservation_of(custom_objects, ns, w)["metadata"]["name"]
            == members[0].metadata.labels[RESERVATION]
        ]
        held = _pinned(custom_objects, ns, wl, members)
        expected = {
            p.metadata.name: "leader/0"
            if p.metadata.labels[LWS_WORKER] == "0"
            else f"worker/{int(p.metadata.labels[LWS_WORKER]) - 1}"
            for p in members
        }
        assert held == expected, "the leader is rank 0, workers 1-3 take worker slots 0-2"
        assert len(_racks(core_v1, members)) == 1, f"group {group} spans racks"


def _deployment(name: str, queue: str, replicas: int, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": _pod_spec(gpus, "Always")},
        },
    }


def _statefulset(name: str, queue: str, replicas: int, gpus: int) -> dict[str, Any]:
    body = _deployment(name, queue, replicas, gpus)
    body["kind"] = "StatefulSet"
    body["spec"]["serviceName"] = name
    return body


def _serving_pods(core, ns: str, app: str) -> list[client.V1Pod]:
    return [
        p
        for p in core.list_namespaced_pod(ns, label_selector=f"app={app}").items
        if not p.metadata.deletion_timestamp
    ]


def _each_pinned(custom, core, ns: str, pods: list[client.V1Pod]) -> None:
    """Each pod on its own reservation's slot node (a Deployment's pods are one Workload each)."""
    for p in pods:
        rr = custom.get_namespaced_custom_object(
            "scheduling.kubenexus.io",
            "v1alpha1",
            ns,
            "resourcereservations",
            p.metadata.labels[RESERVATION],
        )
        slot = slots_of(rr)[p.metadata.annotations[SLOT]]
        assert p.spec.node_name == slot["node"], p.metadata.name


@pytest.fixture(scope="module")
def stay_seconds() -> int:
    """How long the serving pods are watched staying where they were placed (a module that
    reruns the test on another gate path may watch for less)."""
    return 120


def test_deployment_and_statefulset_stay_placed_and_scale(
    nexus_namespace, core_v1, custom_objects, stay_seconds
):
    ns = nexus_namespace
    apps = client.AppsV1Api(core_v1.api_client)
    submitted = time.time()
    apps.create_namespaced_deployment(ns, _deployment("infer", "nexus-silver", 4, 1))
    apps.create_namespaced_stateful_set(ns, _statefulset("db", "nexus-silver", 3, 2))

    def all_ready() -> bool:
        wls = custom_objects.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, ns, "workloads"
        )["items"]
        # a Deployment's pods are one Workload each; the StatefulSet is one pod group
        return len(wls) == 5 and all(check_entry(w).get("state") == "Ready" for w in wls)

    wait_for("5 Workloads with check Ready", all_ready, timeout=120)
    ready = time.time()
    deploy = _running(core_v1, ns, "app=infer", 4)
    sts = _running(core_v1, ns, "app=db", 3)
    _timed("Deployment+StatefulSet", submitted, ready, time.time())
    _each_pinned(custom_objects, core_v1, ns, deploy + sts)
    # a node each per service: a pair of replicas on one node (spread.node, 2500) costs more
    # than breaking a pristine island (2000). Not asserted: a rack each. A pair in one rack
    # costs 100, so reusing nodes another service's replicas already broke wins over a
    # second rack; which nodes those are depends on what the earlier tests and the sibling
    # decisions left, so the racks chosen are the fleet's at that moment, not the test's.
    for pods, kind in ((deploy, "Deployment"), (sts, "StatefulSet")):
        nodes = [p.spec.node_name for p in pods]
        assert len(set(nodes)) == len(nodes), f"two of the {kind}'s replicas share a node: {nodes}"
    # and they stay: no Retry, no eviction, the same pods on the same nodes (2 minutes)
    before = {p.metadata.uid: p.spec.node_name for p in deploy + sts}
    deadline = time.time() + stay_seconds
    while time.time() < deadline:
        now = {
            p.metadata.uid: p.spec.node_name
            for app in ("infer", "db")
            for p in _serving_pods(core_v1, ns, app)
        }
        assert now == before, "serving pods were re-created or moved"
        wls = custom_objects.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, ns, "workloads"
        )["items"]
        states = {w["metadata"]["name"]: check_entry(w).get("state") for w in wls}
        assert set(states.values()) == {"Ready"}, states
        time.sleep(10)
    # scale the Deployment up: the new replicas are placed; down: their reservations go
    apps.patch_namespaced_deployment_scale("infer", ns, {"spec": {"replicas": 6}})
    scaled = _running(core_v1, ns, "app=infer", 6)
    _each_pinned(custom_objects, core_v1, ns, scaled)
    apps.patch_namespaced_deployment_scale("infer", ns, {"spec": {"replicas": 2}})

    def released() -> bool:
        left = {p.metadata.labels[RESERVATION] for p in _serving_pods(core_v1, ns, "infer")}
        held = {
            r["metadata"]["name"]
            for r in reservations(custom_objects, ns)
            if r["metadata"]["name"].startswith("pod-infer-")
        }
        return len(left) == 2 and held == left

    wait_for("reservations of the removed replicas released", released, timeout=90)


def test_a_queue_without_the_check_is_never_touched(
    e2e_namespace, nexus_controller, core_v1, custom_objects
):
    """A Deployment and a StatefulSet on a queue whose ClusterQueue lacks the check, in a
    namespace none of whose queues uses it, while nexus-admit runs: their pods are created
    without our gate, never get a reservation label, and run where kube-scheduler puts them.
    In webhook gate mode every one of those pods reaches the webhook, which looks their
    queue up and lets them pass ungated."""
    ns = e2e_namespace
    apps = client.AppsV1Api(core_v1.api_client)

    def listed() -> bool:
        cm = core_v1.read_namespaced_config_map(GATED_QUEUES_CONFIGMAP, GATED_QUEUES_NAMESPACE)
        data = cm.data or {}
        return data.get(ns) == "" and data.get(f"{ns}.silver") == ""

    if nexus_controller.gate_mode == "policy":  # only the queue gate policy reads the list
        wait_for("the namespace listed as not using the check", listed, timeout=60)
    apps.create_namespaced_deployment(ns, _deployment("web", "silver", 2, 1))
    apps.create_namespaced_stateful_set(ns, _statefulset("cache", "silver", 2, 1))
    pods = _running(core_v1, ns, "app in (web,cache)", 4)
    for p in pods:
        assert RESERVATION not in (p.metadata.labels or {}), p.metadata.name
        assert SLOT not in (p.metadata.annotations or {}), p.metadata.name
        # had the policy gated it, the ungater's patch would have lifted the gate: a pod
        # nexus-admit wrote to lists its field manager
        managers = {m.manager for m in p.metadata.managed_fields or []}
        assert FIELD_MANAGER not in managers, (p.metadata.name, managers)
    events = core_v1.list_namespaced_event(ns).items
    assert not [e for e in events if e.source and "nexus" in (e.source.component or "")]
