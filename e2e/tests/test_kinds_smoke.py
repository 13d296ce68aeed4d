"""Smoke tests for the workload controllers on the e2e control plane.

For each controller build.sh built (its version pinned in e2e/versions.env), one small
object of its kind goes through a ClusterQueue without nexus-admit's check: Kueue's
webhook suspends it, Kueue admits its Workload, the real controller creates the pods and
they run on KWOK nodes. This proves the harness (controllers, CRDs, webhooks, Kueue's
frameworks list); where nexus-admit places these kinds is tested elsewhere.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_util import (
    MPI_JOB_NAME_LABEL,
    MPIJOBS,
    QUEUE_LABEL,
    all_running,
    condition,
    mpijob,
    mpijob_deleted_after,
    require_controller,
    wait_for,
    workload_owned_by,
)
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240, func_only=True)]

QUEUE = "silver"  # a ClusterQueue without the nexus admission check (manifests/kueue.yaml)
IMAGE = "registry.invalid/nexus/worker:e2e"  # never pulled: KWOK fakes the kubelet


def _pod_spec(**extra: Any) -> dict[str, Any]:
    return {
        "restartPolicy": "Never",
        "containers": [
            {"name": "main", "image": IMAGE, "resources": {"requests": {"cpu": "100m"}}}
        ],
        **extra,
    }


def _admitted_and_running(
    custom_objects: client.CustomObjectsApi,
    core_v1: client.CoreV1Api,
    namespace: str,
    owner: dict[str, Any],
    selector: str,
    pods: int,
) -> list[client.V1Pod]:
    """The owner's Workload is admitted on QUEUE's ClusterQueue and `pods` pods matching
    `selector` run on KWOK nodes."""
    kind, uid = owner["kind"], owner["metadata"]["uid"]
    wl = wait_for(
        f"{kind} Workload admitted",
        lambda: (
            (w := workload_owned_by(custom_objects, namespace, uid))
            and condition(w, "Admitted") == "True"
            and w
        ),
        timeout=90,
    )
    assert wl["status"]["admission"]["clusterQueue"] == QUEUE
    running = wait_for(
        f"{kind}: {pods} pods Running",
        lambda: (
            (ps := core_v1.list_namespaced_pod(namespace, label_selector=selector).items)
            and all_running(ps, pods)
            and ps
        ),
        timeout=120,
    )
    for p in running:
        node = core_v1.read_node(p.spec.node_name)
        assert node.metadata.annotations.get("kwok.x-k8s.io/node") == "fake", p.metadata.name
    return running


def _create(
    custom_objects: client.CustomObjectsApi,
    namespace: str,
    group: str,
    version: str,
    plural: str,
    body: dict[str, Any],
) -> dict[str, Any]:
    body["metadata"].setdefault("labels", {})[QUEUE_LABEL] = QUEUE
    created = custom_objects.create_namespaced_custom_object(
        group, version, namespace, plural, body
    )
    # Kueue's webhook suspends what it will admit
    assert created["spec"].get("suspend") in (True, None), created["spec"].get("suspend")
    return created


def test_jobset_admitted_and_running(e2e_namespace, core_v1, custom_objects):
    require_controller("JOBSET_VERSION", "jobset", "jobsets.jobset.x-k8s.io", custom_objects)
    name = f"js-{uuid.uuid4().hex[:5]}"
    job = {
        "parallelism": 1,
        "completions": 1,
        "backoffLimit": 0,
        "template": {"spec": _pod_spec()},
    }
    js = _create(
        custom_objects,
        e2e_namespace,
        "jobset.x-k8s.io",
        "v1alpha2",
        "jobsets",
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": name},
            "spec": {
                "replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": job}}]
            },
        },
    )
    assert js["spec"]["suspend"] is True
    pods = _admitted_and_running(
        custom_objects, core_v1, e2e_namespace, js, f"jobset.sigs.k8s.io/jobset-name={name}", 2
    )
    # JobSet's own pod webhook labelled them (one pod per replicated Job index)
    assert sorted(p.metadata.labels["jobset.sigs.k8s.io/job-index"] for p in pods) == ["0", "1"]


def test_leaderworkerset_admitted_and_running(e2e_namespace, core_v1, custom_objects):
    require_controller(
        "LWS_VERSION", "lws", "leaderworkersets.leaderworkerset.x-k8s.io", custom_objects
    )
    name = f"lws-{uuid.uuid4().hex[:5]}"
    template = {"spec": _pod_spec(restartPolicy="Always")}
    lws = _create(
        custom_objects,
        e2e_namespace,
        "leaderworkerset.x-k8s.io",
        "v1",
        "leaderworkersets",
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {"name": name},
            "spec": {
                "replicas": 1,
                "leaderWorkerTemplate": {
                    "size": 2,
                    "leaderTemplate": template,
                    "workerTemplate": template,
                },
            },
        },
    )
    pods = _admitted_and_running(
        custom_objects,
        core_v1,
        e2e_namespace,
        lws,
        f"leaderworkerset.sigs.k8s.io/name={name}",
        2,
    )
    # LWS's pod webhook: the leader is worker 0 of group 0, its worker is 1
    labels = sorted(
        (
            p.metadata.labels["leaderworkerset.sigs.k8s.io/group-index"],
            p.metadata.labels["leaderworkerset.sigs.k8s.io/worker-index"],
        )
        for p in pods
    )
    assert labels == [("0", "0"), ("0", "1")]


@pytest.fixture
def torch_runtime(e2e_cluster, custom_objects):
    """Trainer's sample ClusterTrainingRuntime `torch-distributed`, from the module build.sh
    built Trainer from (manifests/trainer/runtimes)."""
    require_controller(
        "TRAINER_VERSION", "trainer", "trainjobs.trainer.kubeflow.org", custom_objects
    )
    if not hasattr(e2e_cluster, "info"):
        pytest.skip("Trainer's runtime sample comes from the plane's binary directory")
    bin_dir = Path(e2e_cluster.info()["bin"])
    runtime = yaml.safe_load(
        (bin_dir / "manifests" / "trainer" / "runtimes" / "torch_distributed.yaml").read_text()
    )
    e2e_cluster.apply([runtime])
    yield runtime["metadata"]["name"]


def test_trainjob_admitted_and_running(e2e_namespace, core_v1, custom_objects, torch_runtime):
    name = f"tj-{uuid.uuid4().hex[:5]}"
    tj = _create(
        custom_objects,
        e2e_namespace,
        "trainer.kubeflow.org",
        "v1alpha1",
        "trainjobs",
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": name},
            "spec": {
                "runtimeRef": {
                    "apiGroup": "trainer.kubeflow.org",
                    "kind": "ClusterTrainingRuntime",
                    "name": torch_runtime,
                },
                "trainer": {
                    "image": IMAGE,
                    "numNodes": 1,
                    "resourcesPerNode": {"requests": {"cpu": "100m"}},
                },
            },
        },
    )
    assert tj["spec"]["suspend"] is True
    # Trainer runs a TrainJob as a JobSet of the same name
    _admitted_and_running(
        custom_objects, core_v1, e2e_namespace, tj, f"jobset.sigs.k8s.io/jobset-name={name}", 1
    )


def test_rayjob_admitted_and_running(e2e_namespace, core_v1, custom_objects):
    require_controller("KUBERAY_VERSION", "kuberay", "rayjobs.ray.io", custom_objects)
    name = f"ray-{uuid.uuid4().hex[:5]}"

    def group(container: str) -> dict[str, Any]:
        return {
            "rayStartParams": {},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": container,
                            "image": IMAGE,
                            "resources": {"requests": {"cpu": "100m"}},
                        }
                    ]
                }
            },
        }

    rj = _create(
        custom_objects,
        e2e_namespace,
        "ray.io",
        "v1",
        "rayjobs",
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "metadata": {"name": name},
            "spec": {
                "entrypoint": "python -c 'print(1)'",
                # Kueue's webhook: a Kueue-managed RayJob must delete its cluster at the end
                "shutdownAfterJobFinishes": True,
                "rayClusterSpec": {
                    "headGroupSpec": group("ray-head"),
                    "workerGroupSpecs": [
                        {
                            **group("ray-worker"),
                            "groupName": "workers",
                            "replicas": 1,
                            "minReplicas": 1,
                            "maxReplicas": 1,
                        }
                    ],
                },
            },
        },
    )
    assert rj["spec"]["suspend"] is True
    # KubeRay creates the RayCluster (named in the RayJob's status) once Kueue admits it
    cluster = wait_for(
        "RayJob's RayCluster",
        lambda: (
            custom_objects.get_namespaced_custom_object(
                "ray.io", "v1", e2e_namespace, "rayjobs", name
            ).get("status")
            or {}
        ).get("rayClusterName"),
        timeout=90,
    )
    # its head and worker pods; the submitter Job KubeRay starts next is not counted
    _admitted_and_running(
        custom_objects,
        core_v1,
        e2e_namespace,
        rj,
        f"ray.io/cluster={cluster},ray.io/node-type in (head,worker)",
        2,
    )


def test_mpijob_admitted_and_running(e2e_namespace, core_v1, custom_objects):
    require_controller("MPI_OPERATOR_VERSION", "mpi-operator", "mpijobs.kubeflow.org",
                       custom_objects)
    name = f"mpi-{uuid.uuid4().hex[:5]}"

    with mpijob_deleted_after(custom_objects, core_v1, e2e_namespace, name):
        mj = _create(custom_objects, e2e_namespace, *MPIJOBS,
                     mpijob(name, _pod_spec(), _pod_spec(), 1))
        assert mj["spec"]["runPolicy"]["suspend"] is True  # an MPIJob's suspend: runPolicy
        # the launcher (through a batch Job the operator makes) and the worker
        _admitted_and_running(custom_objects, core_v1, e2e_namespace, mj,
                              f"{MPI_JOB_NAME_LABEL}={name}", 2)
