"""The live snapshot (kube/cluster/live.py) equals a full build of the same objects after
any sequence of watch events: the same nodes in the same order, the same free GPUs, CPU,
memory and NUMA zones, the same topologies and the same malformed objects listed, with and
without the pass's excluded Workloads, while the previous pass's placements changed its
snapshot in between."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kube_factories import node, nrt, pod, reservation, topology_assignment, workload

from nexus_admit.controller.store import Store
from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.live import LiveSnapshot, WithoutReservations
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.errors import Skipped
from nexus_admit.model import ClusterSnapshot

START = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)
NODES = [f"n{i}" for i in range(5)]
WORKLOADS = ["w0", "w1", "w2"]
# versions never repeat across examples: translations are cached by (uid, resourceVersion)
VERSIONS = itertools.count(1)


class World:
    """A store fed events as the watches feed it: versions, uids, deletions."""

    def __init__(self) -> None:
        self.store = Store()
        self.live = LiveSnapshot(self.store.subscribe())
        self.live_bound = LiveSnapshot(self.store.subscribe())  # the capacity metrics' own
        self.version = VERSIONS
        self.now = START

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        rv = next(self.version)
        m = obj["metadata"]
        m["resourceVersion"] = str(rv)
        key = f"{m['namespace']}/{m['name']}" if m.get("namespace") else m["name"]
        old = self.store.get(kind, key)
        m["uid"] = old["metadata"]["uid"] if old is not None else f"uid-{kind}-{key}-{rv}"
        obj["kind"] = kind
        self.store.upsert(kind, obj)

    def delete(self, kind: str, key: str) -> None:
        old = self.store.get(kind, key)
        if old is not None:
            gone = {**old, "metadata": {**old["metadata"],
                                        "resourceVersion": str(next(self.version))}}
            self.store.delete(kind, gone)


def node_event(draw: st.DrawFn, w: World) -> None:
    name = draw(st.sampled_from(NODES))
    if draw(st.integers(0, 6)) == 0:
        w.delete("Node", name)
        return
    labels = {"example.com/rack": draw(st.sampled_from(["r0", "r1"]))}
    if draw(st.booleans()):
        labels[L.LABEL_NUMA_ZONES] = draw(st.sampled_from(["2", "x"]))  # "x": malformed
    w.put("Node", node(name, gpus=draw(st.sampled_from([4, 8])), labels=labels,
                       cpu=draw(st.sampled_from(["32", "64", "lots"])),
                       unschedulable=draw(st.booleans())))


def nrt_event(draw: st.DrawFn, w: World) -> None:
    name = draw(st.sampled_from(NODES))
    if draw(st.booleans()):
        w.delete("NodeResourceTopology", name)
    else:
        w.put("NodeResourceTopology", nrt(name, [("16", 2), ("16", 2)],
                                          available=draw(st.sampled_from([None, ["8", "4"]]))))


def pod_event(draw: st.DrawFn, w: World) -> None:
    name = f"p{draw(st.integers(0, 7))}"
    if draw(st.integers(0, 5)) == 0:
        w.delete("Pod", f"default/{name}")
        return
    labels, annotations = {}, {}
    if draw(st.booleans()):
        labels[L.LABEL_RESERVATION] = f"r{draw(st.integers(0, 3))}"
        annotations[L.ANN_SLOT] = f"main/{draw(st.integers(0, 2))}"
    fraction = draw(st.sampled_from([None, "0.5", "bad"]))
    if fraction is not None:
        annotations[L.ANN_GPU_FRACTION] = fraction
    if draw(st.integers(0, 4)) == 0:
        annotations[L.ANN_NUMA_ZONE] = draw(st.sampled_from(["1", "-1"]))
    if draw(st.integers(0, 2)) == 0:  # a pod Kueue started for a (TAS) Workload
        labels[L.KUEUE_PODSET_LABEL] = "main"
        annotations[L.KUEUE_WORKLOAD_ANNOTATION] = draw(st.sampled_from(WORKLOADS))
    w.put("Pod", pod(name, draw(st.sampled_from([None, *NODES])),
                     gpus=draw(st.integers(0, 2)), cpu=draw(st.sampled_from(["2", "oops"])),
                     phase=draw(st.sampled_from(["Running", "Running", "Succeeded"])),
                     labels=labels, annotations=annotations))


def reservation_event(draw: st.DrawFn, w: World) -> None:
    name = f"r{draw(st.integers(0, 3))}"
    if draw(st.integers(0, 4)) == 0:
        w.delete(L.KIND_RESOURCE_RESERVATION, f"default/{name}")
        return
    slots = []
    for i in range(draw(st.integers(1, 3))):
        gpus: Any = draw(st.sampled_from([[0], [1, 2], 2, [5], "bad"]))
        slot: dict[str, Any] = {"index": i, "node": draw(st.sampled_from(NODES)), "gpus": gpus}
        if draw(st.booleans()):
            slot["numaZone"] = draw(st.sampled_from([0, 1]))
        slots.append(slot)
    expires = draw(st.sampled_from([30, 90, 600, None, "bad"]))
    at = ((w.now + timedelta(seconds=expires)).strftime("%Y-%m-%dT%H:%M:%SZ")
          if isinstance(expires, int) else expires)
    w.put(L.KIND_RESOURCE_RESERVATION, reservation(
        name, draw(st.sampled_from(WORKLOADS)), slots, expires_at=at,
        requests=draw(st.booleans()), gpu_share=draw(st.sampled_from(["1", "0.5"])),
        phase=draw(st.sampled_from(["Reserved", "Reserved", "Bound", "Released"]))))


def workload_event(draw: st.DrawFn, w: World) -> None:
    from kube_factories import pod_set

    name = draw(st.sampled_from(WORKLOADS))
    if draw(st.integers(0, 3)) == 0:
        w.delete("Workload", f"default/{name}")
        return
    wl = workload(name, [pod_set("main", 3, cpu=draw(st.sampled_from(["3", "7"])))])
    shape = draw(st.integers(0, 5))
    if shape >= 2:  # Kueue TAS admitted it: its pods' nodes named before they bind
        per_node = draw(st.dictionaries(st.sampled_from(NODES), st.integers(1, 2),
                                        min_size=1, max_size=3))
        levels = ("kubernetes.io/hostname",) if shape != 5 else ("example.com/rack",)
        assignment: Any = topology_assignment(per_node, levels)
        if shape == 4 and draw(st.booleans()):
            assignment["slices"][0]["domainCount"] += 1  # malformed
        wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] = assignment
        wl["status"]["conditions"] = [{"type": t, "status": "True"} for t in draw(
            st.sampled_from([["QuotaReserved"], ["QuotaReserved"], [],
                             ["QuotaReserved", "Finished"]]))]
    w.put("Workload", wl)


SLICES = ["s0", "s1", "s2", "s3"]
CLAIMS = ["c0", "c1", "c2"]
POOLS = [*NODES, "shared"]  # "shared": one pool named by slices on several nodes


def slice_event(draw: st.DrawFn, w: World) -> None:
    """A GPU driver's ResourceSlice published, moved to another node or pool, changed,
    malformed, or withdrawn."""
    name = draw(st.sampled_from(SLICES))
    shape = draw(st.integers(0, 5))
    if shape == 0:
        w.delete("ResourceSlice", name)
        return
    node_name = draw(st.sampled_from(NODES))
    pool = draw(st.sampled_from([node_name, node_name, "shared"]))
    devices: Any = [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}}
                    for i in range(draw(st.integers(1, 3)))]
    if shape == 1:
        devices = "malformed"  # the node is left out, the slice listed
    spec: Any = {"nodeName": node_name, "driver": L.DRA_GPU_DRIVER,
                 "pool": {"name": pool}, "devices": devices}
    if shape == 2:
        spec = "malformed"
    w.put("ResourceSlice", {"metadata": {"name": name}, "spec": spec})


def claim_event(draw: st.DrawFn, w: World) -> None:
    """A ResourceClaim allocated devices of some pools (or none yet), malformed, or gone."""
    name = draw(st.sampled_from(CLAIMS))
    shape = draw(st.integers(0, 4))
    if shape == 0:
        w.delete("ResourceClaim", f"default/{name}")
        return
    results: Any = [{"request": "gpus", "driver": L.DRA_GPU_DRIVER,
                     "pool": draw(st.sampled_from(POOLS)),
                     "device": f"gpu-{draw(st.integers(0, 2))}"}
                    for _ in range(draw(st.integers(0, 2)))]
    if shape == 1:
        results = "malformed"
    w.put("ResourceClaim", {"metadata": {"name": name, "namespace": "default"},
                            "spec": {"devices": {"requests": []}},
                            "status": {"allocation": {"devices": {"results": results}}}})


def other_event(draw: st.DrawFn, w: World) -> None:
    what = draw(st.integers(0, 2))
    if what == 0:
        w.now += timedelta(seconds=draw(st.sampled_from([20, 60, 400])))
    elif what == 1:
        levels = draw(st.sampled_from([["example.com/rack"], []]))  # []: malformed
        w.put("Topology", {"apiVersion": "kueue.x-k8s.io/v1beta2",
                           "metadata": {"name": "fabric"},
                           "spec": {"levels": [{"nodeLabel": lv} for lv in levels]}})


EVENTS = [node_event, node_event, nrt_event, pod_event, pod_event, pod_event,
          reservation_event, reservation_event, workload_event, workload_event, slice_event,
          claim_event, other_event]


def key(s: Skipped) -> tuple[str, ...]:
    return (s.kind, s.namespace, s.name, s.field, s.reason, s.message, s.owner,
            s.resource_version)


def check(w: World, excluded: frozenset[str]) -> ClusterSnapshot:
    full_skipped: list[Skipped] = []
    full = w.store.dump().snapshot(exclude_workloads=excluded, now=w.now, skipped=full_skipped)
    live_skipped: list[Skipped] = []
    plan = w.live.gather(w.store, exclude_workloads=excluded, now=w.now)
    live = w.live.build(plan, live_skipped)
    assert list(live.nodes) == list(full.nodes)
    for name, expected in full.nodes.items():
        assert live.nodes[name] == expected, name
    assert live.kueue_topologies == full.kueue_topologies
    assert sorted(map(key, live_skipped)) == sorted(map(key, full_skipped))
    return live


def check_without_reservations(w: World) -> None:
    dump = w.store.dump()
    full = ClusterDump(by_kind={k: v for k, v in dump.by_kind.items()
                                if k != L.KIND_RESOURCE_RESERVATION}).snapshot(now=w.now,
                                                                               skipped=[])
    plan = w.live_bound.gather(WithoutReservations(w.store), now=w.now)
    bound = w.live_bound.build(plan, [])
    assert list(bound.nodes.items()) == list(full.nodes.items())


# DRA fleets: GPUs published as slices, held by claims, among the pods that bind there
DRA_EVENTS = [node_event, pod_event, pod_event, slice_event, slice_event, claim_event,
              claim_event, reservation_event]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_live_snapshot_equals_a_full_build_after_any_events(data: st.DataObject) -> None:
    run_events(data, EVENTS)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_live_snapshot_equals_a_full_build_on_a_dra_fleet(data: st.DataObject) -> None:
    run_events(data, DRA_EVENTS)


def run_events(data: st.DataObject, events: list[Any]) -> None:
    w = World()
    for _ in range(data.draw(st.integers(1, 40), label="events")):
        data.draw(st.sampled_from(events), label="event")(data.draw, w)
        if data.draw(st.integers(0, 2), label="pass now") == 0:
            continue
        excluded = frozenset(f"default/{n}" for n in data.draw(
            st.lists(st.sampled_from(WORKLOADS), max_size=2), label="excluded"))
        live = check(w, excluded)
        if data.draw(st.booleans(), label="capacity metrics now"):
            check_without_reservations(w)
        # the pass places on it: the next pass must not see what it took
        for name in data.draw(st.lists(st.sampled_from(NODES), max_size=2), label="taken"):
            if name in live.nodes:
                n = live.nodes[name]
                n.gpu_free = [0] * n.gpu_count
                n.free_cpu_milli = 0
                live.touch([name])


def test_a_pass_translates_only_the_nodes_an_event_marked() -> None:
    w = World()
    for name in NODES:
        w.put("Node", node(name))
    for i, name in enumerate(NODES):
        w.put("Pod", pod(f"p{i}", name, gpus=1))
    first = check(w, frozenset())
    before = {n: first.nodes[n] for n in NODES}
    w.put("Pod", pod("p9", "n2", gpus=2))
    plan = w.live.gather(w.store, now=w.now)
    assert plan.base.targets == {"n2"}
    assert [p["metadata"]["name"] for p in plan.base.pods] == ["p2", "p9"]
    second = w.live.build(plan, [])
    assert second is first  # one snapshot from pass to pass: the engine's memo carries over
    assert all(second.nodes[n] is before[n] for n in NODES if n != "n2")
    assert second.nodes["n2"].gpu_free.count(0) == 3


def test_events_that_move_no_capacity_leave_the_change_log_as_it_was() -> None:
    w = World()
    for name in NODES:
        w.put("Node", node(name))
    w.put("Pod", pod("p0", "n0", gpus=1, phase="Pending"))
    first = check(w, frozenset())
    logged = len(first.change_log)
    heartbeat = node("n1")
    heartbeat["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "lastHeartbeatTime": "2025-05-01T12:00:10Z"}]
    w.put("Node", heartbeat)  # a node's heartbeat
    w.put("Pod", pod("p0", "n0", gpus=1, phase="Running"))  # a bound pod starting
    second = check(w, frozenset())
    assert second is first and len(second.change_log) == logged
    w.put("Pod", pod("p1", "n2", gpus=2))  # capacity moves on n2 only
    third = check(w, frozenset())
    assert third.change_log[logged:] == ["n2"]


def test_a_reservation_expiring_frees_its_node_without_an_event() -> None:
    w = World()
    w.put("Node", node("n0"))
    at = (START + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    w.put(L.KIND_RESOURCE_RESERVATION,
          reservation("r0", "w0", [{"index": 0, "node": "n0", "gpus": [0, 1]}], expires_at=at))
    assert check(w, frozenset()).nodes["n0"].free_whole_gpus == 6
    w.now += timedelta(seconds=31)
    assert check(w, frozenset()).nodes["n0"].free_whole_gpus == 8


def test_a_malformed_pod_is_listed_on_every_pass_though_its_node_is_cached() -> None:
    w = World()
    w.put("Node", node("n0"))
    w.put("Node", node("n1"))
    w.put("Pod", pod("bad", "n0", annotations={L.ANN_GPU_FRACTION: "lots"}, gpus=1))
    for _ in range(3):
        skipped: list[Skipped] = []
        w.live.build(w.live.gather(w.store, now=w.now), skipped)
        assert [s.name for s in skipped] == ["bad"]
        w.put("Pod", pod("other", "n1"))  # another node changes; n0 stays cached


def dra_slice(name: str, node_name: str, pool: str, devices: int = 3) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "nodeName": node_name, "driver": L.DRA_GPU_DRIVER, "pool": {"name": pool},
        "devices": [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}}
                    for i in range(devices)]}}


def dra_claim(name: str, pool: str, device: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {}, "status": {
        "allocation": {"devices": {"results": [
            {"driver": L.DRA_GPU_DRIVER, "pool": pool, "device": device}]}}}}


def test_a_claim_marks_only_the_node_of_its_pool_and_stays_counted_there() -> None:
    w = World()
    for name in NODES:
        w.put("Node", node(name))
        w.put("ResourceSlice", dra_slice(f"{name}-gpus", name, name))
    w.put("ResourceClaim", dra_claim("c0", "n1", "gpu-1"))
    assert check(w, frozenset()).nodes["n1"].gpu_free[:3] == [1000, 0, 1000]
    w.put("ResourceClaim", dra_claim("c1", "n3", "gpu-2"))
    plan = w.live.gather(w.store, now=w.now)
    assert plan.base.targets == {"n3"}  # a DRA fleet is no longer read whole
    assert [c["metadata"]["name"] for c in plan.base.claims] == ["c1"]
    assert w.live.build(plan, []).nodes["n3"].gpu_free[:3] == [1000, 1000, 0]
    w.put("Pod", pod("p1", "n1", gpus=1))  # n1 is read again, with the claim it holds
    assert check(w, frozenset()).nodes["n1"].gpu_free[:3] == [0, 0, 1000]


def test_a_pool_named_on_two_nodes_reads_both() -> None:
    """A device two nodes' slices name is the later node's in a full build: a pass that
    reads one of them reads the other too, and gets the same answer."""
    w = World()
    for name in NODES:
        w.put("Node", node(name))
    w.put("ResourceSlice", dra_slice("a", "n0", "shared"))
    w.put("ResourceSlice", dra_slice("b", "n2", "shared"))
    w.put("ResourceClaim", dra_claim("c0", "shared", "gpu-0"))
    check(w, frozenset())
    w.put("Pod", pod("p1", "n0", gpus=1))
    check(w, frozenset())
    w.delete("ResourceSlice", "b")  # the device is n0's now
    assert check(w, frozenset()).nodes["n0"].gpu_free[:2] == [0, 0]


def test_each_pass_says_why_the_engines_fleet_facts_were_dropped() -> None:
    w = World()
    for name in NODES[:3]:
        w.put("Node", node(name))

    def renewed() -> str | None:
        w.live.build(w.live.gather(w.store, now=w.now), [])
        return w.live.renewed

    assert renewed() == "first"
    w.put("Pod", pod("p0", "n0", gpus=1))
    assert renewed() is None  # free capacity only: the facts carry over
    w.put("Node", node("n1", labels={"zone": "b"}))
    assert renewed() == "static"
    w.put("Node", node("n3"))
    assert renewed() == "membership"
    w.delete("Node", "n3")
    assert renewed() == "nodes-dropped"
    assert renewed() is None


def test_a_tas_assignment_is_counted_with_the_stores_limit_ranges_and_runtime_classes() -> None:
    w = World()
    w.put("Node", node("n0"))
    wl = workload("w0", [{"name": "main", "count": 2, "template": {"spec": {
        "runtimeClassName": "kata", "containers": [{"name": "c", "resources": {}}]}}}])
    wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] = (
        topology_assignment({"n0": 2}))
    w.put("Workload", wl)
    w.put("LimitRange", {"metadata": {"name": "d", "namespace": "default"}, "spec": {
        "limits": [{"type": "Container", "defaultRequest": {"cpu": "2"}}]}})
    w.put("RuntimeClass", {"metadata": {"name": "kata"}, "handler": "kata",
                           "overhead": {"podFixed": {"cpu": "250m"}}})
    live = check(w, frozenset())  # equal to a full build of the same objects
    assert live.nodes["n0"].free_cpu_milli == 64_000 - 2 * (2_000 + 250)
