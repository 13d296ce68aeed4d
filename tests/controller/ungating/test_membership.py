"""Membership by the owner chain Kueue uses (issue 28, item 5): a label or annotation a
tenant writes is no proof; a shared owner (a Job's pods) or the pod among the Workload's
owners (plain pods, pod groups) is."""

from __future__ import annotations

from typing import Any

from nexus_admit.controller.ungating.membership import owned_member


def obj(uid: str, owners: list[str], **meta: Any) -> dict[str, Any]:
    refs = [{"kind": "X", "name": o, "uid": o} for o in owners]
    return {"metadata": {"name": uid, "uid": uid, "ownerReferences": refs, **meta}}


def test_a_jobs_pod_shares_the_workloads_owner() -> None:
    assert owned_member(obj("p", ["job-uid"]), obj("w", ["job-uid"]))


def test_a_plain_pod_is_among_the_workloads_owners() -> None:
    assert owned_member(obj("p1", []), obj("w", ["p0", "p1"]))


def test_a_label_or_annotation_naming_the_workload_is_no_proof() -> None:
    rider = obj(
        "rider",
        ["other-job"],
        labels={"kueue.x-k8s.io/pod-group-name": "w"},
        annotations={"kueue.x-k8s.io/workload": "w"},
    )
    assert not owned_member(rider, obj("w", ["p0", "p1"]))
