"""What wakes the placing pass: any change at once, a pod's within a second (only the
once-a-second lifecycle step reads pods); the ungater wakes at once for every change."""

from __future__ import annotations

import asyncio

import pytest

from nexus_admit.controller import context as context_module
from nexus_admit.controller.context import Context
from nexus_admit.controller.options import RunOptions
from tests.controller.fake_api import FakeApi


def fresh_context() -> Context:
    return Context(
        options=RunOptions(webhook=False),
        api=FakeApi(),  # type: ignore[arg-type]
        engine=None,  # type: ignore[arg-type]
    )


def test_a_workload_change_wakes_both_passes_at_once() -> None:
    async def go() -> None:
        ctx = fresh_context()
        ctx.poke("Workload")
        assert ctx.wake.is_set() and ctx.ungate_wake.is_set()

    asyncio.run(go())


def test_pod_changes_wake_the_ungater_at_once_and_the_placing_pass_once_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(context_module, "POD_PASS_DELAY_SECONDS", 0.05)

    async def go() -> None:
        ctx = fresh_context()
        for _ in range(50):  # a gang's pods bound and Running, one event each
            ctx.poke("Pod")
        assert ctx.ungate_wake.is_set()
        assert not ctx.wake.is_set()
        await asyncio.wait_for(ctx.wake.wait(), timeout=5)
        ctx.wake.clear()
        await asyncio.sleep(0.2)
        assert not ctx.wake.is_set()  # fifty events, one pass
        ctx.poke("Pod")  # the next pod event schedules the next one
        await asyncio.wait_for(ctx.wake.wait(), timeout=5)

    asyncio.run(go())


def test_a_change_of_unknown_kind_wakes_the_placing_pass_at_once() -> None:
    async def go() -> None:
        ctx = fresh_context()
        ctx.poke()
        assert ctx.wake.is_set()

    asyncio.run(go())
