"""Double-booked GPUs and pods off their planned node, from plain API objects."""

from __future__ import annotations

from bench_e2e import booking


def pod(name: str, node: str | None, gpus: int, phase: str = "Running", rr=None, slot=None):
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "labels": {booking.RESERVATION_LABEL: rr} if rr else {},
            "annotations": {booking.SLOT_ANNOTATION: slot} if slot else {},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"resources": {"requests": {booking.GPU: str(gpus)}}},
                {"resources": {}},
            ],
        },
        "status": {"phase": phase},
    }


def reservation(name: str, slots: list[tuple[int, str, list[int]]], deleting=False):
    meta = {"namespace": "ns", "name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "podSets": [
                {"name": "main", "slots": [{"index": i, "node": n, "gpus": g} for i, n, g in slots]}
            ]
        },
    }


def test_only_bound_unfinished_pods_hold_gpus():
    assert booking.bound_pod(pod("a", None, 1)) is None
    assert booking.bound_pod(pod("a", "n1", 1, phase="Succeeded")) is None
    b = booking.bound_pod(pod("a", "n1", 3, rr="r", slot="main/0"))
    assert b == booking.BoundPod("ns", "a", "n1", 3, "r", "main/0")


def test_over_allocated_nodes():
    alloc = {"n1": 8, "n2": 4}
    pods = [booking.bound_pod(pod(f"p{i}", "n1", 4)) for i in range(3)]
    pods.append(booking.bound_pod(pod("q", "n2", 4)))
    pods.append(booking.bound_pod(pod("ghost", "gone", 1)))  # a node that has no allocatable
    assert booking.over_allocated(alloc, pods) == {"n1": 4, "gone": 1}
    assert booking.double_booked_gpus(alloc, pods) == 5
    assert booking.double_booked_gpus(alloc, pods[1:4]) == 0


def test_devices_two_reservations_hold():
    a = reservation("a", [(0, "n1", [0, 1])])
    b = reservation("b", [(0, "n1", [1, 2]), (1, "n2", [0])])
    gone = reservation("c", [(0, "n1", [0])], deleting=True)
    assert booking.shared_devices([a, b, gone]) == ["n1/1: ns/a, ns/b"]
    assert booking.double_booked_gpus({"n1": 8}, [], [a, b]) == 1


def test_pods_on_their_planned_node():
    rr = reservation("r", [(0, "n1", [0]), (1, "n2", [0])])
    pods = [
        booking.bound_pod(pod("ok", "n1", 1, rr="r", slot="main/0")),
        booking.bound_pod(pod("moved", "n3", 1, rr="r", slot="main/1")),
        booking.bound_pod(pod("unknown", "n1", 1, rr="other", slot="main/0")),
        booking.bound_pod(pod("free", "n1", 1)),  # no reservation: not counted
    ]
    good, total, bad = booking.on_planned_node(pods, [rr])
    assert (good, total) == (1, 3)
    assert [b.split(":")[0] for b in bad] == ["ns/moved", "ns/unknown"]
