"""The Jobs that own pending Workloads, read on demand instead of watched.

Who calls it: `loop.cycle.place_pending`, before it translates the Workloads of a pass. The
translation needs one field of a Job, `spec.completionMode` (an Indexed Job's pods carry
their rank), and it never changes after creation; a watch would bring every Job status
change (one per pod created, ready, finished) to the controller and the apiserver would
serialise each for it. So a Workload's Job is read once, trimmed to that field, and kept in
the store while a Workload refers to it; a one-pod Workload's is not read at all (its
translation does not depend on the field: `kube.workload.reads_job_completion_mode`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from cachetools import TTLCache

from nexus_admit.controller.context import Context
from nexus_admit.controller.store import PerObject
from nexus_admit.kube.errors import child, meta
from nexus_admit.kube.views import WorkloadView
from nexus_admit.kube.workload import reads_job_completion_mode

__all__ = [
    "OWNER_KIND",
    "OwningJobs",
    "fetch_owner_jobs",
    "prefetch_owner_jobs",
    "prune_owner_jobs",
    "trimmed_job",
]

log = logging.getLogger(__name__)
OWNER_KIND = "Job"
# how often the Jobs no Workload refers to are let go: only memory waits on it, and the walk
# over every Workload's Jobs ran after each Workload event (a fifth of a pass with 5,000
# Workloads waiting, e2e/bench_e2e/pass_bench.py)
PRUNE_EVERY_SECONDS = 10.0
# a Job the apiserver said does not exist is not read again for this long
JOB_MISS_SECONDS = 30.0


def _missing() -> TTLCache[str, bool]:
    return TTLCache(maxsize=4096, ttl=JOB_MISS_SECONDS)


@dataclass
class OwningJobs:
    """What the Jobs above Workloads cost to keep: the reads in flight, the Jobs just
    answered NotFound, and the memos that keep a pass from walking every Workload."""

    # Job reads in flight ("namespace/name"), shared by the passes that wait on them
    reads: dict[str, asyncio.Task[bool]] = field(default_factory=dict)
    # Jobs the apiserver just answered NotFound ("namespace/name/uid"): not read again for a
    # while, so a Workload naming a Job that is gone (or never was) costs one GET per
    # interval, not one per pass (a pass runs on every event)
    missing: TTLCache[str, bool] = field(default_factory=_missing)
    # each Workload's Jobs (`_job_refs`), and the waiting Workloads whose Jobs were read
    # ahead (`prefetch_owner_jobs`), kept while the store holds the Workload
    job_refs: PerObject[list[tuple[str, str, str]]] = field(default_factory=PerObject)
    prefetched: PerObject[None] = field(default_factory=PerObject)
    # the store's lists (Workloads, Jobs) the last prune walked, and when (monotonic)
    pruned: tuple[list[dict[str, object]], ...] | None = None
    pruned_at: float = float("-inf")

    def reset(self) -> None:
        """Memos only (a read in flight ends on its own and drops itself from `reads`)."""
        self.missing = _missing()
        self.job_refs, self.prefetched = PerObject(), PerObject()
        self.pruned, self.pruned_at = None, float("-inf")


def trimmed_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """What the translation reads of a Job: its identity and completion mode."""
    m = meta(job)
    return {
        "apiVersion": "batch/v1",
        "kind": OWNER_KIND,
        "metadata": {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in m},
        "spec": {"completionMode": child(job, "spec").get("completionMode") or "NonIndexed"},
    }


def _job_refs(workload: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The Jobs of `workload` its translation reads (none for a one-pod Workload): their
    namespace, name and the uid its owner reference names."""
    if not reads_job_completion_mode(workload):
        return []
    ns = str(meta(workload).get("namespace") or "default")
    refs = meta(workload).get("ownerReferences")
    return [
        (ns, str(r.get("name")), str(r.get("uid") or ""))
        for r in (refs if isinstance(refs, list) else [])
        if isinstance(r, Mapping) and r.get("kind") == OWNER_KIND and r.get("name")
    ]


async def _read_job(ctx: Context, ns: str, name: str, uid: str) -> bool:
    try:
        job = await asyncio.to_thread(ctx.api.get, OWNER_KIND, name, ns)
    except Exception as e:  # ApiException, OSError, urllib3's own errors
        ctx.metrics.errors.labels("owner").inc()
        log.warning("could not read Job %s/%s; its Workload waits a pass: %s", ns, name, e)
        return False
    if job is not None:
        ctx.store.upsert(OWNER_KIND, trimmed_job(job))
    elif ctx.store.get(OWNER_KIND, f"{ns}/{name}") is not None:
        ctx.store.forget(OWNER_KIND, f"{ns}/{name}")  # gone: never translate with it
    if job is None or (uid and str(meta(job).get("uid") or "") != uid):
        # the Job the owner reference names is gone (or never was: another Job has its
        # name): the Workload is translated without it, and it is not asked for each pass
        ctx.component(OwningJobs).missing[f"{ns}/{name}/{uid}"] = True
    return True


def _known(ctx: Context, key: str, uid: str) -> bool:
    """The store holds the Job its owner reference names (a Job deleted and made again
    under its name is another uid: read again), or the apiserver just said it is gone."""
    stored = ctx.store.get(OWNER_KIND, key)
    if stored is not None and (not uid or str(meta(stored).get("uid") or "") == uid):
        return True
    return f"{key}/{uid}" in ctx.component(OwningJobs).missing


def _forget_read(ctx: Context, key: str, _: object) -> None:
    ctx.component(OwningJobs).reads.pop(key, None)


_Reads = dict[str, tuple[asyncio.Task[bool], list[str]]]


def _reads(ctx: Context, workloads: Sequence[WorkloadView]) -> _Reads:
    """A read of every Job of `workloads` the store lacks and the apiserver did not just
    answer NotFound ("ns/name" → the read and the Workloads that wait on it); a read
    already in flight is shared, not sent twice."""
    out: _Reads = {}
    in_flight = ctx.component(OwningJobs).reads
    for w in workloads:
        for ns, name, uid in _job_refs(w.raw):
            key = f"{ns}/{name}"
            if _known(ctx, key, uid):
                continue
            if key not in out:
                task = in_flight.get(key)
                if task is None:
                    task = asyncio.create_task(_read_job(ctx, ns, name, uid), name="read-job")
                    in_flight[key] = task
                    task.add_done_callback(partial(_forget_read, ctx, key))
                out[key] = (task, [])
            out[key][1].append(w.key)
    return out


def prefetch_owner_jobs(ctx: Context, workloads: Sequence[WorkloadView]) -> None:
    """Start reading the Jobs of Workloads still waiting for quota, without waiting: by the
    time Kueue reserves it, the pass that places the Workload finds its Job in the store
    instead of waiting a round trip for it. Each Workload's view is looked at once, when
    the store first holds it (`OwningJobs.prefetched`): a pass after one Workload's event
    asked the store about every waiting Workload's Jobs. A read that failed, or a Job gone
    since, is read when the Workload is decided (`fetch_owner_jobs`)."""
    ctx.component(OwningJobs).prefetched.values(workloads, partial(_prefetch_one, ctx))


def _prefetch_one(ctx: Context, workload: WorkloadView) -> None:
    _reads(ctx, [workload])


async def fetch_owner_jobs(ctx: Context, workloads: Sequence[WorkloadView]) -> set[str]:
    """Read the Jobs of `workloads` the store lacks. Returns the keys ("ns/name") of the
    Workloads whose Job could not be read (an API error, not a missing Job): they wait for
    the next pass rather than be placed as if their Job were not Indexed."""
    reads = _reads(ctx, workloads)
    if not reads:
        return set()
    done = await asyncio.gather(*(task for task, _ in reads.values()))
    return {w for ok, (_, keys) in zip(done, reads.values(), strict=True) if not ok for w in keys}


def prune_owner_jobs(ctx: Context) -> None:
    """Forget the Jobs no Workload in the store refers to any more, at most every
    `PRUNE_EVERY_SECONDS` (and not while neither the Workloads nor the Jobs changed: a
    pass runs on every event). A Job kept longer only holds memory: a Workload's Job is
    read again when its owner reference names another uid."""
    state = ctx.component(OwningJobs)
    read = (ctx.store.listed("Workload"), ctx.store.listed(OWNER_KIND))
    if state.pruned is not None and all(
        a is b for a, b in zip(read, state.pruned, strict=True)
    ):
        return
    tick = ctx.clocks.monotonic()
    if tick - state.pruned_at < PRUNE_EVERY_SECONDS:
        return
    state.pruned_at = tick
    # a Workload's Jobs are read again only when the store holds a new object for it
    wanted = {f"{ns}/{name}" for refs in state.job_refs.values(read[0], _job_refs)
              for ns, name, _ in refs}
    for job in ctx.store.items(OWNER_KIND):
        m = meta(job)
        key = f"{m.get('namespace')}/{m.get('name')}"
        if key not in wanted:
            ctx.store.forget(OWNER_KIND, key)
    state.pruned = (ctx.store.listed("Workload"), ctx.store.listed(OWNER_KIND))
