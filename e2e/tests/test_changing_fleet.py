"""Issue 56 on the real control plane: a fleet that changes under nexus-admit.

A Workload no node may take now (its class cordoned, its GPU product not there yet) waits
with its check Pending, keeps its quota and is not deactivated, and runs once a node
comes; a reservation made while another check of the ClusterQueue is still Pending holds
past the reservation TTL, and the pods run on its nodes once that check says Ready.
Checked against the cluster's own objects, never the controller's view.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import fleet as fleet_mod
import pytest
from builders import active_status, admission_check, cluster_queue, flavor_quota
from e2e_util import KUEUE_GROUP, KUEUE_VERSION, condition, kueue_object_gone, wait_for
from kubernetes import client
from test_controller import (
    CHECK,
    L40S,
    PRODUCT,
    RR_GROUP,
    RR_PLURAL,
    RR_VERSION,
    SLOT,
    check_entry,
    job,
    job_pods,
    reservation_of,
    running,
    slots_of,
    wait_check,
    workload_of,
)
from test_hardening import reservation_ttl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

WAITING = "waiting for nodes:"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _waiting_event(core, ns: str, workload: str) -> client.CoreV1Event | None:
    for e in core.list_namespaced_event(ns).items:
        if e.involved_object.name == workload and e.reason == "PlacementWaiting":
            return e
    return None


def _stays_waiting(custom, core, ns: str, job_name: str) -> dict[str, Any]:
    """The check Pending with the wait's message, its Event posted, the Workload keeping
    its quota and active (not Rejected, not deactivated, not evicted)."""
    wl = wait_for(
        f"{job_name}: check Pending, waiting for nodes",
        lambda: (w := workload_of(custom, ns, job_name))
        and check_entry(w).get("message", "").startswith(WAITING) and w,
        timeout=90,
    )
    entry = check_entry(wl)
    assert entry["state"] == "Pending", entry
    event = wait_for("the PlacementWaiting Event",
                     lambda: _waiting_event(core, ns, wl["metadata"]["name"]))
    assert event.message == entry["message"] and event.type == "Normal"
    assert wl["spec"].get("active") is not False
    assert condition(wl, "QuotaReserved") == "True"
    assert condition(wl, "Evicted") != "True"
    return wl


@contextlib.contextmanager
def cordoned(core, product: str) -> Iterator[list[str]]:
    """Every node of `product` cordoned; uncordoned again at the end."""
    names = [n.metadata.name for n in core.list_node(label_selector=f"{PRODUCT}={product}").items]
    assert names, product
    for name in names:
        core.patch_node(name, {"spec": {"unschedulable": True}})
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(client.ApiException):
                core.patch_node(name, {"spec": {"unschedulable": None}})


def test_a_class_whose_nodes_are_all_cordoned_waits_and_runs_after_uncordon(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """Item 1. Before: Rejected ("fits no node in the cluster (16 unschedulable, ...)"),
    so Kueue deactivated the Workload, and it stayed so after the uncordon."""
    ns = nexus_namespace
    with cordoned(core_v1, L40S) as names:
        wants_l40s = job("l40s-only", "nexus-bronze", pods=1, gpus=1)
        wants_l40s.spec.template.spec.node_selector = {PRODUCT: L40S}
        batch_v1.create_namespaced_job(ns, wants_l40s)
        waited = _stays_waiting(custom_objects, core_v1, ns, "l40s-only")
        message = check_entry(waited)["message"]
        assert f"{len(names)} unschedulable" in message, message
        assert not running(core_v1, ns, "l40s-only", 1)
    (pod,) = wait_for("l40s-only Running after the uncordon",
                      lambda: running(core_v1, ns, "l40s-only", 1), timeout=120)
    assert pod.spec.node_name in names
    wl = workload_of(custom_objects, ns, "l40s-only")
    assert wl["metadata"]["uid"] == waited["metadata"]["uid"], "the same Workload"
    assert condition(wl, "Admitted") == "True"
    assert check_entry(wl).get("retryCount") in (None, 0), "never evicted"


H200 = "NVIDIA-H200-141GB-HBM3e"


@contextlib.contextmanager
def joining_node(core, custom, name: str, product: str) -> Iterator[dict[str, Any]]:
    """The manifests of a KWOK node of the H100 pool's shape with another GPU product, and
    of its NodeResourceTopology, for the test to create when it likes; both deleted at the
    end, so the module's fleet is unchanged."""
    template = next(n for n in fleet_mod.expand(fleet_mod.load()) if n.pool == "h100")
    fake = dataclasses.replace(
        template, name=name,
        labels={**template.labels, "kubernetes.io/hostname": name, PRODUCT: product},
    )
    state: dict[str, Any] = {"node": fleet_mod.node_manifest(fake),
                             "nrt": fleet_mod.nrt_manifest(fake)}
    try:
        yield state
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_node(name)
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(
                "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies", name)


def test_a_gpu_product_whose_node_joins_later_waits_for_it(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """Item 1. Before: Rejected ("fits no node in the cluster (64 selector/affinity)"),
    and deactivated for good; the node that joined later was never used."""
    ns = nexus_namespace
    name = f"h200-late-{int(time.time()) % 100000}"
    with joining_node(core_v1, custom_objects, name, H200) as later:
        wants_h200 = job("h200", "nexus-gold", pods=1, gpus=8)
        wants_h200.spec.template.spec.node_selector = {PRODUCT: H200}
        batch_v1.create_namespaced_job(ns, wants_h200)
        wl = _stays_waiting(custom_objects, core_v1, ns, "h200")
        assert "selector/affinity" in check_entry(wl)["message"]
        core_v1.create_node(later["node"])
        custom_objects.create_cluster_custom_object(
            "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies", later["nrt"])
        (pod,) = wait_for("h200 Running on the node that joined",
                          lambda: running(core_v1, ns, "h200", 1), timeout=120)
        assert pod.spec.node_name == name
        wl = workload_of(custom_objects, ns, "h200")
        assert check_entry(wl)["state"] == "Ready"
        assert check_entry(wl).get("retryCount") in (None, 0), "never evicted"
        batch_v1.delete_namespaced_job("h200", ns, propagation_policy="Background")


def test_a_not_ready_node_takes_no_placement_whatever_the_pod_tolerates(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """Item 2. A node of its own GPU product whose Ready condition is False (no kubelet
    drives it); the pod tolerates every taint, the node.kubernetes.io/not-ready one too.
    Before: placed and pinned there, where nothing runs it. Now: it waits, and is placed
    and bound there once the node reports Ready (the test plays its kubelet)."""
    ns = nexus_namespace
    product = "NVIDIA-H100-NVL"
    name = f"h100nvl-nr-{int(time.time()) % 100000}"
    def report(ready: str, reason: str) -> None:
        core_v1.patch_node_status(name, {"status": {"conditions": [{
            "type": "Ready", "status": ready, "reason": reason, "message": "the e2e test",
            "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}]}})

    with joining_node(core_v1, custom_objects, name, product) as later:
        del later["node"]["metadata"]["annotations"]  # not KWOK's: the test reports
        core_v1.create_node(later["node"])
        report("False", "KubeletNotReady")
        anywhere = job("nr", "nexus-gold", pods=1, gpus=8)
        anywhere.spec.template.spec.node_selector = {PRODUCT: product}
        anywhere.spec.template.spec.tolerations = [client.V1Toleration(operator="Exists")]
        batch_v1.create_namespaced_job(ns, anywhere)
        wl = _stays_waiting(custom_objects, core_v1, ns, "nr")
        assert "1 unschedulable" in check_entry(wl)["message"], check_entry(wl)
        report("True", "KubeletReady")
        wl = wait_check(custom_objects, ns, "nr", ("Ready",), timeout=60)
        (slot,) = slots_of(reservation_of(custom_objects, ns, wl)).values()
        assert slot["node"] == name
        wait_for("nr's pod bound to its node", lambda: [
            p for p in job_pods(core_v1, ns, "nr") if p.spec.node_name == name], timeout=60)
        batch_v1.delete_namespaced_job("nr", ns, propagation_policy="Background")


SIBLING = "e2e-sibling"
TWO_CHECKS = "e2e-two-checks"


@contextlib.contextmanager
def queue_with_a_sibling_check(custom, ns: str) -> Iterator[str]:
    """A gold ClusterQueue (the gpu-any flavor) listing our check and `SIBLING`, an
    AdmissionCheck no controller answers but the test (it sets its Active condition and,
    later, its entry on the Workload), and a LocalQueue of the same name in `ns`.
    An earlier test's pair is deleted as it leaves, but Kueue's finalizers keep it until
    that test's namespace (its Workloads) is gone: wait for that first."""
    for plural, name in (("clusterqueues", TWO_CHECKS), ("admissionchecks", SIBLING)):
        wait_for(f"an earlier test's {name} gone",
                 lambda p=plural, n=name: kueue_object_gone(custom, p, n), timeout=180)
    custom.create_cluster_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, "admissionchecks",
        admission_check(SIBLING, "e2e.kubenexus.io/answered-by-the-test"))
    custom.patch_cluster_custom_object_status(
        KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", SIBLING,
        active_status("ByTheTest", "answered by the e2e test", _now()))
    custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", cluster_queue(
        TWO_CHECKS, [CHECK, SIBLING], [flavor_quota("gpu-any")], tier="gold"))
    custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, ns, "localqueues", {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "LocalQueue",
        "metadata": {"name": TWO_CHECKS, "namespace": ns},
        "spec": {"clusterQueue": TWO_CHECKS},
    })
    wait_for(f"ClusterQueue {TWO_CHECKS} active", lambda: condition(
        custom.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues",
                                         TWO_CHECKS), "Active") == "True", timeout=60)
    try:
        yield TWO_CHECKS
    finally:
        with contextlib.suppress(client.ApiException):
            custom.delete_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, ns, "localqueues", TWO_CHECKS)
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", TWO_CHECKS)
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", SIBLING)


def _sibling_ready(e2e_cluster, ns: str, wl: dict[str, Any]) -> None:
    """The sibling check's entry Ready, as its controller would write it (its own field
    manager, only its own entry, taken over from Kueue, which made it Pending)."""
    e2e_cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--subresource=status",
        "--field-manager=e2e-sibling", "-f", "-", input=(
            f"apiVersion: {KUEUE_GROUP}/{KUEUE_VERSION}\nkind: Workload\n"
            f"metadata: {{name: {wl['metadata']['name']}, namespace: {ns}}}\n"
            f"status:\n  admissionChecks:\n  - name: {SIBLING}\n    state: Ready\n"
            f"    message: answered late by the test\n    lastTransitionTime: '{_now()}'\n"
        ))


def test_a_sibling_check_answered_after_the_ttl_runs_the_pods_on_their_reserved_nodes(
    nexus_namespace, e2e_cluster, core_v1, batch_v1, custom_objects
):
    """Item 3. Before: the reservation's `spec.expiresAt` (the TTL from its creation)
    lapsed while the sibling was still Pending: nexus answered Retry, Kueue evicted the
    Workload and reset the sibling to Pending, and the Workload never ran on its own.

    A 15 s TTL; the sibling answers more than twice that after our Ready. Now: our check
    stays Ready and the reservation the same object meanwhile, and once the sibling is
    Ready the pods run on the reservation's nodes."""
    ns = nexus_namespace
    ttl = 15
    with reservation_ttl(custom_objects, ttl), queue_with_a_sibling_check(custom_objects, ns):
        batch_v1.create_namespaced_job(ns, job("late", TWO_CHECKS, pods=2, gpus=8))
        wl = wait_check(custom_objects, ns, "late", ("Ready",))
        rr = reservation_of(custom_objects, ns, wl)
        assert rr["spec"]["ttlSeconds"] == ttl, "placed before the short TTL was seen"
        ready_at = _time(check_entry(wl)["lastTransitionTime"])
        wait_for("more than twice the TTL since our Ready",
                 lambda: datetime.now(UTC) > ready_at + timedelta(seconds=2 * ttl + 5),
                 timeout=90, interval=1)
        wl = workload_of(custom_objects, ns, "late")
        assert check_entry(wl)["state"] == "Ready", check_entry(wl)
        assert condition(wl, "Evicted") != "True" and condition(wl, "Admitted") != "True"
        held = custom_objects.get_namespaced_custom_object(
            RR_GROUP, RR_VERSION, ns, RR_PLURAL, rr["metadata"]["name"])
        assert held["metadata"]["uid"] == rr["metadata"]["uid"], "the same reservation"

        _sibling_ready(e2e_cluster, ns, wl)
        pods = wait_for("late Running", lambda: running(core_v1, ns, "late", 2), timeout=120)
        slots = slots_of(rr)
        for p in pods:
            assert p.spec.node_name == slots[p.metadata.annotations[SLOT]]["node"]
        wl = workload_of(custom_objects, ns, "late")
        assert condition(wl, "Admitted") == "True"
        assert check_entry(wl).get("retryCount") in (None, 0), "never evicted"
        batch_v1.delete_namespaced_job("late", ns, propagation_policy="Background")
