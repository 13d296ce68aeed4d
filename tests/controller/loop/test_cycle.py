"""The pass's views of the Workloads: derived again only when a list they read changed."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_admit.controller.loop import cycle
from nexus_admit.kube.dump import ClusterDump
from tests.controller.test_placing import check_of, cluster, controller, pending, run, watch
from tests.kube.kube_factories import pod


def test_a_pass_on_a_pod_event_walks_no_workload_again(monkeypatch: pytest.MonkeyPatch) -> None:
    walks: list[int] = []
    real = ClusterDump.pending_workloads

    def counting(self: ClusterDump, checks: Any = None) -> Any:
        walks.append(len(self.kind("Workload")))
        return real(self, checks)

    monkeypatch.setattr(ClusterDump, "pending_workloads", counting)
    api = cluster(pending("a", pods=1, gpus=8))
    ctx, _ = controller(api)
    run(ctx)
    watch(ctx, api)
    assert check_of(api, "a")["state"] == "Ready"
    run(ctx)
    seen = len(walks)
    api.put(pod("someone-else", "n2"))  # a pod's event: the Workloads did not change
    watch(ctx, api)
    run(ctx)
    assert len(walks) == seen, "the same Workload list: its views are kept"
    api.put(pending("b", pods=1, gpus=8))  # a Workload's event
    watch(ctx, api)
    run(ctx)
    assert len(walks) == seen + 1
    watch(ctx, api)
    assert check_of(api, "b")["state"] == "Ready", "the new Workload was placed"


def test_views_kept_are_those_a_fresh_walk_gives() -> None:
    api = cluster(pending("a", pods=1, gpus=8), pending("b", pods=1, gpus=8))
    ctx, _ = controller(api)
    active = set(ctx.checks) or {"nexus"}
    dump = ctx.store.dump()
    first = cycle.workload_views(ctx, dump, active)
    again = cycle.workload_views(ctx, ctx.store.dump(), active)
    assert again[0] is first[0] and again[1] is first[1]
    assert [w["metadata"]["name"] for w in first[0]] == [
        w["metadata"]["name"] for w in dump.pending_workloads(active)]
    other = cycle.workload_views(ctx, ctx.store.dump(), {"another-check"})
    assert other[0] == [], "another set of checks: walked again"
