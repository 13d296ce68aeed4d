"""The controller's runtime, in one record passed through kopf's memo (no globals): its
clients, options, engine, store, ledger, metrics and clocks, background work and wake-ups.

A component's own caches are not here: each component (lifecycle, owning Jobs, warming, the
webhook, the ungater...) defines its state in its own module, with one `reset()`, and finds
it with `ctx.component(ItsState)`; a leadership change resets them all (`operator.elect`).

Who calls it: `operator.py` builds one `Context` at start-up; every other module receives it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol, TypeVar, cast

from nexus_admit.controller.api import KubeApi
from nexus_admit.controller.faults import Faults
from nexus_admit.controller.ledger import Ledger
from nexus_admit.controller.metrics import Metrics
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.runtime.lease import LeaseElector
from nexus_admit.controller.store import Store
from nexus_admit.controller.tasks import Background
from nexus_admit.kube.cluster.live import LiveSnapshot
from nexus_admit.model import PlacementConfig
from nexus_admit.placement.base import PlacementPolicy

__all__ = [
    "CheckView",
    "Clocks",
    "Component",
    "Context",
    "Leadership",
    "Promised",
    "Signals",
    "Workers",
    "utc_now",
]

# a reservation a Workload's Ready check names ("namespace/name", name, when the check
# turned Ready; lifecycle.promised_reservations)
Promised = tuple[str, str, datetime | None]


def utc_now() -> datetime:
    return datetime.now(UTC)




class Component(Protocol):
    """A component's own state (its caches and memos), made on first use by
    `Context.component`."""

    def reset(self) -> None:
        """Forget what a leader must not carry into another term (a leadership change)."""


C = TypeVar("C", bound=Component)


@dataclass(frozen=True, slots=True)
class CheckView:
    """One of our AdmissionChecks as the loop needs it: its config, or why it has none."""

    name: str
    config: PlacementConfig | None
    problem: str = ""  # set when the check is inactive
    reason: str = "InvalidParameters"  # the Active condition's reason when inactive


@dataclass
class Clocks:
    """The two clocks: `wall` for what is written and compared with the cluster's times,
    `monotonic` (seconds) for intervals and throttles. Injected, so a unit test of timing
    behaviour advances a fake clock instead of sleeping."""

    wall: Callable[[], datetime] = utc_now
    monotonic: Callable[[], float] = time.monotonic


@dataclass
class Leadership:
    """Whether this replica may decide: listed every kind once, and (with leader election)
    holds the Lease and has re-listed since it took it."""

    synced: bool = False  # every kind listed once: only then may the loop decide anything
    elector: LeaseElector | None = None  # None: no leader election, this process acts
    # leader, and re-listed since it became one (a follower's watches may lag)
    ready: bool = False

    def acting(self) -> bool:
        """May this replica decide and write? Always without leader election; with it,
        only while it holds the Lease and has re-listed since it took it."""
        if self.elector is None:
            return True
        return self.ready and self.elector.leading()


@dataclass
class Signals:
    """The event loop that owns the store, the pass running on it and the wake-ups that
    start the next ones."""

    wake: asyncio.Event = field(default_factory=asyncio.Event)  # a placing pass
    # the ungater runs apart from the placing pass, so a gated pod never waits behind
    # solves: its own wake-up (pods and reservations changed)
    ungate_wake: asyncio.Event = field(default_factory=asyncio.Event)
    pass_task: asyncio.Task[None] | None = None  # the reconcile pass running now, if any
    # the loop that owns the store; the webhook's thread hands it what it fetched
    loop: asyncio.AbstractEventLoop | None = None

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


def _one_solver_thread() -> ThreadPoolExecutor:
    # one worker: CP-SAT runs with one search worker, and decisions are made in order anyway
    return ThreadPoolExecutor(1, thread_name_prefix="solver")


@dataclass
class Workers:
    """Where work runs apart from the pass: the solver's thread and the background tasks
    (check writes, Events)."""

    solver: ThreadPoolExecutor = field(default_factory=_one_solver_thread)
    background: Background = field(default_factory=Background)


@dataclass
class Context:
    options: RunOptions
    api: KubeApi
    engine: PlacementPolicy
    store: Store = field(default_factory=Store)
    ledger: Ledger = field(default_factory=Ledger)
    # the client the watch streams use (their own connections: a stream holds one for
    # minutes), None: `api`
    watch_api: KubeApi | None = None
    metrics: Metrics = field(default_factory=Metrics)
    clocks: Clocks = field(default_factory=Clocks)
    workers: Workers = field(default_factory=Workers)
    checks: dict[str, CheckView] = field(default_factory=dict)
    signals: Signals = field(default_factory=Signals)
    # snapshots kept from the store's changes (kube/cluster/live.py), made on first use:
    # "placing" (the passes') and "bound" (without reservations, the capacity metrics)
    live: dict[str, LiveSnapshot] = field(default_factory=dict)
    leadership: Leadership = field(default_factory=Leadership)
    faults: Faults = field(default_factory=Faults)  # test-only crash points (NEXUS_FAULT)
    # each component's state, by its type (`component`)
    _components: dict[type[Component], Component] = field(default_factory=dict, repr=False)

    def component(self, kind: type[C]) -> C:
        """This process's state of one component (`kind()`, made on first use)."""
        found = self._components.get(kind)
        if found is None:  # setdefault: the webhook's thread may make its own at once
            found = self._components.setdefault(kind, kind())
        return cast(C, found)

    def components(self) -> list[Component]:
        """Every component's state made so far: what a leadership change resets."""
        return list(self._components.values())

    async def read_owner(self, kind: str, name: str, namespace: str
                         ) -> dict[str, object] | None:
        """One owner object from the apiserver (what `pod_owners.OwnerChains` reads with)."""
        return await asyncio.to_thread(self.api.get, kind, name, namespace)

    def acting(self) -> bool:
        """May this replica decide and write? (`Leadership.acting`)"""
        return self.leadership.acting()

    def poke(self) -> None:
        """Something changed: run a placing pass and an ungating pass soon."""
        self.signals.poke()

    def call_in_loop(self, fn: Callable[..., object], *args: object) -> None:
        """Run `fn(*args)` on the loop that owns the store (`Signals.call_in_loop`)."""
        self.signals.call_in_loop(fn, *args)
