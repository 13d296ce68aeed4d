"""Issue 56 item 5 on the real control plane: a Job's pod replaced while it terminates.

An Indexed Job replaces a pod as soon as it starts terminating; the replacement's slot is
the old pod's, on the node the old pod still holds for its grace period. The replacement
waits gated (told once by a PlacementWaiting Event) until the old pod is gone, then runs
on that slot; the rest of the gang keeps running, the Workload is neither sent back
through Retry nor evicted. KWOK keeps the old pod terminating until its
deletionTimestamp (e2e/kwok/pod-delete.yaml, the opt-in annotation below). Checked
against the cluster's own objects.
"""

from __future__ import annotations

import contextlib

import pytest
from builders import GATE, SLOT, job
from e2e_util import condition, wait_for
from kubernetes import client
from test_controller import INDEX, check_entry, job_pods, running, workload_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

AFTER_GRACE = "pod-delete.stage.kwok.x-k8s.io/after-grace"
# longer than the 20 s a pinned pod may stay unschedulable before its gang is re-placed
# (controller/reservation_pods.UNSCHEDULABLE_GRACE): before, the gang went through Retry
GRACE_SECONDS = 45


def _gated(pod: client.V1Pod) -> bool:
    return any(g.name == GATE for g in pod.spec.scheduling_gates or [])


@pytest.fixture
def removed_at_once(nexus_namespace, core_v1, batch_v1):
    """After the test the gang's pods would stay terminating for their grace period, holding
    two H100 nodes from the next module: the Job is deleted, its pods orphaned and removed
    at once."""
    yield
    with contextlib.suppress(client.ApiException):
        batch_v1.delete_namespaced_job("replaced", nexus_namespace, propagation_policy="Orphan")
    with contextlib.suppress(client.ApiException):
        core_v1.delete_collection_namespaced_pod(
            nexus_namespace, label_selector="job-name=replaced", grace_period_seconds=0)


def test_a_replacement_waits_for_the_terminating_pod_of_its_slot(
    nexus_namespace, core_v1, batch_v1, custom_objects, removed_at_once
):
    """Before: the replacement was pinned to the slot at once, stayed unschedulable beside
    the terminating pod, and 20 s later the Workload went through Retry and was evicted,
    its running pod deleted with it."""
    ns = nexus_namespace
    gang = job("replaced", "nexus-gold", pods=2, gpus=8, backoff_limit=6,
               annotations={AFTER_GRACE: "true"})
    gang.spec.template.spec.termination_grace_period_seconds = GRACE_SECONDS
    batch_v1.create_namespaced_job(ns, gang)
    pods = wait_for("2 pods Running", lambda: running(core_v1, ns, "replaced", 2), timeout=120)
    by_index = {p.metadata.labels[INDEX]: p for p in pods}
    old, kept = by_index["1"], by_index["0"]
    wl = workload_of(custom_objects, ns, "replaced")
    reservation = check_entry(wl)["podSetUpdates"][0]["labels"]

    core_v1.delete_namespaced_pod(old.metadata.name, ns, grace_period_seconds=GRACE_SECONDS)

    def replacement() -> client.V1Pod | None:
        return next((p for p in job_pods(core_v1, ns, "replaced")
                     if p.metadata.labels[INDEX] == "1" and p.metadata.uid != old.metadata.uid),
                    None)

    new = wait_for("the replacement of index 1", replacement, timeout=60)
    seen_gated = False

    def old_gone() -> bool:
        """Meanwhile: the old pod terminating, the replacement gated and unbound, the gang's
        Workload admitted as before."""
        nonlocal seen_gated
        names = {p.metadata.name: p for p in job_pods(core_v1, ns, "replaced")}
        now = workload_of(custom_objects, ns, "replaced")
        assert now["metadata"]["uid"] == wl["metadata"]["uid"]
        assert check_entry(now)["state"] == "Ready", check_entry(now)
        assert condition(now, "Evicted") != "True", now["status"]
        assert kept.metadata.name in names, "the running pod was deleted"
        assert names[kept.metadata.name].metadata.uid == kept.metadata.uid
        if old.metadata.name not in names:
            return True
        assert names[old.metadata.name].metadata.deletion_timestamp is not None
        waiting = names.get(new.metadata.name)
        if waiting is not None:
            assert not waiting.spec.node_name, "bound while the old pod holds the node"
            seen_gated = seen_gated or _gated(waiting)
        return False

    wait_for("the old pod gone", old_gone, timeout=GRACE_SECONDS + 30, interval=2)
    assert seen_gated, "the replacement was never seen gated beside the terminating pod"
    told = [e for e in core_v1.list_namespaced_event(ns).items
            if e.reason == "PlacementWaiting" and e.involved_object.name == new.metadata.name]
    assert len(told) == 1, told
    assert f"waits for pod {old.metadata.name}" in told[0].message, told[0].message

    after = wait_for("the replacement and the kept pod Running",
                     lambda: running(core_v1, ns, "replaced", 2), timeout=60)
    by_uid = {p.metadata.uid: p for p in after}
    assert kept.metadata.uid in by_uid, "the running pod kept its uid"
    assert new.metadata.uid in by_uid, "the replacement runs"
    ran = by_uid[new.metadata.uid]
    assert ran.metadata.annotations[SLOT] == old.metadata.annotations[SLOT] == "main/1"
    assert ran.spec.node_name == old.spec.node_name
    final = workload_of(custom_objects, ns, "replaced")
    assert final["metadata"]["uid"] == wl["metadata"]["uid"]
    assert check_entry(final)["state"] == "Ready"
    assert check_entry(final)["podSetUpdates"][0]["labels"] == reservation, "same reservation"
    assert check_entry(final).get("retryCount") in (None, 0), "never sent through Retry"
    assert condition(final, "Evicted") != "True"
