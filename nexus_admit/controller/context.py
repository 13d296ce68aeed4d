"""Everything the handlers share, in one record passed through kopf's memo (no globals).

Who calls it: `operator.py` builds one `Context` at start-up; every other module receives it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cachetools import TTLCache

from nexus_admit.controller.api import KubeApi
from nexus_admit.controller.faults import Faults
from nexus_admit.controller.ledger import Ledger
from nexus_admit.controller.metrics import Metrics
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.pod_owners import OwnerChains
from nexus_admit.controller.runtime.lease import LeaseElector
from nexus_admit.controller.store import PerObject, Store
from nexus_admit.controller.tasks import Background
from nexus_admit.controller.warm import WarmShapes
from nexus_admit.kube.cluster.live import LiveSnapshot
from nexus_admit.model import PlacementConfig
from nexus_admit.placement.base import PlacementPolicy

__all__ = ["CheckView", "Context", "Promised", "WorkloadView", "utc_now"]

# a reservation a Workload's Ready check names ("namespace/name", name, when the check
# turned Ready; lifecycle.promised_reservations)
Promised = tuple[str, str, datetime | None]

# a Workload, its place in Kueue's order when it waits on our check (else None), and
# whether it waits for quota in a queue of ours (loop/cycle.workload_views)
WorkloadView = tuple[dict[str, Any], tuple[int, str, str] | None, bool]


def utc_now() -> datetime:
    return datetime.now(UTC)


# a name the apiserver just said does not exist is not asked again for this long: a flood
# of pod reviews naming made-up queues or reservations costs one GET per name, not per pod
WEBHOOK_MISS_SECONDS = 2.0
# a Job the apiserver said does not exist is not read again for this long (owning_jobs.py)
JOB_MISS_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class CheckView:
    """One of our AdmissionChecks as the loop needs it: its config, or why it has none."""

    name: str
    config: PlacementConfig | None
    problem: str = ""  # set when the check is inactive


@dataclass
class Context:
    options: RunOptions
    api: KubeApi
    engine: PlacementPolicy
    store: Store = field(default_factory=Store)
    ledger: Ledger = field(default_factory=Ledger)
    # the resourceVersion each kind was last listed at (None: not served), where its
    # watch starts (informer.py); and the client the watch streams use (their own
    # connections: a stream holds one for minutes), None: `api`
    list_versions: dict[str, str | None] = field(default_factory=dict)
    watch_api: KubeApi | None = None
    metrics: Metrics = field(default_factory=Metrics)
    clock: Callable[[], datetime] = utc_now
    # one worker: CP-SAT runs with one search worker, and decisions are made in order anyway
    solver: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="solver")
    )
    checks: dict[str, CheckView] = field(default_factory=dict)
    # check name → (what its view was resolved from, the view): kept while nothing changed
    check_inputs: dict[str, tuple[object, CheckView]] = field(default_factory=dict)
    # the queue list last written to the gate policy's ConfigMap (queue_gate.py); None:
    # not written by this process yet
    gated_queues: dict[str, str] | None = None
    # (workload uid → attempt) whose answer is written but not yet seen through the watch:
    # the store may still show the check Pending, and must not get a second answer
    answered: dict[str, str] = field(default_factory=dict)
    # pods patched by the ungater whose update the watch has not delivered yet: uid → slot
    ungating: dict[str, str] = field(default_factory=dict)
    # pods with a reservation label that are not part of its Workload, already told so
    refused_pods: set[str] = field(default_factory=set)
    # objects already reported as skipped, one Event per object version (controller/skipped.py)
    skipped_reported: dict[str, None] = field(default_factory=dict)
    # reservation "namespace/name" → monotonic time its status was last written
    status_written: dict[str, float] = field(default_factory=dict)
    # reservation "namespace/name" → what the lifecycle step last found it quiet on
    # (`lifecycle.Quiet`): not looked at again until one of those objects changes
    lifecycle_quiet: dict[str, object] = field(default_factory=dict)
    # the store's lists (`Store.listed`) a pass last derived its Workload views from, and
    # those views: nothing is walked again while the lists are the same objects
    owners_pruned: tuple[list[dict[str, object]], ...] | None = None
    owners_pruned_at: float = float("-inf")  # monotonic; Jobs are let go every so often
    workload_views: tuple[tuple[object, ...], list[dict[str, object]],
                          list[dict[str, object]]] | None = None
    # each Workload's view (loop/cycle.workload_views), kept while the store holds it
    workload_view_memo: PerObject[WorkloadView] = field(default_factory=PerObject)
    # each Workload's Jobs (owners.prune_owner_jobs over every Workload) and the
    # reservations its Ready checks name (lifecycle.sync_missing), kept while the store
    # holds it; the waiting Workloads whose Jobs were read ahead (owners.prefetch_owner_jobs)
    job_refs_memo: PerObject[list[tuple[str, str, str]]] = field(default_factory=PerObject)
    prefetched: PerObject[None] = field(default_factory=PerObject)
    promised_memo: PerObject[list[list[Promised]]] = field(default_factory=PerObject)
    # each waiting Workload's (tier, GPU milli) demand (demand.pending_demands; the passes'
    # backfill and the capacity metrics, one after the other), kept while the store holds it
    demand_memo: PerObject[tuple[str, int] | None] = field(default_factory=PerObject)
    # the shapes of the Workloads waiting for quota, derived ahead (controller/warm.py)
    warm_shapes: WarmShapes = field(default_factory=WarmShapes)
    warm_planned: float = 0.0  # when a pass may plan its shapes again mid-way (monotonic)
    # draining reservation "namespace/name" → monotonic time its gang was last solved
    # without it (loop.place: a drain moved off once its gang fits)
    drain_checked: dict[str, float] = field(default_factory=dict)
    # reservation "namespace/name" this run deleted to place its Workload again
    # (controller/inflight.py) → (monotonic time, the (node, GPUs) it held): a store that
    # still shows the deleted one must not answer from it
    withdrawn: dict[str, tuple[float, frozenset[tuple[str, tuple[int, ...]]]]] = field(
        default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # the ungater runs apart from the placing pass, so a gated pod never waits behind
    # solves: its own wake-up (pods and reservations changed) and its pass in progress
    ungate_wake: asyncio.Event = field(default_factory=asyncio.Event)
    ungate_task: asyncio.Task[None] | None = None
    # the ungater's pin patches in flight (its loop does not wait for a pass's patches)
    ungate_writes: Background = field(default_factory=lambda: Background(limit=16))
    background: Background = field(default_factory=Background)  # check writes, Events
    capacity_recorded: float = float("-inf")  # monotonic time of the last capacity metrics
    # snapshots kept from the store's changes (kube/cluster/live.py), made on first use:
    # "placing" (the passes') and "bound" (without reservations, the capacity metrics)
    live: dict[str, LiveSnapshot] = field(default_factory=dict)
    lifecycle_synced: float = float("-inf")  # monotonic time of the last lifecycle step
    lifecycle_wake_set: bool = False  # a pass is already due when the lifecycle is
    # Job reads in flight ("namespace/name"), shared by the passes that wait on them
    job_reads: dict[str, asyncio.Task[bool]] = field(default_factory=dict)
    # Jobs the apiserver just answered NotFound ("namespace/name/uid"): not read again for a
    # while, so a Workload naming a Job that is gone (or never was) costs one GET per
    # interval, not one per pass (a pass runs on every event)
    jobs_missing: TTLCache[str, bool] = field(
        default_factory=lambda: TTLCache(maxsize=4096, ttl=JOB_MISS_SECONDS)
    )
    synced: bool = False  # every kind listed once: only then may the loop decide anything
    faults: Faults = field(default_factory=Faults)  # test-only crash points (NEXUS_FAULT)
    elector: LeaseElector | None = None  # None: no leader election, this process acts
    # leader, and re-listed since it became one (a follower's watches may lag)
    leader_ready: bool = False
    pass_task: asyncio.Task[None] | None = None  # the reconcile pass running now, if any
    # names the apiserver just answered NotFound to a webhook lookup: (kind, ns, name);
    # used on the webhook's own loop only (controller/webhook/review.py)
    webhook_misses: TTLCache[tuple[str, str, str], bool] = field(
        default_factory=lambda: TTLCache(maxsize=4096, ttl=WEBHOOK_MISS_SECONDS)
    )
    # the loop that owns the store; the webhook's thread hands it what it fetched
    loop: asyncio.AbstractEventLoop | None = None
    # owners above pods, read on demand (pod_owners.py): one cache per event loop
    owner_chains: OwnerChains = field(init=False)
    webhook_owner_chains: OwnerChains = field(init=False)

    def __post_init__(self) -> None:
        self.owner_chains = OwnerChains(self._get_owner)
        self.webhook_owner_chains = OwnerChains(self._get_owner)

    async def _get_owner(self, kind: str, name: str, namespace: str) -> dict[str, object] | None:
        return await asyncio.to_thread(self.api.get, kind, name, namespace)

    def acting(self) -> bool:
        """May this replica decide and write? Always without leader election; with it,
        only while it holds the Lease and has re-listed since it took it."""
        if self.elector is None:
            return True
        return self.leader_ready and self.elector.leading()

    def poke(self) -> None:
        """Something changed: run a placing pass and an ungating pass soon."""
        self.wake.set()
        self.ungate_wake.set()

    def call_in_loop(self, fn: Callable[..., object], *args: object) -> None:
        """Run `fn(*args)` on the loop that owns the store: now when called there (or when
        no loop is known, as in unit tests), else as soon as that loop gets to it."""
        loop = self.loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is None or loop is here or loop.is_closed():
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)
