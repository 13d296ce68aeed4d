"""The collector's pauses are timed by generation, and the long-lived heap is frozen once
the store is synced, again once the fleet's snapshot exists, then every period."""

from __future__ import annotations

import asyncio
import gc
import itertools
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from nexus_admit.controller.context import Context
from nexus_admit.controller.options import OptionsError, RunOptions
from nexus_admit.controller.runtime.gc_control import (
    RECORD_EVERY_SECONDS,
    YOUNG_EVERY_SECONDS,
    CollectorPauses,
    Freeze,
    collect_young,
    freeze_long_lived,
    keep_heap,
)
from tests.controller.fake_api import FakeApi


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the suite collects as usual


def observed(ctx: Context, generation: str) -> float:
    for metric in ctx.metrics.gc_pause_seconds.collect():
        for s in metric.samples:
            if s.name.endswith("_count") and s.labels.get("generation") == generation:
                return s.value
    return 0.0


def run_keep_heap(ctx: Context, seconds: float) -> None:
    """Run the controller's heap task for `seconds`, then stop it."""

    async def scenario() -> None:
        task = asyncio.create_task(keep_heap(ctx))
        await asyncio.sleep(seconds)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def controller(**options: Any) -> Context:
    return Context(
        options=RunOptions(webhook=False, **options),
        api=FakeApi(),  # type: ignore[arg-type]
        engine=None,  # type: ignore[arg-type]
    )


def test_each_collection_is_timed_by_generation() -> None:
    pauses = CollectorPauses()
    pauses.install()
    try:
        gc.collect(0)
        gc.collect()
    finally:
        pauses.uninstall()
    done = pauses.drain()
    assert [g for g, _ in done][-2:] == [0, 2]
    assert all(seconds >= 0 for _, seconds in done)
    assert pauses.drain() == []
    assert pauses not in gc.callbacks


def test_frozen_objects_are_left_out_of_a_full_collection() -> None:
    cached = [{"metadata": {"name": f"pod-{i}"}, "spec": {}} for i in range(20_000)]
    done = freeze_long_lived()
    assert done.frozen >= len(cached)
    assert done.seconds >= 0
    assert len(gc.get_objects(2)) < len(cached)  # the next full walk skips them


def test_a_whole_refreeze_frees_a_frozen_object_that_became_cyclic_garbage() -> None:
    class Node:
        other: Any = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    freeze_long_lived()
    del a, b  # a cycle: reference counting cannot free it, and it is frozen
    freeze_long_lived()  # walks what is not frozen only
    assert alive() is not None
    freeze_long_lived(whole=True)
    assert alive() is None


def test_the_heap_is_frozen_once_the_first_snapshot_exists_then_every_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = controller(heap_freeze_seconds=3600)
    freezes: list[bool] = []

    def freeze(*, whole: bool = False, take_census: bool = False) -> Freeze:
        freezes.append(whole)
        return Freeze(0, 0.0, 0)

    monkeypatch.setattr("nexus_admit.controller.runtime.gc_control.freeze_long_lived", freeze)

    tick = [1000.0]
    ctx.clocks.monotonic = lambda: tick[0]

    async def a_record_period() -> None:
        tick[0] += RECORD_EVERY_SECONDS + 0.1
        await asyncio.sleep(2.5 * YOUNG_EVERY_SECONDS)  # the task's next step sees it

    async def scenario() -> list[int]:
        seen = []
        task = asyncio.create_task(keep_heap(ctx))
        await a_record_period()
        seen.append(len(freezes))  # not synced: nothing frozen
        ctx.leadership.synced = True
        await a_record_period()
        seen.append(len(freezes))  # synced, no snapshot yet: the first pass is on its way
        ctx.live["nexus"] = object()  # type: ignore[assignment]
        await a_record_period()
        seen.append(len(freezes))
        await a_record_period()
        seen.append(len(freezes))  # not again before the period
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return seen

    assert asyncio.run(scenario()) == [0, 0, 1, 1]
    assert freezes == [True]  # the first freeze walks the whole heap


def test_a_freeze_takes_the_collectors_pauses_out_of_the_walk() -> None:
    ctx = controller(heap_freeze_seconds=3600)
    ctx.leadership.synced = True
    ctx.live["nexus"] = object()  # type: ignore[assignment]

    run_keep_heap(ctx, 0.3)
    assert gc.get_freeze_count() > 0
    assert observed(ctx, "2") >= 1  # the freeze's own full collection, timed


def test_no_freeze_when_the_period_is_zero() -> None:
    ctx = controller(heap_freeze_seconds=0)
    ctx.leadership.synced = True

    run_keep_heap(ctx, 0.05)
    assert gc.get_freeze_count() == 0


def test_a_short_period_is_refused() -> None:
    with pytest.raises(OptionsError, match="--heap-freeze-seconds 5"):
        RunOptions(webhook=False, heap_freeze_seconds=5).validate()


def test_later_freezes_walk_only_what_is_not_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = controller(heap_freeze_seconds=1)  # below the flag's bound: a test's period
    ctx.leadership.synced = True
    ctx.live["nexus"] = object()  # type: ignore[assignment]
    freezes: list[bool] = []

    def freeze(*, whole: bool = False, take_census: bool = False) -> Freeze:
        freezes.append(whole)
        return Freeze(0, 0.0, 0)

    monkeypatch.setattr("nexus_admit.controller.runtime.gc_control.freeze_long_lived", freeze)
    ticks = itertools.count(1000.0, 1.0)  # a period passes at every reading
    ctx.clocks.monotonic = lambda: next(ticks)

    run_keep_heap(ctx, 5 * YOUNG_EVERY_SECONDS)
    assert freezes[:3] == [True, False, False]


def test_a_young_collection_runs_when_the_thresholds_call_for_one_and_is_never_full() -> None:
    gc.disable()
    try:
        gc.collect()
        assert collect_young() is None  # nothing allocated since
        threshold0, threshold1, _ = gc.get_threshold()
        kept: list[list[int]] = []
        generations = []
        for _ in range(threshold1 + 2):
            kept.extend([i] for i in range(threshold0 + 1))  # they survive: counted
            generations.append(collect_young())
        assert generations == [0] * (threshold1 + 1) + [1]
    finally:
        gc.enable()


def automatic_while_running(ctx: Context) -> bool:
    """Is CPython's automatic collection on while the heap task runs?"""

    async def scenario() -> bool:
        task = asyncio.create_task(keep_heap(ctx))
        await asyncio.sleep(0.3)
        seen = gc.isenabled()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return seen

    return asyncio.run(scenario())


def test_the_collector_runs_from_the_task_while_it_runs_and_automatically_after() -> None:
    assert not automatic_while_running(controller(heap_freeze_seconds=3600))
    assert gc.isenabled()  # no collection sets off inside a solve while it ran; on again


def test_with_a_zero_period_the_collector_runs_as_cpython_runs_it() -> None:
    assert automatic_while_running(controller(heap_freeze_seconds=0))


def test_a_due_freeze_waits_for_the_pass_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = controller(heap_freeze_seconds=3600)
    ctx.leadership.synced = True
    ctx.live["nexus"] = object()  # type: ignore[assignment]
    passes_running: list[bool] = []

    def freeze(*, whole: bool = False, take_census: bool = False) -> Freeze:
        running = ctx.signals.pass_task
        passes_running.append(running is not None and not running.done())
        return Freeze(0, 0.0, 0)

    monkeypatch.setattr("nexus_admit.controller.runtime.gc_control.freeze_long_lived", freeze)

    async def scenario() -> list[int]:
        seen = []
        ctx.signals.pass_task = asyncio.create_task(asyncio.sleep(0.6))
        task = asyncio.create_task(keep_heap(ctx))
        await asyncio.sleep(0.4)
        seen.append(len(passes_running))  # due, but a pass is solving
        await ctx.signals.pass_task
        ctx.signals.pass_task = None
        await asyncio.sleep(0.05)
        seen.append(len(passes_running))  # frozen as the pass ended
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return seen

    assert asyncio.run(scenario()) == [0, 1]
    assert passes_running == [False]


def test_a_census_names_what_is_frozen_and_what_was_freed_from_cycles() -> None:
    class Cached:
        pass

    class Cyclic:
        other: Any = None

    gc.disable()  # so no automatic collection frees a cycle before the census counts it
    try:
        freeze_long_lived()  # what the suite holds already is out of the census
        cached = [Cached() for _ in range(500)]
        for _ in range(300):
            a, b = Cyclic(), Cyclic()
            a.other, b.other = b, a
        del a, b
        done = freeze_long_lived(take_census=True)
    finally:
        gc.enable()
    assert f"{__name__}.{Cached.__qualname__} 500" in done.kept
    assert f"{__name__}.{Cyclic.__qualname__} 600" in done.garbage
    assert done.freed >= 600
    assert gc.garbage == [] and gc.get_debug() == 0  # nothing kept past the count
    assert len(cached) == 500
    assert freeze_long_lived().kept == ""  # no census unless asked


def test_a_controller_that_never_syncs_still_collects_every_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = controller(heap_freeze_seconds=1)  # below the flag's bound: a test's period
    freezes: list[bool] = []

    def freeze(*, whole: bool = False, take_census: bool = False) -> Freeze:
        freezes.append(whole)
        return Freeze(0, 0.0, 0)

    monkeypatch.setattr("nexus_admit.controller.runtime.gc_control.freeze_long_lived", freeze)
    ticks = itertools.count(1000.0, 1.0)  # a period passes at every reading
    ctx.clocks.monotonic = lambda: next(ticks)

    run_keep_heap(ctx, 5 * YOUNG_EVERY_SECONDS)
    assert not ctx.leadership.synced
    assert freezes[:2] == [True, False]
