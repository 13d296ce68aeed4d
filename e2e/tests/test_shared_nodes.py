"""nexus-admit beside a Kueue Topology-Aware (TAS) queue on the same GPU nodes.

Kueue TAS writes a Workload's topology assignment (the nodes its pods will run on) when it
reserves quota; the pods exist only once every check of that queue is Ready. Meanwhile
nexus must count those nodes as taken, or it books them twice and one of the two gangs'
pods never schedules. Checked on the cluster's own objects: the TAS Workload's assignment,
the ResourceReservation's slots, the nodes the pods are bound to.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
from builders import (
    CHECK,
    GPU,
    QUEUE_LABEL,
    RESERVATION,
    RR_GROUP,
    RR_PLURAL,
    RR_VERSION,
    SLOT,
    WORKER_IMAGE,
    active_status,
    admission_check,
    cluster_queue,
    create_local_queue,
    flavor_quota,
    job,
)
from e2e_util import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    all_running,
    condition,
    pods_with_labels,
    require_controller,
    wait_for,
    workload_owned_by,
)
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

HOSTNAME = "kubernetes.io/hostname"
RACK = "cloud.google.com/gce-topology-subblock"
# two H100 nodes of one rack (e2e/fleet.yaml): the TAS pod is pinned to the first, the
# nexus gangs may use both
TAS_NODE, FREE_NODE = "h100-r3-6", "h100-r3-7"


def _cluster_object(custom, plural: str, body: dict[str, Any]) -> None:
    custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, body)


@pytest.fixture
def held_tas_queue(nexus_namespace: str, custom_objects):
    """A ClusterQueue on the TAS flavor `h100` with a second AdmissionCheck that stays
    Pending until the test says Ready: Kueue reserves quota and assigns the topology, and
    keeps the Job suspended (no pods) meanwhile. Yields (local queue, check name)."""
    suffix = uuid.uuid4().hex[:5]
    check, cq = f"hold-{suffix}", f"tas-held-{suffix}"
    _cluster_object(custom_objects, "admissionchecks",
                    admission_check(check, "e2e.example/hold"))
    # no controller runs for it: the test marks it Active, as its controller would
    custom_objects.patch_cluster_custom_object_status(
        KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", check,
        active_status("Active", "e2e", "2026-01-01T00:00:00Z"))
    _cluster_object(custom_objects, "clusterqueues",
                    cluster_queue(cq, [check], [flavor_quota("h100")]))
    create_local_queue(custom_objects, nexus_namespace, "tas-held", cq)
    yield "tas-held", check
    for plural, name in (("clusterqueues", cq), ("admissionchecks", check)):
        with contextlib.suppress(client.ApiException):
            custom_objects.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)


def _pinned_to(nodes: list[str]) -> client.V1Affinity:
    return client.V1Affinity(node_affinity=client.V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=client.V1NodeSelector(
            node_selector_terms=[client.V1NodeSelectorTerm(match_expressions=[
                client.V1NodeSelectorRequirement(key=HOSTNAME, operator="In", values=nodes)])])))


def _check(wl: dict[str, Any], name: str) -> dict[str, Any]:
    return next((c for c in (wl.get("status") or {}).get("admissionChecks") or []
                 if c.get("name") == name), {})


def _reserved_nodes(custom, ns: str) -> set[str]:
    rrs = custom.list_namespaced_custom_object(RR_GROUP, RR_VERSION, ns, RR_PLURAL)["items"]
    return {s["node"] for rr in rrs for ps in rr["spec"]["podSets"] for s in ps["slots"]}


def test_a_tas_assignment_whose_pods_are_held_back_is_not_booked_again(
    nexus_namespace, held_tas_queue, core_v1, batch_v1, custom_objects
):
    ns = nexus_namespace
    queue, hold = held_tas_queue
    tas_job = job("tas", queue, 1, 8, annotations={
        "kueue.x-k8s.io/podset-required-topology": RACK})
    tas_job.spec.template.spec.node_selector = {HOSTNAME: TAS_NODE}
    tas_uid = batch_v1.create_namespaced_job(ns, tas_job).metadata.uid

    def assigned():
        wl = workload_owned_by(custom_objects, ns, tas_uid)
        if not wl or condition(wl, "QuotaReserved") != "True":
            return None
        psa = wl["status"]["admission"]["podSetAssignments"][0]
        return wl if psa.get("topologyAssignment") else None

    tas_wl = wait_for("Kueue TAS to assign the held Workload its node", assigned, timeout=60)
    assignment = tas_wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    assert assignment["levels"][-1] == HOSTNAME
    assert TAS_NODE in str(assignment["slices"]), assignment
    assert _check(tas_wl, hold).get("state") == "Pending"
    assert not pods_with_labels(core_v1, ns, "job-name=tas"), "held back: no pods yet"

    # a gang that needs both nodes cannot be placed while TAS holds one of them
    both = batch_v1.create_namespaced_job(
        ns, job("both", "nexus-gold", 2, 8, affinity=_pinned_to([TAS_NODE, FREE_NODE])))

    def answered():
        wl = workload_owned_by(custom_objects, ns, both.metadata.uid)
        state = _check(wl or {}, CHECK).get("state")
        return (wl, state) if state in ("Retry", "Ready") else None

    wl, state = wait_for("nexus to answer the two-node gang", answered, timeout=90)
    assert state == "Retry", f"placed on the TAS node: {_check(wl, CHECK).get('message')}"
    assert TAS_NODE not in _reserved_nodes(custom_objects, ns)
    batch_v1.delete_namespaced_job("both", ns, propagation_policy="Background")

    # a one-node gang goes to the node TAS left free, and runs there
    batch_v1.create_namespaced_job(
        ns, job("one", "nexus-gold", 1, 8, affinity=_pinned_to([TAS_NODE, FREE_NODE])))
    (pod,) = wait_for("the one-node gang running", lambda: (
        p if all_running(p := pods_with_labels(core_v1, ns, "job-name=one"), 1) else None),
        timeout=90)
    assert pod.spec.node_name == FREE_NODE
    assert _reserved_nodes(custom_objects, ns) == {FREE_NODE}

    # the other check says Ready: Kueue admits the TAS Workload, its pod runs on its node
    name = tas_wl["metadata"]["name"]
    checks = [{**c, "state": "Ready", "message": "released",
               "lastTransitionTime": "2026-01-01T00:00:00Z"} if c["name"] == hold else c
              for c in tas_wl["status"]["admissionChecks"]]
    custom_objects.patch_namespaced_custom_object_status(
        KUEUE_GROUP, KUEUE_VERSION, ns, "workloads", name,
        {"status": {"admissionChecks": checks}})
    (tas_pod,) = wait_for("the TAS pod running once released", lambda: (
        p if all_running(p := pods_with_labels(core_v1, ns, "job-name=tas"), 1) else None),
        timeout=90)
    assert tas_pod.spec.node_name == TAS_NODE


@pytest.fixture
def mixed_queue(nexus_namespace: str, custom_objects):
    """A nexus-checked gold ClusterQueue whose one resource group lists the TAS flavor `h100`
    before the broad `gpu-any`: Kueue gives a pod set that asks for a topology `h100` (and
    TAS places it), every other pod set `gpu-any` (a TAS flavor takes only TAS pod sets).
    Yields the LocalQueue's name."""
    cq = f"mixed-{uuid.uuid4().hex[:5]}"
    _cluster_object(custom_objects, "clusterqueues", cluster_queue(
        cq, [CHECK], [flavor_quota("h100"), flavor_quota("gpu-any")], tier="gold"))
    create_local_queue(custom_objects, nexus_namespace, "mixed", cq)
    yield "mixed"
    with contextlib.suppress(client.ApiException):
        custom_objects.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", cq)


def _replicated_job(name: str, pod_spec: dict[str, Any],
                    annotations: dict[str, str] | None = None) -> dict[str, Any]:
    pod_spec = {"restartPolicy": "Never", "containers": [{
        "name": "worker", "image": WORKER_IMAGE, "resources": {
            "requests": {"cpu": "8", "memory": "32Gi", GPU: "8"}, "limits": {GPU: "8"}}}],
        **pod_spec}
    return {"name": name, "replicas": 1, "template": {"spec": {
        "parallelism": 1, "completions": 1, "backoffLimit": 0,
        "template": {"metadata": {"annotations": annotations or {}}, "spec": pod_spec}}}}


def test_a_mixed_workload_tas_pod_set_passed_through_the_other_placed_beside_it(
    nexus_namespace, mixed_queue, core_v1, custom_objects
):
    """One JobSet, two pod sets on one nexus-checked queue: `tas` on the TAS flavor (Kueue
    TAS assigns its node, nexus-admit does not pin it), `plain` on the broad flavor (nexus
    places and pins it on the node TAS did not take). Both run; the reservation holds only
    `plain`'s slot."""
    require_controller("JOBSET_VERSION", "jobset", "jobsets.jobset.x-k8s.io", custom_objects)
    ns = nexus_namespace
    both = client.ApiClient().sanitize_for_serialization(_pinned_to([TAS_NODE, FREE_NODE]))
    js = custom_objects.create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", {
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "mixed", "labels": {QUEUE_LABEL: mixed_queue}},
            "spec": {"replicatedJobs": [
                _replicated_job("tas", {"nodeSelector": {HOSTNAME: TAS_NODE}},
                                {"kueue.x-k8s.io/podset-required-topology": RACK}),
                _replicated_job("plain", {"affinity": both})]}})

    def ready():
        wl = workload_owned_by(custom_objects, ns, js["metadata"]["uid"])
        return wl if wl and _check(wl, CHECK).get("state") == "Ready" else None

    wl = wait_for(f"check {CHECK} Ready on the mixed Workload", ready, timeout=120)
    psas = {a["name"]: a for a in wl["status"]["admission"]["podSetAssignments"]}
    assert set(psas["tas"]["flavors"].values()) == {"h100"}, psas
    assert TAS_NODE in str(psas["tas"]["topologyAssignment"]["slices"]), psas["tas"]
    assert set(psas["plain"]["flavors"].values()) == {"gpu-any"}, psas
    assert not psas["plain"].get("topologyAssignment"), psas["plain"]

    # our answer names only `plain`: a reservation label (and so a pin) for it alone
    updates = {u["name"]: u for u in _check(wl, CHECK).get("podSetUpdates") or []}
    assert RESERVATION not in (updates.get("tas") or {}).get("labels", {}), updates
    rr_name = updates["plain"]["labels"][RESERVATION]
    rr = custom_objects.get_namespaced_custom_object(RR_GROUP, RR_VERSION, ns, RR_PLURAL, rr_name)
    assert [ps["name"] for ps in rr["spec"]["podSets"]] == ["plain"], rr["spec"]
    assert _reserved_nodes(custom_objects, ns) == {FREE_NODE}, "placed on the node TAS took"

    selector = "jobset.sigs.k8s.io/jobset-name=mixed"
    pods = wait_for("both pod sets' pods running", lambda: (
        p if all_running(p := pods_with_labels(core_v1, ns, selector), 2) else None),
        timeout=120)
    by_set = {p.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"]: p for p in pods}
    assert by_set["tas"].spec.node_name == TAS_NODE
    assert RESERVATION not in by_set["tas"].metadata.labels
    assert by_set["plain"].spec.node_name == FREE_NODE
    assert by_set["plain"].metadata.labels[RESERVATION] == rr_name
    assert by_set["plain"].metadata.annotations.get(SLOT) == "plain/0"
