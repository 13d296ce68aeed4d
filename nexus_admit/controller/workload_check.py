"""Writes our entry of a Workload's `status.admissionChecks`, and nothing else.

Who calls it: `loop/` and `lifecycle.py`. Server-side apply with our own field manager
owns exactly the fields of our entry (Kueue's provisioning check does the same), so Kueue's
and other checks' entries are never touched. An Event goes to the Workload only on a real
transition (a new state or a new message), so repeated passes do not spam it; it is posted in
the background (`ctx.background`), since a lost Event never fails the decision.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.events import post_event
from nexus_admit.controller.outcome import Outcome
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import child, meta

__all__ = ["check_entry", "current_entry", "write_check"]

log = logging.getLogger(__name__)


def current_entry(workload: Mapping[str, Any], check: str) -> dict[str, Any]:
    status = child(workload, "status")
    for entry in status.get("admissionChecks") or []:
        if isinstance(entry, Mapping) and entry.get("name") == check:
            return dict(entry)
    return {}


def check_entry(check: str, outcome: Outcome, now: str) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": check,
        "state": outcome.state.value,
        "message": outcome.message,
        "lastTransitionTime": now,
    }
    if outcome.requeue_after_seconds is not None:
        entry["requeueAfterSeconds"] = outcome.requeue_after_seconds
    if outcome.pod_set_updates:
        entry["podSetUpdates"] = [dict(u) for u in outcome.pod_set_updates]
    return entry


async def write_check(
    ctx: Context, workload: Mapping[str, Any], check: str, outcome: Outcome
) -> None:
    """Apply our check entry; raises the API error (the caller decides what it means)."""
    m = meta(workload)
    before = current_entry(workload, check)
    now = ctx.clock()
    body = {
        "apiVersion": L.KUEUE_GROUP_VERSION,
        "kind": "Workload",
        "metadata": {"name": m.get("name"), "namespace": m.get("namespace")},
        "status": {
            "admissionChecks": [check_entry(check, outcome, now.strftime("%Y-%m-%dT%H:%M:%SZ"))]
        },
    }
    await asyncio.to_thread(ctx.api.apply_status, "Workload", body)
    log.info(
        "Workload %s/%s: check %s %s: %s",
        m.get("namespace"),
        m.get("name"),
        check,
        outcome.state.value,
        outcome.message,
    )
    ctx.metrics.placements.labels(outcome.state.value).inc()
    if before.get("state") != outcome.state.value or before.get("message") != outcome.message:
        # best effort, so it need not hold up the next decision: the pass awaits it at its end
        ctx.background.spawn(
            asyncio.to_thread(
                post_event,
                ctx.api,
                workload,
                outcome.event_reason,
                outcome.message,
                event_type=outcome.event_type,
                now=now,
            ),
            name="event",
        )
