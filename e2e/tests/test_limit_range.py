"""A pod's requests as the apiserver admits it, where Kueue's Workload template says less: a
namespace LimitRange's container defaults (the LimitRanger admission plugin fills in what a
container does not request) and pod-level `spec.resources` (PodLevelResources, on since
1.34), which replace the containers' sum for CPU and memory. Kueue applies the LimitRange to
its own copy for quota only; the stored template has neither the defaults nor a sum that
the pod-level figures override."""

from __future__ import annotations

import pytest
from builders import CHECK, GPU, job
from e2e_util import all_running, pods_with_labels, wait_for, workload_owned_by
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]


def _answer(custom_objects, ns: str, uid: str, what: str) -> dict:
    def answered():
        wl = workload_owned_by(custom_objects, ns, uid)
        entry = next((c for c in ((wl or {}).get("status") or {}).get("admissionChecks") or []
                      if c.get("name") == CHECK), {})
        return entry if entry.get("state") in ("Ready", "Rejected", "Retry") else None

    return wait_for(f"nexus to answer {what}", answered, timeout=90)


def _running_on_two_nodes(core_v1, ns: str, name: str) -> list[client.V1Pod]:
    pods = wait_for(f"both pods of {name} running", lambda: (
        p if all_running(p := pods_with_labels(core_v1, ns, f"job-name={name}"), 2) else None),
        timeout=60)
    assert len({p.spec.node_name for p in pods}) == 2, [p.spec.node_name for p in pods]
    return pods


def test_a_limit_range_default_request_is_placed_as_admitted(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """Two 4-GPU pods that request no CPU share one 8-GPU, 192-CPU H100 node; with the
    namespace's default of 100 CPUs per container they do not."""
    ns = nexus_namespace
    core_v1.create_namespaced_limit_range(ns, client.V1LimitRange(
        metadata=client.V1ObjectMeta(name="cpu-default"),
        spec=client.V1LimitRangeSpec(limits=[client.V1LimitRangeItem(
            type="Container", default_request={"cpu": "100"}, default={"cpu": "100"})])))
    defaulted = job("defaulted", "nexus-gold", 2, 4)
    del defaulted.spec.template.spec.containers[0].resources.requests["cpu"]
    uid = batch_v1.create_namespaced_job(ns, defaulted).metadata.uid

    entry = _answer(custom_objects, ns, uid, "the gang whose CPU the LimitRange sets")
    assert entry["state"] == "Ready", entry.get("message")
    for p in _running_on_two_nodes(core_v1, ns, "defaulted"):  # the apiserver defaulted it
        assert p.spec.containers[0].resources.requests["cpu"] == "100"


def test_pod_level_resources_are_placed_as_admitted(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """Two 4-GPU pods of 32Gi containers share one 2000Gi H100 node; their pod-level
    request of 1100Gi each (kube-scheduler counts it, not the containers' sum) does not."""
    ns = nexus_namespace
    pod_level = job("pod-level", "nexus-gold", 2, 4)
    pod_level.spec.template.spec.resources = client.V1ResourceRequirements(
        requests={"memory": "1100Gi"}, limits={"memory": "1100Gi"})
    uid = batch_v1.create_namespaced_job(ns, pod_level).metadata.uid

    entry = _answer(custom_objects, ns, uid, "the gang with pod-level memory")
    assert entry["state"] == "Ready", entry.get("message")
    for p in _running_on_two_nodes(core_v1, ns, "pod-level"):
        assert p.spec.resources.requests["memory"] == "1100Gi"
        assert GPU in p.spec.containers[0].resources.requests
