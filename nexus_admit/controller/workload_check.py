"""Writes our entry of a Workload's `status.admissionChecks`, and nothing else.

Who calls it: `loop/` and `lifecycle.py`. Server-side apply with our own field manager
owns exactly the fields of our entry (Kueue's provisioning check does the same), so Kueue's
and other checks' entries are never touched. An Event goes to the Workload only on a real
transition (a new state or a new message), so repeated passes do not spam it; it is posted in
the background (`ctx.workers.background`), since a lost Event never fails the decision.

It reads the Workload's view (`kube/views.py`: its identity and check entries); the object
(`raw`) only as the Event's subject. `current_entry` stays for the reader of the pass's dump
(`preemption/victims.running_gangs`, in the solver's thread).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.events import post_event
from nexus_admit.controller.outcome import Outcome
from nexus_admit.kube import labels as L
from nexus_admit.kube.kueue import check_entry_of
from nexus_admit.kube.views import WorkloadView

__all__ = ["beside_other_checks", "check_entry", "current_entry", "write_check"]

log = logging.getLogger(__name__)


def current_entry(workload: Mapping[str, Any], check: str) -> dict[str, Any]:
    return check_entry_of(workload, check)


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


_MERGED_FIELDS = ("labels", "annotations", "nodeSelector")


def beside_other_checks(
    updates: Sequence[Mapping[str, Any]], workload: WorkloadView, check: str
) -> tuple[dict[str, Any], ...]:
    """Our podSetUpdates as Kueue can merge them with the other checks' of the Workload
    (v0.19.2 applies every check's to the pods and refuses to start them when two set one
    key of labels, annotations or nodeSelector to different values): one entry per pod
    set (Kueue v0.21 requires it), and a key another check sets to another value left to
    theirs (the placement honoured their nodeSelector already, `place.within_siblings`)."""
    theirs: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in workload.checks:
        if entry.get("name") == check:
            continue
        for update in entry.get("podSetUpdates") or []:
            if not isinstance(update, Mapping):
                continue
            for fld in _MERGED_FIELDS:
                values = update.get(fld)
                if isinstance(values, Mapping):
                    theirs.setdefault((str(update.get("name")), fld), {}).update(values)
    merged: dict[str, dict[str, Any]] = {}
    for update in updates:
        name = str(update.get("name"))
        into = merged.setdefault(name, {"name": name})
        for fld, value in update.items():
            if fld not in _MERGED_FIELDS or not isinstance(value, Mapping):
                into.setdefault(fld, value)
                continue
            other = theirs.get((name, fld), {})
            kept = {k: v for k, v in value.items() if other.get(k, v) == v}
            if len(kept) < len(value):
                log.warning("Workload %s: pod set %s: %s %s left to another check's value",
                            workload.name, name, fld,
                            sorted(set(value) - set(kept)))
            if kept:
                into.setdefault(fld, {}).update(kept)
    return tuple(merged.values())


async def write_check(
    ctx: Context, workload: WorkloadView, check: str, outcome: Outcome
) -> None:
    """Apply our check entry; raises the API error (the caller decides what it means)."""
    before = workload.check(check)
    if outcome.pod_set_updates:
        outcome = replace(outcome, pod_set_updates=beside_other_checks(
            outcome.pod_set_updates, workload, check))
    now = ctx.clocks.wall()
    body = {
        "apiVersion": L.KUEUE_GROUP_VERSION,
        "kind": "Workload",
        "metadata": {"name": workload.name, "namespace": workload.namespace},
        "status": {
            "admissionChecks": [check_entry(check, outcome, now.strftime("%Y-%m-%dT%H:%M:%SZ"))]
        },
    }
    await asyncio.to_thread(ctx.api.apply_status, "Workload", body)
    log.info(
        "Workload %s: check %s %s: %s",
        workload.key,
        check,
        outcome.state.value,
        outcome.message,
    )
    ctx.metrics.placements.labels(outcome.state.value).inc()
    if before.get("state") != outcome.state.value or before.get("message") != outcome.message:
        # best effort, so it need not hold up the next decision: the pass awaits it at its end
        ctx.workers.background.spawn(
            asyncio.to_thread(
                post_event,
                ctx.api,
                workload.raw,
                outcome.event_reason,
                outcome.message,
                event_type=outcome.event_type,
                now=now,
            ),
            name="event",
        )
