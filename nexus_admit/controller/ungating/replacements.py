"""A replacement pod that waits for the terminating pod of its slot says so, once.

Who calls it: `ungater._choose`, after `slot_assignment.assign_slots` left a gated pod
without a slot because the pod of its rank's slot is being deleted and still holds the
node (`slot_assignment.holds_slot`). The replacement stays gated (kube-scheduler would find
it unschedulable beside the old pod, and the lifecycle would send the gang back through
Retry); a Normal Event `PlacementWaiting` on it names the old pod, the node and the latest
time it waits until. Best effort, in the background, like every Event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from nexus_admit.controller.context import Context
from nexus_admit.controller.events import post_event
from nexus_admit.controller.ungating.slot_assignment import (
    TERMINATION_MARGIN,
    RankedPod,
    holds_slot,
)
from nexus_admit.kube.quantity import parse_time
from nexus_admit.kube.reservations import slot_key
from nexus_admit.kube.views import PodView

__all__ = ["REASON", "ReplacementsTold", "tell_waiting", "terminating_holders"]

REASON = "PlacementWaiting"
# replacements remembered as told; the oldest are forgotten first (told again at worst)
_REMEMBERED = 4096


@dataclass
class ReplacementsTold:
    """The uids of replacement pods already told that they wait (oldest first)."""

    uids: dict[str, None] = field(default_factory=dict)

    def reset(self) -> None:
        self.uids = {}  # a new leader tells again: a follower writes no Event


def terminating_holders(pods: Sequence[PodView], now: datetime) -> dict[tuple[str, int], PodView]:
    """Slot → the pod being deleted that still holds it (`holds_slot`)."""
    out: dict[tuple[str, int], PodView] = {}
    for p in pods:
        if not p.deletion or not holds_slot(p, now):
            continue
        if p.slot is not None:
            out[p.slot] = p
    return out


def tell_waiting(
    ctx: Context,
    pods: Sequence[PodView],
    views: Sequence[RankedPod],
    chosen: Collection[str],
) -> None:
    """An Event on each gated pod left without a slot whose rank's slot a terminating pod
    still holds, once per pod."""
    now = ctx.clocks.wall()
    holders = terminating_holders(pods, now)
    if not holders:
        return
    told = ctx.component(ReplacementsTold).uids
    by_name = {p.name: p for p in pods}
    for v in views:
        if not v.gated or v.name in chosen or v.rank is None:
            continue
        old = holders.get((v.pod_set, v.rank))
        pod = by_name.get(v.name)
        uid = pod.uid if pod is not None else ""
        if old is None or pod is None or not uid or uid in told:
            continue
        told[uid] = None
        while len(told) > _REMEMBERED:
            del told[next(iter(told))]
        ends = parse_time(old.deletion)
        until = (ends + TERMINATION_MARGIN).strftime("%Y-%m-%dT%H:%M:%SZ") if ends else "?"
        note = (
            f"waits for pod {old.name}, which still holds slot "
            f"{slot_key(v.pod_set, v.rank)} on node {old.node} "
            f"while it terminates; pinned there once it is gone (at the latest at {until}, "
            "the end of its grace period and a margin)"
        )
        ctx.workers.background.spawn(
            asyncio.to_thread(
                post_event, ctx.api, {"apiVersion": "v1", "kind": "Pod", **pod.raw}, REASON, note,
                now=now, action="Ungate",
            ),
            name="replacement-waiting-event",
        )
