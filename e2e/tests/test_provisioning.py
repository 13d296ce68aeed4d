"""Issue 56 item 2 on the real control plane: autoscaling through Kueue's ProvisioningRequest
admission check.

Kueue v0.19.2 runs its real provisioning controller (the ProvisioningRequest CRD is
installed before it starts); e2e/provisioner.py stands in for cluster-autoscaler. A
ClusterQueue lists Kueue's check and ours; nexus waits for Kueue's to be Ready, then places
the gang on the nodes it selects. Checked against the cluster's own objects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import fleet as fleet_mod
import pytest
from builders import cluster_queue, flavor_quota
from e2e_util import KUEUE_GROUP, KUEUE_VERSION, condition, kueue_object_gone, wait_for
from kubernetes import client
from provisioner import (
    ATOMIC_SCALE_UP,
    CHECK_CAPACITY,
    GROUP,
    PLURAL,
    VERSION,
    Provisioner,
    plural_of,
)
from test_controller import (
    CHECK,
    PRODUCT,
    check_entry,
    job,
    reservations,
    running,
    workload_of,
)
from test_hardening import reservation_ttl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

PROV = "e2e-provisioning"
POOL = "scheduling.kubenexus.io/e2e-pool"
H100 = "NVIDIA-H100-80GB-HBM3"
SCALED_POOL = "h100-scaled"  # no node until the provisioner adds them


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@contextlib.contextmanager
def queue_with_provisioning(custom, ns: str, cls: str, pool_from_detail: bool) -> Iterator[str]:
    """A gold ClusterQueue (flavor gpu-any) listing Kueue's provisioning check `PROV` and
    ours, its ProvisioningRequestConfig of class `cls` (with `pool_from_detail`: the pods'
    node pool from the request's `pool` detail, as GKE's node pools are), and a LocalQueue
    of the same name in `ns`."""
    spec: dict[str, Any] = {"provisioningClassName": cls, "managedResources": ["nvidia.com/gpu"]}
    if pool_from_detail:
        spec["podSetUpdates"] = {"nodeSelector": [
            {"key": POOL, "valueFromProvisioningClassDetail": "pool"}]}
    objects = [
        ("provisioningrequestconfigs", {"kind": "ProvisioningRequestConfig",
                                        "metadata": {"name": PROV}, "spec": spec}),
        ("admissionchecks", {"kind": "AdmissionCheck", "metadata": {"name": PROV}, "spec": {
            "controllerName": "kueue.x-k8s.io/provisioning-request",
            "parameters": {"apiGroup": KUEUE_GROUP, "kind": "ProvisioningRequestConfig",
                           "name": PROV}}}),
        ("clusterqueues", cluster_queue(PROV, [PROV, CHECK], [flavor_quota("gpu-any")],
                                        tier="gold")),
    ]
    try:
        for plural, body in objects:
            custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, {
                "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", **body})
        custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, ns, "localqueues", {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "LocalQueue",
            "metadata": {"name": PROV, "namespace": ns}, "spec": {"clusterQueue": PROV},
        })
        wait_for(f"ClusterQueue {PROV} active (Kueue's provisioning check Active)",
                 lambda: condition(custom.get_cluster_custom_object(
                     KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", PROV), "Active") == "True",
                 timeout=60)
        yield PROV
    finally:
        with contextlib.suppress(client.ApiException):
            custom.delete_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, ns, "localqueues", PROV)
        for plural, _ in reversed(objects):
            with contextlib.suppress(client.ApiException):
                custom.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, PROV)
        # gone before the next test makes them again (Kueue's finalizers hold a
        # ClusterQueue until its Workloads are gone, and an AdmissionCheck until then)
        for plural, _ in objects:
            wait_for(f"{plural} {PROV} gone",
                     lambda plural=plural: kueue_object_gone(custom, plural, PROV), timeout=90)


def scaled_h100_node(name: str) -> list[dict[str, Any]]:
    """A KWOK node of the H100 pool's shape in the pool `SCALED_POOL` (a rack of its own),
    with its NodeResourceTopology: what the provisioner adds."""
    template = next(n for n in fleet_mod.expand(fleet_mod.load()) if n.pool == "h100")
    labels = {**template.labels, "kubernetes.io/hostname": name, POOL: SCALED_POOL}
    for level, value in (("rack", f"{SCALED_POOL}-r0"), ("block", f"{SCALED_POOL}-b0")):
        labels[fleet_mod.load()["topologyLabels"][level]] = value
    fake = dataclasses.replace(template, name=name, pool=SCALED_POOL, labels=labels)
    return [fleet_mod.node_manifest(fake), fleet_mod.nrt_manifest(fake)]


def _remove(core, custom, objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        with contextlib.suppress(client.ApiException):
            if obj["kind"] == "Node":
                core.delete_node(obj["metadata"]["name"])
            else:
                group, version = obj["apiVersion"].split("/")
                custom.delete_cluster_custom_object(
                    group, version, plural_of(obj), obj["metadata"]["name"])


def _requests(custom, ns: str) -> list[dict[str, Any]]:
    return custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]


def _events(core, ns: str, reason: str) -> list[str]:
    return [e.message for e in core.list_namespaced_event(ns).items if e.reason == reason]


def _entry(wl: dict[str, Any], name: str) -> dict[str, Any]:
    return next((c for c in wl["status"].get("admissionChecks") or [] if c["name"] == name), {})


def test_a_gang_for_a_pool_at_zero_runs_on_the_nodes_a_slow_provisioner_adds(
    nexus_namespace, nexus_controller, kube_api, core_v1, batch_v1, custom_objects
):
    """best-effort-atomic-scale-up, slower than nexus's reservation TTL, its nodes joining
    5 s after it says Provisioned. Before: nexus
    placed the gang at once on the H100 nodes that had room (check Ready, reservation
    made), while the ProvisioningRequest was still provisioning; past the TTL it answered
    Retry, whose eviction deleted the request; and pods pinned to the existing nodes could
    never meet the provisioning check's nodeSelector (the scaled pool)."""
    ns, ttl, delay = nexus_namespace, 10, 30
    prov = Provisioner(kube_api, node_template=scaled_h100_node, scale_up_delay=delay,
                       join_delay=5, details={"pool": SCALED_POOL})
    with (reservation_ttl(custom_objects, ttl),
          queue_with_provisioning(custom_objects, ns, ATOMIC_SCALE_UP, True) as queue,
          prov.running()):
        try:
            gang = job("scaled", queue, pods=2, gpus=8)
            gang.spec.template.spec.node_selector = {PRODUCT: H100}
            batch_v1.create_namespaced_job(ns, gang)
            wl = wait_for("our check waiting for the provisioning check", lambda: (
                (w := workload_of(custom_objects, ns, "scaled"))
                and check_entry(w).get("message", "").startswith(
                    f"waiting for the provisioning check {PROV} to be Ready") and w),
                timeout=90)
            assert check_entry(wl)["state"] == "Pending"
            (request,) = wait_for("the ProvisioningRequest", lambda: _requests(custom_objects, ns))
            # killed and started again while it waits: it resumes the wait, nothing doubled
            nexus_controller.stop(signal.SIGKILL)
            nexus_controller.start()
            # past the TTL while provisioning: nothing held, nothing evicted, same request
            waited_from = datetime.now(UTC)
            wait_for("more than the TTL of waiting",
                     lambda: datetime.now(UTC) > waited_from + timedelta(seconds=ttl + 5),
                     timeout=60, interval=1)
            wl = workload_of(custom_objects, ns, "scaled")
            assert check_entry(wl)["state"] == "Pending", check_entry(wl)
            assert condition(wl, "Evicted") != "True" and condition(wl, "QuotaReserved") == "True"
            assert reservations(custom_objects, ns) == []
            assert core_v1.list_namespaced_pod(ns).items == [], "no pod before admission"
            assert [r["metadata"]["uid"] for r in _requests(custom_objects, ns)] == [
                request["metadata"]["uid"]]

            pods = wait_for("scaled Running", lambda: running(core_v1, ns, "scaled", 2),
                            timeout=delay + 120)
            assert {p.spec.node_name for p in pods} <= set(prov.created), prov.created
            wl = workload_of(custom_objects, ns, "scaled")
            assert condition(wl, "Admitted") == "True"
            ours, theirs = check_entry(wl), _entry(wl, PROV)
            assert ours.get("retryCount") in (None, 0), "never evicted"
            (update,) = ours["podSetUpdates"]  # one entry per pod set
            their_selector = theirs["podSetUpdates"][0]["nodeSelector"]
            assert their_selector == {POOL: SCALED_POOL}
            assert update.get("nodeSelector", {}).get(POOL, SCALED_POOL) == SCALED_POOL
            # placed only once provisioned: the reservation is younger than their Ready
            (rr,) = reservations(custom_objects, ns)
            assert _time(rr["metadata"]["creationTimestamp"]) >= _time(
                theirs["lastTransitionTime"]).replace(microsecond=0)
            assert [r["metadata"]["uid"] for r in _requests(custom_objects, ns)] == [
                request["metadata"]["uid"]], "the ProvisioningRequest was never replaced"
            assert prov.vanished == []
            # Provisioned came before the nodes joined: waited for, not retried
            assert _events(core_v1, ns, "WaitingForProvisionedNodes")
            # what an autoscaler reacting to pending pods would have seen: no pod before
            # admission, then gated pods placed; kube-scheduler never found one unschedulable
            assert _events(core_v1, ns, "FailedScheduling") == []
        finally:
            batch_v1.delete_namespaced_job("scaled", ns, propagation_policy="Background")
            _remove(core_v1, custom_objects, prov.created_objects)


def test_check_capacity_on_the_fleet_as_it_is_admits_and_runs(
    nexus_namespace, kube_api, core_v1, batch_v1, custom_objects
):
    """check-capacity: the provisioner answers from the fleet (no node added); nexus places
    once Kueue's check is Ready, and the pods run."""
    ns = nexus_namespace
    prov = Provisioner(kube_api)
    with (queue_with_provisioning(custom_objects, ns, CHECK_CAPACITY, False) as queue,
          prov.running()):
        try:
            batch_v1.create_namespaced_job(ns, job("checked", queue, pods=2, gpus=4))
            pods = wait_for("checked Running", lambda: running(core_v1, ns, "checked", 2),
                            timeout=120)
            assert prov.created == [] and all(p.spec.node_name for p in pods)
            wl = workload_of(custom_objects, ns, "checked")
            assert condition(wl, "Admitted") == "True"
            assert _entry(wl, PROV)["state"] == "Ready"
            assert check_entry(wl)["state"] == "Ready"
            assert prov.vanished == []
        finally:
            batch_v1.delete_namespaced_job("checked", ns, propagation_policy="Background")


def test_a_provisioner_that_never_answers_leaves_the_workload_waiting(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """A class no autoscaler on the plane plays: the Workload waits, told so, past the
    reservation TTL; never deactivated, never evicted, the request kept."""
    ns, ttl = nexus_namespace, 10
    with (reservation_ttl(custom_objects, ttl),
          queue_with_provisioning(custom_objects, ns, "queued-provisioning.gke.io",
                                  False) as queue):
        try:
            batch_v1.create_namespaced_job(ns, job("unanswered", queue, pods=1, gpus=8))
            told = (f"waiting for the provisioning check {PROV} to be Ready "
                    "(Pending; the provisioner has not answered yet)")
            wait_for("our check saying the provisioner has not answered", lambda: (
                (w := workload_of(custom_objects, ns, "unanswered"))
                and check_entry(w).get("message") == told), timeout=90)
            (request,) = wait_for("the ProvisioningRequest", lambda: _requests(custom_objects, ns))
            since = datetime.now(UTC)
            wait_for("more than the TTL of waiting",
                     lambda: datetime.now(UTC) > since + timedelta(seconds=ttl + 5),
                     timeout=60, interval=1)
            wl = workload_of(custom_objects, ns, "unanswered")
            assert check_entry(wl)["state"] == "Pending" and check_entry(wl)["message"] == told
            assert wl["spec"].get("active") is not False
            assert condition(wl, "QuotaReserved") == "True" and condition(wl, "Evicted") != "True"
            assert reservations(custom_objects, ns) == []
            assert [r["metadata"]["uid"] for r in _requests(custom_objects, ns)] == [
                request["metadata"]["uid"]]
        finally:
            batch_v1.delete_namespaced_job("unanswered", ns, propagation_policy="Background")
