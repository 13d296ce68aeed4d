"""Concurrency helpers for API writes that do not depend on one another.

Who calls it: `lifecycle.py` (reservation status writes), `ungating/ungater.py` (pod
patches), `workload_check.py` (Events). A pass used to await each write in turn, so one slow
round trip held up every decision behind it; independent writes now go out together, at
most `limit` at a time so a burst does not open hundreds of connections to the apiserver at
once. Pure asyncio: no kopf, no client.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["Background", "gather_bounded"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# the official client's connection pool holds 10 connections per host by default (5 × CPUs)
DEFAULT_LIMIT = 8


async def gather_bounded(aws: Iterable[Awaitable[T]], limit: int = DEFAULT_LIMIT) -> list[T]:
    """Await every awaitable, at most `limit` at once; results in order. An exception
    propagates like `asyncio.gather`'s (callers pass coroutines that handle their own)."""
    gate = asyncio.Semaphore(limit)

    async def one(aw: Awaitable[T]) -> T:
        async with gate:
            return await aw

    return list(await asyncio.gather(*(one(aw) for aw in aws)))


@dataclass
class Background:
    """Writes that need not delay the next decision (check answers, Events): started at
    once, at most `limit` at a time. `drain()` waits for them (a test's pass); the placing
    loop does not wait for them between passes, and a stopping controller cancels them."""

    limit: int = DEFAULT_LIMIT
    _running: set[asyncio.Task[None]] = field(default_factory=set)
    _gate: asyncio.Semaphore | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    def spawn(self, aw: Awaitable[None], name: str = "background-write") -> None:
        loop = asyncio.get_running_loop()
        if self._gate is None or self._loop is not loop:  # a semaphore serves one loop
            self._gate, self._loop = asyncio.Semaphore(self.limit), loop
        gate = self._gate

        async def run() -> None:
            async with gate:
                await aw

        task = asyncio.create_task(run(), name=name)
        self._running.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background write failed: %s", task.exception())

    async def drain(self) -> None:
        """Wait for every write started so far."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    def cancel(self) -> None:
        for task in list(self._running):
            task.cancel()
