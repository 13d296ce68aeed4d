"""Slot assignment: ranks take their own slot, the rest the first free one, slots held by
live pods are never handed out twice, slots of finished pods are reused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexus_admit.controller.ungating.slot_assignment import (
    TERMINATION_MARGIN,
    RankedPod,
    RankRule,
    assign_slots,
    creation_slot,
    holds_slot,
    rank_rules,
    ranked_pod,
)
from nexus_admit.kube import labels as L
from nexus_admit.kube.reservations import ReservedSlot
from nexus_admit.kube.views import PodView, WorkloadView

NOW = datetime(2026, 12, 1, 7, 0, tzinfo=UTC)


def pod_view(
    p: dict[str, Any], pod_sets: list[str], rules: dict[str, RankRule] | None = None, *,
    now: datetime,
) -> RankedPod:
    """The pod as the ungater ranks it: its store view first (`kube/views.py`)."""
    return ranked_pod(PodView.of(p), pod_sets, rules, now=now)


def slots(n: int, pod_set: str = "main") -> list[ReservedSlot]:
    return [ReservedSlot(pod_set, i, f"node-{i // 2}", (i % 2,), 0) for i in range(n)]


def pod(
    name: str,
    rank: int | None = None,
    *,
    gated: bool = True,
    slot: int | None = None,
    active: bool = True,
    pod_set: str = "main",
) -> RankedPod:
    return RankedPod(
        name, pod_set, rank, gated, (pod_set, slot) if slot is not None else None, active
    )


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([pod("a", 2), pod("b", 0)], {"a": 2, "b": 0}, id="ranks-take-their-index"),
        pytest.param([pod("a"), pod("b")], {"a": 0, "b": 1}, id="unranked-first-free"),
        pytest.param([pod("x", slot=0, gated=False), pod("a", 0)], {"a": 1}, id="rank-slot-held"),
        pytest.param(
            [pod("x", slot=1, gated=False, active=False), pod("a", 1)],
            {"a": 1},
            id="finished-pod-slot-reused",
        ),
        pytest.param(
            [pod("a"), pod("b"), pod("c"), pod("d"), pod("e")],
            {"a": 0, "b": 1, "c": 2, "d": 3},
            id="more-pods-than-slots",
        ),
        pytest.param([pod("a", 9)], {"a": 0}, id="rank-out-of-range-first-free"),
        pytest.param([pod("a", 0, gated=False)], {}, id="ungated-pods-untouched"),
        pytest.param([pod("a", 0, pod_set="other")], {}, id="other-pod-set-has-no-slots"),
    ],
)
def test_assign_slots(pods: list[RankedPod], expected: dict[str, int]) -> None:
    got = assign_slots(slots(4), pods)
    assert {k: v.index for k, v in got.items()} == expected


def test_pod_view_reads_gate_rank_slot_and_pod_set() -> None:
    p = {
        "metadata": {
            "name": "w-3",
            "labels": {"batch.kubernetes.io/job-completion-index": "3"},
            "annotations": {L.ANN_SLOT: "main/3"},
        },
        "spec": {"schedulingGates": [{"name": L.GATE_PLACEMENT}]},
        "status": {"phase": "Pending"},
    }
    v = pod_view(p, ["main"], now=NOW)
    # a gated pod's slot annotation is not ours (our pin lifts the gate with it): ignored
    assert (v.rank, v.gated, v.slot, v.pod_set, v.active) == (3, True, None, "main", True)
    p["spec"] = {"nodeName": "n"}  # pinned: the annotation is the slot it holds
    assert pod_view(p, ["main"], now=NOW).slot == ("main", 3)


def test_a_pod_asking_for_more_gpus_than_a_slot_holds_gets_none() -> None:
    """Before: the ungater never compared the pod's requests with the slot's, so a pod of
    the gang asking for 8 GPUs could take a 1-GPU slot and 7 devices nobody reserved."""
    big = RankedPod("big", "main", 0, True, None, True, gpus=8)
    fits = RankedPod("fits", "main", None, True, None, True, gpus=2)
    got = assign_slots(slots(2), [big, fits])  # each slot holds one device
    assert got == {}
    two = [ReservedSlot("main", i, "n", (0, 1), 0) for i in range(2)]
    assert {k: v.index for k, v in assign_slots(two, [big, fits]).items()} == {"fits": 0}


def test_kueue_pod_index_label_wins() -> None:
    p = {
        "metadata": {
            "name": "p",
            "labels": {"my/rank": "5", "batch.kubernetes.io/job-completion-index": "1"},
        }
    }
    rule = {"main": RankRule(count=8, index_label="my/rank")}
    assert pod_view(p, ["main"], rule, now=NOW).rank == 5


def pod_set(name: str, count: int, topology: dict[str, Any] | None = None, **ann: str) -> dict:
    ps: dict[str, Any] = {"name": name, "count": count, "template": {"metadata": {}}}
    if topology:
        ps["topologyRequest"] = topology
    if ann:
        ps["template"]["metadata"]["annotations"] = ann
    return ps


def ranked(labels: dict[str, str], pod_set_name: str, workload: dict[str, Any]) -> int | None:
    p = {"metadata": {"name": "p", "labels": {"kueue.x-k8s.io/podset": pod_set_name, **labels}}}
    return pod_view(p, [], rank_rules(WorkloadView.of(workload)), now=NOW).rank


JOBSET_TOPOLOGY = {
    "podIndexLabel": "batch.kubernetes.io/job-completion-index",
    "subGroupIndexLabel": "jobset.sigs.k8s.io/job-index",
    "subGroupCount": 2,
}


@pytest.mark.parametrize("with_kueue_tas", [True, False])
def test_a_jobsets_ranks_run_across_its_jobs(with_kueue_tas: bool) -> None:
    """2 Jobs × 2 pods in the `workers` pod set: job 1's pod 0 is rank 2, not 0 (the
    completion index alone collides across Jobs); with Kueue's TAS gate off, JobSet's own
    labels say the same."""
    workers = pod_set("workers", 4, JOBSET_TOPOLOGY if with_kueue_tas else None)
    workload = {"spec": {"podSets": [pod_set("driver", 1), workers]}}
    ranks = {
        (job, index): ranked(
            {
                "jobset.sigs.k8s.io/job-index": str(job),
                "jobset.sigs.k8s.io/replicatedjob-replicas": "2",
                "batch.kubernetes.io/job-completion-index": str(index),
            },
            "workers",
            workload,
        )
        for job in (0, 1)
        for index in (0, 1)
    }
    assert ranks == {(0, 0): 0, (0, 1): 1, (1, 0): 2, (1, 1): 3}
    out_of_range = {
        "jobset.sigs.k8s.io/job-index": "0",
        "batch.kubernetes.io/job-completion-index": "2",
    }
    assert (
        ranked(
            out_of_range | {"jobset.sigs.k8s.io/replicatedjob-replicas": "2"}, "workers", workload
        )
        is None
    )


@pytest.mark.parametrize("offset_annotation", [True, False])
def test_a_leaderworkersets_workers_rank_from_one(offset_annotation: bool) -> None:
    """LWS: the leader is worker-index 0 in its own pod set; workers 1..3 take worker
    slots 0..2 (Kueue's pod-index-offset, or the leader pod set's presence without it)."""
    ann = {"kueue.x-k8s.io/pod-index-offset": "1"} if offset_annotation else {}
    topology = {"podIndexLabel": "leaderworkerset.sigs.k8s.io/worker-index"}
    workload = {"spec": {"podSets": [pod_set("leader", 1), pod_set("worker", 3, topology, **ann)]}}
    label = "leaderworkerset.sigs.k8s.io/worker-index"
    assert [ranked({label: str(i)}, "worker", workload) for i in (1, 2, 3)] == [0, 1, 2]
    assert ranked({label: "0"}, "leader", workload) == 0


@pytest.mark.parametrize(
    ("value", "rank"),
    [
        pytest.param("3", 3, id="ascii"),
        pytest.param("007", 7, id="leading-zeros"),
        pytest.param("²", None, id="superscript-isdigit-but-no-int"),
        pytest.param("٣", None, id="arabic-indic-digit"),
        pytest.param("1234567890", None, id="ten-digits-too-long"),
        pytest.param("-1", None, id="negative"),
        pytest.param(" 1", None, id="space"),
        pytest.param("", None, id="empty"),
    ],
)
def test_a_rank_is_ascii_digits_of_bounded_length_anything_else_no_rank(
    value: str, rank: int | None
) -> None:
    """`"²".isdigit()` is True and `int("²")` raises: the rank parser crashed every
    ungating pass on it. Now a strange index is no rank (the pod takes the first free slot)."""
    p = {
        "metadata": {
            "name": "odd",
            "annotations": {"batch.kubernetes.io/job-completion-index": value},
        },
        "spec": {"schedulingGates": [{"name": L.GATE_PLACEMENT}]},
    }
    assert pod_view(p, ["main"], now=NOW).rank == rank
    p["metadata"]["labels"] = {"batch.kubernetes.io/job-completion-index": value}
    assert pod_view(p, ["main"], now=NOW).rank == rank


# -- creation_slot: the pin given in a pod's create request (controller/ungating/at_creation.py)


@pytest.mark.parametrize(
    ("new", "others", "expected"),
    [
        pytest.param(pod("p3", 3), [pod("p0", 0, gated=False, slot=0)], 3, id="own-rank"),
        pytest.param(pod("p3", None), [], None, id="no-rank"),
        pytest.param(pod("p3", 3), [pod("old", 3, gated=False, slot=3)], None, id="slot-held"),
        pytest.param(
            pod("p3", 3), [pod("old", 3, gated=False, slot=3, active=False)], 3,
            id="slot-of-a-finished-pod",
        ),
        # a gated pod whose own slot is taken takes the lowest free one: maybe this one
        pytest.param(pod("p3", 3), [pod("p1", 1)], None, id="another-waits"),
        pytest.param(pod("p3", 3), [pod("p1", 1, active=False)], 3, id="a-finished-one-waits"),
        pytest.param(pod("p9", 9), [], None, id="no-such-slot"),
        pytest.param(pod("p3", 3, pod_set="other"), [], None, id="another-pod-set"),
        pytest.param(pod("p3", 3, gated=False), [], None, id="not-gated"),
    ],
)
def test_creation_slot(new: RankedPod, others: list[RankedPod], expected: int | None) -> None:
    slot = creation_slot(slots(4), new, others)
    assert (slot.index if slot is not None else None) == expected


def test_creation_slot_needs_a_slot_the_pod_fits() -> None:
    greedy = RankedPod("p0", "main", 0, True, None, True, gpus=2)
    assert creation_slot(slots(2), greedy, []) is None


_views = st.builds(
    RankedPod,
    name=st.sampled_from([f"p{i}" for i in range(6)]),
    pod_set=st.just("main"),
    rank=st.one_of(st.none(), st.integers(0, 5)),
    gated=st.booleans(),
    slot=st.one_of(st.none(), st.tuples(st.just("main"), st.integers(0, 5))),
    active=st.booleans(),
    gpus=st.integers(0, 2),
)


@given(new=_views, others=st.lists(_views, max_size=6, unique_by=lambda v: v.name))
def test_creation_slot_is_the_slot_assign_slots_would_give_whatever_comes_next(
    new: RankedPod, others: list[RankedPod]
) -> None:
    """What the webhook pins at creation, the ungater would have chosen too; and the pods
    that still wait get from it what they would have got without the pin."""
    others = [o for o in others if o.name != new.name]
    new = RankedPod(new.name, new.pod_set, new.rank, True, None, True, new.gpus)
    slot = creation_slot(slots(4), new, others)
    if slot is None:
        return
    without_pin = assign_slots(slots(4), [*others, new])
    assert without_pin.get(new.name) == slot
    pinned = RankedPod(new.name, new.pod_set, new.rank, False, (slot.pod_set, slot.index), True)
    assert assign_slots(slots(4), [*others, pinned]) == {
        k: v for k, v in without_pin.items() if k != new.name
    }


# -- a pod replaced while it terminates (issue 56 item 5)


def job_pod(
    name: str, rank: int, *, node: str | None = None, deleting: datetime | str | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    """A Job's pod of rank `rank`: pinned to slot main/<rank> and bound to `node`, or gated
    without one; being deleted with its grace period ending at `deleting`."""
    meta: dict[str, Any] = {"name": name, "labels": {INDEX: str(rank)}}
    spec: dict[str, Any] = {}
    if node is None:
        spec["schedulingGates"] = [{"name": L.GATE_PLACEMENT}]
    else:
        meta["annotations"] = {L.ANN_SLOT: f"main/{rank}"}
        spec["nodeName"] = node
    if deleting is not None:
        meta["deletionTimestamp"] = (
            deleting if isinstance(deleting, str) else deleting.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


INDEX = "batch.kubernetes.io/job-completion-index"
GRACE_END = NOW + timedelta(seconds=30)


@pytest.mark.parametrize(
    ("p", "at", "holds"),
    [
        pytest.param(job_pod("run", 1, node="n"), NOW, True, id="running"),
        pytest.param(job_pod("t", 1, node="n", deleting=GRACE_END), NOW, True,
                     id="terminating-in-its-grace-period"),
        pytest.param(job_pod("t", 1, node="n", deleting=GRACE_END),
                     GRACE_END + TERMINATION_MARGIN - timedelta(seconds=1), True,
                     id="terminating-within-the-margin"),
        pytest.param(job_pod("t", 1, node="n", deleting=GRACE_END),
                     GRACE_END + TERMINATION_MARGIN, False, id="past-grace-and-margin"),
        pytest.param(job_pod("t", 1, deleting=GRACE_END), NOW, False,
                     id="never-bound-holds-no-node"),
        pytest.param(job_pod("t", 1, node="n", deleting=GRACE_END, phase="Failed"), NOW,
                     False, id="finished-while-terminating"),
        pytest.param(job_pod("t", 1, node="n", deleting="soon"), NOW, False,
                     id="unreadable-deletion-time"),
        pytest.param(job_pod("done", 1, node="n", phase="Succeeded"), NOW, False,
                     id="succeeded"),
    ],
)
def test_holds_slot(p: dict[str, Any], at: datetime, holds: bool) -> None:
    assert holds_slot(PodView.of(p), at) is holds
    assert pod_view(p, ["main"], now=at).active is holds


def test_a_replacement_waits_for_the_terminating_pod_of_its_slot() -> None:
    """Before: the old pod, being deleted, freed its slot at once; the replacement was
    pinned beside it, stayed unschedulable, and its gang went through Retry."""
    kept = job_pod("w-0-a", 0, node="node-0")
    new = job_pod("w-1-new", 1)

    def chosen(*pods: dict[str, Any], at: datetime = NOW) -> dict[str, int]:
        views = [pod_view(p, ["main"], now=at) for p in pods]
        return {k: s.index for k, s in assign_slots(slots(2), views).items()}

    old = job_pod("w-1-old", 1, node="node-0", deleting=GRACE_END)
    assert chosen(kept, old, new) == {}
    assert chosen(kept, new) == {"w-1-new": 1}, "the old pod gone"
    assert chosen(kept, old, new, at=GRACE_END + TERMINATION_MARGIN) == {"w-1-new": 1}
    views = [pod_view(p, ["main"], now=NOW) for p in (kept, old)]
    assert creation_slot(slots(2), pod_view(new, ["main"], now=NOW), views) is None


def test_a_slot_moved_off_the_failed_node_of_its_terminating_pod_is_free_at_once() -> None:
    """The old pod, being deleted on a node that failed, never leaves it (no kubelet): once
    its slot moved to a healthy node (`controller/failed_nodes.py`), it holds that node
    nothing and its replacement is pinned there without waiting out its grace period."""
    kept = job_pod("w-0-a", 0, node="node-0")
    new = job_pod("w-1-new", 1)

    def chosen(old_node: str, slot_node: str) -> dict[str, tuple[int, str]]:
        old = job_pod("w-1-old", 1, node=old_node, deleting=GRACE_END)
        views = [pod_view(p, ["main"], now=NOW) for p in (kept, old, new)]
        moved = [slots(2)[0], ReservedSlot("main", 1, slot_node, (1,), 0)]
        return {k: (s.index, s.node) for k, s in assign_slots(moved, views).items()}

    assert chosen("dead", "healthy") == {"w-1-new": (1, "healthy")}
    assert chosen("node-0", "node-0") == {}, "on its slot's own node it still holds it"
