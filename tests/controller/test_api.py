"""Paginated lists (`KubeApi.list`): every object across pages at the first page's
revision, a page timeout per request, an expired continue token answered by listing again
(then by one unpaginated list), a kind the API does not serve answered with nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from nexus_admit.controller.api import LIST_RESTARTS, ApiException, KubeApi


class PagedServer(KubeApi):
    """The apiserver's list semantics over `count` pods, with the requests recorded;
    `expire` continue tokens answer 410 Gone (etcd compacted past the list's revision)."""

    def __init__(self, count: int, *, page_size: int, expire: int = 0, missing: bool = False):
        super().__init__(None, list_page_size=page_size, list_page_timeout=7)  # type: ignore[arg-type]
        self.pods = [
            {"metadata": {"name": f"p{i:03}", "namespace": "ns", "managedFields": [{}]}}
            for i in range(count)
        ]
        self.expire = expire
        self.missing = missing
        self.calls: list[tuple[dict[str, Any], float | None]] = []
        self.revision = 1000

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        query: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        q = dict(query or {})
        self.calls.append((q, timeout))
        if self.missing:
            raise ApiException(status=404)
        if "continue" in q and self.expire:
            self.expire -= 1
            self.revision += 1  # the list starts again at a newer revision
            raise ApiException(status=410, reason="Expired")
        start = int(q.get("continue") or 0)
        limit = int(q.get("limit") or 0) or len(self.pods)
        page = [dict(p) for p in self.pods[start : start + limit]]
        rest = start + limit < len(self.pods)
        meta = {"resourceVersion": str(self.revision)}
        if rest:
            meta["continue"] = str(start + limit)
        self.revision += 1  # later pages are still answered at the list's revision
        return {"metadata": meta, "items": page}


def names(items: list[dict[str, Any]]) -> list[str]:
    return [i["metadata"]["name"] for i in items]


def test_a_list_reads_every_object_across_pages_at_the_first_pages_revision() -> None:
    api = PagedServer(12, page_size=5)
    items, version = api.list("Pod")
    assert names(items) == [f"p{i:03}" for i in range(12)]
    assert version == 1000
    assert [q.get("limit") for q, _ in api.calls] == ["5", "5", "5"]
    assert [q.get("continue") for q, _ in api.calls] == [None, "5", "10"]
    assert all(timeout == 7 for _, timeout in api.calls)  # each page its own timeout
    assert all(i["kind"] == "Pod" and i["apiVersion"] == "v1" for i in items)


def test_keep_turns_each_object_into_what_is_kept_as_its_page_arrives() -> None:
    api = PagedServer(3, page_size=2)
    items, _ = api.list("Pod", lambda o: {"metadata": {"name": o["metadata"]["name"]}})
    assert items == [{"metadata": {"name": n}} for n in ("p000", "p001", "p002")]


def test_an_expired_continue_token_lists_again_from_the_start() -> None:
    api = PagedServer(7, page_size=3, expire=1)
    items, version = api.list("Pod")
    assert names(items) == [f"p{i:03}" for i in range(7)]  # no object twice, none missing
    assert version == 1002  # the revision of the list that completed
    assert [q.get("continue") for q, _ in api.calls] == [None, "3", None, "3", "6"]


def test_tokens_that_keep_expiring_end_in_one_unpaginated_list() -> None:
    api = PagedServer(7, page_size=3, expire=LIST_RESTARTS)
    items, _ = api.list("Pod")
    assert names(items) == [f"p{i:03}" for i in range(7)]
    last_query, last_timeout = api.calls[-1]
    assert last_query == {} and last_timeout is not None and last_timeout > 7


def test_page_size_zero_lists_in_one_request() -> None:
    api = PagedServer(7, page_size=0)
    items, _ = api.list("Pod")
    assert len(items) == 7 and [q for q, _ in api.calls] == [{}]


def test_a_kind_the_api_does_not_serve_lists_as_nothing() -> None:
    assert PagedServer(3, page_size=2, missing=True).list("ResourceSlice") == ([], None)


def test_other_errors_are_raised() -> None:
    class Broken(PagedServer):
        def request(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            raise ApiException(status=500)

    with pytest.raises(ApiException):
        Broken(3, page_size=2).list("Pod")
