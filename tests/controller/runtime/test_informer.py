"""The store's watch streams (controller/runtime/informer.py): events applied in order, resumed from
the last version seen, the kind listed again after a gap (410 Gone), a broken stream resumed
without a list, and an unreadable event skipped without stopping the stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nexus_admit.controller.api import ApiException
from nexus_admit.controller.context import Context
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.runtime import informer
from nexus_admit.controller.runtime.informer import run_informer
from nexus_admit.controller.runtime.lists import ListedVersions, relist
from tests.controller.fake_api import FakeApi
from tests.kube.kube_factories import node

Step = list[dict[str, Any]] | BaseException


class WatchingApi(FakeApi):
    """Each watch request of a kind answers the next step of its script: a list of events
    (the stream then ends, as the apiserver's timeout ends it), or an exception raised
    after... nothing. With no step left a request waits a little and ends empty."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: dict[str, list[Step]] = {}
        self.watched: list[tuple[str, str]] = []  # (kind, version) of every request
        self.lists = 0

    def list(
        self, kind: str, keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    ) -> tuple[list[dict[str, Any]], int | None]:
        self.lists += 1
        return super().list(kind, keep)

    def watch(self, kind: str, version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        self.watched.append((kind, version))
        script = self.scripts.get(kind) or []
        if not script:
            time.sleep(0.01)
            return
        step = script.pop(0)
        if isinstance(step, BaseException):
            raise step
        for event in step:
            if isinstance(event.get("raise"), BaseException):
                raise event["raise"]
            yield event


def event(kind: str, event_type: str, name: str, rv: int, **extra: Any) -> dict[str, Any]:
    obj = node(name, **extra) if kind == "Node" else {"kind": kind, "metadata": {"name": name}}
    obj["metadata"]["resourceVersion"] = str(rv)
    return {"type": event_type, "object": obj}


def started(api: WatchingApi) -> Context:
    ctx = Context(options=RunOptions(webhook=False), api=api,  # type: ignore[arg-type]
                  engine=None)  # type: ignore[arg-type]
    asyncio.run(relist(ctx, ("Node",)))
    return ctx


def run_until(ctx: Context, kind: str, done: Callable[[], bool], seconds: float = 5.0) -> None:
    async def main() -> None:
        task = asyncio.create_task(run_informer(ctx, kind))
        try:
            deadline = time.monotonic() + seconds
            while not done() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    asyncio.run(main())
    assert done()


def names(ctx: Context) -> set[str]:
    return {str(n["metadata"].get("name")) for n in ctx.store.items("Node")
            if isinstance(n["metadata"], dict)}


def counter(metric: Any, kind: str) -> float:
    return float(metric.labels(kind)._value.get())


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(informer, "RECONNECT_SECONDS", (0.01,))
    monkeypatch.setattr(informer, "UNSERVED_RETRY_SECONDS", 0.01)


def test_events_are_applied_in_order_and_the_next_request_resumes_from_the_last_version(
) -> None:
    api = WatchingApi()
    api.put(node("a"))
    ctx = started(api)
    listed = ctx.component(ListedVersions).by_kind["Node"]
    api.scripts["Node"] = [[
        event("Node", "ADDED", "b", 200),
        event("Node", "MODIFIED", "b", 201, labels={"v": "2"}),
        event("Node", "DELETED", "a", 202),
        {"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {"resourceVersion": "250"}}},
    ]]
    ctx.signals.wake.clear()
    run_until(ctx, "Node", lambda: len(api.watched) >= 2)
    assert names(ctx) == {"b"} and ctx.store.get("Node", "b")["metadata"]["labels"]["v"] == "2"  # type: ignore[index]
    assert api.watched[:2] == [("Node", listed), ("Node", "250")], "resumed after the bookmark"
    assert ctx.signals.wake.is_set() and api.lists == 1


def test_a_gap_lists_the_kind_again_and_drops_what_was_deleted_in_it() -> None:
    api = WatchingApi()
    api.put(node("kept"))
    api.put(node("gone"))
    ctx = started(api)
    del api.objects[("Node", "gone")]  # deleted while the watch was away
    api.scripts["Node"] = [[{"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                                         "message": "too old resource version"}}]]
    run_until(ctx, "Node", lambda: api.lists == 2 and len(api.watched) >= 2)
    assert names(ctx) == {"kept"}
    assert counter(ctx.metrics.watch_gaps, "Node") == 1
    assert api.watched[1] == ("Node", str(api.rv)), "watched from the new list's version"


def test_a_410_answer_to_the_request_itself_is_a_gap_too() -> None:
    api = WatchingApi()
    api.put(node("n"))
    ctx = started(api)
    api.scripts["Node"] = [ApiException(status=410, reason="Gone")]
    run_until(ctx, "Node", lambda: api.lists == 2)
    assert counter(ctx.metrics.watch_gaps, "Node") == 1


def test_a_stream_that_breaks_off_is_resumed_from_where_it_was_without_a_list() -> None:
    api = WatchingApi()
    ctx = started(api)
    api.scripts["Node"] = [
        [event("Node", "ADDED", "a", 300), {"raise": ConnectionResetError("peer reset")}],
        OSError("connection refused"),  # the apiserver still down
        [event("Node", "ADDED", "b", 301)],
    ]
    run_until(ctx, "Node", lambda: names(ctx) == {"a", "b"})
    assert [v for _, v in api.watched[1:3]] == ["300", "300"]
    assert api.lists == 1 and counter(ctx.metrics.watch_reconnects, "Node") == 2
    assert counter(ctx.metrics.watch_gaps, "Node") == 0


def test_an_unreadable_event_is_skipped_and_the_stream_goes_on() -> None:
    api = WatchingApi()
    ctx = started(api)
    api.scripts["Node"] = [[
        {"type": "ADDED", "object": "not an object"},
        {"type": "ADDED"},
        {"type": "SURPRISE", "object": {"metadata": {"name": "x", "resourceVersion": "400"}}},
        {"type": "ADDED", "object": {"kind": "Node", "metadata": ["not", "a", "map"]}},
        event("Node", "ADDED", "fine", 401),
    ]]
    run_until(ctx, "Node", lambda: "fine" in names(ctx) and len(api.watched) >= 2)
    assert api.watched[1] == ("Node", "401")


def test_a_kind_not_served_is_listed_again_and_watched_once_it_is() -> None:
    api = WatchingApi()
    ctx = Context(options=RunOptions(webhook=False), api=api,  # type: ignore[arg-type]
                  engine=None)  # type: ignore[arg-type]
    # its list answered 404: the CRD is not installed
    ctx.component(ListedVersions).by_kind["Node"] = None
    api.put(node("later"))
    run_until(ctx, "Node", lambda: len(api.watched) >= 1)
    assert names(ctx) == {"later"} and api.watched[0] == ("Node", str(api.rv))


def test_a_stopped_informer_does_not_wait_for_its_stream_nor_take_what_it_still_brings(
) -> None:
    """The stream's thread blocks until the next event (up to 300 s in a quiet cluster):
    stopping must not wait for it, and what it reads afterwards goes nowhere."""

    class SlowApi(WatchingApi):
        def watch(self, kind: str, version: str, timeout_seconds: int
                  ) -> Iterator[dict[str, Any]]:
            self.watched.append((kind, version))
            time.sleep(0.3)
            yield event("Node", "ADDED", "late", 500)

    api = SlowApi()
    ctx = started(api)

    async def main() -> float:
        task = asyncio.create_task(run_informer(ctx, "Node"))
        await asyncio.sleep(0.05)
        t = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stopped = time.monotonic() - t
        await asyncio.sleep(0.5)  # the thread reads its event meanwhile
        return stopped

    assert asyncio.run(main()) < 0.2
    assert "late" not in names(ctx)


def test_a_stream_that_ends_at_once_again_and_again_backs_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(informer, "RECONNECT_SECONDS", (0.1,))
    api = WatchingApi()
    ctx = started(api)
    api.scripts["Node"] = [[] for _ in range(100)]  # each request ends empty at once

    async def main() -> None:
        task = asyncio.create_task(run_informer(ctx, "Node"))
        await asyncio.sleep(0.35)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert 2 <= len(api.watched) <= 5, "a request about every backoff, not a tight loop"
