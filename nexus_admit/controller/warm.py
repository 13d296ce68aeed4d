"""Ahead of quota: what the engine derives per pod shape, derived for the Workloads still
waiting in our queues, so the decision when Kueue reserves costs only what changed since.

Why: the first decision of a pod shape on a flavor builds that shape's tracker over every
candidate node (placement/live_reduction.py), O(fleet): about 100 ms at 5,000 nodes against
20 ms at 1,000 (docs/benchmarks.md). Before Kueue reserves quota, a Workload waits in its
queue; the build fits in that wait, on the pass's snapshot (`Warms.warm`).

Kueue picks the flavor only when it reserves, so a waiting Workload is translated as if
admitted on each flavor (up to `FLAVORS_PER_SHAPE`, in the ClusterQueue's order, as Kueue
tries them) of the resource group that covers its GPUs. Workloads of one shape share one
warm: the key is what the translation reads of the Workload less its pod templates' labels,
which carry a Job's own name; a key that joins two shapes only leaves one of them unwarmed.
Warmed shapes are synced again every `RESYNC_SECONDS` while they wait, and at once when a
shape warmed before waits again: a decision after a thousand node changes costs 43 ms at
5,000 nodes (offline), one after a hundred 9 ms, and a tracker further behind than a
quarter of the fleet is rebuilt. A node joining or leaving (a renewed snapshot) has every
waiting shape translated and warmed anew.

Shapes are warmed in the order Kueue will reserve their Workloads' quota (`kueue_order`).
Each pass spends at most `BUDGET_SECONDS` here, after its decisions, or
`IDLE_BUDGET_SECONDS` when it decided nothing. A Workload that cannot be translated is
skipped (it is told where it is placed, when Kueue reserves). Who calls it:
`loop/cycle.place_pending`.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from nexus_admit.controller.store import PerObject
from nexus_admit.kube import labels as L
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.errors import meta, object_key
from nexus_admit.kube.kueue import KueueIndex
from nexus_admit.kube.queues import cluster_queue_checks
from nexus_admit.kube.views import WorkloadView
from nexus_admit.model import ClusterSnapshot, Gang, PlacementConfig
from nexus_admit.placement.base import Warms

__all__ = ["BUDGET_SECONDS", "FLAVORS_PER_SHAPE", "IDLE_BUDGET_SECONDS", "REPLAN_SECONDS",
           "RESYNC_SECONDS", "WarmShapes", "assumed_admissions", "kueue_order"]

log = logging.getLogger(__name__)

BUDGET_SECONDS = 0.05  # per pass; at least one shape is warmed when one is due
# per pass that decided nothing: the solver's thread is idle, and a burst's first shapes
# are reserved within a second of their creation, often before a 50-ms pass reached them
IDLE_BUDGET_SECONDS = 0.25
RESYNC_SECONDS = 10.0
# between a pass's decisions, the waiting Workloads are planned again at most this often
REPLAN_SECONDS = 0.1
FLAVORS_PER_SHAPE = 3
MAX_SHAPES = 64  # distinct shapes kept warm at once (the first in Kueue's order)
KEPT_SHAPES = 4 * MAX_SHAPES  # shapes remembered as warmed (their gangs), waiting or not

_CONTAINER_LISTS = ("containers", "initContainers")
_QUEUE_KINDS = ("ClusterQueue", "LocalQueue", "ResourceFlavor")


@dataclass(slots=True)
class _ToWarm:
    key: str
    workload: dict[str, Any]
    cluster_queue: Mapping[str, Any]
    check: str


@dataclass(slots=True)
class WarmShapes:
    """The shapes of the Workloads waiting for quota, warmed or still to warm."""

    waiting: object = None  # the waiting list `to_warm` and `current` were derived from
    waiting_new: object = None  # the last list `plan_new` derived `to_warm` from
    to_warm: list[_ToWarm] = field(default_factory=list)
    # shape -> its assumed gangs the engine kept facts for, with their check
    # (least recently waiting first; kept after its Workloads stop waiting, so the next
    # Workload of a shape seen before is not translated again)
    done: OrderedDict[str, tuple[tuple[Gang, str], ...]] = field(default_factory=OrderedDict)
    current: set[str] = field(default_factory=set)  # the shapes waiting now
    resync: list[str] = field(default_factory=list)  # warmed shapes left to sync this round
    synced: float = 0.0  # when the last round of syncs started (monotonic)
    epoch: tuple[object, ...] | None = None  # what `shapes` were derived with
    # id of a waiting Workload's view -> (that view, its shape to warm; None: not ours to
    # warm)
    shapes: dict[int, tuple[WorkloadView, _ToWarm | None]] = field(default_factory=dict)
    # each waiting Workload's ClusterQueue and place in it (`kueue_order`)
    order: PerObject[tuple[str, tuple[int, str]]] = field(default_factory=PerObject)

    def reset(self) -> None:
        """Nothing: what it warmed stays true of the engine, whoever leads."""

    def plan(self, waiting: list[WorkloadView], dump: ClusterDump, active: set[str]) -> None:
        """Derive the shapes to warm from `waiting` (the views of the Workloads waiting for
        quota in our queues), again only when it is another list than last time; a
        Workload's shape is derived again only when it is another view (the store builds
        one for each object it accepts, and replaces a changed object)."""
        if waiting is self.waiting:
            return
        self.waiting = waiting
        seen = self._plan(waiting, dump, active)
        # a shape warmed before that waits again is synced at once (it may be far behind)
        self.resync += [k for k in seen - self.current if k in self.done and k not in self.resync]
        self.current = seen
        while len(self.done) > KEPT_SHAPES:
            self.done.popitem(last=False)

    def plan_new(self, waiting: list[WorkloadView], dump: ClusterDump,
                 active: set[str]) -> None:
        """Between a pass's decisions: the shapes to warm from `waiting`, and nothing else
        (which shapes wait, and so which are synced again, is the pass's `plan`)."""
        if waiting is not self.waiting and waiting is not self.waiting_new:
            self.waiting_new = waiting
            self._plan(waiting, dump, active)

    def _plan(self, waiting: list[WorkloadView], dump: ClusterDump,
              active: set[str]) -> set[str]:
        """`to_warm` from `waiting`, in Kueue's order; the shapes waiting."""
        # the queues and flavors a shape was derived from: their labels and specs, not their
        # status, which Kueue writes at every admission (each write translated every
        # waiting Workload again, and a shape's key serialises its pod templates)
        epoch = (*(_labels_and_specs(dump.kind(k)) for k in _QUEUE_KINDS), frozenset(active))
        if self.epoch != epoch:
            self.shapes, self.epoch = {}, epoch
            self.done.clear()  # gangs translated against other queues or flavors
        index = dump.kueue_index() if waiting else KueueIndex()
        to_warm: list[_ToWarm] = []
        seen: set[str] = set()
        shapes: dict[int, tuple[WorkloadView, _ToWarm | None]] = {}
        for wl in kueue_order(waiting, index, self.order, epoch):
            if len(seen) >= MAX_SHAPES:
                break
            kept = self.shapes.get(id(wl))
            shape = (kept[1] if kept is not None and kept[0] is wl
                     else _to_warm(cast(dict[str, Any], wl.raw), index, active))
            shapes[id(wl)] = (wl, shape)
            if shape is None or shape.key in seen:
                continue
            seen.add(shape.key)
            if shape.key in self.done:
                self.done.move_to_end(shape.key)
            else:
                to_warm.append(shape)
        self.shapes = shapes
        self.to_warm = to_warm
        return seen

    def forget(self) -> None:
        """Warm every waiting shape again, translated anew: the snapshot was renewed (nodes
        joined or left, or their labels changed), so the gangs' allowed nodes may be stale."""
        self.done.clear()
        self.resync.clear()
        self.current = set()
        self.waiting = None

    def due(self, tick: float) -> bool:
        """Something to warm, or syncs left or due."""
        if self.to_warm or self.resync:
            return True
        return bool(self.current) and tick - self.synced >= RESYNC_SECONDS

    def step(
        self,
        engine: Warms,
        snapshot: ClusterSnapshot,
        dump: ClusterDump,
        kueue: KueueIndex,
        configs: Mapping[str, PlacementConfig | None],
        now: datetime,
        budget: float = BUDGET_SECONDS,
        stop: Callable[[], bool] = lambda: False,
        syncs: bool = True,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> int:
        """Warm new shapes, then (`syncs`) sync warmed ones, within `budget` seconds and until
        `stop()` (checked between shapes), where the engine's facts are not being read: in
        the solver's thread, or beside one of its solves (`SolvesBeside`). The number of
        shapes warmed (the engine kept facts for at least one of its flavors)."""
        started = time.perf_counter()
        tick = monotonic()
        warmed = 0

        def go_on() -> bool:
            return time.perf_counter() - started < budget and not stop()

        while self.to_warm and go_on():
            shape = self.to_warm.pop(0)
            kept = _warm_new(engine, snapshot, dump, kueue, configs, now, shape, stop)
            if kept is None:  # stopped between its flavors: all of them again next time
                self.to_warm.insert(0, shape)
                break
            self.done[shape.key] = kept
            warmed += bool(kept)
        if not syncs:
            return warmed
        if not self.synced:  # the first round of syncs is due that long after the first warm
            self.synced = tick
        if self.current and not self.resync and tick - self.synced >= RESYNC_SECONDS:
            self.resync, self.synced = [k for k in self.done if k in self.current], tick
        while self.resync and go_on():
            for gang, check in self.done.get(self.resync.pop(), ()):
                config = configs.get(check)
                try:
                    if config is not None:
                        engine.warm(snapshot, gang, config)
                except Exception as e:  # never needed (above); the pass goes on
                    log.debug("shape of %s: not synced ahead of quota: %s", gang.name, e)
        return warmed


def kueue_order(
    waiting: list[WorkloadView], kueue: KueueIndex,
    memo: PerObject[tuple[str, tuple[int, str]]] | None = None, context: object = None,
) -> list[WorkloadView]:
    """`waiting` in the order Kueue reserves quota, as near as the store shows it: each
    scheduling cycle takes the head of every ClusterQueue, a queue's by priority, then age.
    So the n-th of every queue comes before the (n+1)-th of any: the shapes warmed first
    are the ones decided first (in a burst, Kueue reserves within a second of creation).
    `memo` keeps each Workload's queue and place while the store holds it and `context`
    (what its queue name reads of the LocalQueues) is the same."""
    def place(wl: WorkloadView) -> tuple[str, tuple[int, str]]:
        try:
            cq = kueue.cluster_queue_name(wl.raw) or ""
        except Exception:  # malformed: a group of its own, skipped where it is translated
            cq = ""
        return cq, _queue_position(wl.raw)

    places = ([place(wl) for wl in waiting] if memo is None
              else memo.values(waiting, place, (context,)))
    queues: dict[str, list[tuple[tuple[int, str], int]]] = {}
    for i, (cq, position) in enumerate(places):
        queues.setdefault(cq, []).append((position, i))
    # (rank in its queue, place, the queue's first sight, index): equal ranks and places
    # keep their queues' order, and no two entries are equal (no key function to call)
    ranked: list[tuple[int, tuple[int, str], int, int]] = []
    for q, members in enumerate(queues.values()):
        ranked += [(rank, position, q, i) for rank, (position, i) in enumerate(sorted(members))]
    ranked.sort()
    return [waiting[r[3]] for r in ranked]


def _labels_and_specs(objects: list[dict[str, Any]]) -> tuple[object, ...]:
    """What translating a shape reads of queue or flavor objects (compared by equality)."""
    return tuple((meta(o).get("name"), meta(o).get("namespace"), meta(o).get("labels"),
                  o.get("spec")) for o in objects)


def _queue_position(wl: Mapping[str, Any]) -> tuple[int, str]:
    """A Workload's place in its ClusterQueue: higher priority first, then older."""
    spec, m = wl.get("spec"), wl.get("metadata")
    priority = spec.get("priority") if isinstance(spec, Mapping) else None
    created = m.get("creationTimestamp") if isinstance(m, Mapping) else None
    return (-priority if isinstance(priority, int) else 0,
            created if isinstance(created, str) else "")


def _to_warm(wl: dict[str, Any], kueue: KueueIndex, active: set[str]) -> _ToWarm | None:
    """What to warm for a waiting Workload; None for one Kueue reserved quota for already
    (decided, or being decided), one of no queue of ours, or a malformed one (told where it
    is placed)."""
    try:
        if (wl.get("status") or {}).get("admission"):
            return None
        cq_name = kueue.cluster_queue_name(wl)
        cq = kueue.cluster_queues.get(cq_name) if cq_name else None
        checks = sorted(cluster_queue_checks(cq) & active)
        if cq is None or not checks:
            return None
        return _ToWarm(shape_key(wl, cq_name or ""), wl, cq, checks[0])
    except Exception:
        return None


def _warm_new(
    engine: Warms, snapshot: ClusterSnapshot, dump: ClusterDump, kueue: KueueIndex,
    configs: Mapping[str, PlacementConfig | None], now: datetime, shape: _ToWarm,
    stop: Callable[[], bool],
) -> tuple[tuple[Gang, str], ...] | None:
    """The gangs warmed of `shape`, one per flavor; None when `stop()` came true before its
    last flavor (a flavor's warm, one build over its nodes, is what may run past a stop)."""
    config = configs.get(shape.check)
    if config is None:
        return ()
    kept: list[tuple[Gang, str]] = []
    try:
        for i, assumed in enumerate(assumed_admissions(shape.workload, shape.cluster_queue,
                                                       kueue)):
            if i and stop():
                return None
            gang = dump.gang(assumed, config, snapshot, kueue, now=now)
            if engine.warm(snapshot, gang, config):
                kept.append((gang, shape.check))
    except Exception as e:  # a warm is never needed: the decision derives it anyway
        log.debug("Workload %s: not warmed ahead of quota: %s", object_key(shape.workload), e)
    return tuple(kept)


def shape_key(workload: Mapping[str, Any], cluster_queue: str) -> str:
    """What the translation reads of a waiting Workload, less its pod templates' labels."""
    meta = workload.get("metadata") or {}
    spec = workload.get("spec") or {}
    sets = []
    for ps in spec.get("podSets") or []:
        template = ps.get("template") or {}
        sets.append({
            **{k: v for k, v in ps.items() if k not in ("name", "template")},
            "annotations": (template.get("metadata") or {}).get("annotations"),
            "spec": template.get("spec"),
        })
    owners = sorted(str(r.get("kind")) for r in meta.get("ownerReferences") or [])
    return json.dumps(
        [cluster_queue, meta.get("annotations"), owners, spec.get("priority"), sets],
        sort_keys=True, default=str,
    )


def assumed_admissions(
    workload: Mapping[str, Any], cluster_queue: Mapping[str, Any], kueue: KueueIndex
) -> list[dict[str, Any]]:
    """Copies of a Workload waiting for quota, each as if Kueue had reserved it on one
    flavor of the ClusterQueue's resource group covering its GPUs (the first
    `FLAVORS_PER_SHAPE`; flavors of Kueue's Topology-Aware Scheduling are left out: Kueue
    chooses those hosts); every other resource on its group's first flavor. None when no
    group covers a GPU resource the Workload asks for."""
    spec = workload.get("spec") or {}
    groups = [g for g in (cluster_queue.get("spec") or {}).get("resourceGroups") or []
              if isinstance(g, Mapping)]
    pod_sets = [ps for ps in spec.get("podSets") or [] if isinstance(ps, Mapping)]
    asked = [_resources(ps) for ps in pod_sets]
    gpu_group = next((g for g in groups
                      if any(_is_gpu(r) and any(r in a for a in asked)
                             for r in g.get("coveredResources") or [])), None)
    if gpu_group is None:
        return []
    options = [str(f.get("name")) for f in gpu_group.get("flavors") or []
               if isinstance(f, Mapping) and f.get("name")]
    options = [f for f in options if not _topology_flavor(kueue, f)][:FLAVORS_PER_SHAPE]
    out = []
    for flavor in options:
        assignments = []
        for ps, resources in zip(pod_sets, asked, strict=True):
            flavors: dict[str, str] = {}
            for group in groups:
                covered = [str(r) for r in group.get("coveredResources") or []
                           if r in resources]
                names = [str(f.get("name")) for f in group.get("flavors") or []
                         if isinstance(f, Mapping) and f.get("name")]
                if covered and names:
                    chosen = flavor if group is gpu_group else names[0]
                    flavors.update(dict.fromkeys(covered, chosen))
            assignments.append(
                {"name": ps.get("name") or "main", "flavors": flavors, "count": ps.get("count", 1)}
            )
        status = dict(workload.get("status") or {})
        status["admission"] = {"clusterQueue": (cluster_queue.get("metadata") or {}).get("name"),
                               "podSetAssignments": assignments}
        out.append({**workload, "status": status})
    return out


def _resources(pod_set: Mapping[str, Any]) -> set[str]:
    """The resource names a pod set's containers request or limit."""
    pod_spec = (pod_set.get("template") or {}).get("spec") or {}
    out: set[str] = set()
    for kind in _CONTAINER_LISTS:
        for c in pod_spec.get(kind) or []:
            res = c.get("resources") or {}
            out.update(res.get("requests") or {})
            out.update(res.get("limits") or {})
    return out


def _is_gpu(resource: object) -> bool:
    return resource == L.GPU_RESOURCE or str(resource).endswith("/gpu")


def _topology_flavor(kueue: KueueIndex, flavor: str) -> bool:
    rf = kueue.resource_flavors.get(flavor)
    return bool(((rf or {}).get("spec") or {}).get("topologyName"))
