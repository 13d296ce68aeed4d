"""Pending GPUs per tier come from admin-owned ClusterQueue labels, for queues that use our
check, and stop counting once a Workload is admitted."""

from __future__ import annotations

from typing import Any

from nexus_admit.controller.context import CheckView, Context
from nexus_admit.controller.demand import pending_demands, pending_gpus_by_tier
from nexus_admit.controller.loop.cycle import _record_capacity, capacity_plans
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.store import PerObject
from nexus_admit.kube import labels as L
from nexus_admit.kube.dump import ClusterDump
from tests.controller.fake_api import FakeApi


def cq(name: str, tier: str, checks: list[str]) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    return {
        "kind": "ClusterQueue",
        "metadata": {"name": name, "labels": {L.LABEL_TIER: tier}},
        "spec": spec,
    }


def wl(name: str, queue: str, pods: int, gpus: int, admitted: bool = False) -> dict[str, Any]:
    container = {"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}
    return {
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": "t",
            # a tenant's claim of a tier is ignored: the ClusterQueue's label decides
            "annotations": {L.LABEL_TIER: "gold"},
        },
        "spec": {
            "queueName": queue,
            "podSets": [
                {"name": "main", "count": pods, "template": {"spec": {"containers": [container]}}}
            ],
        },
        "status": {"conditions": [{"type": "Admitted", "status": "True"}] if admitted else []},
    }


def test_pending_gpus_by_tier() -> None:
    dump = ClusterDump.of(
        [
            cq("g", "gold", ["nexus"]),
            cq("b", "bronze", ["nexus"]),
            cq("other", "gold", []),
            {
                "kind": "LocalQueue",
                "metadata": {"name": "gq", "namespace": "t"},
                "spec": {"clusterQueue": "g"},
            },
            {
                "kind": "LocalQueue",
                "metadata": {"name": "bq", "namespace": "t"},
                "spec": {"clusterQueue": "b"},
            },
            {
                "kind": "LocalQueue",
                "metadata": {"name": "oq", "namespace": "t"},
                "spec": {"clusterQueue": "other"},
            },
            wl("w1", "gq", 4, 8),
            wl("w2", "gq", 1, 8, admitted=True),
            wl("w3", "bq", 2, 1),
            wl("w4", "oq", 8, 8),
        ]
    )
    assert pending_gpus_by_tier(dump, {"nexus"}) == {"gold": 32, "bronze": 2}


def test_a_workload_whose_queue_cannot_be_read_waits_for_none_of_ours() -> None:
    """Before: its unreadable status raised out of every placing pass (issue 55)."""
    lq = {"kind": "LocalQueue", "metadata": {"name": "gq", "namespace": "t"},
          "spec": {"clusterQueue": "g"}}
    dump = ClusterDump.of([cq("g", "gold", ["nexus"]), lq, wl("w1", "gq", 1, 8),
                           {**wl("lost", "gq", 1, 8), "status": "lost"}])
    assert pending_gpus_by_tier(dump, {"nexus"}) == {"gold": 8}


def test_demands_kept_per_workload_are_those_derived_afresh() -> None:
    """With a memo, a Workload's demand is derived again only for a new object, and all of
    them when a queue's tier or checks change; the answer is always the fresh one."""
    queues: list[dict[str, Any]] = [
        cq("g", "gold", ["nexus"]),
        {"kind": "LocalQueue", "metadata": {"name": "gq", "namespace": "t"},
         "spec": {"clusterQueue": "g"}},
    ]
    workloads = [wl("w1", "gq", 4, 8), wl("w2", "gq", 1, 2)]
    memo: PerObject[tuple[str, int] | None] = PerObject()

    def both(dump: ClusterDump) -> list[tuple[str, int]]:
        kept = pending_demands(dump, {"nexus"}, memo)
        assert kept == pending_demands(dump, {"nexus"})
        return kept

    assert both(ClusterDump.of([*queues, *workloads])) == [("gold", 32_000), ("gold", 2_000)]
    workloads[1] = wl("w2", "gq", 1, 2, admitted=True)  # a new object for w2
    assert both(ClusterDump.of([*queues, *workloads])) == [("gold", 32_000)]
    queues[0] = cq("g", "silver", ["nexus"])  # the queue's tier relabelled by its admin
    assert both(ClusterDump.of([*queues, *workloads])) == [("silver", 32_000)]
    queues[0] = cq("g", "silver", [])  # the queue no longer uses the check
    assert both(ClusterDump.of([*queues, *workloads])) == []


def test_the_pending_gpus_metric_forgets_a_tier_that_no_longer_waits() -> None:
    ctx = Context(options=RunOptions(webhook=False), api=FakeApi(), engine=None)  # type: ignore[arg-type]
    ctx.checks = {"nexus": CheckView("nexus", None)}
    queues = [
        cq("g", "gold", ["nexus"]),
        {"kind": "LocalQueue", "metadata": {"name": "gq", "namespace": "t"},
         "spec": {"clusterQueue": "g"}},
    ]

    def gold() -> float | None:
        return ctx.metrics.registry.get_sample_value("nexus_admit_pending_gpus", {"tier": "gold"})

    def record_capacity(dump: ClusterDump) -> None:
        _record_capacity(ctx, dump, capacity_plans(ctx))

    record_capacity(ClusterDump.of([*queues, wl("w1", "gq", 4, 8)]))
    assert gold() == 32
    record_capacity(ClusterDump.of([*queues, wl("w1", "gq", 4, 8, admitted=True)]))
    assert gold() is None


def test_the_capacity_step_counts_a_renewal_of_the_passes_snapshot() -> None:
    ctx = Context(options=RunOptions(webhook=False), api=FakeApi(), engine=None)  # type: ignore[arg-type]

    def renewals(reason: str) -> float | None:
        return ctx.metrics.registry.get_sample_value(
            "nexus_admit_snapshot_renewals_total", {"reason": reason})

    _record_capacity(ctx, ClusterDump.of([]), capacity_plans(ctx))
    assert renewals("first") == 1  # the passes' snapshot, built here first
    _record_capacity(ctx, ClusterDump.of([]), capacity_plans(ctx))
    assert renewals("first") == 1  # kept: nothing changed
