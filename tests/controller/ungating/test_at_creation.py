"""Pin at creation (`ungating/at_creation.py`): a ranked pod of a reservation nobody else
waits on is pinned in its create request exactly as the ungater would pin it; any doubt,
anything unreadable, and any pod that is not the Workload's leaves it as it came (gated by
the policy), never refused."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from typing import Any

import jsonpatch
import pytest

from nexus_admit.controller.context import Context
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.ungating.at_creation import (
    answer_gate_or_pin_review,
    answer_pin_review,
)
from nexus_admit.controller.ungating.ungater import sync_ungating
from nexus_admit.kube import labels as L
from nexus_admit.placement.policies import make_policy
from tests.controller.fake_api import FakeApi
from tests.controller.ungating.test_ungater import expired_setup, gated_pod, setup


def review(pod: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    """The review the apiserver sends after the gate policy: a pod created with
    generateName (no name, no uid yet) in namespace "default"."""
    obj = copy.deepcopy(pod)
    obj["metadata"].pop("uid", None)
    obj["metadata"].pop("namespace", None)
    obj["metadata"]["generateName"] = obj["metadata"].pop("name") + "-"
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "req-1",
            "operation": operation,
            "namespace": "default",
            "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
            "object": obj,
        },
    }


def answer(ctx: Context, pod: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    """The pod as the apiserver would create it after this answer (None: no patch)."""
    out = asyncio.run(answer_pin_review(ctx, review(pod, operation)))
    response = out["response"]
    assert response["allowed"] is True and response["uid"] == "req-1"
    obj = review(pod, operation)["request"]["object"]
    if "patch" not in response:
        return {"patched": False, "pod": obj}
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    return {"patched": True, "pod": jsonpatch.apply_patch(obj, ops)}


def counted(ctx: Context, answer_label: str) -> float:
    return ctx.metrics.webhook_requests.labels(answer_label)._value.get()


def test_a_ranked_pod_is_pinned_at_creation_as_the_ungater_would_pin_it() -> None:
    new = gated_pod("p-1", 1)
    ctx, _ = setup(gated_pod("p-0", 0))
    asyncio.run(sync_ungating(ctx))  # the ungater pins p-0 ...
    ctx2, api2 = setup(new)
    asyncio.run(sync_ungating(ctx2))  # ... and, had it been gated, p-1
    by_ungater = api2.get("Pod", "p-1", "default")
    assert by_ungater is not None

    ctx3, _ = setup()
    got = answer(ctx3, new)
    assert got["patched"]
    at_creation = got["pod"]
    for field in ("nodeSelector", "affinity", "schedulingGates"):
        assert at_creation["spec"].get(field) == by_ungater["spec"].get(field), field
    assert at_creation["spec"]["schedulingGates"] == []
    assert at_creation["metadata"]["annotations"] == by_ungater["metadata"]["annotations"]
    assert at_creation["metadata"]["annotations"][L.ANN_SLOT] == "main/1"
    assert counted(ctx3, "pinned") == 1


def test_the_pods_own_selector_affinity_gates_and_annotations_are_kept() -> None:
    new = gated_pod("p-0", 0)
    new["metadata"]["annotations"] = {"team": "a"}
    new["spec"]["nodeSelector"] = {"pool": "h100"}
    new["spec"]["schedulingGates"] = [{"name": "theirs"}, {"name": L.GATE_PLACEMENT}]
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    new["spec"]["affinity"] = {
        "podAntiAffinity": {"x": 1},
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}],
        },
    }
    ctx, _ = setup()
    spec = answer(ctx, new)["pod"]["spec"]
    assert spec["nodeSelector"] == {"pool": "h100", L.HOSTNAME_LABEL: "n0"}
    assert spec["schedulingGates"] == [{"name": "theirs"}]
    assert spec["affinity"]["podAntiAffinity"] == {"x": 1}
    node_affinity = spec["affinity"]["nodeAffinity"]
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [{"weight": 1}]
    assert node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [zone], "matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n0"]}]}]
    }
    assert answer(setup()[0], new)["pod"]["metadata"]["annotations"]["team"] == "a"


def _unpinned(ctx: Context, pod: dict[str, Any], operation: str = "CREATE") -> None:
    got = answer(ctx, pod, operation)
    assert not got["patched"], got["pod"]["spec"]


def test_a_slot_held_by_a_live_pod_is_not_given_at_creation() -> None:
    holder = gated_pod("old-0", 0)
    holder["spec"]["schedulingGates"] = []
    holder["metadata"]["annotations"] = {L.ANN_SLOT: "main/0"}
    ctx, _ = setup(holder)
    _unpinned(ctx, gated_pod("p-0", 0))
    assert counted(ctx, "left-gated") == 1


def test_no_pin_at_creation_while_another_pod_of_the_reservation_waits_gated() -> None:
    """A gated pod whose own slot is taken takes the lowest free one, which may be this
    pod's: only the ungater decides then."""
    ctx, _ = setup(gated_pod("p-0", 0))
    _unpinned(ctx, gated_pod("p-1", 1))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda p: p["metadata"]["labels"].pop(
            "batch.kubernetes.io/job-completion-index"), id="no-rank"),
        pytest.param(lambda p: p["metadata"]["ownerReferences"][0].update(uid="other-job"),
                     id="another-jobs-pod"),
        pytest.param(lambda p: p["metadata"].pop("ownerReferences"), id="no-owner"),
        pytest.param(lambda p: p["metadata"]["labels"].update(
            {L.LABEL_RESERVATION: "rr-missing"}), id="reservation-not-in-store"),
        pytest.param(lambda p: p["spec"].update(nodeSelector={L.HOSTNAME_LABEL: "n1"}),
                     id="asks-another-host"),
        pytest.param(lambda p: p["spec"].update(nodeName="n0"), id="node-name-set"),
        pytest.param(lambda p: p["spec"].update(schedulingGates="junk"), id="malformed-gates"),
        pytest.param(lambda p: p["spec"]["containers"][0]["resources"].update(
            limits={"nvidia.com/gpu": "9"}, requests={"nvidia.com/gpu": "9"}),
            id="more-gpus-than-the-slot"),
        pytest.param(lambda p: p["metadata"].update(labels="junk"), id="malformed-labels"),
    ],
)
def test_any_doubt_leaves_the_pod_gated_and_never_refuses_it(change: Any) -> None:
    ctx, _ = setup()
    new = gated_pod("p-0", 0)
    change(new)
    _unpinned(ctx, new)


def test_an_update_is_not_reviewed() -> None:
    ctx, _ = setup()
    _unpinned(ctx, gated_pod("p-0", 0), operation="UPDATE")


def test_a_reservation_past_its_ttl_before_binding_gives_no_pin() -> None:
    ctx, _ = expired_setup()
    _unpinned(ctx, gated_pod("p-0", 0))


def test_a_reservation_being_deleted_gives_no_pin() -> None:
    ctx, _ = setup()
    rr = copy.deepcopy(ctx.store.get(L.KIND_RESOURCE_RESERVATION, "default/rr-1"))
    assert rr is not None
    rr["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    ctx.store.upsert(L.KIND_RESOURCE_RESERVATION, rr)
    _unpinned(ctx, gated_pod("p-0", 0))


def test_the_hostname_label_of_the_node_is_the_selector() -> None:
    ctx, _ = setup()
    n0 = copy.deepcopy(ctx.store.get("Node", "n0"))
    assert n0 is not None
    n0["metadata"].setdefault("labels", {})[L.HOSTNAME_LABEL] = "host-zero"
    ctx.store.upsert("Node", n0)
    spec = answer(ctx, gated_pod("p-0", 0))["pod"]["spec"]
    assert spec["nodeSelector"] == {L.HOSTNAME_LABEL: "host-zero"}


def test_a_context_without_the_workload_leaves_it_gated() -> None:
    ctx = Context(options=RunOptions(webhook=False), api=FakeApi(), engine=make_policy("nexus"))  # type: ignore[arg-type]
    _unpinned(ctx, gated_pod("p-0", 0))


def test_a_jobs_pod_is_proven_the_workloads_by_its_own_owner_without_a_read() -> None:
    ctx, api = setup()
    reads: list[str] = []
    get = api.get

    def counting_get(kind: str, name: str, namespace: str | None = None) -> Any:
        reads.append(kind)
        return get(kind, name, namespace)

    api.get = counting_get  # type: ignore[method-assign]
    assert answer(ctx, gated_pod("p-0", 0))["patched"]
    assert reads == []
    # another Job's pod: its owners are read (this Job may sit under the Workload's owner)
    assert not answer(ctx, gated_pod("p-1", 1, owner_uid="other"))["patched"]
    assert reads == ["Job"]


# ---------------------------------------------------------------- webhook gate mode


def gate_or_pin(ctx: Context, pod: dict[str, Any], **request: Any) -> dict[str, Any]:
    """`/pod-gate-pin`'s answer to a pod created without any gate (no gate policy runs),
    as the apiserver would apply it: {"allowed", "pod", "message"}."""
    rv = review(pod)
    rv["request"]["object"]["spec"]["schedulingGates"] = []
    rv["request"].update(request)
    response = asyncio.run(answer_gate_or_pin_review(ctx, rv))["response"]
    obj = rv["request"]["object"]
    if "patch" in response:
        obj = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
    message = (response.get("status") or {}).get("message", "")
    return {"allowed": response["allowed"], "pod": obj, "message": message}


def test_without_a_gate_policy_the_gate_hook_pins_instead_of_gating() -> None:
    ctx, _ = setup()
    got = gate_or_pin(ctx, gated_pod("p-1", 1))
    assert got["allowed"]
    assert got["pod"]["spec"]["schedulingGates"] == []
    assert got["pod"]["spec"]["nodeSelector"] == {L.HOSTNAME_LABEL: "n1"}
    assert got["pod"]["metadata"]["annotations"][L.ANN_SLOT] == "main/1"
    assert counted(ctx, "pinned") == 1
    # reinvoked after another webhook's change: the same pin again
    again = gate_or_pin(ctx, {**got["pod"], "metadata": {**got["pod"]["metadata"],
                                                        "name": "p-1"}})
    assert again["pod"]["spec"] == got["pod"]["spec"]


def test_without_a_gate_policy_a_pod_it_cannot_pin_is_gated_and_a_foreign_one_denied() -> None:
    holder = gated_pod("old-1", 1)
    holder["spec"]["schedulingGates"] = []
    holder["metadata"]["annotations"] = {L.ANN_SLOT: "main/1"}
    ctx, _ = setup(holder)
    got = gate_or_pin(ctx, gated_pod("p-1", 1))  # its slot is held: gated, not pinned
    assert got["allowed"]
    assert got["pod"]["spec"]["schedulingGates"] == [{"name": L.GATE_PLACEMENT}]
    assert L.HOSTNAME_LABEL not in (got["pod"]["spec"].get("nodeSelector") or {})
    assert counted(ctx, "pinned") == 0
    foreign = gated_pod("t-0", 0, owner_uid="not-the-jobs")
    denied = gate_or_pin(setup()[0], foreign, userInfo={"username": "tenant"})
    assert not denied["allowed"] and "is not part of Workload" in denied["message"]
