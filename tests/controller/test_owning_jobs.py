"""A pending Workload's Job is read once, trimmed to its completion mode, kept while a
Workload refers to it; a Job the API cannot return holds its Workload back a pass (a unit
test over `FakeApi`; the e2e tests place Indexed Jobs on the real control plane)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.owning_jobs import (
    PRUNE_EVERY_SECONDS,
    OwningJobs,
    fetch_owner_jobs,
    prefetch_owner_jobs,
    prune_owner_jobs,
)
from nexus_admit.kube.views import WorkloadView
from nexus_admit.placement.policies import make_policy
from tests.controller.fake_api import FakeApi
from tests.kube.kube_factories import pod_set, workload


def job(name: str, mode: str = "Indexed") -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "uid": "u", "labels": {"a": "b"}},
        "spec": {"completionMode": mode, "parallelism": 8, "template": {"spec": {}}},
        "status": {"active": 8},
    }


def setup() -> tuple[Context, FakeApi, dict[str, Any]]:
    api = FakeApi()
    api.put(job("w"))
    wl = api.put(workload("w", [pod_set("main", 8)]))
    ctx = Context(options=RunOptions(webhook=False), api=api, engine=make_policy("nexus"))  # type: ignore[arg-type]
    ctx.store.upsert("Workload", wl)
    return ctx, api, wl


def count_reads(api: FakeApi) -> list[tuple[Any, ...]]:
    """The API's GETs, recorded as they are made."""
    reads: list[tuple[Any, ...]] = []
    real = api.get

    def counting(*args: Any) -> Any:
        reads.append(args)
        return real(*args)

    api.get = counting  # type: ignore[method-assign]
    return reads


def test_a_workloads_job_is_read_once_and_kept_trimmed() -> None:
    ctx, api, wl = setup()
    wl_v = WorkloadView.of(wl)
    reads = count_reads(api)
    assert asyncio.run(fetch_owner_jobs(ctx, [wl_v])) == set()
    assert asyncio.run(fetch_owner_jobs(ctx, [wl_v])) == set()
    assert reads == [("Job", "w", "default")]
    (kept,) = ctx.store.items("Job")
    assert kept["spec"] == {"completionMode": "Indexed"}
    assert "status" not in kept and "labels" not in kept["metadata"]
    # the translation sees it: an Indexed Job's 8-pod Workload is a training gang
    dump = ctx.store.dump()
    assert dump.kueue_index().owner_of(wl) == kept


def test_a_one_pod_workloads_job_is_not_read() -> None:
    ctx, api, _ = setup()
    one = api.put(workload("one", [pod_set("main", 1)]))
    one_v = WorkloadView.of(one)
    api.put(job("one"))
    reads = count_reads(api)
    prefetch_owner_jobs(ctx, [one_v])
    assert asyncio.run(fetch_owner_jobs(ctx, [one_v])) == set()
    assert reads == [] and ctx.store.items("Job") == []


def test_a_job_the_api_cannot_return_holds_its_workload_back() -> None:
    ctx, api, wl = setup()
    wl_v = WorkloadView.of(wl)

    def down(*_: Any) -> Any:
        raise OSError("connection refused")

    api.get = down  # type: ignore[method-assign]
    assert asyncio.run(fetch_owner_jobs(ctx, [wl_v])) == {"default/w"}
    assert ctx.store.items("Job") == []


def test_a_deleted_job_is_not_waited_for_nor_read_at_every_pass() -> None:
    """A Job the apiserver answers NotFound for (gone, or a tenant's Workload naming one
    that never was) is not read again for `JOB_MISS_SECONDS`: one GET per interval, not one
    per pass, whether its Workload is placed or still waits for quota."""
    ctx, api, wl = setup()
    wl_v = WorkloadView.of(wl)
    del api.objects[("Job", "default/w")]
    reads = count_reads(api)
    assert asyncio.run(fetch_owner_jobs(ctx, [wl_v])) == set()
    assert ctx.store.items("Job") == []
    for _ in range(3):
        prefetch_owner_jobs(ctx, [wl_v])
        assert asyncio.run(fetch_owner_jobs(ctx, [wl_v])) == set()
    assert reads == [("Job", "w", "default")]
    ctx.component(OwningJobs).missing.clear()  # as when the interval has passed
    assert asyncio.run(fetch_owner_jobs(ctx, [wl_v])) == set()
    assert len(reads) == 2


def test_a_job_no_workload_refers_to_is_forgotten_every_so_often() -> None:
    ctx, _, wl = setup()
    wl_v = WorkloadView.of(wl)
    tick = [1000.0]
    ctx.clocks.monotonic = lambda: tick[0]
    asyncio.run(fetch_owner_jobs(ctx, [wl_v]))
    prune_owner_jobs(ctx)
    assert len(ctx.store.items("Job")) == 1
    ctx.store.delete("Workload", wl)
    prune_owner_jobs(ctx)
    assert len(ctx.store.items("Job")) == 1  # the last walk was just now
    tick[0] += PRUNE_EVERY_SECONDS
    prune_owner_jobs(ctx)
    assert ctx.store.items("Job") == []


def test_a_waiting_workloads_jobs_are_read_ahead_once_per_stored_object() -> None:
    """The read ahead looks at a Workload when the store first holds that object, not at
    every pass (with 5,000 waiting, a pass asked the store about each one's Jobs); a read
    that failed is left to the pass that decides the Workload."""
    ctx, api, wl = setup()
    wl_v = WorkloadView.of(wl)
    calls: list[tuple[Any, ...]] = []

    def down(*args: Any) -> Any:
        calls.append(args)
        raise OSError("connection refused")

    api.get = down  # type: ignore[method-assign]

    async def scenario() -> None:
        for _ in range(3):
            prefetch_owner_jobs(ctx, [wl_v])
            await asyncio.gather(*ctx.component(OwningJobs).reads.values())
        assert len(calls) == 1
        changed = copy.deepcopy(wl)  # the store replaces an object that changed
        changed_v = WorkloadView.of(changed)
        prefetch_owner_jobs(ctx, [changed_v])
        await asyncio.gather(*ctx.component(OwningJobs).reads.values())
        assert len(calls) == 2
        assert await fetch_owner_jobs(ctx, [changed_v]) == {"default/w"}  # decided: read
        assert len(calls) == 3

    asyncio.run(scenario())


def test_a_job_gone_is_not_translated_from_the_store() -> None:
    """A Job the apiserver answers NotFound for goes from the store too: a Workload that
    names a new Job of that name (another uid) is not translated with the old one's
    completion mode."""
    ctx, api, wl = setup()
    wl_v = WorkloadView.of(wl)
    asyncio.run(fetch_owner_jobs(ctx, [wl_v]))  # the first Job (Indexed), kept
    del api.objects[("Job", "default/w")]
    again = copy.deepcopy(wl)
    again["metadata"]["ownerReferences"][0]["uid"] = "u2"
    again_v = WorkloadView.of(again)
    ctx.store.upsert("Workload", again)
    assert asyncio.run(fetch_owner_jobs(ctx, [again_v])) == set()
    assert ctx.store.items("Job") == []
    assert ctx.store.dump().kueue_index().owner_of(again) is None


def test_a_job_read_in_flight_is_shared_and_a_prefetched_one_is_not_read_again() -> None:
    """A Workload still waiting for quota has its Job read ahead (not waited for); the
    pass that places it later finds it in the store, and two passes asking at once send
    one read."""
    ctx, api, wl = setup()
    wl_v = WorkloadView.of(wl)
    reads = count_reads(api)

    async def scenario() -> set[str]:
        prefetch_owner_jobs(ctx, [wl_v])
        assert len(ctx.component(OwningJobs).reads) == 1  # in flight
        unread = await fetch_owner_jobs(ctx, [wl_v])  # waits on the same read
        assert await fetch_owner_jobs(ctx, [wl_v]) == set()  # in the store now
        return unread

    assert asyncio.run(scenario()) == set()
    assert reads == [("Job", "w", "default")]
    assert ctx.component(OwningJobs).reads == {}


def test_a_pass_reads_the_jobs_of_workloads_still_waiting_for_quota() -> None:
    from nexus_admit.controller.loop.cycle import reconcile
    from tests.kube.kube_factories import admission_check, cluster_queue, local_queue

    api = FakeApi()
    cq = cluster_queue("cq", "gold")
    cq["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": "nexus"}]}
    for obj in (cq, local_queue("default", "q", "cq"), admission_check("nexus"), job("w")):
        api.put(obj)
    queued = api.put(workload("w", [pod_set("main", 8)], cluster_queue=None, conditions={}))
    queued["status"].pop("admissionChecks")
    ctx = Context(options=RunOptions(webhook=False), api=api, engine=make_policy("nexus"))  # type: ignore[arg-type]
    for kind in ("ClusterQueue", "LocalQueue", "AdmissionCheck", "Workload"):
        ctx.store.replace(kind, *api.list(kind))
    ctx.leadership.synced = True

    async def scenario() -> None:
        await reconcile(ctx)
        await asyncio.gather(*ctx.component(OwningJobs).reads.values())

    asyncio.run(scenario())
    (kept,) = ctx.store.items("Job")
    assert kept["spec"] == {"completionMode": "Indexed"}


def test_a_job_made_again_under_its_name_is_read_again() -> None:
    """A Job deleted and made again under the same name is another uid: the Workload that
    names the new one has its Job read, whether the store holds the old one or the
    apiserver just answered NotFound for the old one."""
    ctx, api, wl = setup()
    wl_v = WorkloadView.of(wl)
    asyncio.run(fetch_owner_jobs(ctx, [wl_v]))  # the first Job, uid "u"
    reads = count_reads(api)
    api.put({**job("w", mode="NonIndexed"), "metadata": {
        "name": "w", "namespace": "default", "uid": "u2"}})
    again = copy.deepcopy(wl)
    again["metadata"]["ownerReferences"][0]["uid"] = "u2"
    again_v = WorkloadView.of(again)
    ctx.store.upsert("Workload", again)
    assert asyncio.run(fetch_owner_jobs(ctx, [again_v])) == set()
    assert reads == [("Job", "w", "default")]
    (kept,) = ctx.store.items("Job")
    assert kept["metadata"]["uid"] == "u2" and kept["spec"]["completionMode"] == "NonIndexed"
    del api.objects[("Job", "default/w")]
    third = copy.deepcopy(again)
    third["metadata"]["ownerReferences"][0]["uid"] = "u3"
    third_v = WorkloadView.of(third)
    ctx.store.forget("Job", "default/w")
    assert asyncio.run(fetch_owner_jobs(ctx, [third_v])) == set()  # NotFound, remembered
    assert asyncio.run(fetch_owner_jobs(ctx, [third_v])) == set()
    assert len(reads) == 2


def test_an_owner_reference_naming_another_uid_is_not_read_at_every_pass() -> None:
    """A Workload whose owner reference names a Job by a uid no Job of that name has (the
    tenant's to write) costs one read per interval, not one per pass."""
    ctx, api, wl = setup()
    bogus = copy.deepcopy(wl)
    bogus["metadata"]["ownerReferences"][0]["uid"] = "not-the-jobs"
    bogus_v = WorkloadView.of(bogus)
    ctx.store.upsert("Workload", bogus)
    reads = count_reads(api)
    for _ in range(3):
        assert asyncio.run(fetch_owner_jobs(ctx, [bogus_v])) == set()
    assert reads == [("Job", "w", "default")]
