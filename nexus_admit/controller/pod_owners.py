"""The owners above a pod, read on demand and remembered: who a pod belongs to.

Who calls it: the ungater (`ungating/ungater.py`) and the pod webhook (`webhook/review.py`),
before a pod may take a slot of a reservation. Kueue makes a Workload for the top object of
a kind (a Job, JobSet, TrainJob, RayJob, LeaderWorkerSet, StatefulSet...) and owns it by
that object; the pods sit one or more owners below it: a JobSet's pod is owned by a Job
the JobSet owns, a TrainJob's by a Job of a JobSet the TrainJob owns, a RayJob's by its
RayCluster. So a pod is the Workload's when one of its ancestors is one of the Workload's
owners (`owned_member`): Kueue's own way to find a pod's job
(`FindAncestorJobManagedByKueue`). A label or annotation naming the Workload is set by
whoever writes the pod and proves nothing.

The intermediate owners are read one GET each (the kinds of `api.RESOURCES`; an owner of
another kind ends that branch) and kept for a while: the pods of one Job share it, and an
owner's identity and owners do not change. A cached owner whose uid differs from the
reference (deleted and created again under the same name) is read again. A failed read
leaves the owner unknown: the pod waits for the next pass, it is not refused. The ungater
reads nothing for a pod whose own owner already owns the Workload (a Job's pod).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache

from nexus_admit.controller.api import RESOURCES
from nexus_admit.kube.errors import meta

__all__ = ["MAX_DEPTH", "OwnerChains", "OwnerRef", "owned_member", "owner_refs"]

log = logging.getLogger(__name__)

# pod → Job → JobSet → TrainJob is the longest chain Kueue integrates (3 owners up)
MAX_DEPTH = 4
# owners read up from one object: its controller first (the one Kueue follows), so a pod
# carrying thousands of made-up ownerReferences costs a few reads, not thousands
MAX_OWNERS_READ = 4
# how long an owner read stays good; owners never change their own owners in practice
OWNER_TTL_SECONDS = 300.0
OWNER_CACHE_SIZE = 20_000


@dataclass(frozen=True, slots=True)
class OwnerRef:
    kind: str
    name: str
    uid: str


def owner_refs(obj: Mapping[str, Any]) -> list[OwnerRef]:
    refs = meta(obj).get("ownerReferences")
    return [
        OwnerRef(str(r.get("kind") or ""), str(r.get("name") or ""), str(r.get("uid") or ""))
        for r in (refs if isinstance(refs, list) else [])
        if isinstance(r, Mapping) and r.get("uid") and r.get("name")
    ]


def _to_read(obj: Mapping[str, Any]) -> list[OwnerRef]:
    """The owners of `obj` worth reading up: the controller first, at most
    `MAX_OWNERS_READ` (Kueue itself follows the controller reference alone)."""
    refs = meta(obj).get("ownerReferences")
    rows = [r for r in (refs if isinstance(refs, list) else []) if isinstance(r, Mapping)]
    rows.sort(key=lambda r: r.get("controller") is not True)  # stable: the controller first
    return owner_refs({"metadata": {"ownerReferences": rows}})[:MAX_OWNERS_READ]


Getter = Callable[[str, str, str], Awaitable[Mapping[str, Any] | None]]  # kind, name, ns


@dataclass(frozen=True, slots=True)
class _Known:
    uid: str
    owners: tuple[OwnerRef, ...]


class OwnerChains:
    """Ancestors of pods, from a cache of owner reads. One instance per event loop (the
    cache is not thread-safe): the controller's loop and the webhook's thread each keep
    their own."""

    def __init__(self, get: Getter, *, ttl: float = OWNER_TTL_SECONDS) -> None:
        self._get = get
        self._known: TTLCache[tuple[str, str, str], _Known | None] = TTLCache(
            maxsize=OWNER_CACHE_SIZE, ttl=ttl
        )

    def _cached(self, namespace: str, ref: OwnerRef) -> _Known | bool | None:
        """The owner as known, None when known to be gone, False when it must be read."""
        key = (ref.kind, namespace, ref.name)
        if key not in self._known:
            return False
        known = self._known[key]
        if known is not None and known.uid != ref.uid:
            return False  # same name, another object: read it again
        return known

    async def resolve(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """Read every owner up the chains of `objs` that the cache does not hold, level by
        level, each level's reads at once."""
        frontier = [(str(meta(o).get("namespace") or ""), r) for o in objs for r in _to_read(o)]
        for _ in range(MAX_DEPTH):
            wanted = {
                (ns, r)
                for ns, r in frontier
                if r.kind in RESOURCES and self._cached(ns, r) is False
            }
            await asyncio.gather(*(self._read(ns, r) for ns, r in wanted))
            frontier = [
                (ns, up)
                for ns, r in frontier
                if isinstance(known := self._cached(ns, r), _Known)
                for up in known.owners[:MAX_OWNERS_READ]
            ]
            if not frontier:
                return

    async def _read(self, namespace: str, ref: OwnerRef) -> None:
        try:
            obj = await self._get(ref.kind, ref.name, namespace)
        except Exception as e:  # unknown for now: the pod waits, it is not refused
            log.warning("could not read %s %s/%s: %s", ref.kind, namespace, ref.name, e)
            return
        key = (ref.kind, namespace, ref.name)
        self._known[key] = (
            None if obj is None else _Known(str(meta(obj).get("uid") or ""), tuple(_to_read(obj)))
        )

    def ancestor_uids(self, obj: Mapping[str, Any]) -> set[str]:
        """The uids of the object's owners and of theirs, up to MAX_DEPTH, as far as the
        cache knows them (`resolve` first)."""
        namespace = str(meta(obj).get("namespace") or "")
        out: set[str] = set()
        frontier = owner_refs(obj)
        for _ in range(MAX_DEPTH):
            out |= {r.uid for r in frontier}
            frontier = [
                up
                for r in frontier
                if isinstance(known := self._cached(namespace, r), _Known)
                for up in known.owners
                if up.uid not in out
            ]
            if not frontier:
                break
        return out


def owned_member(
    pod: Mapping[str, Any], workload: Mapping[str, Any], ancestors: Collection[str] = ()
) -> bool:
    """Is the pod one of the Workload's? One of its owners or `ancestors` (the uids above
    them, `OwnerChains.ancestor_uids`) owns the Workload (a Job's pod, a JobSet's...), or
    the Workload is owned by the pod itself: Kueue makes every member of a plain pod group
    (a lone pod, a StatefulSet's or LeaderWorkerSet's pods) an owner of its Workload."""
    workload_owners = {r.uid for r in owner_refs(workload)}
    uid = str(meta(pod).get("uid") or "")
    above = {r.uid for r in owner_refs(pod)} | set(ancestors)
    return bool(above & workload_owners) or (bool(uid) and uid in workload_owners)
