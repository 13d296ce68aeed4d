"""A pod set naming a RuntimeClass, read the way the apiserver admits its pods: the class's
`overhead.podFixed` joins each pod's requests (kube-scheduler counts it) and its
`scheduling.nodeSelector` joins the pod's; Kueue's Workload template carries neither."""

from __future__ import annotations

import contextlib
import uuid

import pytest
from builders import CHECK, job
from e2e_util import all_running, pods_with_labels, wait_for, workload_owned_by
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

RACK = "cloud.google.com/gce-topology-subblock"


@pytest.fixture
def runtime_class(kube_api):
    """A RuntimeClass adding 10 CPUs per pod and keeping its pods in rack h100-r2."""
    node_api = client.NodeV1Api(kube_api)
    name = f"sandboxed-{uuid.uuid4().hex[:5]}"
    node_api.create_runtime_class(client.V1RuntimeClass(
        metadata=client.V1ObjectMeta(name=name), handler="runc",
        overhead=client.V1Overhead(pod_fixed={"cpu": "10"}),
        scheduling=client.V1Scheduling(node_selector={RACK: "h100-r2"})))
    yield name
    with contextlib.suppress(client.ApiException):
        node_api.delete_runtime_class(name)


def test_a_runtime_classs_overhead_and_node_selector_are_placed_as_admitted(
    runtime_class, nexus_namespace, core_v1, batch_v1, custom_objects
):
    """Two 4-GPU pods of 90 CPUs share one 8-GPU, 192-CPU node; with the class's 10 CPUs
    each they do not, and the class keeps them in one rack."""
    ns = nexus_namespace
    sandboxed = job("sandboxed", "nexus-gold", 2, 4, cpu="90")
    sandboxed.spec.template.spec.runtime_class_name = runtime_class
    uid = batch_v1.create_namespaced_job(ns, sandboxed).metadata.uid

    def answered():
        wl = workload_owned_by(custom_objects, ns, uid)
        entry = next((c for c in ((wl or {}).get("status") or {}).get("admissionChecks") or []
                      if c.get("name") == CHECK), {})
        return entry if entry.get("state") in ("Ready", "Rejected", "Retry") else None

    entry = wait_for("nexus to answer the sandboxed gang", answered, timeout=90)
    assert entry["state"] == "Ready", entry.get("message")
    pods = wait_for("both pods running", lambda: (
        p if all_running(p := pods_with_labels(core_v1, ns, "job-name=sandboxed"), 2) else None),
        timeout=60)
    for p in pods:  # the apiserver added the overhead and the selector
        assert p.spec.overhead == {"cpu": "10"}
        assert p.spec.node_selector.get(RACK) == "h100-r2"
    nodes = {p.spec.node_name for p in pods}
    assert len(nodes) == 2, nodes
    assert all(n.startswith("h100-r2-") for n in nodes), nodes
