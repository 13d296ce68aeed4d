"""The shapes of Workloads waiting for quota, warmed ahead: their decision then builds
nothing over the fleet, answers as without the warm, and a malformed Workload warms
nothing and stops no one."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest

from nexus_admit.controller import warm as warm_mod
from nexus_admit.controller.context import Context
from nexus_admit.controller.loop.cycle import PassState
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.warm import WarmShapes, assumed_admissions, kueue_order, shape_key
from nexus_admit.kube.kueue import KueueIndex
from nexus_admit.kube.views import WorkloadView
from nexus_admit.placement import live_reduction as live_mod
from nexus_admit.placement.base import Warms
from nexus_admit.placement.policies import make_policy
from tests.controller.fake_api import FakeApi
from tests.controller.test_placing import (
    QR,
    CountingEngine,
    check_of,
    run,
    slot_nodes,
    watch,
)
from tests.kube.kube_factories import (
    admission_check,
    flavor,
    local_queue,
    node,
    pod_set,
    workload,
)

GPU = "nvidia.com/gpu"


def gpu_queue(*flavors: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "cq", "labels": {"scheduling.kubenexus.io/tier": "gold"}},
        "spec": {
            "admissionChecksStrategy": {"admissionChecks": [{"name": "nexus"}]},
            "resourceGroups": [
                {"coveredResources": ["cpu", "memory", GPU],
                 "flavors": [{"name": f, "resources": []} for f in flavors]},
            ],
        },
    }


def waiting(name: str, gpus: int = 1, job: str | None = None) -> dict[str, Any]:
    """A Workload in our queue that Kueue has not reserved quota for yet."""
    labels = {"batch.kubernetes.io/job-name": job or name}
    return workload(name, [pod_set(count=1, gpus=gpus, labels=labels)], cluster_queue=None,
                    conditions={}, created=QR)


def reserved(wl: dict[str, Any], on: str) -> dict[str, Any]:
    """`wl` once Kueue reserved its quota on flavor `on`."""
    out = copy.deepcopy(wl)
    out["status"]["conditions"] = [
        {"type": "QuotaReserved", "status": "True", "lastTransitionTime": QR}]
    out["status"]["admission"] = {
        "clusterQueue": "cq",
        "podSetAssignments": [
            {"name": ps["name"], "count": ps["count"],
             "flavors": {"cpu": on, "memory": on, GPU: on}}
            for ps in out["spec"]["podSets"]],
    }
    return out


def fleet(*workloads: dict[str, Any]) -> FakeApi:
    api = FakeApi()
    for i in range(12):
        pool = "h100" if i < 8 else "a100"
        api.put(node(f"n{i}", labels={"pool": pool}))
    api.put(flavor("h100", {"pool": "h100"}))
    api.put(flavor("a100", {"pool": "a100"}))
    tas = flavor("tas")
    tas["spec"]["topologyName"] = "default"
    api.put(tas)
    api.put(gpu_queue("h100", "a100", "tas"))
    api.put(local_queue("default", "q", "cq"))
    api.put(admission_check("nexus"))
    for w in workloads:
        api.put(w)
    return api


class Builds:
    """Counts the trackers built over the fleet."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = live_mod.LiveReduction.__init__

        def counting(tracker: Any, *args: Any) -> None:
            self.count += 1
            real(tracker, *args)

        monkeypatch.setattr(live_mod.LiveReduction, "__init__", counting)


def controller(api: FakeApi) -> Context:
    ctx = Context(options=RunOptions(webhook=False), api=api, engine=make_policy("nexus"))  # type: ignore[arg-type]
    watch(ctx, api)
    ctx.leadership.synced = True
    return ctx


def test_a_waiting_workload_is_assumed_on_each_flavor_but_kueues_topology_ones() -> None:
    api = fleet()
    kueue = KueueIndex.of(resource_flavors=api.of_kind("ResourceFlavor"))
    wl = waiting("w")
    assumed = assumed_admissions(wl, gpu_queue("h100", "a100", "tas"), kueue)
    on = [a["status"]["admission"]["podSetAssignments"][0]["flavors"] for a in assumed]
    assert on == [dict.fromkeys(("cpu", "memory", GPU), f) for f in ("h100", "a100")]
    assert "admission" not in wl["status"], "the Workload itself is left as it is"
    cpu_only = workload("c", [pod_set(gpus=0)], cluster_queue=None, conditions={})
    assert assumed_admissions(cpu_only, gpu_queue("h100"), kueue) == []


def test_one_jobs_shape_is_one_key_whatever_the_jobs_name() -> None:
    assert shape_key(waiting("a", job="a"), "cq") == shape_key(waiting("b", job="b"), "cq")
    assert shape_key(waiting("a", gpus=1), "cq") != shape_key(waiting("a", gpus=2), "cq")
    assert shape_key(waiting("a"), "cq") != shape_key(waiting("a"), "other-cq")


def test_shapes_are_warmed_in_the_order_kueue_reserves_quota() -> None:
    def queued(name: str, queue: str, priority: int | None, created: str) -> dict[str, Any]:
        wl = waiting(name)
        wl["spec"]["queueName"] = queue
        wl["metadata"]["creationTimestamp"] = created
        if priority is not None:
            wl["spec"]["priority"] = priority
        return wl

    kueue = KueueIndex.of(local_queues=[local_queue("default", "q", "cq"),
                                        local_queue("default", "other", "cq2")])
    wls = [
        queued("old-low", "q", None, "2026-01-01T00:00:00Z"),
        queued("new-high", "q", 100, "2026-01-01T00:00:09Z"),
        queued("other-old", "other", None, "2026-01-01T00:00:01Z"),
        queued("other-new", "other", None, "2026-01-01T00:00:05Z"),
        queued("new-low", "q", None, "2026-01-01T00:00:07Z"),
        queued("broken", "q", "high", None),  # type: ignore[arg-type]
    ]
    order = [w.name for w in kueue_order([WorkloadView.of(w) for w in wls], kueue)]
    # each scheduling cycle takes every queue's head: first the heads, then the seconds...
    # (a priority or time that cannot be read counts as none)
    assert order == ["new-high", "other-old", "broken", "other-new", "old-low", "new-low"]


def test_queue_heads_alike_in_priority_and_age_keep_their_queues_order() -> None:
    """Heads equal in priority and creation time come in the order their queues were
    first seen, whatever their own place in the list."""
    kueue = KueueIndex.of(local_queues=[local_queue("default", "x", "cq-x"),
                                        local_queue("default", "y", "cq-y")])

    def queued(name: str, queue: str, created: str) -> dict[str, Any]:
        wl = waiting(name)
        wl["spec"]["queueName"] = queue
        wl["metadata"]["creationTimestamp"] = created
        return wl

    wls = [queued("x-second", "x", "2026-01-01T00:00:02Z"),
           queued("y-head", "y", "2026-01-01T00:00:01Z"),
           queued("x-head", "x", "2026-01-01T00:00:01Z")]
    order = [w.name for w in kueue_order([WorkloadView.of(w) for w in wls], kueue)]
    assert order == ["x-head", "y-head", "x-second"]


def test_a_shape_warmed_while_waiting_is_decided_without_a_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = fleet(waiting("w"), waiting("twin"))
    ctx = controller(api)
    assert isinstance(ctx.engine, Warms)
    builds = Builds(monkeypatch)
    run(ctx)
    assert builds.count == 2, "the one shape, on each of its two flavors"
    assert ctx.metrics.warmed_shapes._value.get() == 1
    run(ctx)
    assert builds.count == 2, "warmed once"
    api.put(reserved(api.get("Workload", "w", "default"), "a100"))
    watch(ctx, api)
    run(ctx)
    watch(ctx, api)
    assert check_of(api, "w")["state"] == "Ready"
    assert builds.count == 2, "the decision synced the warmed tracker"
    assert slot_nodes(api.of_kind("ResourceReservation")[0]) <= {"n8", "n9", "n10", "n11"}


def test_a_warmed_decision_is_the_decision_without_the_warm() -> None:
    wl = waiting("w", gpus=2)
    cold, warm = fleet(wl), fleet(wl)
    cold_ctx, warm_ctx = controller(cold), controller(warm)
    cold_ctx.engine = CountingEngine()  # the same engine, without its warm
    assert not isinstance(cold_ctx.engine, Warms)
    run(cold_ctx)
    run(warm_ctx)
    assert warm_ctx.metrics.warmed_shapes._value.get() == 1
    for api, ctx in ((cold, cold_ctx), (warm, warm_ctx)):
        api.put(reserved(api.get("Workload", "w", "default"), "h100"))
        watch(ctx, api)
        run(ctx)
    rrs = [api.of_kind("ResourceReservation")[0]["spec"]["podSets"] for api in (cold, warm)]
    assert rrs[0] == rrs[1]


def test_a_malformed_waiting_workload_warms_nothing_and_stops_no_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = waiting("broken")
    broken["spec"]["podSets"][0]["template"]["spec"]["containers"] = "not a list"
    worse = waiting("worse")
    worse["spec"]["podSets"] = {"not": "a list"}
    api = fleet(broken, worse, waiting("fine", gpus=4))
    ctx = controller(api)
    builds = Builds(monkeypatch)
    run(ctx)
    assert builds.count == 2, "the well-formed shape is warmed on both flavors"
    api.put(reserved(api.get("Workload", "fine", "default"), "h100"))
    watch(ctx, api)
    run(ctx)
    watch(ctx, api)
    assert check_of(api, "fine")["state"] == "Ready"


def test_warmed_shapes_are_synced_while_they_wait_and_a_node_joining_warms_them_anew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nexus_admit.controller import warm as warm_mod
    from nexus_admit.kube.dump import ClusterDump

    api = fleet(waiting("w"))
    ctx = controller(api)
    engine = ctx.engine
    calls: list[str] = []
    translations: list[str] = []
    real_warm, real_gang = engine.warm, ClusterDump.gang  # type: ignore[attr-defined]

    def counting(snapshot: Any, gang: Any, config: Any) -> bool:
        calls.append(gang.name)
        return bool(real_warm(snapshot, gang, config))

    def translating(self: ClusterDump, wl: Any, *args: Any, **kwargs: Any) -> Any:
        translations.append(wl["metadata"]["name"])
        return real_gang(self, wl, *args, **kwargs)

    monkeypatch.setattr(engine, "warm", counting)
    monkeypatch.setattr(ClusterDump, "gang", translating)
    run(ctx)
    assert (len(calls), len(translations)) == (2, 2)
    run(ctx)
    assert len(calls) == 2, "nothing new, no sync due: no warm"
    monkeypatch.setattr(warm_mod, "RESYNC_SECONDS", 0.0)
    run(ctx)
    assert (len(calls), len(translations)) == (4, 2), "a sync round: no translation"
    monkeypatch.setattr(warm_mod, "RESYNC_SECONDS", 3600.0)
    api.put(reserved(api.get("Workload", "w", "default"), "h100"))
    watch(ctx, api)
    run(ctx)  # w is placed; none of its shape waits
    assert ctx.component(WarmShapes).current == set()
    done = len(calls)
    api.put(waiting("again"))  # the same shape waits again: synced at once, not translated
    watch(ctx, api)
    run(ctx)
    assert len(calls) == done + 2 and translations.count("again") == 0
    api.put(node("n12", labels={"pool": "a100"}))  # a node joins: the snapshot is renewed
    watch(ctx, api)
    # by the next build, here the capacity step's
    ctx.component(PassState).capacity_recorded = 0.0
    run(ctx)
    run(ctx)
    assert translations.count("again") == 2, "translated anew against the new fleet"


def test_kueues_own_queue_status_writes_keep_the_warmed_shapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kueue writes a ClusterQueue's status at every admission; what a shape's translation
    reads of it (labels, spec) did not change, so nothing is translated or warmed again.
    A change of its spec warms the waiting shapes anew."""
    api = fleet(waiting("w"))
    ctx = controller(api)
    builds = Builds(monkeypatch)
    run(ctx)
    assert builds.count == 2 and len(ctx.component(WarmShapes).done) == 1
    translated: list[str] = []
    real = warm_mod._to_warm

    def counting(wl: dict[str, Any], *args: Any) -> Any:
        translated.append(wl["metadata"]["name"])
        return real(wl, *args)

    monkeypatch.setattr(warm_mod, "_to_warm", counting)
    queue = api.get("ClusterQueue", "cq")
    assert queue is not None
    api.put({**queue, "status": {"admittedWorkloads": 3}})
    api.put(waiting("w2", gpus=2))  # a new waiting list, the queues' statuses changed
    watch(ctx, api)
    run(ctx)
    assert translated == ["w2"], "only the new Workload"
    assert len(ctx.component(WarmShapes).done) == 2
    api.put(gpu_queue("a100", "h100", "tas"))  # the flavors' order: Kueue tries a100 first
    api.put(waiting("w3", gpus=4))
    watch(ctx, api)
    run(ctx)
    assert sorted(translated) == ["w", "w2", "w2", "w3"], "every waiting shape anew"



def _warms_by_thread(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """"thread:shapes warmed" of every warm step from now on."""
    threads: list[str] = []
    real = warm_mod.WarmShapes.step

    def step(self: warm_mod.WarmShapes, *args: Any, **kwargs: Any) -> int:
        warmed = real(self, *args, **kwargs)
        threads.append(f"{threading.current_thread().name}:{warmed}")
        return warmed

    monkeypatch.setattr(warm_mod.WarmShapes, "step", step)
    return threads


def test_waiting_shapes_are_warmed_beside_a_gangs_solve_not_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pass that solves a gang (CP-SAT) warms the shapes waiting for quota in a thread
    beside the solve, on the pass's snapshot; the warm after the pass's decisions finds
    nothing left, and the gang is placed as by an engine that warms nothing."""
    gang = workload("gang", [pod_set(count=3, gpus=2)], cluster_queue=None, conditions={},
                    created=QR)
    api, cold = fleet(waiting("one", gpus=4), gang), fleet(gang)
    api.put(reserved(gang, "h100"))
    cold.put(reserved(gang, "h100"))
    ctx, cold_ctx = controller(api), controller(cold)
    cold_ctx.engine = CountingEngine()
    threads = _warms_by_thread(monkeypatch)
    run(ctx)
    run(cold_ctx)
    assert threads[0] == "beside-solve:1", threads
    assert all(t.endswith(":0") for t in threads[1:]), threads
    assert ctx.metrics.warmed_shapes._value.get() == 1
    watch(ctx, api)
    watch(cold_ctx, cold)
    assert check_of(api, "gang")["state"] == "Ready"
    rrs = [a.of_kind("ResourceReservation")[0]["spec"]["podSets"] for a in (api, cold)]
    assert rrs[0] == rrs[1]


def test_a_warm_stopped_between_flavors_warms_the_whole_shape_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Beside a solve a warm stops when the solve is done: between a shape's flavors, the
    shape stays to warm (not remembered as warmed with one flavor), and the next warm
    builds only the flavor left."""
    api = fleet(waiting("w"))
    ctx = controller(api)
    builds = Builds(monkeypatch)
    real = warm_mod.WarmShapes.step

    def stopping(self: warm_mod.WarmShapes, *args: Any) -> int:
        return real(self, *args, stop=lambda: builds.count >= 1)

    monkeypatch.setattr(warm_mod.WarmShapes, "step", stopping)
    run(ctx)
    assert builds.count == 1
    assert not ctx.component(WarmShapes).done and len(ctx.component(WarmShapes).to_warm) == 1
    assert ctx.metrics.warmed_shapes._value.get() == 0
    monkeypatch.setattr(warm_mod.WarmShapes, "step", real)
    run(ctx)
    assert builds.count == 2, "the first flavor's tracker synced, the second built"
    assert len(ctx.component(WarmShapes).done) == 1 and not ctx.component(WarmShapes).to_warm
    assert ctx.metrics.warmed_shapes._value.get() == 1


def test_a_workload_created_while_a_pass_decides_is_warmed_in_that_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between its decisions a pass plans its warming again from the store: a Workload
    Kueue created after the pass began (the next one it reserves, in a burst) is warmed
    beside the pass's next solve, not a pass later."""
    from nexus_admit.controller.loop import cycle as cycle_mod

    gangs = [workload(n, [pod_set(count=3, gpus=2)], cluster_queue=None, conditions={},
                      created=QR) for n in ("a", "b")]
    api = fleet()
    for g in gangs:
        api.put(reserved(g, "h100"))
    ctx = controller(api)
    monkeypatch.setattr(cycle_mod, "REPLAN_SECONDS", 0.0)
    real = cycle_mod._plan_warming_again
    planned: list[int] = []

    def plan_again(ctx: Context, active: set[str]) -> None:
        if not planned:  # the pass has begun: Kueue creates a Workload
            api.put(waiting("late", gpus=4))
            watch(ctx, api)
        planned.append(len(ctx.component(WarmShapes).done))
        real(ctx, active)

    monkeypatch.setattr(cycle_mod, "_plan_warming_again", plan_again)
    threads = _warms_by_thread(monkeypatch)
    run(ctx)
    assert planned == [0, 1], "planned before each of the two decisions"
    assert "beside-solve:1" in threads, threads
    assert len(ctx.component(WarmShapes).done) == 1 and ctx.metrics.warmed_shapes._value.get() == 1
    watch(ctx, api)
    assert check_of(api, "a")["state"] == check_of(api, "b")["state"] == "Ready"


def test_beside_a_solve_new_shapes_are_warmed_and_warmed_ones_not_synced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sync due is left to the warm after the decisions (`syncs=False` beside a solve):
    after a burst's changes a sync costs tens of ms at 5,000 nodes, and the shape's next
    decision syncs it anyway."""
    api = fleet(waiting("w"))
    ctx = controller(api)
    run(ctx)
    assert len(ctx.component(WarmShapes).done) == 1
    monkeypatch.setattr(warm_mod, "RESYNC_SECONDS", 0.0)
    synced: list[str] = []

    class Engine:
        def warm(self, snapshot: Any, gang: Any, config: Any) -> bool:
            synced.append(gang.name)
            return True

    configs = {name: view.config for name, view in ctx.checks.items()}
    args = (Engine(), None, ctx.store.dump(), KueueIndex(), configs, ctx.clocks.wall())
    assert ctx.component(WarmShapes).step(*args, syncs=False) == 0  # type: ignore[arg-type]
    assert synced == []
    ctx.component(WarmShapes).step(*args)  # type: ignore[arg-type]
    assert len(synced) == 2, "the shape's two flavors synced"


def test_planning_between_decisions_adds_new_shapes_and_leaves_the_syncs_to_the_pass() -> None:
    """`plan_new` (between a pass's decisions) only finds the shapes to warm; which shapes
    wait, and so which warmed one waiting again is synced at once, is the pass's `plan`."""
    api = fleet(waiting("w"))
    ctx = controller(api)
    run(ctx)
    shapes = ctx.component(WarmShapes)
    warmed = set(shapes.done)
    assert len(warmed) == 1 and shapes.current == warmed
    shapes.plan([], ctx.store.dump(), {"nexus"})  # no longer waiting
    assert shapes.current == set()
    api.put(waiting("again"))
    api.put(waiting("new", gpus=4))
    watch(ctx, api)
    dump = ctx.store.dump()
    stored = {w.name: w for w in ctx.store.workloads()}
    again, new = stored["again"], stored["new"]
    shapes.plan_new([again, new], dump, {"nexus"})
    assert [s.workload["metadata"]["name"] for s in shapes.to_warm] == ["new"]
    assert shapes.current == set() and shapes.resync == []
    shapes.plan([again, new], dump, {"nexus"})
    assert shapes.current == {*warmed, shapes.to_warm[0].key} and shapes.resync == [*warmed]


def test_planning_between_decisions_derives_a_waiting_list_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between decisions the same waiting list (the store unchanged) is not planned again."""
    api = fleet(waiting("w"))
    ctx = controller(api)
    run(ctx)
    orders: list[int] = []
    real = warm_mod.kueue_order

    def counting(waiting: Any, *args: Any) -> Any:
        orders.append(len(waiting))
        return real(waiting, *args)

    monkeypatch.setattr(warm_mod, "kueue_order", counting)
    dump = ctx.store.dump()
    later = [*ctx.store.workloads()]
    for _ in range(3):
        ctx.component(WarmShapes).plan_new(later, dump, {"nexus"})
    assert orders == [1], "the same list again: nothing derived again"
