"""The re-list loop: every period, and at the next tick after any failed step (an outage may
have left a watch gap), until a re-list succeeds."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.runtime.lists import relist, resync_loop
from nexus_admit.kube.stored import StoredObject
from tests.controller.fake_api import FakeApi
from tests.kube.kube_factories import node

TICK = 0.01


class FlakyListApi(FakeApi):
    """Lists of Nodes fail `list_failures` times (the apiserver without its etcd), then
    answer (a re-list lists its kinds side by side: one failure per re-list)."""

    def __init__(self, list_failures: int = 0) -> None:
        super().__init__()
        self.list_failures = list_failures
        self.lists = 0

    def list(
        self, kind: str, keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    ) -> tuple[list[dict[str, Any]], int | None]:
        self.lists += 1
        if self.list_failures and kind == "Node":
            self.list_failures -= 1
            raise OSError("connection refused")
        return super().list(kind, keep)


def started_controller(api: FakeApi) -> Context:
    """A controller whose store still holds node `gone`, deleted while no watch ran."""
    api.put(node("kept"))
    ctx = Context(
        options=RunOptions(webhook=False, tick_seconds=TICK, resync_seconds=3600),
        api=api,  # type: ignore[arg-type]
        engine=None,  # type: ignore[arg-type]
    )
    for name in ("kept", "gone"):
        ctx.store.upsert("Node", node(name))
    return ctx


def nodes(ctx: Context) -> set[str]:
    return {n["metadata"]["name"] for n in ctx.store.items("Node")}


def relists(ctx: Context) -> float:
    return ctx.metrics.relists._value.get()  # type: ignore[attr-defined]


async def with_resync_loop(
    ctx: Context, step: Callable[[], None] | None = None, until: Callable[[], bool] | None = None
) -> None:
    """Run the loop for a few ticks, then `step`, then until `until` holds (at most 5 s: a
    loaded machine runs the re-list's threads late)."""
    task = asyncio.create_task(resync_loop(ctx))
    try:
        await asyncio.sleep(10 * TICK)
        if step is not None:
            step()
        for _ in range(500):
            if until is None or until():
                break
            await asyncio.sleep(TICK)
        await asyncio.sleep(5 * TICK)  # and no further re-list right after
    finally:
        task.cancel()


def test_no_relist_before_the_period_while_nothing_failed() -> None:
    ctx = started_controller(FakeApi())
    asyncio.run(with_resync_loop(ctx))
    assert nodes(ctx) == {"kept", "gone"} and relists(ctx) == 0


def test_a_relist_once_the_period_has_passed_while_nothing_failed() -> None:
    ctx = started_controller(FakeApi())
    tick = [1000.0]
    ctx.clocks.monotonic = lambda: tick[0]

    def period_passes() -> None:
        tick[0] += ctx.options.resync_seconds

    asyncio.run(with_resync_loop(ctx, period_passes, until=lambda: relists(ctx) > 0))
    assert nodes(ctx) == {"kept"} and relists(ctx) == 1, "one period, one re-list"


def test_a_failed_step_brings_a_relist_at_the_next_tick() -> None:
    ctx = started_controller(FakeApi())
    fail = lambda: ctx.metrics.errors.labels("check").inc()  # noqa: E731
    asyncio.run(with_resync_loop(ctx, fail, until=lambda: relists(ctx) > 0))
    assert nodes(ctx) == {"kept"}, "the node deleted during the gap is still in the store"
    assert relists(ctx) == 1, "one failure, one re-list"


def test_a_failed_relist_is_tried_again_until_one_succeeds() -> None:
    api = FlakyListApi(list_failures=3)
    ctx = started_controller(api)
    fail = lambda: ctx.metrics.errors.labels("reserve").inc()  # noqa: E731
    asyncio.run(with_resync_loop(ctx, fail, until=lambda: relists(ctx) > 0))
    assert api.list_failures == 0 and relists(ctx) == 1
    assert nodes(ctx) == {"kept"}
    assert ctx.metrics.errors.labels("relist")._value.get() == 3  # type: ignore[attr-defined]


def test_a_relist_strips_only_what_changed_and_keeps_the_stored_objects_of_the_same_version(
) -> None:
    api = FakeApi()
    api.put(node("same"))
    api.put(node("changed"))
    ctx = started_controller(api)
    asyncio.run(relist(ctx))
    same, changed = ctx.store.get("Node", "same"), ctx.store.get("Node", "changed")
    assert isinstance(same, StoredObject) and isinstance(changed, StoredObject)
    updated = node("changed", labels={"new": "label"})
    updated["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    api.put(updated)
    asyncio.run(relist(ctx))
    assert ctx.store.get("Node", "same") is same  # same version: not stripped again
    now = ctx.store.get("Node", "changed")
    assert now is not changed and now["metadata"]["labels"]["new"] == "label"
    assert "managedFields" not in now["metadata"]


def test_an_event_of_the_version_the_store_holds_changes_nothing_and_wakes_nobody() -> None:
    """A watch resumed from an older version than the store holds delivers versions it
    already has: they are not stored again and wake nobody."""
    from tests.controller.test_placing import deliver

    api = FakeApi()
    api.put(node("n"))
    ctx = started_controller(api)
    asyncio.run(relist(ctx))
    held = ctx.store.get("Node", "n")
    ctx.signals.wake.clear()
    deliver(ctx, "Node", api.get("Node", "n") or {}, "ADDED")
    assert ctx.store.get("Node", "n") is held and not ctx.signals.wake.is_set()
    newer = api.put(node("n", labels={"new": "label"}))
    deliver(ctx, "Node", newer)
    assert ctx.store.get("Node", "n") is not held and ctx.signals.wake.is_set()


def test_a_lost_create_is_held_for_its_own_horizon_not_the_re_list_period() -> None:
    """Before: two re-list periods. With a short period an unseen reservation was forgotten
    sooner; with a long one a create never made held its GPUs for twenty minutes."""
    from nexus_admit.controller.loop.inputs import settle_ledger
    from nexus_admit.model import Gang, PodSet, Slot

    ctx = started_controller(FakeApi())
    ctx.options = RunOptions(webhook=False, resync_seconds=5, lost_write_seconds=120)
    gang = Gang("ns/w", (PodSet("main", count=1, gpus=8),))
    slot = (Slot("main", 0, "kept", tuple(range(8)), 0),)
    now = 1000.0
    ctx.clocks.monotonic = lambda: now
    ctx.ledger.assume("ns/recent", "ns/w", gang, slot, now - 60)
    ctx.ledger.assume("ns/old", "ns/v", gang, slot, now - 121)
    ctx.ledger.lost("ns/recent")
    ctx.ledger.lost("ns/old")
    settle_ledger(ctx, [])
    assert set(ctx.ledger.unsure) == {"ns/recent"}


def test_lost_write_seconds_is_validated() -> None:
    import pytest

    from nexus_admit.controller.options import OptionsError

    with pytest.raises(OptionsError, match="--lost-write-seconds 1"):
        RunOptions(webhook=False, lost_write_seconds=1).validate()


def test_a_relist_lists_its_kinds_side_by_side() -> None:
    """The pods' list (most of a start-up at 5,000 nodes) does not wait for the Nodes'."""
    started = {kind: threading.Event() for kind in ("Node", "Pod")}

    class BothAtOnce(FakeApi):
        def list(
            self, kind: str, keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        ) -> tuple[list[dict[str, Any]], int | None]:
            started[kind].set()
            other = "Pod" if kind == "Node" else "Node"
            assert started[other].wait(5), f"{kind} listed alone"
            return super().list(kind, keep)

    api = BothAtOnce()
    ctx = started_controller(api)
    asyncio.run(relist(ctx, ("Node", "Pod")))
    assert nodes(ctx) == {"kept"} and relists(ctx) == 1
