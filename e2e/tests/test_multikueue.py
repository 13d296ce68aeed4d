"""nexus-admit under MultiKueue, on one plane: the manager's side and one worker's side.

Kueue's own MultiKueue e2e runs a manager and workers on separate apiservers; this plane has
one, so it plays one role per test with the objects each side really holds:

- as a manager: a ClusterQueue listing a MultiKueue check and a nexus check. The manager has
  no GPU nodes to place on, so the nexus check goes inactive once, saying where it belongs,
  and Kueue stops the ClusterQueue (instead of each Workload being refused).
- as a worker: a Workload as MultiKueue's manager writes it on a worker (its own copy, with
  the `kueue.x-k8s.io/multikueue-origin` label, no Job yet: all-at-once dispatch sends one to
  every worker). nexus places it; when the manager picks another worker it deletes this
  copy, and the copy's reservation must go at once, the GPUs free for the next gang.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
from builders import (
    GPU,
    RR_GROUP,
    RR_PLURAL,
    RR_VERSION,
    WORKER_IMAGE,
    cluster_queue,
    flavor_quota,
    job,
)
from e2e_util import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    all_running,
    condition,
    pods_with_labels,
    wait_for,
)
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

MULTIKUEUE = "kueue.x-k8s.io/multikueue"
ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
HOSTNAME = "kubernetes.io/hostname"
NODE = "h100-r3-7"  # one 8-GPU H100 node of e2e/fleet.yaml


def _create(custom: client.CustomObjectsApi, plural: str, body: dict[str, Any]) -> None:
    custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", **body})


def _active(obj: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c.get("type") == "Active"), {})


@pytest.fixture
def manager_queue(nexus_controller: Any, custom_objects) -> Any:
    """A MultiKueue manager's ClusterQueue: Kueue's MultiKueue check and a nexus check of
    its own (the suite's shared check must stay active for the other tests)."""
    suffix = uuid.uuid4().hex[:5]
    mk, ours, cq = f"mk-{suffix}", f"nexus-mgr-{suffix}", f"manager-{suffix}"
    _create(custom_objects, "admissionchecks", {
        "kind": "AdmissionCheck", "metadata": {"name": mk},
        "spec": {"controllerName": MULTIKUEUE, "parameters": {
            "apiGroup": KUEUE_GROUP, "kind": "MultiKueueConfig", "name": mk}}})
    _create(custom_objects, "admissionchecks", {
        "kind": "AdmissionCheck", "metadata": {"name": ours},
        "spec": {"controllerName": "kubenexus.io/placement"}})
    _create(custom_objects, "clusterqueues", cluster_queue(
        cq, [mk, ours], [flavor_quota("h100", cpu="100", memory="1000Gi")]))
    yield ours, cq
    for plural, name in (("clusterqueues", cq), ("admissionchecks", ours),
                         ("admissionchecks", mk)):
        with contextlib.suppress(client.ApiException):
            custom_objects.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)


def test_a_nexus_check_on_a_managers_cluster_queue_goes_inactive_saying_where_it_belongs(
    manager_queue, custom_objects
) -> None:
    ours, cq = manager_queue

    def inactive() -> dict[str, Any] | None:
        ac = custom_objects.get_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", ours)
        cond = _active(ac)
        return cond if cond.get("status") == "False" else None

    cond = wait_for("the nexus check inactive", inactive, timeout=60)
    assert cond["reason"] == "MultiKueueManager", cond
    assert f"ClusterQueue {cq}" in cond["message"], cond
    assert "worker clusters" in cond["message"], cond
    # Kueue stops the ClusterQueue: nothing of it is admitted to be refused one by one
    wait_for("Kueue to mark the manager's ClusterQueue inactive", lambda: condition(
        custom_objects.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues",
                                                 cq), "Active") == "False", timeout=60)


def _worker_copy(name: str, gpus: int) -> dict[str, Any]:
    """A Workload as MultiKueue's manager creates it on a worker (one pod set, no owner)."""
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "Workload",
        "metadata": {"name": name, "labels": {ORIGIN_LABEL: "manager-e2e"}},
        "spec": {
            "queueName": "nexus-gold",
            "podSets": [{"name": "main", "count": 1, "template": {"spec": {
                "restartPolicy": "Never",
                "nodeSelector": {HOSTNAME: NODE},
                "containers": [{"name": "worker", "image": WORKER_IMAGE, "resources": {
                    "requests": {"cpu": "8", "memory": "32Gi", GPU: str(gpus)},
                    "limits": {GPU: str(gpus)}}}]}}}],
        },
    }


def _reservations(custom: client.CustomObjectsApi, ns: str) -> list[dict[str, Any]]:
    return custom.list_namespaced_custom_object(RR_GROUP, RR_VERSION, ns, RR_PLURAL)["items"]


def test_a_worker_copy_the_manager_deletes_releases_its_gpus(
    nexus_namespace: str, custom_objects, batch_v1, core_v1
) -> None:
    ns = nexus_namespace
    custom_objects.create_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, ns, "workloads", _worker_copy("copy", 8))

    def placed() -> list[dict[str, Any]] | None:
        rrs = [rr for rr in _reservations(custom_objects, ns)
               if rr["metadata"]["name"].startswith("copy-")]
        return rrs or None

    (rr,) = wait_for("nexus to reserve the worker's copy", placed, timeout=90)
    assert {s["node"] for ps in rr["spec"]["podSets"] for s in ps["slots"]} == {NODE}

    # the manager picked another worker: it deletes this copy
    custom_objects.delete_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, ns, "workloads", "copy")
    wait_for("the copy's reservation released", lambda: not [
        r for r in _reservations(custom_objects, ns)
        if r["metadata"]["name"] == rr["metadata"]["name"]], timeout=30)

    # the whole node it held is free for the next gang
    gang = job("next", "nexus-gold", 1, 8)
    gang.spec.template.spec.node_selector = {HOSTNAME: NODE}
    batch_v1.create_namespaced_job(ns, gang)
    (pod,) = wait_for("the next gang running on the freed node", lambda: (
        p if all_running(p := pods_with_labels(core_v1, ns, "job-name=next"), 1) else None),
        timeout=90)
    assert pod.spec.node_name == NODE
