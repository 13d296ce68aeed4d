"""Feeds the store: one watch stream per kind, read on a thread of its own, straight into
the store, resumed from the last version seen, and the kind listed again after a gap.

Who calls it: `operator.py` starts `run_informers` once `watches.initial_list` has filled
the store (each kind is watched from the version its list was read at).

Why not kopf's event handlers: kopf hands every event to a per-object worker task, with
its own logger, patch, body views and handler invocation, for a handler that only puts the
object in the store. On the 5,000-node benchmark that was about a quarter of the
controller's busy time (py-spy, docs/benchmarks.md), and a controller that fell behind on
its pod watch was dropped by the apiserver and had to list 20,000 pods again, twice (kopf's
list and the store's). Here a thread reads the stream and strips each object as it arrives
(`kube/stored.py`); the event loop takes what arrived in one go, applies it to the store and
wakes the loops once.

Watch gaps: the stream resumes from the last resourceVersion it saw (an event's or a
bookmark's). When the apiserver answers 410 Gone, that version is no longer in its watch
cache (it restarted, or dropped this watcher for falling behind): events were missed,
deletions among them, which no later event brings back. The kind is then listed again
(`Store.replace` drops what the list no longer holds) and watched from the list's version
(`nexus_admit_watch_gaps_total{kind}`). A stream that broke off otherwise (a lost
connection, the apiserver down) is resumed from where it was, after a backoff.

Every event is untrusted: one that cannot be read is counted, logged and skipped; it never
stops the stream.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nexus_admit.controller.api import ApiException, KubeApi
from nexus_admit.controller.context import Context
from nexus_admit.controller.runtime.lists import ListedVersions, relist
from nexus_admit.controller.store import WATCHED_KINDS
from nexus_admit.kube.errors import meta
from nexus_admit.kube.stored import stripped

__all__ = [
    "QUICK_END_SECONDS",
    "RECONNECT_SECONDS",
    "UNSERVED_RETRY_SECONDS",
    "WATCH_SECONDS",
    "Gone",
    "run_informer",
    "run_informers",
]

log = logging.getLogger(__name__)

# how long the apiserver keeps one watch request open (it ends it then; the informer asks
# again from the version it reached)
WATCH_SECONDS = 300
# waits before resuming a stream that broke off, one more step per failure in a row
RECONNECT_SECONDS = (1.0, 2.0, 5.0, 10.0)
# a request that ends cleanly sooner than this (the apiserver keeps it WATCH_SECONDS) waits
# like a broken one before the next, so a stream cut short at once is no tight loop
QUICK_END_SECONDS = 1.0
# a kind the apiserver does not serve (a CRD not installed: NRT, DRA) is listed again this
# often, and watched once it is served
UNSERVED_RETRY_SECONDS = 30.0


class Gone(Exception):
    """410 Gone: the version the watch asked for is no longer in the apiserver's cache."""


@dataclass(slots=True)
class _Stream:
    """A kind's watch, shared by its reading thread and the event loop, from request to
    request."""

    version: str  # the last resourceVersion seen (an event's or a bookmark's)
    arrived: collections.deque[tuple[str, dict[str, Any]]] = field(
        default_factory=collections.deque)
    lock: threading.Lock = field(default_factory=threading.Lock)
    scheduled: bool = False  # a take is already on its way to the event loop
    closed: bool = False  # the informer stopped: a request still being read hands nothing on


async def run_informers(ctx: Context, kinds: Iterable[str] = WATCHED_KINDS) -> None:
    """Watch every kind of `kinds`, each from the version it was last listed at
    (`lists.ListedVersions`)."""
    await asyncio.gather(*(run_informer(ctx, kind) for kind in kinds))


async def run_informer(ctx: Context, kind: str) -> None:
    """Watch `kind` for ever: resume after a break, list again after a gap."""
    failures = 0
    listed = ctx.component(ListedVersions).by_kind.get(kind)
    stream = None if listed is None else _Stream(listed)
    while True:
        try:
            if stream is None:  # not served when last listed: list again, then watch
                await asyncio.sleep(UNSERVED_RETRY_SECONDS)
                await relist(ctx, (kind,))
                listed = ctx.component(ListedVersions).by_kind.get(kind)
                stream = None if listed is None else _Stream(listed)
                continue
            started = ctx.clocks.monotonic()
            await _watch_once(ctx, kind, stream)
            if ctx.clocks.monotonic() - started < QUICK_END_SECONDS:
                # the stream ended at once (a proxy cutting it short): never a tight loop
                await asyncio.sleep(_backoff(failures))
                failures += 1
            else:
                failures = 0
        except Gone:
            ctx.metrics.watch_gaps.labels(kind).inc()
            log.info("watch of %s: version %s is gone (a gap): listing it again",
                     kind, stream.version if stream else None)
            try:
                await relist(ctx, (kind,))
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("list of %s after a watch gap failed: %s", kind, e)
                await asyncio.sleep(_backoff(failures))
                failures += 1
                continue
            listed = ctx.component(ListedVersions).by_kind.get(kind)
            stream = None if listed is None else _Stream(listed)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a lost connection, the apiserver down: resume from version
            ctx.metrics.watch_reconnects.labels(kind).inc()
            delay = _backoff(failures)
            failures += 1
            log.warning("watch of %s broke off (%s); resuming from version %s in %.0f s",
                        kind, _describe(e), stream.version if stream else None, delay)
            await asyncio.sleep(delay)


def _backoff(failures: int) -> float:
    return RECONNECT_SECONDS[min(failures, len(RECONNECT_SECONDS) - 1)]


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:200]


async def _watch_once(ctx: Context, kind: str, stream: _Stream) -> None:
    """One watch request, read to its end (`stream.version`: where the next one resumes).
    Raises `Gone` (410), or what broke the stream (the events read before it are applied
    all the same)."""
    loop = asyncio.get_running_loop()
    api = ctx.watch_api or ctx.api

    def take() -> None:  # on the event loop: everything that arrived, in order
        with stream.lock:
            events = list(stream.arrived)
            stream.arrived.clear()
            stream.scheduled = False
        apply_events(ctx, kind, events)

    def arrive(event_type: str, obj: dict[str, Any]) -> None:  # on the reading thread
        with stream.lock:
            if stream.closed:
                return
            stream.arrived.append((event_type, obj))
            if stream.scheduled:
                return
            stream.scheduled = True
        loop.call_soon_threadsafe(take)

    done: asyncio.Future[None] = loop.create_future()

    def finish(error: BaseException | None) -> None:  # on the event loop
        if done.done():
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def reading() -> None:  # a thread of its own: a stream is read for minutes
        error: BaseException | None = None
        try:
            _read(api, kind, stream, arrive)
        except BaseException as e:
            error = e
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
            loop.call_soon_threadsafe(finish, error)

    # a daemon thread, not a pool's: a stream waiting for its next event must not hold the
    # process up at exit (a pool's threads are joined then, up to the stream's 300 s)
    threading.Thread(target=reading, name=f"watch-{kind}", daemon=True).start()
    try:
        await done
    except asyncio.CancelledError:
        stream.closed = True
        raise


def _read(
    api: KubeApi, kind: str, stream: _Stream, arrive: Callable[[str, dict[str, Any]], None]
) -> None:
    """The reading thread: every event of one watch request, stripped, handed on."""
    try:
        for event in api.watch(kind, stream.version, WATCH_SECONDS):
            event_type, obj = event.get("type"), event.get("object")
            if not isinstance(obj, dict):
                log.warning("watch of %s: an event without an object skipped: %.200r", kind, event)
                continue
            if event_type == "ERROR":
                if obj.get("code") == 410:
                    raise Gone(str(obj.get("message") or "410 Gone"))
                raise RuntimeError(f"the watch stream answered {str(obj)[:300]}")
            version = meta(obj).get("resourceVersion")
            if isinstance(version, str) and version:
                stream.version = version
            if event_type == "BOOKMARK":
                continue
            if event_type not in ("ADDED", "MODIFIED", "DELETED"):
                log.warning("watch of %s: an event of type %.40r skipped", kind, event_type)
                continue
            obj.setdefault("kind", kind)
            try:
                kept = stripped(kind, obj)
            except Exception as e:  # kept whole: the store's readers report what is wrong
                log.debug("watch of %s: not stripped: %s", kind, e)
                kept = obj  # type: ignore[assignment]
            arrive(str(event_type), kept)
    except ApiException as e:
        if e.status == 410:
            raise Gone(str(e.reason)) from None
        raise


def apply_events(ctx: Context, kind: str, events: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """Put watch events of `kind` in the store, in order; wake the loops once if anything
    changed. An event the store cannot take is counted and skipped."""
    changed = False
    for event_type, obj in events:
        try:
            if event_type == "DELETED":
                changed = ctx.store.delete(kind, obj) or changed
            else:
                changed = ctx.store.upsert(kind, obj) or changed
        except Exception as e:
            ctx.metrics.objects_skipped.labels(kind, "unreadable-event").inc()
            log.warning("watch of %s: an event the store cannot take skipped: %s",
                        kind, _describe(e))
    if changed:
        ctx.poke()
