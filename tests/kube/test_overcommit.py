"""Which reserved slots a node has no room for once pods nexus-admit does not place were bound
there (`kube/cluster/overcommit.py`)."""

from __future__ import annotations

from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.overcommit import displaced_slots
from tests.kube.kube_factories import node, pod, reservation, tas_pod, tas_workload


def _rr(name: str, created: str, slots: list[dict[str, Any]]) -> dict[str, Any]:
    rr = reservation(name, f"wl-{name}", slots)
    rr["metadata"]["creationTimestamp"] = created
    return rr


def _found(n: dict[str, Any], pods: list[dict[str, Any]], rrs: list[dict[str, Any]],
           pinned: frozenset[tuple[str, str]] = frozenset()) -> list[tuple[str, str, bool]]:
    return [(d.reservation, d.slot, d.held) for d in displaced_slots(n, pods, rrs, pinned)]


OLD = _rr("old", "2026-01-01T00:00:00Z", [{"index": 0, "node": "n0", "gpus": [0, 1, 2, 3]}])
NEW = _rr("new", "2026-01-01T00:01:00Z", [{"index": 0, "node": "n0", "gpus": [4, 5, 6, 7]}])


def test_slots_that_fit_beside_what_is_bound_are_not_displaced() -> None:
    hog = pod("hog", "n0", gpus=0)  # takes no GPU
    assert _found(node("n0"), [hog], [OLD, NEW]) == []


def test_the_newest_reservation_is_displaced_and_the_older_one_kept() -> None:
    hog = pod("hog", "n0", gpus=4)  # on devices the device plugin picked, perhaps OLD's
    (found,) = displaced_slots(node("n0"), [hog], [NEW, OLD], frozenset())
    assert (found.reservation, found.slot, found.held) == ("default/new", "main/0", False)
    assert found.node == "n0" and found.others == ("pod default/hog",)


def test_a_node_taken_whole_displaces_every_slot_there() -> None:
    hog = pod("hog", "n0", gpus=8)
    assert _found(node("n0"), [hog], [OLD, NEW]) == [
        ("default/old", "main/0", False), ("default/new", "main/0", False)]


def test_cpu_memory_and_pods_count_as_well_as_gpus() -> None:
    hog = pod("hog", "n0", cpu="62")  # the reservation's slots ask 4 CPUs each
    assert _found(node("n0"), [hog], [OLD, NEW]) == [
        ("default/old", "main/0", False), ("default/new", "main/0", False)]
    full = node("n0", pods="1")
    assert _found(full, [hog], [OLD]) == [("default/old", "main/0", False)]


def test_a_pinned_slot_counts_first_and_is_reported_held() -> None:
    hog = pod("hog", "n0", gpus=4)
    # the newer gang's pod is pinned there: kube-scheduler binds it when room is there
    assert _found(node("n0"), [hog], [OLD, NEW], frozenset({("default/new", "main/0")})) == [
        ("default/old", "main/0", False)]
    assert _found(node("n0"), [pod("all", "n0", gpus=8)], [NEW],
                  frozenset({("default/new", "main/0")})) == [("default/new", "main/0", True)]


def test_a_slot_whose_pod_is_bound_counts_as_its_pod() -> None:
    own = pod("own", "n0", gpus=4, labels={L.LABEL_RESERVATION: "old"},
              annotations={L.ANN_SLOT: "main/0"})
    assert _found(node("n0"), [own], [OLD, NEW]) == []
    hog = pod("hog", "n0", gpus=4)
    assert _found(node("n0"), [own, hog], [OLD, NEW]) == [("default/new", "main/0", False)]


def test_finished_pods_take_nothing() -> None:
    done = pod("done", "n0", gpus=8, phase="Succeeded")
    assert _found(node("n0"), [done], [OLD, NEW]) == []


def test_an_unreadable_node_displaces_nothing() -> None:
    broken = node("n0")
    broken["status"]["allocatable"]["cpu"] = "lots"
    assert _found(broken, [pod("hog", "n0", gpus=8)], [OLD]) == []


def test_a_tas_assignment_naming_the_node_counts_before_our_slots_and_once_with_its_pods() -> None:
    tas = tas_workload("tas", {"n0": 1}, gpus=4)
    (found,) = displaced_slots(node("n0"), [], [OLD, NEW], frozenset(), workloads=[tas])
    assert (found.reservation, found.others) == ("default/new", ("TAS Workload default/tas",))
    bound = tas_pod("tas-0", "n0", "tas", gpus=4)  # its pod bound: counted as the pod alone
    assert _found(node("n0"), [bound], [OLD]) == []
    assert [d.reservation for d in displaced_slots(
        node("n0"), [bound], [OLD, NEW], frozenset(), workloads=[tas])] == ["default/new"]


def test_a_gangs_slots_on_other_nodes_are_left_out_without_a_word(caplog: Any) -> None:
    """Counting one node of a multi-node gang must not log the gang's other slots as
    'not in the snapshot': they are not missing, only not asked for."""
    gang = _rr("gang", "2026-01-01T00:00:00Z", [
        {"index": 0, "node": "n0", "gpus": [0, 1, 2, 3, 4, 5, 6, 7]},
        {"index": 1, "node": "n1", "gpus": [0, 1, 2, 3, 4, 5, 6, 7]},
    ])
    with caplog.at_level("INFO"):
        found = _found(node("n0"), [pod("hog", "n0", gpus=8)], [gang])
    assert found == [("default/gang", "main/0", False)]
    assert "not in the snapshot" not in caplog.text
