"""Which terminating pod holds which slot, and a replacement told it waits for it only when
its own slot is held and no other slot was given to it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.ungating.replacements import (
    REASON,
    tell_waiting,
    terminating_holders,
)
from nexus_admit.controller.ungating.slot_assignment import TERMINATION_MARGIN, RankedPod
from nexus_admit.kube import labels as L
from nexus_admit.kube.views import PodView
from nexus_admit.placement.policies import make_policy
from tests.controller.fake_api import FakeApi

NOW = datetime(2026, 12, 1, 7, 0, tzinfo=UTC)
GRACE_END = NOW + timedelta(seconds=30)


def bound(name: str, slot: str, *, deleting: datetime | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "namespace": "default",
                            "annotations": {L.ANN_SLOT: slot}}
    if deleting is not None:
        meta["deletionTimestamp"] = deleting.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": meta, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}


def gated(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "namespace": "default"},
            "spec": {"schedulingGates": [{"name": L.GATE_PLACEMENT}]},
            "status": {"phase": "Pending"}}


def test_terminating_holders_are_pods_being_deleted_that_still_hold_their_node() -> None:
    old = bound("old", "main/1", deleting=GRACE_END)
    pods = [PodView.of(p) for p in
            (bound("run", "main/0"), old, bound("late", "main/2", deleting=NOW))]
    assert terminating_holders(pods, NOW) == {("main", 1): pods[1], ("main", 2): pods[2]}
    assert terminating_holders(pods, NOW + TERMINATION_MARGIN) == {("main", 1): pods[1]}
    assert terminating_holders(pods, GRACE_END + TERMINATION_MARGIN) == {}


def test_only_a_replacement_left_without_a_slot_is_told_and_only_once() -> None:
    api = FakeApi()
    ctx = Context(options=RunOptions(webhook=False), api=api, engine=make_policy("nexus"))  # type: ignore[arg-type]
    ctx.clocks.wall = lambda: NOW
    pods = [PodView.of(p) for p in
            (bound("old", "main/1", deleting=GRACE_END), gated("new"), gated("other"))]
    views = [RankedPod(name, "main", 1, True, None, True) for name in ("new", "other")]

    async def tell_twice() -> None:
        tell_waiting(ctx, pods, views, chosen={"other"})  # "other" got a free slot
        tell_waiting(ctx, pods, views, chosen={"other"})
        await ctx.workers.background.drain()

    asyncio.run(tell_twice())
    (event,) = api.list("Event")[0]
    assert (event["reason"], event["regarding"]["name"]) == (REASON, "new")
    assert "pod old, which still holds slot main/1 on node n1" in event["note"]
    assert (GRACE_END + TERMINATION_MARGIN).strftime("%Y-%m-%dT%H:%M:%SZ") in event["note"]
