"""The ConfigMap of gated queues the queue gate policy reads: written with exactly the
LocalQueues whose ClusterQueue lists our check, only when that changes, and a failed
write is retried next pass without stopping anything."""

from __future__ import annotations

import asyncio
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.queue_gate import QueueGate, sync_queue_gate
from tests.controller.fake_api import FakeApi

NAMESPACES = {"a": "uses-check", "b": "uses-check"}  # both have a queue using the check
CHECK = "nexus-placement"
TARGET = "nexus-system/gated"


def ctx_with(api: FakeApi, target: str | None = TARGET) -> Context:
    options = RunOptions(webhook=False, queue_gate_configmap=target)
    ctx = Context(options=options, api=api, engine=None)  # type: ignore[arg-type]
    store = ctx.store
    store.upsert(
        "ClusterQueue",
        {
            "metadata": {"name": "gpu"},
            "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]}},
        },
    )
    store.upsert("ClusterQueue", {"metadata": {"name": "cpu"}, "spec": {}})
    for ns, name, cq in (("a", "train", "gpu"), ("b", "serve", "gpu"), ("a", "batch", "cpu")):
        store.upsert(
            "LocalQueue",
            {"metadata": {"name": name, "namespace": ns}, "spec": {"clusterQueue": cq}},
        )
    store.upsert("LocalQueue", {"metadata": {"name": "junk", "namespace": "a"}, "spec": "x"})
    return ctx


def written(api: FakeApi) -> dict[str, Any]:
    cm = api.get("ConfigMap", "gated", "nexus-system")
    assert cm is not None
    return dict(cm["data"])


def test_lists_exactly_the_queues_that_use_the_check_and_writes_only_on_change() -> None:
    api = FakeApi()
    ctx = ctx_with(api)
    asyncio.run(sync_queue_gate(ctx, {CHECK}))
    # every queue it knows: with its ClusterQueue when that uses the check, else ""
    assert written(api) == {
        "a.train": "gpu", "b.serve": "gpu", "a.batch": "", "a.junk": "", **NAMESPACES
    }
    asyncio.run(sync_queue_gate(ctx, {CHECK}))
    assert api.count("apply", "ConfigMap") == 1
    ctx.store.upsert(
        "LocalQueue",
        {"metadata": {"name": "train", "namespace": "a"}, "spec": {"clusterQueue": "cpu"}},
    )
    asyncio.run(sync_queue_gate(ctx, {CHECK}))
    # namespace a has no queue using the check any more
    assert written(api) == {
        "a.train": "", "b.serve": "gpu", "a.batch": "", "a.junk": "", "a": "", "b": "uses-check"
    }


def test_a_failed_write_is_retried_next_pass() -> None:
    api = FakeApi()
    api.fail[("apply", "ConfigMap")] = 1
    ctx = ctx_with(api)
    asyncio.run(sync_queue_gate(ctx, {CHECK}))
    assert ctx.component(QueueGate).written is None
    asyncio.run(sync_queue_gate(ctx, {CHECK}))
    assert written(api) == {
        "a.train": "gpu", "b.serve": "gpu", "a.batch": "", "a.junk": "", **NAMESPACES
    }


def test_nothing_is_written_when_no_configmap_is_named() -> None:
    api = FakeApi()
    asyncio.run(sync_queue_gate(ctx_with(api, None), {CHECK}))
    assert api.writes == []
