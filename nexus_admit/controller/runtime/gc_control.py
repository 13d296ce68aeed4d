"""The garbage collector's pauses, and the long-lived heap kept out of them.

Why: CPython's full collection (generation 2) walks every container object the process
holds, while every thread waits (the solver, the watch streams, the webhook). The store
caches the whole cluster: at 5,000 nodes and 20,000 pods about 600,000 objects once
stripped, and a full collection of them took 527 ms on the benchmark's plane. Those objects
live for minutes to hours and hold no reference cycles (decoded JSON), so walking them finds
nothing. `freeze_long_lived` moves them out of the collector's reach (`gc.freeze`) once the
store is synced and the fleet's snapshot built, and what survived since every
`--heap-freeze-seconds`: a full collection then walks only what changed since (on the
benchmark's plane, tens of thousands of objects a minute in a burst; docs/benchmarks.md).
Every `WHOLE_EVERY`th freeze walks the whole heap again, so a frozen object that later
became cyclic garbage is freed within that many periods.

Where a collection runs: CPython sets one off inside whatever allocation crosses its
thresholds, most often a solve (the thread that allocates most), and a full one counts
in that decision's time. So `keep_heap` turns automatic collection off and runs it
itself: the young generations from the event loop every `YOUNG_EVERY_SECONDS`, by
CPython's own thresholds (`collect_young`), and full collections only as part of a freeze,
which waits for the pass in progress to end.

Who calls it: `operator.py` runs `keep_heap` as one of the controller's tasks.
`nexus_admit_gc_pause_seconds` times every collection, by generation.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Histogram

from nexus_admit.controller.context import Context

__all__ = ["CollectorPauses", "Freeze", "census", "collect_young", "freeze_long_lived", "keep_heap"]

log = logging.getLogger(__name__)


class CollectorPauses:
    """Times each collection through `gc.callbacks`. The callback runs inside whatever
    allocation set the collection off, in any thread: it only appends to a deque (no lock,
    so it cannot wait on a lock its own thread holds); `record` moves the pauses into the
    histogram from the event loop."""

    def __init__(self, keep: int = 4096) -> None:
        self._started = 0.0  # collections never overlap: the GIL, and gc's own guard
        self._done: deque[tuple[int, float]] = deque(maxlen=keep)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._done.append((int(info.get("generation", 0)), time.perf_counter() - self._started))

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def uninstall(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def drain(self) -> list[tuple[int, float]]:
        """The pauses since the last drain: (generation, seconds), oldest first."""
        out = []
        while self._done:
            out.append(self._done.popleft())
        return out

    def record(self, histogram: Histogram) -> None:
        for generation, seconds in self.drain():
            histogram.labels(str(generation)).observe(seconds)


@dataclass(frozen=True)
class Freeze:
    frozen: int  # objects frozen in all, after this freeze
    seconds: float  # the full collection's pause
    freed: int  # objects the collection found unreachable (garbage in reference cycles)
    # with a census: the commonest types among what this freeze froze, and among the
    # cyclic garbage it freed ("type count, ..."); "" without
    kept: str = ""
    garbage: str = ""


def census(objects: Iterable[object], top: int = 10) -> str:
    """The commonest types among `objects`, "module.Type count" by count: the first few
    built-in ones (how much), then the `top` commonest others (whose: built-in dicts and
    lists say little of where they came from)."""
    counts = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in objects)
    ranked = counts.most_common()
    builtin = [(k, n) for k, n in ranked if k.startswith("builtins.")][:4]
    others = [(k, n) for k, n in ranked if not k.startswith("builtins.")][:top]
    return ", ".join(f"{name} {n}" for name, n in builtin + others)


def freeze_long_lived(*, whole: bool = False, take_census: bool = False) -> Freeze:
    """Collect, then freeze what survives. `whole`: unfreeze first, so the collection walks
    every object, frees a frozen one that became cyclic garbage since, and costs one full
    pause; else it walks only what is not frozen yet (cheap). `take_census`: also count the
    types of what is frozen now and of the cyclic garbage freed (a walk of the heap not
    frozen, and the garbage kept until counted: for finding what a pass keeps or leaves in
    cycles, not for every run)."""
    started = time.perf_counter()
    if whole:
        gc.unfreeze()
    if take_census:
        gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        freed = gc.collect()
    finally:
        if take_census:
            gc.set_debug(0)
    seconds = time.perf_counter() - started
    kept = garbage = ""
    if take_census:
        garbage = census(gc.garbage)
        gc.garbage.clear()
        kept = census(gc.get_objects(2))
    gc.freeze()
    return Freeze(gc.get_freeze_count(), seconds, freed, kept, garbage)


# every this many freezes, one walks the whole heap again (`freeze_long_lived(whole=True)`):
# a frozen object that became cyclic garbage (an old snapshot's, a finished task's) is
# freed within this many periods (an hour by default), at the cost of one full pause
# (up to a second at 5,000 nodes)
WHOLE_EVERY = 60

# how long after the store is synced the first freeze waits at most for the first pass's
# snapshot of the fleet (a replica with no check to place for builds none)
FIRST_FREEZE_WAIT_SECONDS = 30.0


def collect_young() -> int | None:
    """A young collection (generation 0, or 1 when 0 has been collected often enough since),
    when CPython's own thresholds call for one; never a full one. Returns the generation
    collected, or None."""
    threshold0, threshold1, _ = gc.get_threshold()
    count0, count1, _ = gc.get_count()
    if count0 <= threshold0:
        return None
    generation = 1 if count1 > threshold1 else 0
    gc.collect(generation)
    return generation


# with automatic collection off, the young generations are collected from the event loop
# this often (what a tenth of a second of a burst keeps is a few milliseconds' walk)
YOUNG_EVERY_SECONDS = 0.1
RECORD_EVERY_SECONDS = 1.0


async def keep_heap(ctx: Context, pauses: CollectorPauses | None = None) -> None:
    """Time the collector's pauses; unless `--heap-freeze-seconds` is 0, run the collector
    from here instead of inside whatever allocation sets it off (a solve, most often):
    automatic collection off, the young generations collected every `YOUNG_EVERY_SECONDS`,
    and a full collection only when the heap is frozen, between two passes. The first
    freeze comes once the store is synced and the first pass has built the fleet's snapshot
    (`ctx.live`; a follower, or after `FIRST_FREEZE_WAIT_SECONDS`, without it), then one
    every `--heap-freeze-seconds`, walking the whole heap every `WHOLE_EVERY`th time."""
    pauses = pauses or CollectorPauses()
    pauses.install()
    every = ctx.options.heap_freeze_seconds
    automatic = gc.isenabled()
    if every > 0:
        gc.disable()
    synced_at: float | None = None
    frozen_at: float | None = None
    freezes = 0
    started = ctx.clocks.monotonic()
    recorded = float("-inf")
    waiting_on: asyncio.Task[None] | None = None  # the pass whose end the freeze waits for

    def freeze(_: object = None) -> None:
        nonlocal freezes, frozen_at, waiting_on
        waiting_on = None
        done = freeze_long_lived(whole=freezes % WHOLE_EVERY == 0,
                                 take_census=ctx.options.heap_census)
        freezes += 1
        frozen_at = ctx.clocks.monotonic()
        log.info("heap: %d long-lived objects frozen, out of the collector's walks (the full "
                 "collection before took %.0f ms and freed %d objects in reference cycles)",
                 done.frozen, done.seconds * 1000, done.freed)
        if done.kept or done.garbage:
            log.info("heap census: frozen now: %s; freed from cycles: %s",
                     done.kept or "-", done.garbage or "-")

    try:
        while True:
            await asyncio.sleep(YOUNG_EVERY_SECONDS if every > 0 else RECORD_EVERY_SECONDS)
            if every <= 0:
                pauses.record(ctx.metrics.gc_pause_seconds)
                continue
            collect_young()
            now = ctx.clocks.monotonic()
            if now - recorded < RECORD_EVERY_SECONDS:
                continue
            recorded = now
            pauses.record(ctx.metrics.gc_pause_seconds)
            if ctx.leadership.synced and synced_at is None:
                synced_at = now
            if frozen_at is None:
                due = synced_at is not None and (
                    bool(ctx.live) or not ctx.acting()
                    or now - synced_at >= FIRST_FREEZE_WAIT_SECONDS)
                # a store that never syncs (the apiserver out of reach) must not leave cyclic
                # garbage uncollected: with automatic collection off, only a freeze frees it
                due = due or now - started >= every
            else:
                due = now - frozen_at >= every
            if not due or waiting_on is not None:
                continue
            if ctx.signals.pass_task is None:
                freeze()
            else:  # the walk waits for the pass's end, so no solve waits on it
                waiting_on = ctx.signals.pass_task
                waiting_on.add_done_callback(freeze)
    finally:
        if waiting_on is not None:
            waiting_on.remove_done_callback(freeze)
        if automatic:
            gc.enable()
        pauses.uninstall()
        pauses.record(ctx.metrics.gc_pause_seconds)
