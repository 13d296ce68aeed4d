"""The store keeps the newest version of every object; stale and duplicate events change
nothing; a re-list drops what it no longer holds unless an event newer than the list updated it."""

from __future__ import annotations

from typing import Any

from nexus_admit.controller.store import PerObject, Store
from nexus_admit.kube import labels as L


def obj(name: str, rv: int, ns: str | None = "ns", **extra: object) -> dict[str, object]:
    m: dict[str, object] = {"name": name, "resourceVersion": str(rv)}
    if ns:
        m["namespace"] = ns
    return {"kind": "Pod", "metadata": m, **extra}


def test_an_older_event_after_a_newer_one_is_ignored() -> None:
    s = Store()
    assert s.upsert("Pod", obj("a", 10, spec={"v": 2}))
    assert not s.upsert("Pod", obj("a", 7, spec={"v": 1}))
    assert s.get("Pod", "ns/a")["spec"] == {"v": 2}


def test_a_duplicate_event_keeps_one_object() -> None:
    s = Store()
    s.upsert("Pod", obj("a", 10))
    s.upsert("Pod", obj("a", 10))
    assert len(s.items("Pod")) == 1


def test_a_stale_add_after_a_delete_does_not_resurrect() -> None:
    s = Store()
    s.upsert("Pod", obj("a", 10))
    assert s.delete("Pod", obj("a", 12))
    assert not s.upsert("Pod", obj("a", 11))
    assert s.get("Pod", "ns/a") is None
    assert s.upsert("Pod", obj("a", 13))  # re-created later: a real new object


def test_relist_drops_objects_deleted_during_a_watch_gap() -> None:
    s = Store()
    s.upsert("Pod", obj("gone", 5))
    s.upsert("Pod", obj("kept", 6))
    s.upsert("Pod", obj("newer", 30))  # an event after the list was taken
    s.replace("Pod", [obj("kept", 6)], list_version=20)
    assert {o["metadata"]["name"] for o in s.items("Pod")} == {"kept", "newer"}


def test_dump_answers_the_same_queries_as_a_cluster_dump() -> None:
    s = Store()
    s.upsert("Node", {"kind": "Node", "metadata": {"name": "n1", "resourceVersion": "1"}})
    assert s.dump().kind("Node")[0]["metadata"]["name"] == "n1"


def test_a_dump_is_the_store_as_it_is_now_and_reuses_the_lists_of_kinds_that_did_not_change(
) -> None:
    s = Store()
    s.upsert("Node", {"kind": "Node", "metadata": {"name": "n1", "resourceVersion": "1"}})
    s.upsert("Pod", obj("p1", 2))
    first = s.dump()
    s.upsert("Pod", obj("p2", 3))
    second = s.dump()
    assert second.kind("Node") is first.kind("Node")  # no Node changed: not copied again
    assert [p["metadata"]["name"] for p in first.kind("Pod")] == ["p1"]  # as it was then
    assert sorted(p["metadata"]["name"] for p in second.kind("Pod")) == ["p1", "p2"]
    s.delete("Node", {"kind": "Node", "metadata": {"name": "n1", "resourceVersion": "4"}})
    s.replace("Pod", [obj("p2", 3)], list_version=5)
    third = s.dump()
    assert third.kind("Node") == [] and len(first.kind("Node")) == 1
    assert [p["metadata"]["name"] for p in third.kind("Pod")] == ["p2"]


def reserved_pod(name: str, rv: int, rr: str | None, gated: bool) -> dict[str, object]:
    labels = {"scheduling.kubenexus.io/reservation": rr} if rr else {}
    spec = {"schedulingGates": [{"name": "scheduling.kubenexus.io/placement"}]} if gated else {}
    o = obj(name, rv, spec=spec)
    o["metadata"]["labels"] = labels  # type: ignore[index]
    return o


def test_the_pod_indexes_follow_labels_gates_deletes_and_relists() -> None:
    s = Store()
    s.upsert("Pod", reserved_pod("a", 1, "rr-1", gated=True))
    s.upsert("Pod", reserved_pod("b", 2, "rr-1", gated=False))
    s.upsert("Pod", reserved_pod("c", 3, None, gated=True))
    assert {p["metadata"]["name"] for p in s.pods_of_reservation("ns", "rr-1")} == {"a", "b"}
    assert {p["metadata"]["name"] for p in s.gated_pods()} == {"a", "c"}
    assert [v.raw for v in s.gated_pod_views()] == s.gated_pods()
    s.upsert("Pod", reserved_pod("a", 4, "rr-1", gated=False))  # ungated
    s.upsert("Pod", reserved_pod("b", 5, "rr-2", gated=False))  # relabelled
    assert {p["metadata"]["name"] for p in s.gated_pods()} == {"c"}
    assert [p["metadata"]["name"] for p in s.pods_of_reservation("ns", "rr-1")] == ["a"]
    assert [p["metadata"]["name"] for p in s.pods_of_reservation("ns", "rr-2")] == ["b"]
    assert s.pods_of_reservation("other", "rr-2") == []
    s.delete("Pod", reserved_pod("a", 6, "rr-1", gated=False))
    assert s.pods_of_reservation("ns", "rr-1") == []
    s.replace("Pod", [reserved_pod("b", 5, "rr-2", gated=False)], list_version=10)  # c gone
    assert s.gated_pods() == []
    assert [p["metadata"]["name"] for p in s.pods_of_reservation("ns", "rr-2")] == ["b"]


def test_a_statefulset_is_kept_trimmed_to_its_identity_and_labels() -> None:
    """Only its queue label is read; a re-list's items carry no kind, the store's copy does
    (the owner index keys owners by kind)."""
    store = Store()
    listed = {
        "metadata": {"name": "db", "namespace": "ns", "uid": "u", "resourceVersion": "5",
                     "labels": {"kueue.x-k8s.io/queue-name": "q"}, "annotations": {"big": "x"}},
        "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}},
    }
    store.replace("StatefulSet", [listed], 5)
    (kept,) = store.items("StatefulSet")
    assert kept == {
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": "ns", "uid": "u", "resourceVersion": "5",
                     "labels": {"kueue.x-k8s.io/queue-name": "q"}},
    }


# ---- the live snapshot's feed and indexes (kube/cluster/live.py)

RR_KIND = "ResourceReservation"


def bound_pod(name: str, rv: int, node: str | None, rr: str | None = None) -> dict[str, object]:
    o = obj(name, rv, spec={"nodeName": node} if node else {})
    o["metadata"]["labels"] = (  # type: ignore[index]
        {"scheduling.kubenexus.io/reservation": rr} if rr else {})
    return o


def rr_obj(name: str, rv: int, workload: str, nodes: list[str]) -> dict[str, object]:
    slots = [{"index": i, "node": n, "gpus": [0]} for i, n in enumerate(nodes)]
    return {"kind": RR_KIND, "metadata": {"name": name, "namespace": "ns",
                                          "resourceVersion": str(rv)},
            "spec": {"workloadRef": {"name": workload, "namespace": "ns"},
                     "podSets": [{"name": "main", "slots": slots}]}}


def test_pods_and_reservations_are_indexed_by_node_and_follow_moves() -> None:
    s = Store()
    s.upsert("Pod", bound_pod("a", 1, "n1"))
    s.upsert("Pod", bound_pod("b", 2, "n1"))
    s.upsert(RR_KIND, rr_obj("r", 3, "w", ["n1", "n2"]))
    assert [p["metadata"]["name"] for p in s.pods_on_node("n1")] == ["a", "b"]
    s.upsert("Pod", bound_pod("a", 4, "n2"))  # moved
    assert [p["metadata"]["name"] for p in s.pods_on_node("n1")] == ["b"]
    assert [p["metadata"]["name"] for p in s.pods_on_node("n2")] == ["a"]
    assert [r["metadata"]["name"] for r in s.reservations_on_node("n2")] == ["r"]
    assert [r["metadata"]["name"] for r in s.reservations_of_workload("ns/w")] == ["r"]
    # and as their views, the store's own
    assert s.pod_views_on_node("n2") == [s.pod("ns/a")]
    assert s.reservation_views_on_node("n2") == [s.reservation("ns/r")]
    s.delete(RR_KIND, rr_obj("r", 5, "w", ["n1", "n2"]))
    assert s.reservations_on_node("n1") == [] and s.reservations_of_workload("ns/w") == []
    assert s.reservation_views_on_node("n1") == []
    # a pod keeps its place when it changes, as in the store's own order
    assert s.order("Pod", "ns/a") < s.order("Pod", "ns/b")


def test_the_feed_marks_the_nodes_a_change_moves() -> None:
    s = Store()
    feed = s.subscribe()
    assert feed.take().everything  # a new subscriber reads everything first
    s.upsert(RR_KIND, rr_obj("r", 1, "w", ["n1", "n2"]))
    s.upsert("Pod", bound_pod("p", 2, None, rr="r"))
    changes = feed.take()
    assert changes.nodes == {"n1", "n2"} and set(changes.pods) == {"ns/p"}
    s.upsert("Pod", bound_pod("p", 3, "n3", rr="r"))  # bound: its slot is counted as the pod
    changes = feed.take()
    assert changes.nodes == {"n1", "n2", "n3"}
    assert changes.touched == {"n3"}, "the other slots' nodes: nothing on them changed"
    s.upsert("Node", {"kind": "Node", "metadata": {"name": "n4", "resourceVersion": "4"}})
    changes = feed.take()
    assert changes.nodes == changes.node_objects == changes.touched == {"n4"}
    gpus = {"kind": "ResourceSlice", "metadata": {"name": "s", "resourceVersion": "5"},
            "spec": {"nodeName": "n5", "driver": "gpu.nvidia.com", "pool": {"name": "p"}}}
    s.upsert("ResourceSlice", gpus)
    changes = feed.take()  # its node, not the whole fleet
    assert not changes.everything and changes.nodes == changes.node_objects == {"n5"}
    s.upsert("ResourceSlice", {**gpus, "metadata": {"name": "s2", "resourceVersion": "6"},
                               "spec": {**gpus["spec"], "nodeName": "n6"}})
    assert feed.take().nodes == {"n5", "n6"}  # a pool shared with n5's slice
    claim = {"kind": "ResourceClaim",
             "metadata": {"name": "c", "namespace": "ns", "resourceVersion": "7"},
             "status": {"allocation": {"devices": {"results": [
                 {"driver": "gpu.nvidia.com", "pool": "p", "device": "gpu-0"}]}}}}
    s.upsert("ResourceClaim", claim)
    changes = feed.take()
    assert changes.nodes == {"n5", "n6"} and set(changes.claims) == {"ns/c"}
    assert s.nodes_of_pool("gpu.nvidia.com\np") == {"n5", "n6"}
    assert [c["metadata"]["name"] for c in s.claims_in_pool("gpu.nvidia.com\np")] == ["c"]
    assert [sl["metadata"]["name"] for sl in s.slices_on_node("n6")] == ["s2"]


def test_a_relist_of_the_same_versions_marks_nothing() -> None:
    s = Store()
    s.upsert("Pod", bound_pod("p", 2, "n1"))
    feed = s.subscribe()
    feed.take()
    s.replace("Pod", [bound_pod("p", 2, "n1")], list_version=10)
    changes = feed.take()
    assert not changes.nodes and not changes.pods
    assert [p["metadata"]["name"] for p in s.pods_on_node("n1")] == ["p"]


def test_a_node_heartbeat_is_no_change() -> None:
    """KWOK and kubelets rewrite node status every few seconds at 5,000 nodes (conditions'
    heartbeat times, stripped on the way in): the stored version stays (the caches keyed
    on it stay warm), no pass is woken and no node is marked for the live snapshot."""
    s = Store()
    node = {"kind": "Node", "metadata": {"name": "n1", "resourceVersion": "4"},
            "status": {"allocatable": {"nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "lastHeartbeatTime": "t1"}]}}
    assert s.upsert("Node", node)
    held = s.get("Node", "n1")
    feed = s.subscribe()
    feed.take()
    beat = {**node, "metadata": {"name": "n1", "resourceVersion": "9"},
            "status": {**node["status"], "conditions": [{"type": "Ready",  # type: ignore[dict-item]
                                                         "lastHeartbeatTime": "t2"}]}}
    assert not s.upsert("Node", beat)
    assert s.get("Node", "n1") is held and not feed.take().nodes
    changed = {**beat, "metadata": {"name": "n1", "resourceVersion": "10"},
               "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
    assert s.upsert("Node", changed)
    assert feed.take().node_objects == {"n1"}
    assert not s.upsert("Node", beat), "older than the stored version: stale"


def test_a_pod_changed_only_in_its_version_stays_as_it_was_in_every_index() -> None:
    s = Store()
    gated = bound_pod("p", 2, None, rr="r")
    gated["spec"] = {"schedulingGates": [{"name": "scheduling.kubenexus.io/placement"}]}
    s.upsert("Pod", gated)
    held = s.get("Pod", "ns/p")
    again = {**gated, "metadata": {**gated["metadata"], "resourceVersion": "5"}}  # type: ignore[dict-item]
    assert not s.upsert("Pod", again)
    assert s.pods_of_reservation("ns", "r") == [held] and s.gated_pods() == [held]
    bound = {**again, "metadata": {**again["metadata"], "resourceVersion": "6"},  # type: ignore[dict-item]
             "spec": {"nodeName": "n1"}}
    assert s.upsert("Pod", bound)
    assert s.gated_pods() == [] and s.pods_on_node("n1") == [s.get("Pod", "ns/p")]


def test_per_object_derives_only_what_the_store_holds_anew() -> None:
    """A value is derived once per stored object: again for an object the store replaced,
    for all when the context is not what it was, and objects no longer listed are let go."""
    store = Store()
    for i in range(100):
        store.upsert("Workload", {"metadata": {"name": f"w{i}", "namespace": "d",
                                               "resourceVersion": "1"}})
    derived: list[str] = []

    def name(obj: dict[str, Any]) -> str:
        derived.append(obj["metadata"]["name"])
        return str(obj["metadata"]["name"])

    memo: PerObject[str] = PerObject()
    first = memo.values(store.listed("Workload"), name, ("nexus",))
    assert first == [f"w{i}" for i in range(100)] and len(derived) == 100
    derived.clear()
    store.upsert("Workload", {"metadata": {"name": "w7", "namespace": "d",
                                           "resourceVersion": "2"}, "spec": {"x": 1}})
    assert memo.values(store.listed("Workload"), name, ("nexus",)) == first
    assert derived == ["w7"], "only the object the store replaced"
    derived.clear()
    assert memo.values(store.listed("Workload"), name, ("other",)) == first
    assert len(derived) == 100, "another context: every value derived again"
    for i in range(90):
        store.delete("Workload", {"metadata": {"name": f"w{i}", "namespace": "d"}})
    assert memo.values(store.listed("Workload"), name, ("other",)) == [
        f"w{i}" for i in range(90, 100)]
    assert len(memo) == 10, "the objects no longer listed were let go"
    assert memo.values([], name, ("nexus",)) == [] and len(memo) == 0, "a new context"


def test_the_store_builds_each_view_once_when_it_accepts_an_object() -> None:
    """A view per Workload, reservation and pod, built on the way in and kept while the
    store keeps that object: the same view until the object changes, none once deleted."""
    s = Store()
    rr = {"metadata": {"name": "r", "namespace": "ns", "resourceVersion": "1"},
          "spec": {"workloadRef": {"name": "w", "uid": "u"}}}
    pod = {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "1",
                        "labels": {L.LABEL_RESERVATION: "r"}}}
    s.upsert(L.KIND_RESOURCE_RESERVATION, rr)
    s.upsert("Pod", pod)
    s.upsert("Workload", {"metadata": {"name": "w", "namespace": "ns", "resourceVersion": "1"}})
    view = s.reservation("ns/r")
    assert view is not None and view.raw is s.get(L.KIND_RESOURCE_RESERVATION, "ns/r")
    assert view.workload_key == "ns/w" and s.workload("ns/w") is s.workloads()[0]
    assert s.reservations() == [view] and s.reservations() is s.reservations()
    assert [p.key for p in s.pod_views_of_reservation("ns", "r")] == ["ns/p"]
    assert s.pod("ns/p") is s.pod_views_of_reservation("ns", "r")[0]
    s.upsert(L.KIND_RESOURCE_RESERVATION, {**rr, "metadata": {**rr["metadata"],
                                                                "resourceVersion": "1"}})
    assert s.reservation("ns/r") is view, "the same object again: the same view"
    s.upsert(L.KIND_RESOURCE_RESERVATION, {**rr, "metadata": {**rr["metadata"],
                                                                "resourceVersion": "2"},
                                           "status": {"phase": "Bound"}})
    again = s.reservation("ns/r")
    assert again is not view and again is not None and again.phase == "Bound"
    assert s.reservations() == [again]
    s.delete("Pod", pod)
    assert s.pod("ns/p") is None and s.pod_views_of_reservation("ns", "r") == []


def test_a_malformed_object_is_stored_with_a_view_naming_its_problem() -> None:
    """One bad object never stops the store: its view names the field, the rest go on."""
    s = Store()
    s.upsert(L.KIND_RESOURCE_RESERVATION, {
        "metadata": {"name": "bad", "namespace": "ns", "resourceVersion": "1",
                     "annotations": ["not", "a", "map"]},
        "spec": {"expiresAt": "whenever", "podSets": "many"}})
    s.upsert("Pod", {"metadata": {"name": "p", "namespace": "ns", "labels": "x"},
                     "spec": 3, "status": {"conditions": "none"}})
    bad = s.reservation("ns/bad")
    assert bad is not None and bad.slots == () and bad.problem is not None
    assert bad.problem.field == "spec.expiresAt"
    pod = s.pod("ns/p")
    assert pod is not None and (pod.node, pod.reservation, pod.gated) == (None, None, False)


def test_the_store_keeps_each_views_problem_while_it_keeps_that_version() -> None:
    """What a view could not read is kept per object for the pass to tell: replaced by a
    newer version's, dropped once the object is fixed or deleted; none for the others."""
    s = Store()
    broken = {"metadata": {"name": "w", "namespace": "ns", "resourceVersion": "1"},
              "status": "lost"}
    s.upsert("Workload", broken)
    s.upsert("Workload", {"metadata": {"name": "ok", "namespace": "ns",
                                       "resourceVersion": "1"}, "status": {}})
    s.upsert("Pod", obj("p", 1))
    (problem,) = s.view_problems()
    assert (problem.kind, problem.name, problem.field) == ("Workload", "w", "status")
    assert problem.resource_version == "1"
    s.upsert("Workload", {**broken, "metadata": {**broken["metadata"], "resourceVersion": "2"},
                          "status": ["broken", "anew"]})
    (again,) = s.view_problems()
    assert again.resource_version == "2", "the stored version's"
    s.upsert("Workload", {**broken, "metadata": {**broken["metadata"], "resourceVersion": "3"},
                          "status": {}})
    assert s.view_problems() == [], "fixed"
    s.upsert("Workload", {**broken, "metadata": {**broken["metadata"], "resourceVersion": "4"}})
    assert len(s.view_problems()) == 1
    s.delete("Workload", {**broken, "metadata": {**broken["metadata"], "resourceVersion": "5"}})
    assert s.view_problems() == [], "deleted"
    s.upsert("Workload", {**broken, "metadata": {**broken["metadata"], "resourceVersion": "6"}})
    s.replace("Workload", [], list_version=7)
    assert s.view_problems() == [], "gone from a re-list"
