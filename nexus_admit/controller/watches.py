"""Feeds the store: kopf event-watching handlers for every kind the controller reads, and
the full re-lists that make the store exact again after a watch gap.

Who calls it: `operator.py` (`register` at start-up; `list_early`, the webhook's kinds, then
`initial_list`, the rest, before kopf starts; `resync_loop` as a background task). Event-
watching handlers put nothing on the objects (no finalizers, no progress annotations): the
controller does not own Workloads, pods or nodes, and must leave no trace on them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from functools import partial
from typing import Any

import kopf

from nexus_admit.controller.api import RESOURCES
from nexus_admit.controller.context import Context
from nexus_admit.controller.store import WATCHED_KINDS, Store
from nexus_admit.kube.errors import meta, object_key
from nexus_admit.kube.stored import stripped

__all__ = [
    "EARLY_KINDS",
    "LATER_KINDS",
    "UNOBSERVED_RESYNC_SECONDS",
    "initial_list",
    "list_early",
    "register",
    "relist",
    "resync_loop",
    "resync_period",
]

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
            elif _held(ctx.store, _kind, obj) is not None:
                # the version the store holds (kopf's own list before its watch, after ours)
                changed = False
            else:
                changed = ctx.store.upsert(_kind, obj)
            if changed:
                ctx.poke()

        kopf.on.event(res.group, res.version, res.plural, id=f"watch-{kind}", registry=registry)(
            on_event
        )


# the kinds the pod webhook reads from the store without asking the API when they are
# missing (`webhook/review.py`: our AdmissionChecks decide which queues are gated), and the
# small configuration kinds beside them: listed first at start-up, so the webhook serves
# while the fleet (nodes, pods, Workloads) is still being listed
EARLY_KINDS = (
    "AdmissionCheck",
    "ClusterQueue",
    "LocalQueue",
    "ResourceFlavor",
    "Topology",
    "PlacementConfig",
    "ResourceReservation",
)
LATER_KINDS = tuple(k for k in WATCHED_KINDS if k not in EARLY_KINDS)


def _held(store: Store, kind: str, obj: dict[str, Any]) -> dict[str, Any] | None:
    """The stored object when it is this same version of `obj`, else None."""
    held = store.get(kind, object_key(obj))
    version = meta(obj).get("resourceVersion")
    if held is not None and version and meta(held).get("resourceVersion") == version:
        return held
    return None


def _kept(store: Store, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """What the store keeps of a listed object: the stored one when it is that same version
    (most are, on a re-list: nothing to strip again), else the object stripped (in the
    list's worker thread: a read of the store's dict, which only the event loop writes)."""
    held = _held(store, kind, obj)
    return held if held is not None else stripped(kind, obj)


async def relist(ctx: Context, kinds: Iterable[str] = WATCHED_KINDS) -> None:
    """List every kind of `kinds` (page by page, each object stripped to what is read as
    its page arrives: `api.KubeApi.list`, `kube/stored.py`) and replace the store's view
    of it."""
    for kind in kinds:
        started = time.perf_counter()
        keep = partial(_kept, ctx.store, kind)
        items, version = await asyncio.to_thread(ctx.api.list, kind, keep)
        ctx.store.replace(kind, items, version)
        log.debug("listed %d %s in %.2f s", len(items), kind, time.perf_counter() - started)
    ctx.metrics.relists.inc()
    ctx.poke()


async def list_early(ctx: Context) -> None:
    """The kinds the webhook's answers need (`EARLY_KINDS`), before it serves."""
    await relist(ctx, EARLY_KINDS)
    log.info("store: the webhook's kinds listed")


async def initial_list(ctx: Context) -> None:
    """The whole cluster once (after `list_early`: the rest), before any decision: a pass
    on a half-filled store could miss a reservation and double-book its GPUs."""
    await ctx.faults.hold("hold-fleet-list")  # test-only (controller/faults.py)
    started = time.perf_counter()
    await relist(ctx, LATER_KINDS)
    ctx.synced = True
    counts = {k: len(ctx.store.objects[k]) for k in WATCHED_KINDS if ctx.store.objects[k]}
    log.info("store synced in %.1f s: %s", time.perf_counter() - started, counts)


def _error_count(ctx: Context) -> float:
    return sum(
        s.value
        for metric in ctx.metrics.errors.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    )


# the full re-list's period where kopf's list rounds cannot be seen (list_rounds.observe):
# the period alone then bounds how long an object deleted in a watch gap stays in the store
UNOBSERVED_RESYNC_SECONDS = 60.0


def resync_period(ctx: Context) -> float:
    """Seconds between safety re-lists of every kind."""
    o = ctx.options.resync_seconds
    return o if ctx.list_rounds_observed else min(o, UNOBSERVED_RESYNC_SECONDS)


async def resync_loop(ctx: Context) -> None:
    """Re-lists, at the next tick after what may have left a watch gap: the kinds kopf had
    to list again (their watch broke off: `list_rounds.py`), and every kind after any failed
    step (an apiserver or etcd outage: an object deleted in a gap would otherwise stay in
    the store), and every kind each `resync_period` for safety. A failed re-list is tried
    again at the next tick."""
    last = time.monotonic()
    errors = _error_count(ctx)
    while True:
        await asyncio.sleep(ctx.options.tick_seconds)
        gaps = ctx.list_rounds.take()
        due = time.monotonic() - last >= resync_period(ctx) or _error_count(ctx) != errors
        if not due and not gaps:
            continue
        seen = _error_count(ctx)
        kinds = WATCHED_KINDS if due else tuple(k for k in WATCHED_KINDS if k in gaps)
        try:
            await relist(ctx, kinds)
        except Exception as e:  # still down: watches reconnect; this one tries next tick
            ctx.list_rounds.give_back(gaps)
            ctx.metrics.errors.labels("relist").inc()
            log.warning("re-list failed, retrying in %ss: %s", ctx.options.tick_seconds, e)
            continue
        if due:
            last, errors = time.monotonic(), seen  # failures during the list: once more
