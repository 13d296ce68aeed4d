"""Smoke tests proving the e2e control plane is real.

etcd + kube-apiserver + kube-controller-manager + kube-scheduler + KWOK + Kueue, all
built from upstream Go modules: Kueue's webhook suspends a queued Job, Kueue admits it,
the job controller creates pods, kube-scheduler binds them to fake GPU nodes, KWOK runs
them, and the garbage collector removes them when the Job goes away.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import fleet
import pytest
from e2e_util import (
    ADMISSION_GATE,
    GPU,
    KUEUE_GROUP,
    KUEUE_VERSION,
    POD_GROUP_LABEL,
    POD_GROUP_TOTAL_ANNOTATION,
    QUEUE_LABEL,
    all_running,
    condition,
    pods_with_labels,
    wait_for,
    workload_owned_by,
)
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180, func_only=True)]

VERSIONS = dict(
    line.split("=", 1)
    for line in (Path(__file__).resolve().parents[1] / "versions.env").read_text().splitlines()
    if line and not line.startswith("#")
)
PRODUCT = "nvidia.com/gpu.product"


def _container(gpus: int, cpu: str = "4", memory: str = "16Gi") -> client.V1Container:
    res = {"cpu": cpu, "memory": memory, GPU: str(gpus)}
    return client.V1Container(
        name="trainer",
        image="registry.invalid/nexus/trainer:e2e",  # never pulled: KWOK fakes the kubelet
        resources=client.V1ResourceRequirements(requests=res, limits={GPU: str(gpus)}),
    )


def _job(
    name: str, queue: str, parallelism: int, gpus: int, annotations: dict[str, str] | None = None
) -> client.V1Job:
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels={QUEUE_LABEL: queue}),
        spec=client.V1JobSpec(
            parallelism=parallelism,
            completions=parallelism,
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": name}, annotations=annotations),
                spec=client.V1PodSpec(restart_policy="Never", containers=[_container(gpus)]),
            ),
        ),
    )


def _node_labels(core_v1: client.CoreV1Api, name: str) -> dict[str, str]:
    return core_v1.read_node(name).metadata.labels


def test_apiserver_reports_pinned_version(kube_api):
    info = client.VersionApi(kube_api).get_code()
    assert info.git_version == VERSIONS["KUBERNETES_VERSION"]
    assert info.git_tree_state == "clean"


def test_fleet_nodes_nrt_and_kueue_objects(core_v1, custom_objects):
    want = fleet.summary()
    nodes = core_v1.list_node(label_selector="type=kwok").items
    got: dict[str, dict[str, int]] = {}
    for n in nodes:
        pool = n.metadata.labels["scheduling.kubenexus.io/e2e-pool"]
        s = got.setdefault(pool, {"nodes": 0, "gpus": 0})
        s["nodes"] += 1
        s["gpus"] += int(n.status.allocatable.get(GPU, 0))  # the CPU pool has none
        ready = [c.status for c in n.status.conditions or [] if c.type == "Ready"]
        assert ready == ["True"], f"{n.metadata.name} not Ready"
    assert got == want

    h100 = core_v1.read_node("h100-r0-0").metadata.labels
    assert h100[PRODUCT] == "NVIDIA-H100-80GB-HBM3"
    assert h100["nvidia.com/gpu.memory"] == "81559"
    assert h100["nvidia.com/gpu.count"] == "8"
    assert h100["cloud.google.com/gce-topology-subblock"] == "h100-r0"
    # one NVLink clique per H100 rack
    cliques = {
        core_v1.read_node(f"h100-r{r}-0").metadata.labels["nvidia.com/gpu.clique"] for r in range(4)
    }
    assert len(cliques) == 4

    nrts = custom_objects.list_cluster_custom_object(
        "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies"
    )["items"]
    assert len(nrts) == len(nodes)
    nrt = next(o for o in nrts if o["metadata"]["name"] == "h100-r0-0")
    assert [z["name"] for z in nrt["zones"]] == ["node-0", "node-1"]
    gpus = [r["allocatable"] for z in nrt["zones"] for r in z["resources"] if r["name"] == GPU]
    assert gpus == ["4", "4"]

    topo = custom_objects.get_cluster_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, "topologies", "gpu-fabric"
    )
    assert [lvl["nodeLabel"] for lvl in topo["spec"]["levels"]] == [
        "cloud.google.com/gce-topology-block",
        "cloud.google.com/gce-topology-subblock",
        "kubernetes.io/hostname",
    ]
    # Read the fleet's queues by name: other tests add their own ClusterQueues.
    for tier in ("gold", "silver", "bronze"):
        cq = custom_objects.get_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", tier
        )
        assert cq["metadata"]["labels"]["scheduling.kubenexus.io/tier"] == tier
        assert condition(cq, "Active") == "True", tier


def test_job_is_suspended_admitted_scheduled_running_and_garbage_collected(
    e2e_namespace, core_v1, batch_v1, custom_objects
):
    ns = e2e_namespace
    name = f"smoke-{uuid.uuid4().hex[:6]}"
    created = batch_v1.create_namespaced_job(ns, _job(name, "bronze", parallelism=2, gpus=4))
    # Kueue's mutating webhook suspends every queued Job at creation.
    assert created.spec.suspend is True

    wl = wait_for(
        "the Job's Workload to be admitted",
        lambda: (
            (w := workload_owned_by(custom_objects, ns, created.metadata.uid))
            and condition(w, "Admitted") == "True"
            and w
        ),
        timeout=60,
    )
    assert wl["status"]["admission"]["clusterQueue"] == "bronze"

    wait_for(
        "Kueue to unsuspend the Job",
        lambda: batch_v1.read_namespaced_job(name, ns).spec.suspend is False,
        timeout=30,
    )
    pods = wait_for(
        "2 Job pods Running on nodes",
        lambda: (
            p if all_running(p := pods_with_labels(core_v1, ns, f"job-name={name}"), 2) else None
        ),
        timeout=90,
    )
    for p in pods:
        assert p.metadata.owner_references[0].kind == "Job"
        assert p.metadata.owner_references[0].uid == created.metadata.uid
        assert _node_labels(core_v1, p.spec.node_name)[PRODUCT] == "NVIDIA-L40S"
    # 4 GPUs each on 4-GPU L40S nodes: kube-scheduler had to use two different nodes
    assert len({p.spec.node_name for p in pods}) == 2

    batch_v1.delete_namespaced_job(name, ns, propagation_policy="Background")
    wait_for(
        "the garbage collector to delete the Job's pods",
        lambda: not pods_with_labels(core_v1, ns, f"job-name={name}"),
        timeout=90,
    )
    wait_for(
        "the Workload to go away with its Job",
        lambda: workload_owned_by(custom_objects, ns, created.metadata.uid) is None,
        timeout=60,
    )


def test_plain_pod_group_is_gated_admitted_and_running(e2e_namespace, core_v1, custom_objects):
    ns = e2e_namespace
    group = f"grp-{uuid.uuid4().hex[:6]}"
    for i in range(3):
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=f"{group}-{i}",
                labels={QUEUE_LABEL: "silver", POD_GROUP_LABEL: group},
                # KWOK completes them later: Kueue keeps a finalizer on plain pods until
                # they end, so a group that never ends would keep its namespace forever
                annotations={
                    POD_GROUP_TOTAL_ANNOTATION: "3",
                    "pod-complete.stage.kwok.x-k8s.io/delay": "40s",
                },
            ),
            spec=client.V1PodSpec(restart_policy="Never", containers=[_container(8)]),
        )
        created = core_v1.create_namespaced_pod(ns, pod)
        gates = [g.name for g in created.spec.scheduling_gates or []]
        assert ADMISSION_GATE in gates, "Kueue's pod webhook did not gate the pod"

    wl = wait_for(
        "the pod group's Workload to be admitted",
        lambda: (
            (
                w := custom_objects.get_namespaced_custom_object(
                    KUEUE_GROUP, KUEUE_VERSION, ns, "workloads", group
                )
            )
            and condition(w, "Admitted") == "True"
            and w
        ),
        timeout=60,
    )
    assert wl["status"]["admission"]["clusterQueue"] == "silver"
    assert sum(ps["count"] for ps in wl["spec"]["podSets"]) == 3

    pods = wait_for(
        "3 group pods Running on nodes",
        lambda: (
            p
            if all_running(p := pods_with_labels(core_v1, ns, f"{POD_GROUP_LABEL}={group}"), 3)
            else None
        ),
        timeout=90,
    )
    nodes = {p.spec.node_name for p in pods}
    assert len(nodes) == 3  # 8 GPUs each on 8-GPU nodes
    for n in nodes:
        assert _node_labels(core_v1, n)[PRODUCT] == "NVIDIA-A100-SXM4-40GB"
    for p in pods:
        assert not p.spec.scheduling_gates


def test_topology_aware_job_lands_in_one_rack(e2e_namespace, core_v1, batch_v1, custom_objects):
    """gold -> h100 flavor with Kueue Topology gpu-fabric: a rack-required gang of 4 x 8 GPUs."""
    ns = e2e_namespace
    name = f"tas-{uuid.uuid4().hex[:6]}"
    rack = "cloud.google.com/gce-topology-subblock"
    created = batch_v1.create_namespaced_job(
        ns,
        _job(
            name,
            "gold",
            parallelism=4,
            gpus=8,
            annotations={"kueue.x-k8s.io/podset-required-topology": rack},
        ),
    )
    assert created.spec.suspend is True
    wl = wait_for(
        "the TAS Workload to be admitted",
        lambda: (
            (w := workload_owned_by(custom_objects, ns, created.metadata.uid))
            and condition(w, "Admitted") == "True"
            and w
        ),
        timeout=60,
    )
    assert wl["status"]["admission"]["podSetAssignments"][0].get("topologyAssignment")
    pods = wait_for(
        "4 TAS pods Running",
        lambda: (
            p if all_running(p := pods_with_labels(core_v1, ns, f"job-name={name}"), 4) else None
        ),
        timeout=90,
    )
    racks = {_node_labels(core_v1, p.spec.node_name)[rack] for p in pods}
    assert len(racks) == 1, racks
    assert len({p.spec.node_name for p in pods}) == 4


def test_pod_completes_only_when_asked(e2e_namespace, core_v1):
    """KWOK stage e2e/kwok/pod-complete.yaml: the opt-in annotation finishes a pod."""
    ns = e2e_namespace
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name="finisher", annotations={"pod-complete.stage.kwok.x-k8s.io/delay": "1s"}
        ),
        spec=client.V1PodSpec(restart_policy="Never", containers=[_container(1)]),
    )
    core_v1.create_namespaced_pod(ns, pod)
    wait_for(
        "the pod to succeed",
        lambda: core_v1.read_namespaced_pod("finisher", ns).status.phase == "Succeeded",
        timeout=60,
    )
