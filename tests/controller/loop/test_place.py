"""`loop/place.py` on a fleet that changes: a Workload no node may take now (every node
cordoned, tainted, NotReady, or its pool not there yet) keeps its quota with a Pending
check that says why, and is placed by the first pass after a node it may use appears."""

from __future__ import annotations

from typing import Any

import pytest

from tests.controller.fake_api import FakeApi
from tests.controller.test_placing import RR, check_of, cluster, controller, pending, run, watch
from tests.kube.kube_factories import admission_check, node


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


# ---- beside Kueue's provisioning check ----------------------------------------------

PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"

def _beside_provisioning(state: str = "Pending", message: str = "", pods: int = 1) -> FakeApi:
    """A ClusterQueue with Kueue's provisioning check `prov` and ours; a gang of 8-GPU
    pods; one existing node n0 with room it should not be put on (outside the provisioned
    pool)."""
    api = cluster(pending("w", pods=pods, gpus=8), nodes=("n0",))
    api.put(admission_check("prov", controller=PROVISIONING_CONTROLLER))
    w = api.get("Workload", "w", "default")
    assert w is not None
    w["status"]["admissionChecks"].insert(0, {"name": "prov", "state": state,
                                              "message": message})
    api.put(w)
    return api


def _provisioned(api: FakeApi) -> None:
    """What cluster-autoscaler and Kueue do once the ProvisioningRequest is Provisioned: the
    node joins, the check is Ready with its podSetUpdates (annotations, nodeSelector)."""
    api.put(node("p0", labels={"pool": "gpu-a"}))
    w = api.get("Workload", "w", "default")
    assert w is not None
    w["status"]["admissionChecks"][0] = {
        "name": "prov", "state": "Ready", "message": "Provisioned",
        "podSetUpdates": [{
            "name": "main", "nodeSelector": {"pool": "gpu-a"},
            "annotations": {"autoscaling.x-k8s.io/consume-provisioning-request": "w-prov-1"},
        }],
    }
    api.put(w)


def test_a_workload_waits_for_the_provisioning_check_then_is_placed_on_its_nodes() -> None:
    api = _beside_provisioning()
    ctx, engine = controller(api)
    run(ctx)
    entry = check_of(api, "w")
    assert entry["state"] == "Pending", entry
    assert entry["message"] == ("waiting for the provisioning check prov to be Ready "
                                "(Pending; the provisioner has not answered yet)")
    assert api.of_kind(RR) == [] and engine.calls == 0
    assert len(_events(api, "WaitingForProvisioning")) == 1
    # restarted while the provisioner works: the same wait, written once, nothing held
    ctx, engine = controller(api)
    run(ctx)
    run(ctx)
    assert api.count("apply", "Workload") == 1 and api.of_kind(RR) == []
    # provisioned: placed on the provisioned node, not on n0 that had room all along
    _provisioned(api)
    watch(ctx, api)
    run(ctx)
    entry = check_of(api, "w")
    assert entry["state"] == "Ready", entry
    (rr,) = api.of_kind(RR)
    assert {s["node"] for s in rr["spec"]["podSets"][0]["slots"]} == {"p0"}
    (update,) = entry["podSetUpdates"]  # one entry per pod set, no key of theirs rewritten
    assert update["name"] == "main"
    assert update.get("nodeSelector", {}).get("pool", "gpu-a") == "gpu-a"
    # restarted after Ready: answered from the reservation, never a second one
    ctx, engine = controller(api)
    run(ctx)
    assert len(api.of_kind(RR)) == 1 and engine.calls == 0


def test_the_wait_message_carries_what_the_provisioner_said() -> None:
    api = _beside_provisioning(message="Provisioning Request wasn't provisioned. ETA 5m")
    ctx, _ = controller(api)
    run(ctx)
    assert check_of(api, "w")["message"] == (
        "waiting for the provisioning check prov to be Ready (Pending; it says: "
        "Provisioning Request wasn't provisioned. ETA 5m)")


@pytest.mark.parametrize("state", ["Retry", "Rejected"])
def test_a_provisioning_check_that_gave_up_is_not_placed_past(state: str) -> None:
    """Kueue evicts or deactivates the Workload for it; nexus neither places nor answers
    Retry (whose eviction would also delete the ProvisioningRequest)."""
    api = _beside_provisioning(state=state)
    ctx, _ = controller(api)
    run(ctx)
    entry = check_of(api, "w")
    assert entry["state"] == "Pending" and f"({state};" in entry["message"]
    assert api.of_kind(RR) == []


def test_a_reservation_of_this_attempt_made_before_the_wait_is_answered_from() -> None:
    """One made by a run that did not wait (an older version): answered from, not
    placed twice, not held back."""
    api = _beside_provisioning()
    w = api.get("Workload", "w", "default")
    assert w is not None
    w["status"]["admissionChecks"][0]["state"] = "Ready"
    api.put(w)
    ctx, _ = controller(api)
    run(ctx)
    (rr,) = api.of_kind(RR)
    w = api.get("Workload", "w", "default")
    assert w is not None
    for entry in w["status"]["admissionChecks"]:  # both Pending again, the reservation kept
        entry.update(state="Pending", message="")
        entry.pop("podSetUpdates", None)
    api.put(w)
    ctx, engine = controller(api)
    run(ctx)
    assert check_of(api, "w")["state"] == "Ready" and engine.calls == 0
    assert api.of_kind(RR) == [rr]


def test_provisioned_nodes_still_joining_are_waited_for_not_retried() -> None:
    """cluster-autoscaler says Provisioned once the scale-up is under way: a node that
    has not joined yet is waited for (Retry's eviction would delete the request)."""
    api = _beside_provisioning(pods=2)
    _provisioned(api)  # p0 joined; p1, the second node of the scale-up, not yet
    ctx, _ = controller(api)
    run(ctx)
    entry = check_of(api, "w")
    assert entry["state"] == "Pending", entry
    assert entry["message"].startswith(
        "waiting for the nodes the provisioning check prov provisioned: "), entry
    assert api.of_kind(RR) == [] and len(_events(api, "WaitingForProvisionedNodes")) == 1
    api.put(node("p1", labels={"pool": "gpu-a"}))
    watch(ctx, api)
    run(ctx)
    assert check_of(api, "w")["state"] == "Ready"
    (rr,) = api.of_kind(RR)
    assert {s["node"] for s in rr["spec"]["podSets"][0]["slots"]} == {"p0", "p1"}
