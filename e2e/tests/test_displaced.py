"""Issue 57 item 2 on the real control plane: a pod nexus-admit does not place, bound onto
capacity a reservation holds before the gang's pods exist.

kube-scheduler does not see our reservations. Gangs G and H are reserved on one node each
while another AdmissionCheck of their ClusterQueue stays Pending (Kueue keeps their Jobs
suspended: no pods). A plain pod of no queue, or a Job of a queue without the nexus check
(Kueue-only; on an H100 node its TAS flavor assigns the node), pinned by nodeSelector to
G's node, is bound there and takes all its GPUs. G's slot moves to another node of its
rack (the reservation patched in place, Event `SlotMoved`, our Ready kept), H's
reservation is untouched, and once the other check is Ready both gangs run on their
slots. Before: nothing moved; G's pods were pinned to the taken node, stayed
unschedulable, and G went back through Retry after the grace. Checked on the cluster's
own objects.
"""

from __future__ import annotations

import time

import pytest
from builders import GPU, SLOT, create_local_queue, job
from e2e_util import condition, wait_for
from kubernetes import client
from test_changing_fleet import _sibling_ready, queue_with_a_sibling_check
from test_controller import (
    RACK,
    check_entry,
    event,
    reservation_of,
    running,
    slots_of,
    wait_check,
    workload_of,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

HOSTNAME = "kubernetes.io/hostname"


def _plain_pod(name: str, node: str, gpus: int) -> client.V1Pod:
    """A pod of no queue, for kube-scheduler alone, asking `node` by nodeSelector."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_selector={HOSTNAME: node},
            containers=[client.V1Container(
                name="c", image="registry.invalid/other:1",
                resources=client.V1ResourceRequirements(
                    requests={GPU: str(gpus), "cpu": "1", "memory": "1Gi"},
                    limits={GPU: str(gpus)}))]))


# the Kueue-only ClusterQueue (e2e/manifests/kueue.yaml, no nexus check) whose flavor
# holds a node of each product: gold's h100 is a TAS flavor (Kueue TAS assigns the node)
KUEUE_ONLY = {"NVIDIA-H100-80GB-HBM3": "gold", "NVIDIA-A100-SXM4-40GB": "silver",
              "NVIDIA-L40S": "bronze"}


def _take_node(core_v1, batch_v1, custom_objects, ns: str, node: str, by: str) -> str:
    """Bind 8 GPUs of `node` by something nexus does not place: a plain pod of no queue, or
    a Job of a queue without the nexus check (Kueue admits it; kube-scheduler binds it).
    The bound pod's name."""
    if by == "plain pod":
        core_v1.create_namespaced_pod(ns, _plain_pod("hog", node, 8))
        selector = "metadata.name=hog"
    else:
        product = core_v1.read_node(node).metadata.labels["nvidia.com/gpu.product"]
        create_local_queue(custom_objects, ns, "kueue-only", KUEUE_ONLY[product])
        hog = job("hog", "kueue-only", pods=1, gpus=8)
        hog.spec.template.spec.node_selector = {HOSTNAME: node}
        batch_v1.create_namespaced_job(ns, hog)
        selector = None

    def bound() -> client.V1Pod | None:
        pods = (core_v1.list_namespaced_pod(ns, field_selector=selector).items if selector
                else core_v1.list_namespaced_pod(ns, label_selector="job-name=hog").items)
        return next((p for p in pods if p.spec.node_name), None)

    pod = wait_for(f"the {by} bound onto G's node", bound, timeout=90, interval=0.2)
    assert pod.spec.node_name == node
    return str(pod.metadata.name)


@pytest.mark.parametrize("by", ["plain pod", "Job of a queue without the check"])
def test_capacity_taken_from_a_reservation_moves_only_the_displaced_gangs_slot(
    nexus_namespace, e2e_cluster, core_v1, batch_v1, custom_objects, by
):
    ns = nexus_namespace
    with queue_with_a_sibling_check(custom_objects, ns) as queue:
        batch_v1.create_namespaced_job(ns, job("g", queue, pods=1, gpus=8))
        g_wl = wait_check(custom_objects, ns, "g", ("Ready",))
        batch_v1.create_namespaced_job(ns, job("h", queue, pods=1, gpus=8))
        h_wl = wait_check(custom_objects, ns, "h", ("Ready",))
        g_rr, h_rr = reservation_of(custom_objects, ns, g_wl), reservation_of(custom_objects,
                                                                              ns, h_wl)
        taken = slots_of(g_rr)["main/0"]["node"]
        rack = core_v1.read_node(taken).metadata.labels[RACK]
        assert slots_of(h_rr)["main/0"]["node"] != taken

        hog = _take_node(core_v1, batch_v1, custom_objects, ns, taken, by)
        t0 = time.monotonic()

        def moved_off() -> dict | None:
            now = workload_of(custom_objects, ns, "g")
            if check_entry(now).get("state") != "Ready":  # sent back through Retry
                raise AssertionError(f"not moved: {check_entry(now)}")
            r = reservation_of(custom_objects, ns, now)
            return r if slots_of(r)["main/0"]["node"] != taken else None

        moved = wait_for("G's slot moved off the taken node", moved_off, timeout=60,
                         interval=0.2)
        t_moved = time.monotonic() - t0
        assert moved["metadata"]["uid"] == g_rr["metadata"]["uid"], "the same reservation"
        to = slots_of(moved)["main/0"]["node"]
        assert core_v1.read_node(to).metadata.labels[RACK] == rack, "within its rack"
        assert event(core_v1, ns, "SlotMoved", f"moved from node {taken}")
        h_now = reservation_of(custom_objects, ns, workload_of(custom_objects, ns, "h"))
        assert h_now["metadata"]["uid"] == h_rr["metadata"]["uid"], "H keeps its reservation"
        assert h_now["spec"] == h_rr["spec"], "and its slots"

        for name in ("g", "h"):
            _sibling_ready(e2e_cluster, ns, workload_of(custom_objects, ns, name))
        (g_pod,) = wait_for("G Running on its moved slot", lambda: running(core_v1, ns, "g", 1),
                            timeout=90)
        t_running = time.monotonic() - t0
        (h_pod,) = wait_for("H Running", lambda: running(core_v1, ns, "h", 1), timeout=60)
        assert g_pod.spec.node_name == to != taken
        assert h_pod.spec.node_name == slots_of(h_rr)[h_pod.metadata.annotations[SLOT]]["node"]
        for name in ("g", "h"):
            wl = workload_of(custom_objects, ns, name)
            assert condition(wl, "Admitted") == "True"
            assert check_entry(wl).get("retryCount") in (None, 0), f"{name} never evicted"
        for name in ("g", "h"):
            batch_v1.delete_namespaced_job(name, ns, propagation_policy="Background")
        if by == "plain pod":
            core_v1.delete_namespaced_pod(hog, ns, grace_period_seconds=0)
        else:
            batch_v1.delete_namespaced_job("hog", ns, propagation_policy="Background")
    print(f"\n[displaced] {by} bound -> G's slot moved {t_moved:.1f}s, G Running "
          f"{t_running:.1f}s (the other check answered at once)")
