"""Who may read /metrics: the caller's bearer token, authenticated by the apiserver
(TokenReview) and authorised for `get` on the non-resource URL /metrics
(SubjectAccessReview), as controller-runtime's secure metrics serving does.

Who calls it: `operator.py`'s /metrics handler when `--metrics-auth=kubernetes` (the
chart's default). A scraper needs a ClusterRole granting `get` on nonResourceURLs
["/metrics"] (the chart's `<release>-metrics-reader`); the controller needs `create` on
tokenreviews and subjectaccessreviews.

Each answer is remembered for `ttl_seconds` per token (by its SHA-256, never the token
itself), at most `max_entries` tokens, so a scrape every 30 s costs two API calls a minute
at most; at most `max_in_flight` reviews run at once, so a flood of made-up tokens costs a
bounded number of API calls and never blocks the loop (they run on the API threads).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Decision", "MetricsAuthorizer", "bearer_token"]

log = logging.getLogger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
METRICS_PATH = "/metrics"


class _Requests(Protocol):
    def request(self, method: str, path: str, *, body: Any = None) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Decision:
    status: int  # 200 allowed, 401 not authenticated, 403 not authorised, 503 cannot tell
    reason: str


def bearer_token(headers: Mapping[str, str]) -> str | None:
    value = headers.get("Authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class MetricsAuthorizer:
    def __init__(
        self,
        api: _Requests,
        *,
        ttl_seconds: float = 60.0,
        max_entries: int = 1024,
        max_in_flight: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self.clock = clock
        self._cache: OrderedDict[str, tuple[float, Decision]] = OrderedDict()
        self._in_flight = asyncio.Semaphore(max_in_flight)

    async def decide(self, token: str | None) -> Decision:
        if not token:
            return Decision(401, "no bearer token")
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > self.clock():
            self._cache.move_to_end(key)
            return hit[1]
        async with self._in_flight:
            decision = await asyncio.to_thread(self._review, token)
        if decision.status != 503:  # an API outage is not remembered
            self._cache[key] = (self.clock() + self.ttl_seconds, decision)
            self._cache.move_to_end(key)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return decision

    def _review(self, token: str) -> Decision:
        try:
            review = self.api.request(
                "POST",
                TOKEN_REVIEWS,
                body={
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenReview",
                    "spec": {"token": token},
                },
            )
            status = review.get("status") or {}
            if not status.get("authenticated"):
                return Decision(401, "token not authenticated")
            user = status.get("user") or {}
            access = self.api.request(
                "POST",
                ACCESS_REVIEWS,
                body={
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SubjectAccessReview",
                    "spec": {
                        "user": user.get("username"),
                        "uid": user.get("uid"),
                        "groups": user.get("groups") or [],
                        "extra": user.get("extra") or {},
                        "nonResourceAttributes": {"path": METRICS_PATH, "verb": "get"},
                    },
                },
            )
        except Exception as e:  # ApiException, OSError, urllib3's errors in an outage
            log.warning("cannot review a /metrics caller: %s", e)
            return Decision(503, "cannot reach the apiserver to review the token")
        if (access.get("status") or {}).get("allowed"):
            return Decision(200, "allowed")
        return Decision(403, f"{user.get('username')} may not get {METRICS_PATH}")
