"""The pass's views of the Workloads: derived again only when a list they read changed."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_admit.controller.demand import waiting_workloads
from nexus_admit.controller.loop import inputs
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.views import WorkloadView
from tests.controller.test_placing import check_of, cluster, controller, pending, run, watch
from tests.kube.kube_factories import cluster_queue, local_queue, pod, pod_set, workload


def test_a_pass_on_a_pod_event_walks_no_workload_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod's event leaves the Workload views as they were; a Workload's event has only
    that Workload looked at again, not every one in the store."""
    looked_at: list[str] = []
    real = WorkloadView.pending_on

    def counting(wl: WorkloadView, checks: Any) -> bool:
        looked_at.append(wl.name)
        return real(wl, checks)

    monkeypatch.setattr(WorkloadView, "pending_on", counting)
    api = cluster(pending("a", pods=1, gpus=8))
    ctx, _ = controller(api)
    run(ctx)
    watch(ctx, api)
    assert check_of(api, "a")["state"] == "Ready"
    run(ctx)
    looked_at.clear()
    api.put(pod("someone-else", "n2"))  # a pod's event: the Workloads did not change
    watch(ctx, api)
    run(ctx)
    assert looked_at == [], "the same Workload list: its views are kept"
    api.put(pending("b", pods=1, gpus=8))  # a Workload's event
    watch(ctx, api)
    run(ctx)
    assert looked_at == ["b"], "only the Workload that changed"
    watch(ctx, api)
    assert check_of(api, "b")["state"] == "Ready", "the new Workload was placed"


def _fresh_views(dump: ClusterDump, active: set[str]) -> tuple[list[str], list[str]]:
    """The views walked afresh, as every pass did before they were kept per Workload."""
    pending = dump.pending_workloads(active)
    placing = {w["metadata"]["name"] for w in pending}
    waiting = [w for w, _ in waiting_workloads(dump, active)
               if w["metadata"]["name"] not in placing]
    return ([w["metadata"]["name"] for w in pending],
            [w["metadata"]["name"] for w in waiting])


def test_views_kept_per_workload_are_those_a_fresh_walk_gives() -> None:
    """Through changes of Workloads (new, changed, gone), of a queue's status (kept) and of
    the checks a queue uses (all walked again), the kept views equal a fresh walk."""
    waiting_for_quota = workload("q1", [pod_set(count=1, gpus=1)], conditions={},
                                 cluster_queue=None, check_state="Pending")
    api = cluster(pending("a", pods=1, gpus=8, created="2026-11-25T10:00:05Z"),
                  pending("b", pods=2, gpus=4, created="2026-11-25T10:00:01Z"),
                  waiting_for_quota)
    cq = cluster_queue("cq", "gold")
    cq["spec"] = {"admissionChecksStrategy": {"admissionChecks": [{"name": "nexus"}]}}
    api.put(cq)
    api.put(local_queue("default", "q", "cq"))
    ctx, _ = controller(api)
    active = {"nexus"}

    def names() -> tuple[list[str], list[str]]:
        pending, waiting = inputs.workload_views(ctx, ctx.store.dump(), active)
        return [w.name for w in pending], [w.name for w in waiting]

    def step() -> tuple[list[str], list[str]]:
        watch(ctx, api)
        got = names()
        assert got == _fresh_views(ctx.store.dump(), active)
        return got

    assert step() == (["b", "a"], ["q1"])
    urgent = pending("a", pods=1, gpus=8, created="2026-11-25T10:00:05Z")
    urgent["spec"]["priority"] = 100
    api.put(urgent)  # a new object for a: ahead of b now
    assert step() == (["a", "b"], ["q1"])
    api.put(pending("c", pods=1, gpus=1, created="2026-11-25T10:00:00Z"))
    api.delete("Workload", "b", "default")
    assert step() == (["a", "c"], ["q1"])
    cq["status"] = {"admittedWorkloads": 2}  # Kueue's own counters: nothing to walk again
    api.put(cq)
    assert step() == (["a", "c"], ["q1"])
    cq = dict(cq, spec={})  # the queue no longer uses the check: its waiting Workload goes
    api.put(cq)
    assert step() == (["a", "c"], [])


def test_views_kept_are_those_a_fresh_walk_gives() -> None:
    api = cluster(pending("a", pods=1, gpus=8), pending("b", pods=1, gpus=8))
    ctx, _ = controller(api)
    active = set(ctx.checks) or {"nexus"}
    dump = ctx.store.dump()
    first = inputs.workload_views(ctx, dump, active)
    again = inputs.workload_views(ctx, ctx.store.dump(), active)
    assert again[0] is first[0] and again[1] is first[1]
    assert [w.name for w in first[0]] == [
        w["metadata"]["name"] for w in dump.pending_workloads(active)]
    other = inputs.workload_views(ctx, ctx.store.dump(), {"another-check"})
    assert other[0] == [], "another set of checks: walked again"


def test_a_pass_decides_on_the_stores_views_and_builds_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pass's Workloads are the views the store built when it accepted them: placing
    them (inputs, Job reads, decisions, writes) builds no view again."""
    api = cluster(pending("a", pods=1, gpus=8), pending("b", pods=2, gpus=4))
    ctx, _ = controller(api)
    stored = {v.name: v for v in ctx.store.workloads()}
    built: list[str] = []
    real = WorkloadView.of.__func__  # type: ignore[attr-defined]

    def counting(cls: type[WorkloadView], obj: Any) -> WorkloadView:
        view: WorkloadView = real(cls, obj)
        built.append(view.name)
        return view

    monkeypatch.setattr(WorkloadView, "of", classmethod(counting))
    pending_views, _ = inputs.workload_views(ctx, ctx.store.dump(), {"nexus"})
    assert [v.name for v in pending_views] == ["a", "b"]
    assert all(v is stored[v.name] for v in pending_views)
    run(ctx)
    assert built == [], "the store's views, not new ones"
    watch(ctx, api)
    assert check_of(api, "a")["state"] == check_of(api, "b")["state"] == "Ready"
