"""What makes a request an AdmissionReview the pod webhook can review (table-driven); the
same checks over HTTPS, with kopf in between, are in tests/fuzz/test_fuzz_webhook_http.py."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_admit.controller.webhook.server import denial, review_problem

POD = {"kind": "Pod", "metadata": {"name": "p", "namespace": "t"}, "spec": {}}


def review(**request: Any) -> dict[str, Any]:
    base = {
        "uid": "u1",
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "userInfo": {"username": "someone"},
        "object": POD,
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": base | request,
    }


@pytest.mark.parametrize(
    ("data", "uid", "says"),
    [
        pytest.param(review(), None, None, id="well-formed"),
        pytest.param(review(operation="UPDATE", oldObject=POD), None, None, id="update"),
        pytest.param([review()], "", "must be an AdmissionReview object", id="a-list"),
        pytest.param({"request": "x"}, "", "field request is missing", id="request-a-string"),
        pytest.param(review(uid=""), "", "request.uid", id="empty-uid"),
        pytest.param(review(uid=None), "", "request.uid", id="null-uid"),
        pytest.param(
            review() | {"apiVersion": "v1"}, "u1", "field apiVersion must be", id="api-version"
        ),
        pytest.param(review(resource=None), "u1", "field request.resource", id="no-resource"),
        pytest.param(review(operation="DELETE"), "u1", "request.operation", id="delete"),
        pytest.param(review(userInfo="root"), "u1", "field request.userInfo", id="userinfo"),
        pytest.param(review(object=None), "u1", "field request.object must", id="no-object"),
        pytest.param(review(object=[POD]), "u1", "field request.object must", id="object-list"),
        pytest.param(
            review(oldObject="x"), "u1", "field request.oldObject must", id="old-object-string"
        ),
        pytest.param(
            review(object={**POD, "spec": []}), "u1", "request.object.spec", id="spec-list"
        ),
    ],
)
def test_review_problem(data, uid, says) -> None:
    problem = review_problem(data)
    if says is None:
        assert problem is None
        return
    assert problem is not None and problem.uid == uid
    assert says in problem.message
    if uid:
        assert problem.message.startswith(f"AdmissionReview {uid}: field ")


def test_a_denial_carries_the_uid_and_the_message() -> None:
    answer = denial("u1", "why")
    assert answer["response"] == {
        "uid": "u1",
        "allowed": False,
        "status": {"code": 400, "message": "why"},
    }
