"""Watch gaps seen as kopf's list rounds (controller/list_rounds.py): the first list of a
kind is kopf's start, every later one re-lists that kind in the store, and only that kind."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from nexus_admit.controller.list_rounds import ListRounds, forget, observe
from nexus_admit.controller.loop.cycle import _settle_ledger
from nexus_admit.controller.options import OptionsError, RunOptions
from nexus_admit.controller.store import WATCHED_KINDS
from nexus_admit.controller.watches import UNOBSERVED_RESYNC_SECONDS, resync_period
from nexus_admit.model import Gang, PodSet, Slot
from tests.controller.test_watches import (
    FlakyListApi,
    nodes,
    relists,
    started_controller,
    with_resync_loop,
)


def test_the_first_list_of_a_kind_is_kopfs_start_and_a_later_one_a_gap() -> None:
    told: list[str] = []
    rounds = ListRounds(on_gap=told.append)
    rounds.listed("", "nodes")
    rounds.listed("", "pods")
    assert rounds.take() == set() and told == []
    rounds.listed("", "nodes")
    rounds.listed("", "nodes")  # a failed list tried again: one gap to re-list
    assert rounds.take() == {"Node"} and told == ["Node", "Node"]
    assert rounds.take() == set()
    rounds.give_back({"Node"})  # the re-list failed: taken again next time
    assert rounds.take() == {"Node"}


def test_kopfs_own_kinds_are_not_the_stores() -> None:
    rounds = ListRounds()
    for _ in range(2):
        rounds.listed("kopf.dev", "kopfpeerings")
        rounds.listed("", "namespaces")
    assert rounds.take() == set() and rounds.rounds == {}


def test_kopfs_watch_stream_lists_through_the_function_observed() -> None:
    """The observer wraps `fetching.fetch_objs`; kopf's watch stream must call it through
    the module at every round, or the gaps go unseen (a kopf upgrade that moves it fails
    here, and the controller falls back to the short re-list period)."""
    from kopf._cogs.clients import fetching, watching

    assert watching.fetching is fetching
    assert "fetching.fetch_objs(" in inspect.getsource(watching.continuous_watch)


def test_the_observer_tells_every_list_kopf_starts_and_passes_its_pages_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kopf._cogs.clients import fetching
    from kopf._cogs.structs.references import Resource

    from nexus_admit.controller import list_rounds

    async def kopfs_list(**_: Any) -> AsyncIterator[tuple[list[str], str]]:
        yield ["page 1"], "7"
        yield ["page 2"], "7"

    monkeypatch.setattr(fetching, "fetch_objs", kopfs_list)  # restored after the test
    monkeypatch.setattr(list_rounds, "_listeners", [])
    first: list[tuple[str, str]] = []
    second: list[tuple[str, str]] = []
    assert observe(lambda g, p: first.append((g, p)))
    assert observe(lambda g, p: second.append((g, p)))
    assert fetching.fetch_objs is not kopfs_list

    async def one_round() -> list[Any]:
        pods = Resource(group="", version="v1", plural="pods", namespaced=True)
        return [page async for page in fetching.fetch_objs(resource=pods)]

    assert asyncio.run(one_round()) == [(["page 1"], "7"), (["page 2"], "7")]
    assert first == second == [("", "pods")]  # wrapped once, each observer told once
    forget(list_rounds._listeners[0])
    asyncio.run(one_round())
    assert first == [("", "pods")] and second == [("", "pods")] * 2


def test_a_gap_re_lists_that_kind_only_and_drops_what_it_deleted() -> None:
    api = FlakyListApi()
    ctx = started_controller(api)
    ctx.list_rounds_observed = True
    ctx.list_rounds.listed("", "nodes")  # kopf's start

    def gap() -> None:
        ctx.list_rounds.listed("", "nodes")

    asyncio.run(with_resync_loop(ctx, gap, until=lambda: relists(ctx) > 0))
    assert nodes(ctx) == {"kept"}, "the node deleted during the gap is still in the store"
    assert relists(ctx) == 1 and api.lists == 1, "one kind re-listed, not every kind"


def test_a_gap_whose_re_list_fails_is_re_listed_at_a_later_tick() -> None:
    api = FlakyListApi(list_failures=2)
    ctx = started_controller(api)
    ctx.list_rounds_observed = True
    ctx.list_rounds.listed("", "nodes")

    def gap() -> None:
        ctx.list_rounds.listed("", "nodes")

    asyncio.run(with_resync_loop(ctx, gap, until=lambda: relists(ctx) > 0))
    assert nodes(ctx) == {"kept"}
    # a failed re-list is a failed step, as an outage's: then every kind is re-listed
    assert api.lists == 2 + len(WATCHED_KINDS) and relists(ctx) == 1


def test_the_safety_period_is_short_where_kopfs_lists_cannot_be_seen() -> None:
    ctx = started_controller(FlakyListApi())
    ctx.options = RunOptions(webhook=False, resync_seconds=900)
    assert resync_period(ctx) == UNOBSERVED_RESYNC_SECONDS
    ctx.list_rounds_observed = True
    assert resync_period(ctx) == 900


def test_a_lost_create_is_held_for_its_own_horizon_not_the_re_list_period() -> None:
    """Before: two re-list periods. With a short period an unseen reservation was forgotten
    sooner; with a long one a create never made held its GPUs for twenty minutes."""
    ctx = started_controller(FlakyListApi())
    ctx.options = RunOptions(webhook=False, resync_seconds=5, lost_write_seconds=120)
    gang = Gang("ns/w", (PodSet("main", count=1, gpus=8),))
    slot = (Slot("main", 0, "kept", tuple(range(8)), 0),)
    now = time.monotonic()
    ctx.ledger.assume("ns/recent", "ns/w", gang, slot, now - 60)
    ctx.ledger.assume("ns/old", "ns/v", gang, slot, now - 121)
    ctx.ledger.lost("ns/recent")
    ctx.ledger.lost("ns/old")
    _settle_ledger(ctx, [])
    assert set(ctx.ledger.unsure) == {"ns/recent"}


def test_lost_write_seconds_is_validated() -> None:
    with pytest.raises(OptionsError, match="--lost-write-seconds 1"):
        RunOptions(webhook=False, lost_write_seconds=1).validate()
