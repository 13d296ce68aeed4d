"""`nexus-admit plan` on a dump of the live control plane.

Kueue reserves quota for real Workloads on a ClusterQueue that lists a nexus AdmissionCheck
(its Active condition set as the controller will set it), so the Workloads stay Pending on
our check with quota reserved. `kubectl get ... -o yaml` of the real objects (v1beta2
Workloads, Nodes with GFD labels, NodeResourceTopologies, flavors, queues) is the snapshot;
the translation and the engine must place the feasible gang on the flavor Kueue assigned and
reject the impossible one with a message naming the VRAM.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from builders import (
    active_status,
    admission_check,
    cluster_queue,
    create_local_queue,
    flavor_quota,
    job,
)
from e2e_util import KUEUE_GROUP, KUEUE_VERSION, condition, kueue_object_gone, wait_for
from kubernetes import client

from nexus_admit.kube import labels as L

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240, func_only=True)]

CHECK_CONTROLLER = "kubenexus.io/placement"
A100 = "NVIDIA-A100-SXM4-40GB"
DUMP_KINDS = (
    "nodes,pods,workloads.kueue.x-k8s.io,clusterqueues,localqueues,resourceflavors,"
    "admissionchecks,topologies.kueue.x-k8s.io,noderesourcetopologies,placementconfigs"
)


def _job(name: str, queue: str, pods: int, gpus: int, vram: str) -> client.V1Job:
    return job(name, queue, pods, gpus, cpu="4", memory="16Gi", indexed=False,
               backoff_limit=None, annotations={L.ANN_GPU_MEMORY: vram})

def _cluster_object(custom: client.CustomObjectsApi, plural: str, body: dict) -> None:
    custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, body)


@pytest.fixture
def nexus_queue(custom_objects, batch_v1, e2e_namespace):
    """A silver ClusterQueue on the a100 flavor guarded by a nexus AdmissionCheck."""
    suffix = uuid.uuid4().hex[:6]
    check, cq = f"nexus-e2e-{suffix}", f"nexus-silver-{suffix}"
    _cluster_object(custom_objects, "admissionchecks", admission_check(check, CHECK_CONTROLLER))
    # What the controller does while healthy; without it Kueue deactivates the queue.
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    custom_objects.patch_cluster_custom_object_status(
        KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", check,
        active_status("Ready", "e2e stands in for the controller", now),
    )
    _cluster_object(custom_objects, "clusterqueues", cluster_queue(
        cq, [check], [flavor_quota("a100", 128)], tier="silver"))
    create_local_queue(custom_objects, e2e_namespace, "nexus", cq)
    yield "nexus"
    # Cluster-scoped objects outlive the namespace: remove them fully so later tests see
    # only the fleet's queues. Kueue keeps a ClusterQueue (finalizer) while Workloads use it,
    # so the Jobs go first, with their Workloads.
    for old in batch_v1.list_namespaced_job(e2e_namespace).items:
        batch_v1.delete_namespaced_job(
            old.metadata.name, e2e_namespace, propagation_policy="Foreground"
        )
    for plural, name in (("clusterqueues", cq), ("admissionchecks", check)):
        try:
            custom_objects.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)
        except client.ApiException as err:
            if err.status != 404:
                raise
        wait_for(
            f"{plural}/{name} deleted",
            lambda p=plural, n=name: kueue_object_gone(custom_objects, p, n),
            timeout=60,
        )


def _pending_on_check(custom, namespace: str, job: str) -> dict | None:
    items = custom.list_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads"
    )["items"]
    for wl in items:
        owners = wl["metadata"].get("ownerReferences", [])
        if not any(o.get("name") == job for o in owners):
            continue
        checks = wl.get("status", {}).get("admissionChecks", [])
        if (
            condition(wl, "QuotaReserved") == "True"
            and checks
            and all(c.get("state") == "Pending" for c in checks)
        ):
            return wl
    return None


def _a100_pods_elsewhere(cluster, ns: str) -> list[str]:
    out = cluster.kubectl("get", "pods", "-A", "-o", "json").stdout
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in json.loads(out)["items"]
        if p["metadata"]["namespace"] != ns
        and str((p.get("spec") or {}).get("nodeName", "")).startswith("a100-")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]


def test_plan_places_live_workloads_and_rejects_impossible_vram(
    e2e_cluster, batch_v1, custom_objects, e2e_namespace, nexus_queue, tmp_path: Path
):
    ns = e2e_namespace
    # earlier modules' namespaces may still be going away; their pods on A100 nodes would
    # leave this plan no room, which is not what it tests
    wait_for(
        "A100 nodes free of other tests' pods",
        lambda: not _a100_pods_elsewhere(e2e_cluster, ns),
        timeout=180,
    )
    batch_v1.create_namespaced_job(ns, _job("fits", nexus_queue, pods=4, gpus=2, vram="30Gi"))
    batch_v1.create_namespaced_job(ns, _job("too-big", nexus_queue, pods=1, gpus=1, vram="141Gi"))
    fits = wait_for(
        "workload 'fits' pending on the nexus check with quota reserved",
        lambda: _pending_on_check(custom_objects, ns, "fits"),
        90,
    )
    big = wait_for(
        "workload 'too-big' pending on the nexus check with quota reserved",
        lambda: _pending_on_check(custom_objects, ns, "too-big"),
        90,
    )

    dump = tmp_path / "cluster.yaml"
    dump.write_text(e2e_cluster.kubectl("get", DUMP_KINDS, "-A", "-o", "yaml").stdout)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nexus_admit.cli",
            "plan",
            "--snapshot",
            str(dump),
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    placements = {p["workload"]: p for p in json.loads(result.stdout)["placements"]}

    placed = placements[f"{ns}/{fits['metadata']['name']}"]
    assert placed["feasible"], placed["reason"]
    assert sum(a["pods"] for a in placed["assignments"]) == 4
    nodes = {a["node"] for a in placed["assignments"]}
    node_objs = json.loads(e2e_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    products = {
        n["metadata"]["name"]: n["metadata"]["labels"].get("nvidia.com/gpu.product")
        for n in node_objs
    }
    assert {products[n] for n in nodes} == {A100}, "must stay on the flavor Kueue assigned"
    assert placed["terms"]["tierMismatch"] == 0  # silver on A100 is the ideal class

    rejected = placements[f"{ns}/{big['metadata']['name']}"]
    assert not rejected["feasible"]
    assert "141 GiB" in rejected["reason"] and "VRAM" in rejected["reason"]
