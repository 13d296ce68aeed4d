"""Objects a pass left out, told where their owners look.

Who calls it: the placing pass (after every `dump.snapshot`, whose `skipped` lists the
objects it could not read) and the ungater (a pod or a reservation it could not handle).
One malformed object is left out of this pass and the pass goes on for everyone else; this
module counts it (`nexus_admit_objects_skipped_total{kind,reason}`) and posts one Warning
Event per object version: on the object itself (a Pod, a Node...), or on the Workload a
reservation belongs to. A later version of the object (the field fixed, or broken anew) is
reported again; the same version never twice, however many passes skip it.

The store's views name a field they could not read (`kube/views.py`, `view.problem`); the
pass adds those to what its snapshot left out (`with_view_problems`), so a Workload, a
reservation or a pod read leniently is told the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.events import post_event
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import Skipped

__all__ = ["REASON", "Reported", "report_skipped", "with_view_problems"]

log = logging.getLogger(__name__)

REASON = "ObjectSkipped"  # the Events' reason
# versions remembered as reported; beyond this the oldest are forgotten (a forgotten one
# that is still skipped gets one more Event, which is harmless)
_REMEMBERED = 4096


@dataclass
class Reported:
    """The skipped objects already reported, one Event per object version (oldest first)."""

    seen: dict[str, None] = field(default_factory=dict)

    def reset(self) -> None:
        # a follower's Events were refused (only the leader writes): a new leader reports
        self.seen = {}

# the group/version of the kinds an Event may be about, for its `regarding`
_API_VERSIONS = {
    "Pod": "v1",
    "Node": "v1",
    "Workload": L.KUEUE_GROUP_VERSION,
    L.KIND_RESOURCE_RESERVATION: L.GROUP_VERSION,
    "NodeResourceTopology": "topology.node.k8s.io/v1alpha2",
    "ResourceSlice": "resource.k8s.io/v1",
    "ResourceClaim": "resource.k8s.io/v1",
}


def _regarding(ctx: Context, s: Skipped) -> tuple[Mapping[str, Any], str]:
    """The object the Event is about, and the note's lead (who is left out, when the Event
    is not on the object itself)."""
    if s.owner:
        kind, _, key = s.owner.partition(" ")
        owner = ctx.store.get(kind, key)
        if owner is not None:
            return {"apiVersion": _API_VERSIONS.get(kind, ""), "kind": kind, **owner}, (
                f"{s.ref} left out: "
            )
    stored = ctx.store.get(s.kind, f"{s.namespace}/{s.name}" if s.namespace else s.name)
    obj = stored or {"metadata": {"name": s.name, "namespace": s.namespace, "uid": s.uid}}
    return {"apiVersion": _API_VERSIONS.get(s.kind, ""), "kind": s.kind, **obj}, ""


def _version(s: Skipped) -> str:
    """The object version and field a report is about (each told once)."""
    return f"{s.kind}/{s.namespace}/{s.name}/{s.uid}/{s.resource_version}/{s.field}"


def with_view_problems(ctx: Context, skipped: list[Skipped]) -> list[Skipped]:
    """`skipped` and what the store's views could not read (`Store.view_problems`),
    but for a field `skipped` names already (the snapshot reads some of the same fields: a
    reservation's expiry), so it is counted once per pass."""
    problems = ctx.store.view_problems()
    if not problems:
        return skipped
    named = {_version(s) for s in skipped}
    return [*skipped, *(p for p in problems if _version(p) not in named)]


def report_skipped(ctx: Context, skipped: Iterable[Skipped], *, action: str = "Place",
                   count: bool = True) -> None:
    """Count every skipped object (`count`: once per placing pass, not again for the
    capacity metrics' snapshot) and, once per object version, log it and post a Warning
    Event where its owner looks (in the background: an Event never delays a pass)."""
    reported = ctx.component(Reported).seen
    for s in skipped:
        if count:
            ctx.metrics.objects_skipped.labels(s.kind, s.reason).inc()
        seen = _version(s)
        if seen in reported:
            continue
        reported[seen] = None
        while len(reported) > _REMEMBERED:
            del reported[next(iter(reported))]
        where = f"field {s.field}: " if s.field else ""
        log.warning("%s skipped this pass: %s%s", s.ref, where, s.message)
        regarding, lead = _regarding(ctx, s)
        note = f"{lead}{where}{s.message}; nexus-admit leaves it out until it is fixed"
        ctx.workers.background.spawn(
            asyncio.to_thread(
                post_event,
                ctx.api,
                regarding,
                REASON,
                note,
                event_type="Warning",
                now=ctx.clocks.wall(),
                action=action,
            ),
            name="skipped-object-event",
        )
