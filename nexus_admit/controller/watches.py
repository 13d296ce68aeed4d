"""Feeds the store: kopf event-watching handlers for every kind the controller reads, and
the full re-lists that make the store exact again after a watch gap.

Who calls it: `operator.py` (`register` at start-up, `initial_list` before kopf starts,
`resync_loop` as a background task). Event-watching handlers put nothing on the objects
(no finalizers, no progress annotations): the controller does not own Workloads, pods or
nodes, and must leave no trace on them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import kopf

from nexus_admit.controller.api import RESOURCES
from nexus_admit.controller.context import Context
from nexus_admit.controller.store import WATCHED_KINDS

__all__ = ["initial_list", "register", "relist", "resync_loop"]

log = logging.getLogger("nexus_admit.watches")


def register(registry: kopf.OperatorRegistry) -> None:
    for kind in WATCHED_KINDS:
        res = RESOURCES[kind]

        async def on_event(*, event: kopf.RawEvent, memo: Any, _kind: str = kind, **_: Any) -> None:
            ctx: Context = memo.ctx
            obj: Any = event.get("object")
            if not isinstance(obj, dict):
                return
            obj.setdefault("kind", _kind)
            if event.get("type") == "DELETED":
                changed = ctx.store.delete(_kind, obj)
            else:
                changed = ctx.store.upsert(_kind, obj)
            if changed:
                ctx.poke()

        kopf.on.event(res.group, res.version, res.plural, id=f"watch-{kind}", registry=registry)(
            on_event
        )


async def relist(ctx: Context) -> None:
    """List every kind and replace the store's view of it."""
    for kind in WATCHED_KINDS:
        items, version = await asyncio.to_thread(ctx.api.list, kind)
        ctx.store.replace(kind, items, version)
    ctx.metrics.relists.inc()
    ctx.poke()


async def initial_list(ctx: Context) -> None:
    """The whole cluster once, before any decision: a pass on a half-filled store could
    miss a reservation and double-book its GPUs."""
    await relist(ctx)
    ctx.synced = True
    counts = {k: len(ctx.store.objects[k]) for k in WATCHED_KINDS if ctx.store.objects[k]}
    log.info("store synced: %s", counts)


def _error_count(ctx: Context) -> float:
    return sum(
        s.value
        for metric in ctx.metrics.errors.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    )


async def resync_loop(ctx: Context) -> None:
    """A full re-list every `resync_seconds`, and at the next tick after any failed step:
    a failed API call (an apiserver or etcd outage) may mean a watch gap, and an object
    deleted in it would otherwise stay in the store until the period ends."""
    last = time.monotonic()
    errors = _error_count(ctx)
    while True:
        await asyncio.sleep(ctx.options.tick_seconds)
        if time.monotonic() - last < ctx.options.resync_seconds and _error_count(ctx) == errors:
            continue
        seen = _error_count(ctx)
        try:
            await relist(ctx)
        except Exception as e:  # still down: watches reconnect; this one tries next tick
            ctx.metrics.errors.labels("relist").inc()
            log.warning("re-list failed, retrying in %ss: %s", ctx.options.tick_seconds, e)
            continue
        last, errors = time.monotonic(), seen  # failures during the list: once more
