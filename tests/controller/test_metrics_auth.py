"""/metrics behind the apiserver's TokenReview and SubjectAccessReview: who may read it, what
it costs, and what an outage does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nexus_admit.controller.metrics_auth import (
    ACCESS_REVIEWS,
    TOKEN_REVIEWS,
    MetricsAuthorizer,
    bearer_token,
)

USERS = {"scraper-token": "system:serviceaccount:monitoring:prometheus", "other-token": "bob"}
READERS = {"system:serviceaccount:monitoring:prometheus"}


class ReviewingApi:
    """The two review calls as the apiserver answers them; counts calls, can be down."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.down = False

    def request(self, method: str, path: str, *, body: Any = None) -> dict[str, Any]:
        self.calls.append(path)
        if self.down:
            raise OSError("connection refused")
        assert method == "POST"
        if path == TOKEN_REVIEWS:
            user = USERS.get(body["spec"]["token"])
            if user is None:
                return {"status": {"authenticated": False}}
            return {"status": {"authenticated": True, "user": {"username": user, "groups": []}}}
        assert path == ACCESS_REVIEWS
        attrs = body["spec"]["nonResourceAttributes"]
        assert attrs == {"path": "/metrics", "verb": "get"}
        return {"status": {"allowed": body["spec"]["user"] in READERS}}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def decide(auth: MetricsAuthorizer, token: str | None) -> int:
    return asyncio.run(auth.decide(token)).status


@pytest.mark.parametrize(
    ("token", "status", "calls"),
    [
        pytest.param(None, 401, 0, id="no-token-costs-no-call"),
        pytest.param("made-up", 401, 1, id="unknown-token"),
        pytest.param("other-token", 403, 2, id="authenticated-not-authorised"),
        pytest.param("scraper-token", 200, 2, id="the-scraper"),
    ],
)
def test_who_may_read_metrics(token: str | None, status: int, calls: int) -> None:
    api = ReviewingApi()
    assert decide(MetricsAuthorizer(api), token) == status
    assert len(api.calls) == calls


def test_answers_are_remembered_for_the_ttl_and_bounded_in_number() -> None:
    api, clock = ReviewingApi(), Clock()
    auth = MetricsAuthorizer(api, ttl_seconds=60, max_entries=2, clock=clock)
    assert decide(auth, "scraper-token") == 200
    assert decide(auth, "scraper-token") == 200
    assert len(api.calls) == 2, "the second scrape costs no API call"
    clock.now = 61
    assert decide(auth, "scraper-token") == 200
    assert len(api.calls) == 4, "reviewed again after the TTL"
    # a flood of made-up tokens: one review each, and the cache keeps at most 2 entries
    for i in range(10):
        assert decide(auth, f"junk-{i}") == 401
    assert len(auth._cache) == 2


def test_an_outage_answers_503_and_is_not_remembered() -> None:
    api = ReviewingApi()
    auth = MetricsAuthorizer(api)
    api.down = True
    assert decide(auth, "scraper-token") == 503
    api.down = False
    assert decide(auth, "scraper-token") == 200


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer ", None),
        ("", None),
    ],
)
def test_bearer_token(header: str, token: str | None) -> None:
    assert bearer_token({"Authorization": header} if header else {}) == token
