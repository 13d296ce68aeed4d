"""`kube/slices.py`: what an elastic Job's Workload slices and a shrinking Workload say."""

from __future__ import annotations

from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.nodes import node_from_object
from nexus_admit.kube.reservations import reservation_pod_label
from nexus_admit.kube.slices import (
    added_gang,
    carried_domain,
    carried_slots,
    replaced_slice,
    surplus_trimmed,
    template_reservation_label,
    wanted_slots,
    with_carried,
)
from nexus_admit.model import Gang, PodSet
from tests.kube.kube_factories import node, pod_set, workload


def _rr(name: str, slots: list[tuple[int, str]], pod_label: str | None = None) -> dict[str, Any]:
    ann = {L.ANN_POD_LABEL: pod_label} if pod_label else {}
    return {
        "metadata": {"name": name, "namespace": "default", "annotations": ann},
        "spec": {"podSets": [{"name": "main", "requests": {"cpu": "4", "memory": "16Gi"},
                              "slots": [{"index": i, "node": n, "gpus": [i]} for i, n in slots]}]},
    }


def test_a_slice_names_the_one_it_replaces_in_its_own_namespace_only() -> None:
    w = workload("w2", [pod_set(count=4)])
    assert replaced_slice(w) is None
    w["metadata"]["annotations"] = {L.KUEUE_WORKLOAD_SLICE_REPLACES: "default/w1"}
    assert replaced_slice(w) == "default/w1"
    w["metadata"]["annotations"] = {L.KUEUE_WORKLOAD_SLICE_REPLACES: "other/w1"}
    assert replaced_slice(w) is None


def test_the_template_label_must_be_one_label_on_every_pod_set() -> None:
    ours = {L.LABEL_RESERVATION: "rr1"}
    assert template_reservation_label(workload("w", [pod_set(labels=ours)])) == "rr1"
    mixed = [pod_set("a", labels=ours), pod_set("b")]
    assert template_reservation_label(workload("w", mixed)) is None


def test_the_new_slice_keeps_the_old_slots_and_numbers_the_added_after_them() -> None:
    old = _rr("rr1", [(0, "n0"), (1, "n0")])
    carried = carried_slots(old, {"main": 4})
    gang = Gang("default/w2", (PodSet("main", 4, gpus=1),))
    added = added_gang(gang, carried)
    assert added is not None and added.pod_sets[0].count == 2
    body = _rr("rr2", [(0, "n1"), (1, "n1")])
    merged = with_carried(body, old, carried, ["main"], "rr1")
    slots = merged["spec"]["podSets"][0]["slots"]
    assert [(s["index"], s["node"]) for s in slots] == [(0, "n0"), (1, "n0"), (2, "n1"), (3, "n1")]
    assert reservation_pod_label(merged) == "rr1"
    assert reservation_pod_label(body) == "rr2"
    # a slice that adds nothing to a pod set keeps its slots and requests
    assert added_gang(Gang("default/w2", (PodSet("main", 2, gpus=1),)), carried) is None


def test_the_added_pods_are_tried_in_the_smallest_domain_the_carried_slots_share() -> None:
    nodes = {n: node_from_object(node(n, labels={"rack": r, "block": "b1"}))[0]
             for n, r in (("n0", "r1"), ("n1", "r1"), ("n2", "r2"))}
    carried = carried_slots(_rr("rr1", [(0, "n0"), (1, "n1")]), {"main": 2})
    assert carried_domain(carried, nodes, ["block", "rack"]) == {"rack": "r1"}
    spread = carried_slots(_rr("rr1", [(0, "n0"), (1, "n2")]), {"main": 2})
    assert carried_domain(spread, nodes, ["block", "rack"]) == {"block": "b1"}


def test_a_scale_down_and_reclaimable_pods_lower_the_slots_wanted() -> None:
    w = workload("w", [pod_set(count=4)])
    assert wanted_slots(w) == {"main": 4}
    w["spec"]["podSets"][0]["count"] = 3
    w["status"]["reclaimablePods"] = [{"name": "main", "count": 1}, {"name": "x", "count": 9}]
    assert wanted_slots(w) == {"main": 2}


def test_only_surplus_slots_no_live_pod_holds_are_given_back() -> None:
    rr = _rr("rr", [(0, "n0"), (1, "n0"), (2, "n1"), (3, "n1")])
    assert surplus_trimmed(rr, {"main": 4}, set()) is None
    kept = surplus_trimmed(rr, {"main": 2}, {"main/0", "main/1", "main/3"})
    assert kept is not None
    assert [s["index"] for s in kept[0]["slots"]] == [0, 1, 3]
    kept = surplus_trimmed(rr, {"main": 2}, {"main/0", "main/1"})
    assert kept is not None
    assert [s["index"] for s in kept[0]["slots"]] == [0, 1]
    assert surplus_trimmed(rr, {}, set()) is None  # a pod set the Workload does not name
