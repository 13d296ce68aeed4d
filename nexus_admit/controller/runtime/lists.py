"""Fills the store by full lists: at start-up (the webhook's kinds first, then the fleet),
on taking the Lease, after any failed step and, for safety, every `--resync-seconds`.

Who calls it: `operator.py` (`list_early`, the webhook's kinds, then `initial_list`, the
rest, before the loops start; `resync_loop` as a background task); `informer.py` lists one
kind again after a watch gap. The watch streams that keep the store current between lists
are `informer.py`'s; each kind is watched from the version its last list was read at
(`ListedVersions`). Nothing is ever written on the objects read: the controller does not
own Workloads, pods or nodes, and must leave no trace on them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.store import WATCHED_KINDS, Store
from nexus_admit.kube.errors import meta, object_key
from nexus_admit.kube.stored import stripped

__all__ = [
    "EARLY_KINDS",
    "LATER_KINDS",
    "ListedVersions",
    "initial_list",
    "list_early",
    "relist",
    "resync_loop",
]

log = logging.getLogger(__name__)


@dataclass
class ListedVersions:
    """The resourceVersion each kind was last listed at (None: not served): where its
    watch starts (`informer.py`)."""

    by_kind: dict[str, str | None] = field(default_factory=dict)

    def reset(self) -> None:
        """Kept: they are the store's, not a leader's (a new leader re-lists anyway)."""


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


async def _relist_kind(ctx: Context, kind: str) -> None:
    started = time.perf_counter()
    keep = partial(_kept, ctx.store, kind)
    items, version = await asyncio.to_thread(ctx.api.list, kind, keep)
    ctx.store.replace(kind, items, version)
    ctx.component(ListedVersions).by_kind[kind] = None if version is None else str(version)
    log.debug("listed %d %s in %.2f s", len(items), kind, time.perf_counter() - started)


async def relist(ctx: Context, kinds: Iterable[str] = WATCHED_KINDS) -> None:
    """List every kind of `kinds` (page by page, each object stripped to what is read as
    its page arrives: `api.KubeApi.list`, `kube/stored.py`) and replace the store's view
    of it. The kinds are listed side by side, each in a worker thread: while the apiserver
    reads one kind's page (the pods, at 20,000 of them, take most of a start-up), this
    process decodes another's. Raises the first failure, once every list has ended."""
    results = await asyncio.gather(*(_relist_kind(ctx, k) for k in kinds),
                                   return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise failed[0]
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
    ctx.leadership.synced = True
    counts = {k: len(ctx.store.objects[k]) for k in WATCHED_KINDS if ctx.store.objects[k]}
    log.info("store synced in %.1f s: %s", time.perf_counter() - started, counts)


def _error_count(ctx: Context) -> float:
    return sum(
        s.value
        for metric in ctx.metrics.errors.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    )


async def resync_loop(ctx: Context) -> None:
    """A full re-list at the next tick after any failed step (an apiserver or etcd outage
    may have cut a watch short in a way its stream did not show), and every
    `--resync-seconds` for safety; a failed re-list is tried again at the next tick. A gap
    a watch stream sees itself (410 Gone) re-lists that kind at once (`informer.py`)."""
    last = ctx.clocks.monotonic()
    errors = _error_count(ctx)
    while True:
        await asyncio.sleep(ctx.options.tick_seconds)
        due = ctx.clocks.monotonic() - last >= ctx.options.resync_seconds
        if not due and _error_count(ctx) == errors:
            continue
        seen = _error_count(ctx)
        try:
            await relist(ctx)
        except Exception as e:  # still down: watches reconnect; this one tries next tick
            ctx.metrics.errors.labels("relist").inc()
            log.warning("re-list failed, retrying in %ss: %s", ctx.options.tick_seconds, e)
            continue
        last, errors = ctx.clocks.monotonic(), seen  # failures during the list: once more
