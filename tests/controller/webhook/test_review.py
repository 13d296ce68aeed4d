"""The pod webhook's decision: a reservation label is honoured only for the pods of the
reservation's own Workload (table-driven)."""

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
from nexus_admit.controller.store import Store
from nexus_admit.controller.webhook.review import (
    WebhookState,
    answer_review,
    decide,
    gated_spec,
    malformed_gates,
    pod_ref,
    queued_under_check,
    review_pod,
)
from nexus_admit.kube import labels as L
from tests.controller.fake_api import FakeApi

WL = {
    "metadata": {
        "name": "job-train-1",
        "namespace": "t",
        "uid": "wl-uid",
        "ownerReferences": [{"kind": "Job", "name": "train", "uid": "job-uid"}],
    }
}
RR = {
    "metadata": {"name": "rr1", "namespace": "t"},
    "spec": {"workloadRef": {"name": "job-train-1", "namespace": "t", "uid": "wl-uid"}},
}


def pod(owner_uid: str | None = "job-uid", **labels: str) -> dict[str, Any]:
    m: dict[str, Any] = {
        "name": "p",
        "namespace": "t",
        "labels": {L.LABEL_RESERVATION: "rr1", **labels},
    }
    if owner_uid:
        m["ownerReferences"] = [{"kind": "Job", "name": "x", "uid": owner_uid}]
    return {"metadata": m, "spec": {}}


@pytest.mark.parametrize(
    ("the_pod", "rr", "wl", "allowed", "says"),
    [
        pytest.param(pod(), RR, WL, True, "", id="own-job-pod-gated"),
        pytest.param(
            pod(owner_uid="other-job"),
            RR,
            WL,
            False,
            "not part of Workload",
            id="another-jobs-pod-denied",
        ),
        pytest.param(
            pod(owner_uid=None), RR, WL, False, "not part of Workload", id="bare-pod-denied"
        ),
        pytest.param(
            # a tenant's pod claiming a group by label: the label is no proof (issue 28)
            pod(owner_uid=None, **{"kueue.x-k8s.io/pod-group-name": "job-train-1"}),
            RR,
            WL,
            False,
            "no proof",
            id="pod-group-label-denied",
        ),
        pytest.param(pod(), None, None, False, "does not exist", id="missing-reservation"),
        pytest.param(
            pod(),
            RR,
            {**WL, "metadata": {**WL["metadata"], "uid": "new"}},
            False,
            "no longer exists",
            id="workload-recreated",
        ),
    ],
)
def test_decide(the_pod, rr, wl, allowed, says) -> None:
    answer = decide(the_pod, "t", rr, wl)
    assert answer.allowed is allowed
    assert says in answer.message
    assert answer.add_gate is allowed


def test_a_pod_in_a_nexus_queue_is_gated_whoever_owns_it_others_are_not() -> None:
    """Regression (issue 29): pods with owners (a ReplicaSet's, a StatefulSet's) were
    skipped, so a Deployment's pods bound before they had a slot."""
    s = Store()
    s.upsert(
        "LocalQueue", {"metadata": {"name": "q", "namespace": "t"}, "spec": {"clusterQueue": "cq"}}
    )
    s.upsert(
        "ClusterQueue",
        {
            "metadata": {"name": "cq"},
            "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": "nexus"}]}},
        },
    )
    plain = {"metadata": {"name": "p", "labels": {L.KUEUE_QUEUE_NAME_LABEL: "q"}}}
    assert queued_under_check(plain, "t", s, {"nexus"})
    assert not queued_under_check(plain, "t", s, {"other-check"})
    for owner in ("ReplicaSet", "StatefulSet", "Job", "LeaderWorkerSet"):
        owned = {"metadata": {**plain["metadata"], "ownerReferences": [{"kind": owner}]}}
        assert queued_under_check(owned, "t", s, {"nexus"}), owner
    other = {"metadata": {"name": "p", "labels": {L.KUEUE_QUEUE_NAME_LABEL: "plain"}}}
    assert not queued_under_check(other, "t", s, {"nexus"})


@pytest.mark.parametrize(
    ("gates", "says"),
    [
        pytest.param(None, None, id="none"),
        pytest.param([{"name": "other"}], None, id="a-list-of-gates"),
        pytest.param("gate", "spec.schedulingGates must be a list", id="a-string"),
        pytest.param({"name": "x"}, "spec.schedulingGates must be a list", id="a-mapping"),
        pytest.param([{"name": 3}], "spec.schedulingGates must be a list", id="name-a-number"),
        pytest.param(["x"], "spec.schedulingGates must be a list", id="entry-a-string"),
    ],
)
def test_malformed_gates_are_refused_not_patched(gates, says) -> None:
    """Regression: the handler once built its patch with list(gates), so a string became
    one gate per character and a number crashed the handler."""
    the_pod = pod()
    if gates is not None:
        the_pod["spec"]["schedulingGates"] = gates
    got = malformed_gates(the_pod)
    assert (got is None) if says is None else (got is not None and says in got)
    if says is None:
        assert gated_spec(the_pod)[-1] == {"name": L.GATE_PLACEMENT}


def test_pod_ref_names_a_pod_that_has_no_name_yet() -> None:
    assert pod_ref({"metadata": {"generateName": "job-"}}, "t") == "Pod t/job-<generated>"
    assert pod_ref({"metadata": []}, "t") == "Pod t/<unnamed>"


def test_a_follower_replica_gates_a_queued_plain_pod_too() -> None:
    """Every replica serves the webhook; only the leader runs the loop that fills
    ctx.checks. A follower (ctx.checks empty) must still gate a plain pod queued under our
    check, or the pod would be created ungated and never pinned."""
    import asyncio

    from nexus_admit.controller.context import Context
    from nexus_admit.controller.options import RunOptions
    from nexus_admit.placement.policies import make_policy
    from tests.controller.fake_api import FakeApi
    from tests.kube.kube_factories import admission_check, cluster_queue, local_queue

    cq = cluster_queue("cq", "silver")
    cq["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": "nexus"}]}
    ctx = Context(options=RunOptions(webhook=False), api=FakeApi(), engine=make_policy("nexus"))  # type: ignore[arg-type]
    for kind, obj in (
        ("ClusterQueue", cq),
        ("LocalQueue", local_queue("t", "q", "cq")),
        ("AdmissionCheck", admission_check("nexus")),
    ):
        ctx.store.upsert(kind, obj)
    assert ctx.checks == {}, "a follower: no pass has run"
    plain = {
        "metadata": {"name": "p", "namespace": "t", "labels": {"kueue.x-k8s.io/queue-name": "q"}}
    }
    answer = asyncio.run(review_pod(ctx, plain, "t"))
    assert answer.allowed and answer.add_gate


def review(the_pod: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "namespace": "t", "operation": operation, "object": the_pod},
    }


def answered(ctx: Any, the_pod: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    response = asyncio.run(answer_review(ctx, review(the_pod, operation)))
    assert response["apiVersion"] == "admission.k8s.io/v1" and response["kind"] == "AdmissionReview"
    assert response["response"]["uid"] == "u-1"
    return dict(response["response"])


def patched(the_pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["patchType"] == "JSONPatch"
    ops = jsonpatch.JsonPatch(json.loads(base64.b64decode(response["patch"])))
    return dict(ops.apply(copy.deepcopy(the_pod)))


def webhook_ctx(api: Any = None) -> Context:
    ctx = Context(options=RunOptions(webhook=False), api=api or FakeApi(), engine=None)  # type: ignore[arg-type]
    ctx.store.upsert(L.KIND_RESOURCE_RESERVATION, RR)
    ctx.store.upsert("Workload", WL)
    return ctx


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({}, id="no-gates"),
        pytest.param({"schedulingGates": [{"name": "other"}]}, id="another-gate"),
        pytest.param(None, id="no-spec"),
    ],
)
def test_an_admitted_pod_gets_exactly_our_gate_added(spec: dict[str, Any] | None) -> None:
    the_pod = pod()
    if spec is None:
        del the_pod["spec"]
    else:
        the_pod["spec"] = spec
    response = answered(webhook_ctx(), the_pod)
    assert response["allowed"] is True
    before = (spec or {}).get("schedulingGates", [])
    assert patched(the_pod, response)["spec"]["schedulingGates"] == [
        *before,
        {"name": L.GATE_PLACEMENT},
    ]


def test_a_denial_starts_with_the_pod_and_says_why() -> None:
    response = answered(webhook_ctx(), pod(owner_uid="other-job"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["message"].startswith("Pod t/p: the pod is not part of Workload")


def test_an_update_passes_untouched() -> None:
    response = answered(webhook_ctx(), pod(), operation="UPDATE")
    assert response == {"uid": "u-1", "allowed": True}


def test_an_api_failure_behind_a_lookup_is_a_503_that_names_the_pod() -> None:
    class Down(FakeApi):
        def get(self, *args: Any, **kwargs: Any) -> Any:
            raise OSError("connection refused")

    ctx = webhook_ctx(Down())
    ctx.store = Store()  # the reservation must be fetched: the API is down
    response = answered(ctx, pod())
    assert response["allowed"] is False and response["status"]["code"] == 503
    assert response["status"]["message"].startswith("Pod t/p: could not check")
    assert "connection refused" in response["status"]["message"]


def test_a_webhook_that_cannot_listen_says_so_at_start(tmp_path: Any) -> None:
    """The port is taken: start() raises with the reason instead of leaving a replica that
    looks up but answers no pod."""
    import socket

    from nexus_admit.controller.operator import webhook_thread
    from nexus_admit.controller.webhook.thread import WebhookStartError
    from tests.fuzz.test_fuzz_webhook_http import _throwaway_cert

    crt, key = _throwaway_cert(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        options = RunOptions(
            webhook_addr="127.0.0.1", webhook_port=port, webhook_cert=str(crt), webhook_key=str(key)
        )
        server = webhook_thread(options, webhook_ctx())
        with pytest.raises(WebhookStartError, match="ddress"):
            server.start(timeout=10)
        assert not server.alive()


def test_a_flood_of_reviews_naming_an_unknown_reservation_costs_one_get() -> None:
    """Before: every review naming a reservation the store lacks sent one synchronous GET
    to the apiserver. Now a miss is remembered for a moment (`WEBHOOK_MISS_SECONDS`)."""
    from cachetools import TTLCache

    gets: list[tuple[Any, ...]] = []

    class Counting(FakeApi):
        def get(self, *args: Any, **kwargs: Any) -> Any:
            gets.append(args)
            return None

    ctx = webhook_ctx(Counting())
    ctx.store = Store()
    ctx.component(WebhookState).misses = TTLCache(maxsize=8, ttl=60)  # none expires meanwhile
    for _ in range(20):
        response = answered(ctx, pod())
        assert response["allowed"] is False
    assert len(gets) == 1, gets
