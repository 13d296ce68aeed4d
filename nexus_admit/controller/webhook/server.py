"""The HTTPS endpoint of the pod webhook: kopf's `WebhookServer`, with every request checked
before kopf reads it.

Who calls it: `webhook/thread.py` runs a `GuardedWebhookServer` on its own thread and hands
each checked review to the answer of its path (kopf's admission engine is not in the path:
it cost ~5 ms of CPU per pod for one JSON patch). Why a guard: the answers read the
AdmissionReview by plain indexing, so a body that is JSON but not a review (a list, no
`request`, an `object` that is a string) would end in an HTTP 500 with no message. The
apiserver only ever sends well-formed reviews, but anything that can reach the port can send
anything, and the answer must still be an answer: HTTP 400 with the reason when there is no
`request.uid` to answer to, else an AdmissionReview that denies with the uid and a message
naming the field.

`review_problem` is pure; `GuardedWebhookServer` only wires it into aiohttp. Bodies above
aiohttp's limit (1 MiB) are answered 413 by aiohttp before this code runs; with the
webhook's `failurePolicy: Fail` the apiserver then refuses the pod (it is never admitted
without its gate).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from aiohttp import web

__all__ = [
    "GuardedWebhookServer",
    "ReviewProblem",
    "UnknownWebhookPath",
    "denial",
    "review_problem",
]

REVIEW_API_VERSION = "admission.k8s.io/v1"


class UnknownWebhookPath(LookupError):
    """A request to a path that names no webhook of ours: answered 404. Our own, not kopf's
    (its admission engine's errors are private API, and we serve without that engine)."""


@dataclass(frozen=True, slots=True)
class ReviewProblem:
    """Why a request is not a pod AdmissionReview we can review; `uid` is empty when
    there is no uid to answer to (then the answer is HTTP 400)."""

    uid: str
    message: str


def _shown(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else f"{text[:limit]}…"


def review_problem(data: Any) -> ReviewProblem | None:
    """None when `data` is a v1 AdmissionReview of a pod CREATE or UPDATE that kopf and
    our handler can read; otherwise what is wrong, naming the field."""
    if not isinstance(data, Mapping):
        return ReviewProblem("", f"the body must be an AdmissionReview object, not {_shown(data)}")
    request = data.get("request")
    if not isinstance(request, Mapping):
        return ReviewProblem("", "AdmissionReview: field request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        return ReviewProblem("", "AdmissionReview: field request.uid is missing or not a string")

    def bad(field: str, want: str) -> ReviewProblem:
        got = _shown(_at(data, field))
        return ReviewProblem(uid, f"AdmissionReview {uid}: field {field} must be {want}, not {got}")

    if data.get("apiVersion") != REVIEW_API_VERSION:
        return bad("apiVersion", REVIEW_API_VERSION)
    if data.get("kind") != "AdmissionReview":
        return bad("kind", "AdmissionReview")
    resource = request.get("resource")
    if not isinstance(resource, Mapping) or (
        resource.get("group"),
        resource.get("version"),
        resource.get("resource"),
    ) != ("", "v1", "pods"):
        return bad("request.resource", '{"group": "", "version": "v1", "resource": "pods"}')
    if request.get("subResource") not in (None, ""):
        return bad("request.subResource", "empty (this webhook reviews pods themselves)")
    if request.get("operation") not in ("CREATE", "UPDATE"):
        return bad("request.operation", "CREATE or UPDATE")
    if not isinstance(request.get("userInfo"), Mapping):
        return bad("request.userInfo", "an object")
    for field in ("object", "oldObject"):
        obj = request.get(field)
        if obj is None and field == "oldObject":
            continue
        if not isinstance(obj, Mapping):
            return bad(f"request.{field}", "a Pod object")
        if obj.get("kind", "Pod") != "Pod":
            return bad(f"request.{field}.kind", "Pod")
        if not isinstance(obj.get("metadata", {}), Mapping):
            return bad(f"request.{field}.metadata", "an object")
        if not isinstance(obj.get("spec", {}), Mapping):
            return bad(f"request.{field}.spec", "an object")
    return None


def _at(data: Mapping[str, Any], dotted: str) -> Any:
    value: Any = data
    for step in dotted.split("."):
        value = value.get(step) if isinstance(value, Mapping) else None
    return value


def denial(uid: str, message: str, code: int = 400) -> dict[str, Any]:
    """An AdmissionReview response that refuses the request and says why."""
    return {
        "apiVersion": REVIEW_API_VERSION,
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": False, "status": {"code": code, "message": message}},
    }


class GuardedWebhookServer(kopf.WebhookServer):
    """kopf's TLS webhook server; each request is read and checked here first."""

    @staticmethod
    async def _serve(fn: Any, request: web.Request) -> web.Response:
        try:
            data = json.loads(await request.text())
        except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
            return web.Response(status=400, text=f"the body is not JSON: {e}")
        problem = review_problem(data)
        if problem is not None and not problem.uid:
            return web.Response(status=400, text=problem.message)
        if problem is not None:
            return web.json_response(denial(problem.uid, problem.message))
        transport = request.transport
        try:
            answer = await fn(
                data,
                webhook=request.match_info.get("id"),
                sslpeer=transport.get_extra_info("peercert") if transport else None,
                headers=dict(request.headers),
            )
        except UnknownWebhookPath as e:
            return web.Response(status=404, text=str(e))
        return web.json_response(answer)
