"""The degraded mode: when no replica has led for `--degraded-after-seconds`, any replica
still running marks our AdmissionChecks `Active=False` with the reason, so Kueue stops
reserving quota for Workloads that nobody would place (it deactivates the ClusterQueues
that use the check) and the on-call engineer sees why on the AdmissionCheck.

Who calls it: `operator.py` runs `watch_leadership` beside the elector when leader
election is on. The one write is made without the leader guard (a follower writes it: the
leader is who is missing). When a replica leads again, its first pass
(`check_config.sync_checks`) sees the condition differ and writes `Active=True` back.
How no replica can lead while one runs: the Lease cannot be written (a refused write, an
admission policy, a wrong namespace), or every replica is failing its renewals. With no
replica running at all nothing can write it: see docs/admin-guide.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.runtime.lease import LeaseElector
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import child, meta

__all__ = ["NO_LEADER_REASON", "no_leader_condition", "watch_leadership"]

log = logging.getLogger(__name__)

NO_LEADER_REASON = "NoLeader"


def no_leader_condition(seconds: float, lease: str, holder: str) -> dict[str, str]:
    last = f"last held by {holder!r}" if holder else "released by its last holder"
    return {
        "type": "Active",
        "status": "False",
        "reason": NO_LEADER_REASON,
        "message": (
            f"no nexus-admit replica has led for {seconds:.0f} s (Lease {lease} {last}): "
            "Workloads of this check are not placed; see 'When nexus-admit is down' in the "
            "admin guide (nexus-admit release)"
        ),
    }


def _marked(check: Mapping[str, Any]) -> bool:
    for c in child(check, "status").get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "Active":
            return c.get("status") == "False" and c.get("reason") == NO_LEADER_REASON
    return False


async def mark_no_leader(ctx: Context, elector: LeaseElector, seconds: float) -> int:
    """Write Active=False on each of our checks not marked yet; how many were written."""
    c = elector.config
    cond = {
        **no_leader_condition(seconds, f"{c.namespace}/{c.name}", elector.holder),
        "lastTransitionTime": ctx.clocks.wall().strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    written = 0
    for check in ctx.store.items("AdmissionCheck"):
        if child(check, "spec").get("controllerName") != L.ADMISSION_CHECK_CONTROLLER:
            continue
        name = str(meta(check).get("name"))
        if _marked(check):
            continue
        body = {
            "apiVersion": L.KUEUE_GROUP_VERSION,
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "status": {"conditions": [cond]},
        }
        try:
            await asyncio.to_thread(ctx.api.apply_status, "AdmissionCheck", body, guarded=False)
        except Exception as e:  # tried again on the next round
            ctx.metrics.errors.labels("degraded").inc()
            log.warning("no leader: could not mark AdmissionCheck %s inactive: %s", name, e)
            continue
        written += 1
        log.error("AdmissionCheck %s marked Active=False: %s", name, cond["message"])
    return written


async def watch_leadership(ctx: Context, elector: LeaseElector, after_seconds: float) -> None:
    """Every lease round: once nobody has led for `after_seconds`, mark our checks."""
    if after_seconds <= 0:
        return
    while True:
        await asyncio.sleep(elector.config.retry_seconds)
        seconds = elector.leaderless_seconds()
        if seconds < after_seconds:
            continue
        # judged by a fresh read: after a pause this replica's last read is stale, and
        # another replica may have led all along
        seconds = await asyncio.to_thread(elector.refresh)
        if seconds >= after_seconds:
            await mark_no_leader(ctx, elector, seconds)
