"""`loop/place.py` on a fleet that changes: a Workload no node may take now (every node
cordoned, tainted, NotReady, or its pool not there yet) keeps its quota with a Pending
check that says why, and is placed by the first pass after a node it may use appears."""

from __future__ import annotations

from typing import Any

import pytest

from tests.controller.test_placing import RR, check_of, cluster, controller, pending, run, watch
from tests.kube.kube_factories import node


def _events(api: Any, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.of_kind("Event") if e["reason"] == reason]


@pytest.mark.parametrize(
    ("unusable", "told"),
    [
        pytest.param({"unschedulable": True}, "3 unschedulable", id="cordoned"),
        pytest.param(
            {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]},
            "3 untolerated taint", id="tainted",
        ),
    ],
)
def test_no_usable_node_keeps_the_check_pending_until_one_is(
    unusable: dict[str, Any], told: str
) -> None:
    api = cluster(pending("w", pods=1, gpus=8))
    for name in ("n0", "n1", "n2"):
        api.put(node(name, **unusable))
    ctx, _ = controller(api)
    run(ctx)
    entry = check_of(api, "w")
    assert entry["state"] == "Pending", entry
    assert entry["message"].startswith("waiting for nodes: pod set 'main' fits no node now")
    assert told in entry["message"]
    assert api.of_kind(RR) == []
    (event,) = _events(api, "PlacementWaiting")
    assert event["type"] == "Normal" and event["note"] == entry["message"]
    # the next passes, nothing changed: no write, no second Event
    watch(ctx, api)
    run(ctx)
    run(ctx)
    assert api.count("apply", "Workload") == 1 and len(_events(api, "PlacementWaiting")) == 1
    # a node comes back: the next pass places the Workload
    api.put(node("n1"))
    watch(ctx, api)
    run(ctx)
    entry = check_of(api, "w")
    assert entry["state"] == "Ready", entry
    (rr,) = api.of_kind(RR)
    assert {s["node"] for s in rr["spec"]["podSets"][0]["slots"]} == {"n1"}


def test_a_pool_that_is_not_there_yet_is_waited_for() -> None:
    api = cluster(pending("w", pods=1, gpus=8))
    w = api.get("Workload", "w", "default")
    assert w is not None
    w["spec"]["podSets"][0]["template"]["spec"]["nodeSelector"] = {"pool": "later"}
    api.put(w)
    ctx, _ = controller(api)
    run(ctx)
    entry = check_of(api, "w")
    assert entry["state"] == "Pending" and "3 selector/affinity" in entry["message"]
    api.put(node("late", labels={"pool": "later"}))
    watch(ctx, api)
    run(ctx)
    assert check_of(api, "w")["state"] == "Ready"


def test_more_gpus_per_pod_than_any_node_has_is_rejected_whatever_is_cordoned() -> None:
    api = cluster(pending("w", pods=1, gpus=16))
    api.put(node("n0", unschedulable=True))
    ctx, _ = controller(api)
    run(ctx)
    entry = check_of(api, "w")
    assert entry["state"] == "Rejected" and "fits no node in the cluster" in entry["message"]
